"""Operations from the command line: submit to the fleet, run a worker, decide approvals, pause,
unpause, the inbox and the figures. Each verb is the twin of a ``raysaga.Client`` method.
"""

from __future__ import annotations

import json
import os
import shlex
import signal
import sys
import time
import tomllib
from pathlib import Path
from typing import Annotated, Any

import typer

from raysaga.errors import UserError
from raysaga.orchestrator import cli_input, stop_signals
from raysaga.orchestrator.cli_errors import EXIT_SIGINT, EXIT_SIGTERM, err, errors, out, say
from raysaga.orchestrator.cli_options import DbOpt, LabelOpt, LeaseOpt, MaxDeathsOpt, RunIdArg
from raysaga.state.redact import scrub_text
from raysaga.types import check_text

NodeArg = Annotated[str, typer.Argument(metavar="NODE",
                                        help="The approval node (or agent tool call), as inbox shows it.")]
ByOpt = Annotated[str | None, typer.Option("--by", envvar="RAYSAGA_USER",
                                           help="Who decides (default: $RAYSAGA_USER, else $USER).")]
DecisionOpt = Annotated[str | None, typer.Option(
    "--decision-id", help="An id that makes a retried command one decision (default: a new one).")]


def _client(db: str | None, run_id: str | None = None, *, writes: bool = True) -> Any:
    from raysaga.orchestrator import cli_store
    from raysaga.orchestrator.client import Client

    store = cli_store.open_for_writes(db, run_id) if writes else cli_store.open_for_reads(db, run_id)
    return Client(store)


#: Longest --by: the name is recorded in the event of each decision or transition.
MAX_BY = 200


def _who(by: str | None) -> str:
    who = by or os.environ.get("USER") or ""
    if not who.strip():
        raise UserError("say who decides: --by NAME (or set RAYSAGA_USER)")
    return _named(who.strip())


def _named(who: str) -> str:
    """``--by`` as recorded: 1-200 printable characters (it was written whatever its size)."""
    return check_text(who, "--by (who decides)", MAX_BY)


def _actor(by: str | None) -> str | None:
    who = (by or os.environ.get("USER") or "").strip()
    return _named(who) if who else None


def _node(node: str) -> tuple[str, int]:
    """``review`` or ``review[3]`` (a fan-out's item), as ``inbox`` prints it. The index is ASCII
    digits: ``str.isdigit`` also takes '²' (``int`` then raised a bare ValueError) and '٣' (read as 3)."""
    if node.endswith("]") and "[" in node:
        name, index = node[:-1].split("[", 1)
        if index.isascii() and index.isdigit() and len(index) <= 10 and int(index) <= cli_input.INT32_MAX:
            return name, int(index)
        if index.isdigit() or index.isdecimal() or index.isnumeric():
            raise UserError(f"NODE {node!r}: a fan-out item is NAME[N], N a whole number from 0 to "
                            f"{cli_input.INT32_MAX} in ASCII digits (as `raysaga inbox` shows it)")
    return node, -1


#: The states of a run at rest without a driver: a worker takes it up when its ``wake_at`` comes.
_AT_REST = ("waiting_human", "waiting_timer", "paused")
#: The states of a run that goes on no more by itself (ended, or parked for an operator).
_ENDED = ("completed", "cancelled", "compensated", "failed", "compensation_failed")


def _next_step(run_id: str, client: Any = None) -> str:
    """What happens next; ``client``: a decision's, to tell a run its live driver holds (a timer of
    the run is near, or other branches run) from one at rest, and one at rest that is due (a worker
    takes it up now) from one that is not (it said "now" of a run left resting for 10 minutes)."""
    run = None if client is None else client.get_run(run_id)
    now, quoted = time.time(), shlex.quote(run_id)
    if run is not None and run.status.value in _ENDED:  # (a decision retried with its --decision-id)
        parked = run.status.value in ("failed", "compensation_failed")
        return f"the run is {run.status.value} already: " + (
            f"it goes on once `raysaga retry {quoted}` reopens it" if parked else "nothing more happens")
    if run is not None and run.lease_owner is not None and (run.lease_expires_at or 0.0) >= now:
        from raysaga.orchestrator.ownership import gone_because

        gone = gone_because(run.lease_owner)  # a SIGKILLed driver's lease outlives it
        if gone is None:
            return "the run's live driver takes the decision at its next heartbeat"
        return (f"its driver is gone ({gone}): `raysaga resume {quoted}` takes it over at once, or a worker once "
                "its lease expires")
    if run is None or run.status.value not in _AT_REST or (run.wake_at is not None and run.wake_at <= now):
        return f"a worker (`raysaga worker`) takes the run up now, or `raysaga resume {quoted}`"
    from raysaga.orchestrator.runner import held_by_operator  # loaded with the Client already
    from raysaga.orchestrator.status_text import one_line, when

    why = one_line(run.status_reason or run.status.value)
    if held_by_operator(run):  # held: no worker takes it up
        return (f"the run is paused ({why}): it goes on with the decision once `raysaga unpause {quoted}` "
                "lets a worker take it up")
    if run.status.value == "paused":
        return (f"the run paused itself ({why}): it goes on with the decision once `raysaga resume {quoted}` "
                "takes it up (a spent budget: resumed with a larger one)")
    due = "no worker takes it up until something wakes it" if run.wake_at is None else \
        f"a worker (`raysaga worker`) takes it up when it is due, {when(run.wake_at, now)}"
    return f"the run still rests ({why}): {due}; `raysaga resume {quoted}` takes it up now"


def _still_waiting(client: Any, run_id: str, name: str, index: int) -> str | None:
    """What a quorum still needs after this approval ("1 of 2 approvals so far (alice): waits for 1
    more of bob, carol"), or None when the approval is settled and the run goes on."""
    for w in client.store.waiting_approvals(run_id=run_id):
        if w.node == name and w.fan_index == index and len(w.approvals) < w.request.quorum:
            deciders = [d for d in (w.request.deciders() or []) if d not in w.approvals]
            among = f" of {', '.join(deciders)}" if deciders else ""
            return (f"{len(w.approvals)} of {w.request.quorum} approvals so far ({', '.join(w.approvals)}): "
                    f"it waits for {w.request.quorum - len(w.approvals)} more{among}")
    return None


def approve(
    run_id: RunIdArg,
    node: NodeArg,
    by: ByOpt = None,
    comment: Annotated[str | None, typer.Option("--comment", help="Recorded with the decision.")] = None,
    answer: Annotated[str | None, typer.Option(
        "--answer", help="An approve 'with edits': JSON (or @file.json) checked against the node's schema.")] = None,
    decision_id: DecisionOpt = None,
    db: DbOpt = None,
) -> None:
    """Approve a waiting approval (double and late decisions are refused with why)."""
    with errors():
        cli_input.check_run_id(run_id)
        value = cli_input.parse_input(answer, "--answer") if answer is not None else None
        name, index = _node(node)
        client = _client(db, run_id)
        decision = client.approve(run_id, name, by=_who(by), answer=value, comment=comment,
                                  decision_id=decision_id, fan_index=index)
        # scrubbed as the store has it: ``--by`` holding a secret was recorded "[redacted]", and printed whole
        say(out, scrub_text(f"{node} of run {run_id}: approved by {decision.by} (decision {decision.decision_id}); "
                            f"{_still_waiting(client, run_id, name, index) or _next_step(run_id, client)}"))


def reject(
    run_id: RunIdArg,
    node: NodeArg,
    by: ByOpt = None,
    comment: Annotated[str | None, typer.Option("--comment", help="Why (an agent's model is shown it).")] = None,
    decision_id: DecisionOpt = None,
    db: DbOpt = None,
) -> None:
    """Reject a waiting approval: the node fails (a critical one rolls the saga back); an agent's
    tool call is refused and the model is told why."""
    with errors():
        cli_input.check_run_id(run_id)
        name, index = _node(node)
        client = _client(db, run_id)
        decision = client.reject(run_id, name, by=_who(by), comment=comment, decision_id=decision_id,
                                 fan_index=index)
        say(out, scrub_text(f"{node} of run {run_id}: rejected by {decision.by} (decision {decision.decision_id}); "
                            f"{_next_step(run_id, client)}"))


def pause(run_id: RunIdArg, by: ByOpt = None, db: DbOpt = None) -> None:
    """Pause a run: its driver releases all compute at the next step boundary (at once without one)."""
    with errors():
        cli_input.check_run_id(run_id)
        run = _client(db, run_id).pause(run_id, by=_actor(by))
        state = "paused" if run.status.value == "paused" else f"{run.status.value}; its driver pauses it shortly"
        say(out, f"run {run_id}: {state} (`raysaga unpause {shlex.quote(run_id)}` lets it go on)")


def unpause(run_id: RunIdArg, by: ByOpt = None, db: DbOpt = None) -> None:
    """Let a paused run go on."""
    with errors():
        cli_input.check_run_id(run_id)
        _client(db, run_id).unpause(run_id, by=_actor(by))
        say(out, f"run {run_id}: unpaused; {_next_step(run_id)}")


def inbox(
    approver: Annotated[str | None, typer.Option("--for", help="Only what this approver may decide.")] = None,
    as_json: Annotated[bool, typer.Option("--json", help="One JSON object per line.")] = False,
    db: DbOpt = None,
) -> None:
    """What waits for a human decision, oldest first."""
    with errors():
        from raysaga.orchestrator.status_text import flat, one_line, payload_line, relative
        from raysaga.state.redact import scrub

        waiting = _client(db, writes=False).inbox(approver)
        if as_json:  # scrubbed as the dashboard's inbox is: a prompt is a step's output, stored as it came
            for item in waiting:
                shown = scrub(item.model_dump(mode="json"))  # written compact, as model_dump_json did
                sys.stdout.write(json.dumps(shown, separators=(",", ":"), ensure_ascii=False) + "\n")
            return
        if not waiting:
            say(out, "nothing waits for a decision" + (f" by {scrub_text(approver)}" if approver else ""))
            return
        now = time.time()
        for item in waiting:  # a block per approval: the run and node (what approve needs) never cut
            r = item.request
            label = item.node if item.fan_index < 0 else f"{item.node}[{item.fan_index}]"
            quorum = f" ({len(item.approvals)}/{r.quorum} approved)" if r.quorum > 1 else ""
            due = "no timeout" if r.timeout_at is None else f"times out {relative(max(r.timeout_at, now), now)}"
            # "approvers:", not "decided by": it waits, and read so it looked decided already
            say(out, (flat(f"{item.run_id} {label}"), "bold"), f"  asked {relative(min(r.asked_at, now), now)} · "
                f"approvers: {flat(scrub_text(', '.join(r.deciders() or ['anyone'])))}{quorum} · {due}")
            # one line, cut: a prompt is a step's output (its newlines would draw fake lines, 20 MB printed whole)
            say(out, f"  {one_line(r.prompt, more=' (`raysaga inbox --json` has it whole)')}")
            payload = payload_line(r)  # what the approver approves: a tool call's arguments, say
            if payload is not None:
                say(out, f"  {payload}")


def submit(
    workflow: Annotated[str, typer.Argument(metavar="MODULE:WORKFLOW", help="e.g. examples.order.workflow:wf")],
    input: Annotated[str | None, typer.Option("--input", "-i", help="JSON text, @file.json or @- for stdin.")] = None,
    run_id: Annotated[str | None, typer.Option("--run-id", help="Id for the run.")] = None,
    db: DbOpt = None,
    label: LabelOpt = None,
    max_driver_deaths: MaxDeathsOpt = None,
) -> None:
    """Record a run for the worker fleet and return at once; prints the run id."""
    with errors():
        cli_input.check_run_id(run_id, "--run-id")
        tags = cli_input.run_labels("--label", label)
        deaths = cli_input.max_driver_deaths(max_driver_deaths)
        value = cli_input.parse_input(input)
        from raysaga.orchestrator.loader import load_workflow, recordable_ref

        wf = load_workflow(workflow)
        cli_input.check_input(wf, value, input is not None)
        from raysaga.orchestrator.options import RunOptions

        options = RunOptions(labels=tags, max_driver_deaths=cli_input.run_limit(deaths))
        run = _client(db).submit(wf, value, run_id=run_id, workflow_ref=recordable_ref(workflow), options=options)
        sys.stdout.write(run.run_id + "\n")


def worker(
    workflow: Annotated[list[str] | None, typer.Option(
        "--workflow", "-w", help="MODULE:WORKFLOW this worker drives (repeatable).")] = None,
    config: Annotated[Path | None, typer.Option(
        "--config", help="A TOML file: workflows = [...], concurrency, executor, address, limits = {wf = N}.")] = None,
    concurrency: Annotated[int | None, typer.Option("--concurrency", "-c", help="Runs driven at once (4).")] = None,
    limit: Annotated[list[str] | None, typer.Option(
        "--limit", help="WORKFLOW=N: at most N runs of it driven at once, fleet-wide (repeatable).")] = None,
    db: DbOpt = None,
    executor: Annotated[str | None, typer.Option(
        "--executor", help="ray (default) or inline (in this process); over executor in --config.")] = None,
    address: Annotated[str | None, typer.Option(
        "--address", help="Ray cluster to join (over address in --config, over RAY_ADDRESS; default: a local Ray "
        "started on demand).")] = None,
    lease_ttl: LeaseOpt = 15.0,
    poll: Annotated[float, typer.Option("--poll", help="Seconds between looks for work when idle.")] = 0.5,
    max_driver_deaths: Annotated[int | None, typer.Option(
        "--max-driver-deaths", help="Drivers of a run that die in a row before it commits any step's outcome, "
        "then it is parked as a crash loop (3; a run created with its own RunOptions.max_driver_deaths "
        "keeps it).")] = None,
) -> None:
    """Claim runnable runs of the registered workflows and drive them, until SIGTERM or Ctrl-C
    (which hand the runs back: another worker takes them at once)."""
    with errors():
        settings = _worker_settings(config, workflow, concurrency, limit, executor, address)
        _at_most_a_day("--lease-ttl", lease_ttl)
        _at_most_a_day("--poll", poll)
        from raysaga.orchestrator import cli_store
        from raysaga.orchestrator.loader import load_workflow
        from raysaga.orchestrator.options import RunOptions
        from raysaga.orchestrator.worker import Worker
        from raysaga.orchestrator.worker_checks import checked_max_driver_deaths

        options = RunOptions(lease_ttl=lease_ttl)
        if max_driver_deaths is not None:
            options = RunOptions(lease_ttl=lease_ttl, max_driver_deaths=checked_max_driver_deaths(max_driver_deaths))
        _one_file_per_name(settings["workflows"])
        workflows = [load_workflow(ref) for ref in settings["workflows"]]
        store = cli_store.open_for_writes(db)
        w = Worker(workflows, store, concurrency=settings["concurrency"], executor=settings["executor"],
                   address=settings["address"], options=options, poll=poll, limits=settings["limits"])
        w.start_engine()  # Ray first: it installs signal handlers of its own, which ours replace
        stops: list[int] = []

        def on_signal(signum: int, frame: object) -> None:
            stops.append(signum)
            if len(stops) > 1:  # a second signal: stop at once; leases expire and others take over
                os._exit(EXIT_SIGINT if signum == signal.SIGINT else EXIT_SIGTERM)
            w.stop(signal.Signals(signum).name)

        for signum in (signal.SIGTERM, signal.SIGINT):
            # a SIGINT ignored when the worker started (`nohup raysaga worker &`) stays ignored, also
            # before Worker.run keeps it so: Ray's start may have installed a handler of its own
            signal.signal(signum, signal.SIG_IGN if stop_signals.ignored(signum) else on_signal)
        names = ", ".join(sorted(w.workflows))
        say(out, f"worker {os.getpid()}: driving {names} from {cli_store.describe(store.url)}, "
                 f"{w.concurrency} at once (SIGTERM or Ctrl-C stops it and hands its runs back)")
        counts = w.run()
        say(out, f"worker {os.getpid()}: stopped; claimed {counts.claimed}, completed {counts.completed}, "
                 f"ended otherwise {counts.ended} (failed, rolled back or cancelled), resting {counts.rested} "
                 f"(waiting or paused), handed back {counts.handed_back}, errors {counts.failed}")


def stats(
    as_json: Annotated[bool, typer.Option("--json", help="Print the figures as JSON.")] = False,
    prometheus: Annotated[bool, typer.Option("--prometheus", help="Prometheus text format.")] = False,
    since: Annotated[float | None, typer.Option("--since", help="Only runs created in the last N seconds.")] = None,
    db: DbOpt = None,
) -> None:
    """Runs by state, time waiting for humans, resumes, duplicates prevented, retries, claim latency."""
    with errors():
        cli_input.positive_seconds("--since", since)
        if as_json and prometheus:  # --prometheus once won silently
            raise UserError("--json and --prometheus are two formats: choose one")
        figures = _client(db, writes=False).stats(None if since is None else time.time() - since)
        if prometheus:
            from raysaga.state.stats import prometheus as text

            sys.stdout.write(text(figures))
        elif as_json:
            sys.stdout.write(figures.model_dump_json(indent=2) + "\n")
        else:
            by_state = ", ".join(f"{k} {v}" for k, v in sorted(figures.runs_by_state.items())) or "none"
            w = figures.waiting_human_seconds
            c = figures.claim_latency_seconds
            rate = "-" if figures.resume_success_rate is None else f"{figures.resume_success_rate:.0%}"
            nobody = figures.runs_without_driver  # active, no driver holds their lease: none goes on alone
            for line in (f"runs: {by_state}",
                         *([f"runs no driver drives: {nobody} (running or compensating, their lease released or "
                            "expired: `raysaga resume RUN` continues each, a worker serving its queue a submitted one; "
                            "`raysaga list` marks them, `raysaga status RUN` says why)"] if nobody else []),
                         f"waiting for a human: {w.count} waits, p50 {_secs(w.p50)}, p95 {_secs(w.p95)}",
                         f"resumes: {figures.resumes} of {figures.resumed_runs} runs; of those at rest, "
                         f"{rate} completed",
                         f"duplicate effects prevented (ledger hits): {figures.duplicates_prevented}",
                         f"retries: {figures.retries}; circuit breakers open: {figures.breaker_trips}",
                         f"worker claims: {c.count}, latency p50 {_secs(c.p50)}, p95 {_secs(c.p95)}"):
                say(out, line)


#: What each key of a worker's ``--config`` holds: its type, and how a refusal names it
#: (``concurrency`` and the limits' values: ``Worker``'s own checks, the same message either way).
_CONFIG_KEYS: dict[str, tuple[type, str]] = {
    "workflows": (list, 'a list of "MODULE:WF" strings'), "executor": (str, '"ray" or "inline"'),
    "address": (str, 'a Ray address, a string ("HOST:PORT")'),
    "limits": (dict, "a table of whole numbers by workflow name ({ wf = N })")}


def _worker_settings(config: Path | None, workflows: list[str] | None, concurrency: int | None,
                     limits: list[str] | None, executor: str | None, address: str | None) -> dict[str, Any]:
    """The worker's settings: a flag over its key in ``--config`` over the default."""
    loaded: dict[str, Any] = {}
    if config is not None:
        try:
            loaded = tomllib.loads(config.read_text(encoding="utf-8"))
        except (OSError, tomllib.TOMLDecodeError, UnicodeDecodeError) as exc:
            raise UserError(f"--config {config}: {exc}") from None
        extra = sorted(set(loaded) - {"workflows", "concurrency", "executor", "address", "limits"})
        if extra:
            raise UserError(f"--config {config}: unknown keys {', '.join(extra)} (it takes workflows, concurrency, "
                            "executor, address, limits)")
        for key, (expected, what) in _CONFIG_KEYS.items():
            value: Any = loaded.get(key, expected())
            if not isinstance(value, expected) or isinstance(value, bool) or (
                    key == "workflows" and not all(isinstance(r, str) for r in loaded.get(key, []))):
                raise UserError(f"--config {config}: {key} must be {what}, got {type(value).__name__} {value!r:.80}")
    refs = [*loaded.get("workflows", []), *(workflows or [])]
    if not refs or not all(isinstance(r, str) for r in refs):
        raise UserError("name the workflows this worker drives: --workflow MODULE:WF (repeatable) or workflows = "
                        "[...] in --config; a worker never imports a module named by the database")
    table = dict(loaded.get("limits", {}))
    for item in limits or []:
        name, _, count = item.partition("=")
        count = count.strip()
        if not name or not (count.isascii() and count.isdigit()):  # '²' passes isdigit, then int() fails
            raise UserError(f"--limit {item!r}: write WORKFLOW=N, N a whole number in ASCII digits "
                            "(at most N runs of it driven at once)")
        table[name.strip()] = int(count)
    from raysaga.orchestrator.worker_checks import checked_concurrency, checked_executor, checked_limits

    slots = checked_concurrency(concurrency if concurrency is not None else loaded.get("concurrency", 4))
    kind = checked_executor(executor) if executor is not None else \
        checked_executor(loaded.get("executor", "ray"), f"--config {config}: executor")
    # an address joins a Ray cluster, inline joins none: refused where one option set both (a flag
    # --executor inline over a file's executor = "ray" leaves that file's address aside)
    if kind == "inline" and (address or (executor is None and loaded.get("address"))):
        given, drop = ("--address", "--address") if address else \
            (f"the address in --config {config}", f"the address from {config}")
        raise UserError(f"{given} names a Ray cluster to join, and the inline executor joins none (its runs are "
                        f"driven in this process): drop {drop}, or use the ray executor")
    return {"workflows": refs, "concurrency": slots, "limits": checked_limits(table),
            # the environment last: a RAY_ADDRESS left over (a Ray job's) beat the file's address
            "executor": kind, "address": address or loaded.get("address") or os.environ.get("RAY_ADDRESS") or None}


#: The longest ``--poll`` and ``--lease-ttl`` a worker takes: it waits on them (a heartbeat every
#: ttl/3), and a wait longer than ``threading.TIMEOUT_MAX`` (~292 years) raised OverflowError in its
#: loop; a day between looks for work, or a dead driver's run blocked for a day, is already a mistake.
MAX_WAIT_S = 86400.0


def _at_most_a_day(option: str, value: float) -> None:
    cli_input.positive_seconds(option, value)
    if value > MAX_WAIT_S:
        raise UserError(f"{option} must be at most {MAX_WAIT_S:.0f} seconds (a day), got {value:g}")


def _one_file_per_name(refs: list[str]) -> None:
    """Two workflow files of one name (``a/flows.py``, ``b/flows.py``) are one module to Ray's
    workers, which import a step by its module's name: the second file replaced the first, and
    the first workflow's steps were looked up in the second's module."""
    seen: dict[str, Path] = {}
    for ref in refs:
        module = ref.rpartition(":")[0]
        if module.endswith(".py"):
            path = Path(module).resolve()
            other = seen.setdefault(path.stem, path)
            if other != path:
                raise UserError(f"workflow files {str(other)!r} and {str(path)!r} would both be imported as module "
                                f"{path.stem!r}: rename one of them")


def _secs(value: float | None) -> str:
    return "-" if value is None else f"{value:.2f}s"


TokenBudgetOpt = Annotated[int | None, typer.Option(
    "--token-budget", help="Model tokens the whole run may spend from now on (raise a spent budget to go on).")]
CostBudgetOpt = Annotated[float | None, typer.Option(
    "--cost-budget", help="Model cost in USD the whole run may spend from now on (raise a spent budget to go on).")]


def budgets(token_budget: int | None, cost_budget: float | None) -> dict[str, Any]:
    """``--token-budget`` / ``--cost-budget`` as ``RunOptions`` fields, checked as ``RunOptions``
    checks them but naming the flag (a negative or NaN budget, or one the store's column cannot hold)."""
    cli_input.int_in_range("--token-budget", token_budget, 0, cap=2**63 - 1)
    if cost_budget is not None and not (cost_budget >= 0 and cost_budget != float("inf")):
        raise UserError(f"--cost-budget must be a finite amount of USD >= 0, got {cost_budget}")
    return {"token_budget": token_budget, "cost_budget": cost_budget}


def budget_hint(run: Any, verb: str = "resume") -> None:
    """After a resume or retry that left the run paused on its spent budget: how to raise it."""
    if run.status.value == "paused" and (run.status_reason or "").startswith("budget:"):
        from raysaga.orchestrator.driver_signals import budget_advice
        from raysaga.orchestrator.status_text import one_line

        say(err, f"run {run.run_id} stays paused on its spent budget ({one_line(run.status_reason)}): raise it: "
                 f"{budget_advice(run, verb)}")


def cancel_outcome(store: Any, run: Any, compensate: bool) -> None:
    """A cancel that did not end as asked exits 1 saying so: ``--compensate`` finding the run ended
    ``cancelled`` by a plain cancel that came first (its effects stand; it said ``cancelled``, exit 0,
    and the rollback never ran), or a plain cancel leaving the run to a rollback asked before it."""
    from raysaga.state.models import EffectStatus, RunStatus

    quoted = shlex.quote(run.run_id)
    if compensate and run.status == RunStatus.CANCELLED:
        stand = [f"{e.effect_name} ({e.node_id}{'' if e.fan_index < 0 else f'[{e.fan_index}]'}"
                 f"{'' if e.status == EffectStatus.COMMITTED else ', ' + e.status.value + ': may have happened'})"
                 for e in store.effects(run.run_id) if e.status != EffectStatus.FAILED]
        say(err, f"run {run.run_id} ended cancelled without a rollback: a plain cancel reached it first. "
                 + (f"Its effects stand: {', '.join(stand)}. A cancelled run never changes again: no raysaga command "
                    "rolls it back; undo them by hand (or with a new run)" if stand else "It committed no effect"))
        raise typer.Exit(1)
    if not compensate and run.status not in (RunStatus.CANCELLED, RunStatus.COMPENSATED) and any(
            s.kind == "cancel" and isinstance(s.payload, dict) and s.payload.get("compensate")
            for s in store.pending_signals(run.run_id)):
        say(err, f"run {run.run_id}: a rollback was asked for first (cancel --compensate): it rolls back instead "
                 f"of ending cancelled (a worker takes it up, or `raysaga resume {quoted}`)")
