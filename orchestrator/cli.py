"""The ``raysaga`` command line (typer). See docs/cli.md.

Exit codes: 0 the run completed (or the command succeeded); 1 the run ended not completed
(failed, cancelled, compensated, waiting), or a cancel found nothing to cancel; 2 a usage or
store error (bad module path, unknown workflow or run, malformed input, a store that cannot be
opened); 3 another live driver owns the run; 4 this driver lost its lease mid-run; 130 interrupted
by SIGINT (Ctrl-C); 143 stopped by SIGTERM. Errors are one line; ``--debug`` (or
``RAYSAGA_DEBUG=1``) adds the traceback. User data (run ids, messages, names) is never read as
markup.
"""

from __future__ import annotations

import json
import shlex
import sys
from collections.abc import Callable
from dataclasses import dataclass
from types import ModuleType
from typing import TYPE_CHECKING, Annotated, Any

import typer

from raysaga.errors import RaySagaError, RunNotFoundError, UserError
from raysaga.orchestrator import cli_input, cli_ops
from raysaga.orchestrator.cli_dashboard import dashboard
from raysaga.orchestrator.cli_errors import EXIT_NOT_COMPLETED, err, errors, out, say, settings
from raysaga.orchestrator.cli_fork import fork, replay
from raysaga.orchestrator.cli_maintenance import db_upgrade, prune
from raysaga.orchestrator.cli_options import (
    AddressOpt,
    DbOpt,
    ExecutorOpt,
    LabelFilterOpt,
    LabelOpt,
    LeaseOpt,
    MaxDeathsOpt,
    RunIdArg,
    WorkflowOpt,
)
from raysaga.orchestrator.cli_options import check_address as _check_address
from raysaga.orchestrator.cli_watch import events, status
from raysaga.state.models import PARKED, TERMINAL, RunRecord, RunStatus
from raysaga.state.redact import scrub, scrub_text

if TYPE_CHECKING:
    from raysaga.orchestrator.options import RunOptions
    from raysaga.orchestrator.workflow import Workflow
    from raysaga.state import SqlStore

# Each command imports what it needs when it runs (``raysaga --help`` loads neither SQLAlchemy nor
# the workflow DSL; read commands never load the driver, Ray or networkx): a command's wall time
# is its own work, not every other command's imports.


def _status() -> ModuleType:
    from raysaga.orchestrator import cli_status

    return cli_status


def _stores() -> ModuleType:
    from raysaga.orchestrator import cli_store

    return cli_store


def _load_workflow(ref: str) -> Workflow:
    from raysaga.orchestrator.loader import load_workflow

    return load_workflow(ref)


def _loader() -> ModuleType:
    from raysaga.orchestrator import loader

    return loader


def _runner() -> ModuleType:
    """The runner (driver, executors, Ray) is imported only by the commands that drive a run:
    read commands start without it."""
    from raysaga.orchestrator import runner

    return runner

app = typer.Typer(add_completion=False, no_args_is_help=True, pretty_exceptions_enable=False,
                  rich_markup_mode=None, help="raysaga: crash-proof multi-agent workflows on Ray.")
db_app = typer.Typer(no_args_is_help=True, help="Database maintenance.")
app.add_typer(db_app, name="db")

#: Most runs one ``raysaga list`` page shows.
MAX_LIST = 1000


@dataclass
class _Current:
    """The run a command drives, for the message after a Ctrl-C."""

    run_id: str | None = None


def _version(value: bool) -> None:
    if value:
        from importlib import metadata

        from raysaga.state.engine import default_url

        try:
            version = metadata.version("raysaga")
        except metadata.PackageNotFoundError:
            version = "(not installed)"
        with errors():
            where = _stores().describe(default_url())
        say(out, f"raysaga {version} (store schema {_stores().SCHEMA_VERSION})")
        say(out, f"store: {where} (--db or RAYSAGA_DB to change it)")
        raise typer.Exit(0)


@app.callback()
def _main(
    debug: Annotated[bool, typer.Option("--debug", help="Print tracebacks (also RAYSAGA_DEBUG=1).")] = False,
    version: Annotated[bool, typer.Option("--version", is_eager=True, callback=_version,
                                          help="Print the version and the default store, then exit.")] = False,
) -> None:
    """raysaga: crash-proof multi-agent workflows on Ray."""
    settings.debug = debug


def _run_id(value: str) -> str:
    checked = cli_input.check_run_id(value)
    assert checked is not None
    return checked


def _options(lease_ttl: float, deadline: float | None = None, retry_budget: int | None = None,
             allow_changed: bool = False, labels: list[str] | None = None,
             max_driver_deaths: int | None = None, budgets: dict[str, Any] | None = None) -> RunOptions:
    tags = cli_input.run_labels("--label", labels)
    cli_input.positive_seconds("--lease-ttl", lease_ttl)
    cli_input.positive_seconds("--deadline", deadline)
    cli_input.int_in_range("--retry-budget", retry_budget, 0, cap=cli_input.INT32_MAX)
    deaths = cli_input.max_driver_deaths(max_driver_deaths)
    from raysaga.orchestrator.options import RunOptions

    return RunOptions(lease_ttl=lease_ttl, deadline=deadline, retry_budget=retry_budget, allow_changed=allow_changed,
                      labels=tags, max_driver_deaths=cli_input.run_limit(deaths), **(budgets or {}))


def _drive(action: Callable[[Callable[[Any], None]], RunRecord], total_hint: int, quiet: bool) -> RunRecord:
    if quiet or not err.is_terminal:
        return action(lambda _p: None)
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

    with Progress(TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(),
                  console=err, transient=True) as progress:
        task = progress.add_task("steps", total=total_hint)

        def update(p: Any) -> None:
            progress.update(task, completed=p.done, total=p.total or total_hint)

        return action(update)


def _report(store: SqlStore, run: RunRecord, as_json: bool) -> None:
    run = store.get_run(run.run_id)  # as it stands now: the driver has released its lease
    if as_json:
        _status().stream_json(store, run, sys.stdout)
    else:
        _status().print_status(out, store, run, store_text=_stores().describe(store.url))
    if run.status in (RunStatus.WAITING_HUMAN, RunStatus.WAITING_TIMER):
        say(err, f"run {run.run_id} rests ({_status().one_line(run.status_reason or '')}); nothing holds it: "
                 + ("`raysaga inbox` shows what to decide, `raysaga approve|reject RUN NODE` decides; "
                    if run.status == RunStatus.WAITING_HUMAN else "")
                 + f"a `raysaga worker` takes it up when it is due, or `raysaga resume {shlex.quote(run.run_id)}`")


def _exit_for(run: RunRecord, success: RunStatus = RunStatus.COMPLETED) -> None:
    if run.status != success:
        raise typer.Exit(EXIT_NOT_COMPLETED)


@app.command()
def run(
    ctx: typer.Context,
    workflow: Annotated[str, typer.Argument(metavar="MODULE:WORKFLOW",
                                            help="e.g. examples.order.workflow:wf or flows.py:wf")],
    input: Annotated[str | None, typer.Option(
        "--input", "-i", help="Run input: JSON text, @file.json, or @- for stdin.")] = None,
    run_id: Annotated[str | None, typer.Option("--run-id", help="Id for the run; an existing id resumes it.")] = None,
    db: DbOpt = None,
    executor: ExecutorOpt = "ray",
    address: AddressOpt = None,
    deadline: Annotated[float | None, typer.Option(help="Seconds until the run stops with reason 'deadline'.")] = None,
    retry_budget: Annotated[int | None, typer.Option(help="Retries the whole run may spend.")] = None,
    lease_ttl: LeaseOpt = 15.0,
    as_json: Annotated[bool, typer.Option("--json", help="Print the final status as JSON.")] = False,
    quiet: Annotated[bool, typer.Option("--quiet", "-q", help="No progress bar.")] = False,
    label: LabelOpt = None,
    max_driver_deaths: MaxDeathsOpt = None,
) -> None:
    """Start a run of WORKFLOW and drive it to the end (Ctrl-C or a kill: `raysaga resume RUN` continues it)."""
    current = _Current()
    with errors(current):
        cli_input.check_run_id(run_id, "--run-id")
        options = _options(lease_ttl, deadline, retry_budget, labels=label, max_driver_deaths=max_driver_deaths)
        _check_address(executor, address, ctx)
        value = cli_input.parse_input(input)
        wf = _load_workflow(workflow)
        if input is not None or run_id is None or not _run_exists(db, run_id):  # no --input: resume as is
            cli_input.check_input(wf, value, input is not None)
        store = _stores().open_for_writes(db)
        given = value if input is not None else _runner().NO_INPUT  # JSON null is an input; no --input is not
        if run_id is not None and max_driver_deaths is not None:
            _same_given_deaths(store, wf, run_id, given, max_driver_deaths)
        current.run_id = run_id = run_id or _runner().new_run_id(wf)
        result = _drive(lambda hook: _runner().run(
            wf, given, store=store, run_id=run_id, executor=executor, address=address,
            options=options, on_progress=hook, workflow_ref=_loader().recordable_ref(workflow),
        ), len(wf.steps), quiet or as_json)
        _report(store, result, as_json)
    _exit_for(result)


def _same_given_deaths(store: SqlStore, wf: Workflow, run_id: str, given: Any, deaths: int) -> None:
    """``run --run-id EXISTING --max-driver-deaths N``: N must be the run's own limit if it recorded
    one (``run_identity.same_own_deaths``). ``runner.run`` compares a limit other than the default; the
    default given on the command line (3) is a limit too, which ``RunOptions`` cannot tell from one
    left out: compared here, after the checks ``runner.run`` makes first (workflow, input)."""
    from raysaga.orchestrator.run_identity import same_own_deaths

    existing = _runner().existing_run(wf, store, run_id, given)
    if existing is not None:
        same_own_deaths(existing, deaths, "run")


def _run_exists(db: str | None, run_id: str) -> bool:
    """Whether the store (if there is one) holds ``run_id``; nothing is created."""
    try:
        store = _stores().open_for_reads(db, run_id)
    except RaySagaError:
        return False
    try:
        store.get_run(run_id, lenient=True)
        return True
    except RunNotFoundError:
        return False
    finally:
        store.close()


def _workflow_for(store: SqlStore, run_id: str, ref: str | None) -> Workflow:
    """The run's workflow: the one the operator names (``--workflow``), else the module the run
    recorded (``load_recorded_workflow``: a stored ref is never a file path)."""
    if ref:
        return _load_workflow(ref)
    from raysaga.orchestrator.loader import load_recorded_workflow

    return load_recorded_workflow(store.get_run(run_id).workflow_ref, run_id)


AllowChangedOpt = Annotated[bool, typer.Option(
    "--allow-changed", help="Go on with a changed workflow definition (what changed is listed).")]


@app.command()
def resume(
    ctx: typer.Context,
    run_id: Annotated[str, typer.Argument(metavar="RUN", help="The run to continue.")],
    workflow: WorkflowOpt = None,
    db: DbOpt = None,
    executor: ExecutorOpt = "ray",
    address: AddressOpt = None,
    lease_ttl: LeaseOpt = 15.0,
    as_json: Annotated[bool, typer.Option("--json")] = False,
    quiet: Annotated[bool, typer.Option("--quiet", "-q")] = False,
    allow_changed: AllowChangedOpt = False,
    token_budget: cli_ops.TokenBudgetOpt = None,
    cost_budget: cli_ops.CostBudgetOpt = None,
) -> None:
    """Continue a run from the store: completed nodes are not re-run, committed effects not repeated."""
    with errors(_Current(run_id)):
        _run_id(run_id)
        options = _options(lease_ttl, allow_changed=allow_changed, budgets=cli_ops.budgets(token_budget, cost_budget))
        _check_address(executor, address, ctx)
        store = _stores().open_for_writes(db, run_id)
        before = store.get_run(run_id)
        if before.status in TERMINAL or before.status in PARKED:  # at rest: no code is imported
            say(err, f"run {run_id} is already {before.status.value}: nothing to resume ", _finished_note(before))
            _report(store, before, as_json)
            _exit_for(before)
            return
        _runner().check_resumable(before)  # a paused run is held: refused before any code is imported
        _runner().check_run_secrets(before, executor)  # (and before Ray starts) a secret missing here
        with _runner().executor_started(executor, address) as started:  # Ray joins while the code loads
            wf = _workflow_for(store, run_id, workflow)
            ex = started()
            result = _drive(lambda hook: _runner().resume(wf, run_id, store=store, executor=ex, options=options,
                                                       on_progress=hook),
                            len(wf.steps), quiet or as_json)
        _report(store, result, as_json)
        cli_ops.budget_hint(store.get_run(run_id))
    _exit_for(result)


@app.command()
def retry(
    ctx: typer.Context,
    run_id: Annotated[str, typer.Argument(metavar="RUN", help="A failed run to retry with the same idempotency keys.")],
    workflow: WorkflowOpt = None,
    db: DbOpt = None,
    executor: ExecutorOpt = "ray",
    address: AddressOpt = None,
    lease_ttl: LeaseOpt = 15.0,
    compensations: Annotated[bool, typer.Option(
        "--compensations", help="Retry the failed compensations of a compensation_failed run.")] = False,
    as_json: Annotated[bool, typer.Option("--json")] = False,
    quiet: Annotated[bool, typer.Option("--quiet", "-q")] = False,
    allow_changed: AllowChangedOpt = False,
    token_budget: cli_ops.TokenBudgetOpt = None,
    cost_budget: cli_ops.CostBudgetOpt = None,
) -> None:
    """Operator retry of a parked run (same idempotency keys): a failed run's failed and skipped nodes run
    again; --compensations completes a compensation_failed run's rollback. Refused before anything changes:
    a run started by another definition (unless --allow-changed), one its spent budget failed (unless
    --token-budget/--cost-budget raise it), one an agent fails again from its turns (`raysaga fork` it)."""
    with errors(_Current(run_id)):
        _run_id(run_id)
        options = _options(lease_ttl, allow_changed=allow_changed, budgets=cli_ops.budgets(token_budget, cost_budget))
        _check_address(executor, address, ctx)
        store = _stores().open_for_writes(db, run_id)
        _runner().check_retryable(store.get_run(run_id), compensations, options)  # before any workflow code is imported
        wf = _workflow_for(store, run_id, workflow)
        result = _drive(lambda hook: _runner().retry(wf, run_id, store=store, executor=executor, address=address,
                                                  options=options, on_progress=hook, compensations=compensations),
                        len(wf.steps), quiet or as_json)
        _report(store, result, as_json)
        cli_ops.budget_hint(store.get_run(run_id), "resume")
    _exit_for(result, RunStatus.COMPENSATED if compensations else RunStatus.COMPLETED)


@app.command()
def cancel(
    ctx: typer.Context,
    run_id: RunIdArg,
    reason: Annotated[str, typer.Option(help="Recorded with the cancellation.")] = "cancelled by operator",
    compensate: Annotated[bool, typer.Option(
        "--compensate", help="Also roll back committed effects (compensations in reverse).")] = False,
    workflow: WorkflowOpt = None,
    db: DbOpt = None,
    executor: ExecutorOpt = "ray",
    address: AddressOpt = None,
    allow_changed: AllowChangedOpt = False,
) -> None:
    """Stop a run: no more dispatching, in-flight tasks cancelled. Committed effects stand,
    unless --compensate rolls them back (refused before anything changes when the run was started
    by another definition, unless --allow-changed). Exit 1 when there was nothing to cancel."""
    with errors(_Current(run_id)):
        _run_id(run_id)
        cli_input.check_reason(reason, "--reason")
        _check_address(executor, address, ctx)
        store = _stores().open_for_writes(db, run_id)
        # lenient: a run whose input blob was damaged outside raysaga must still be cancellable
        before = store.get_run(run_id, lenient=True)
        ended = before.status in TERMINAL or before.status == RunStatus.COMPENSATION_FAILED  # retry --compensations
        if ended or (before.status in PARKED and not compensate):
            say(out, f"run {run_id} is already {before.status.value}: nothing to cancel ", _finished_note(before))
            cli_ops.cancel_outcome(store, before, compensate)  # --compensate of a run a plain cancel ended: what stands
            raise typer.Exit(EXIT_NOT_COMPLETED)
        wf = _workflow_for(store, run_id, workflow) if compensate else None
        result = _runner().cancel(run_id, store=store, reason=reason, compensate=compensate, workflow=wf,
                               executor=executor, address=address, allow_changed=allow_changed)
        say(out, f"run {run_id}: {result.status.value}"
            + (f" — {_status().one_line(result.status_reason)}" if result.status_reason else ""))
        cli_ops.cancel_outcome(store, result, compensate)  # not ended as asked: says so, exit 1
    if result.status not in (RunStatus.CANCELLED, RunStatus.COMPENSATED):
        raise typer.Exit(EXIT_NOT_COMPLETED)


def _finished_note(run: RunRecord) -> str:
    if run.status == RunStatus.COMPLETED:
        return ("(a completed run's effects stand; raysaga does not roll back a completed run: undo its effects "
                "with a new run or by hand)")
    if run.status in (RunStatus.COMPENSATED, RunStatus.CANCELLED):
        return f"(a {run.status.value} run never changes again)"
    quoted = shlex.quote(run.run_id)
    if run.status == RunStatus.COMPENSATION_FAILED:  # (a plain retry is refused: its forward part is over)
        return (f"(a compensation_failed run is parked for an operator: once what its failed compensations need "
                f"is fixed, `raysaga retry {quoted} --compensations` finishes its rollback)")
    return (f"(a {run.status.value} run is parked for an operator: `raysaga retry {quoted}` revives it, "
            f"`raysaga cancel {quoted} --compensate` rolls it back)")


@app.command("list")
def list_runs(
    status: Annotated[str | None, typer.Option("--status", help="Only runs in this state.")] = None,
    workflow: Annotated[str | None, typer.Option("--workflow", help="Only runs of this workflow (its name).")] = None,
    limit: Annotated[int, typer.Option(help=f"At most this many, newest first (1 to {MAX_LIST}).")] = 50,
    before: Annotated[str | None, typer.Option(
        "--before", help="The next page: runs created before this run (the last one listed).")] = None,
    db: DbOpt = None,
    as_json: Annotated[bool, typer.Option("--json")] = False,
    label: LabelFilterOpt = None,
) -> None:
    """The runs in the store, newest first (times in UTC)."""
    with errors():
        wanted = None
        if status is not None:
            try:
                wanted = RunStatus(status)
            except ValueError:
                raise UserError(f"--status {status!r} is not a run state; use one of "
                                f"{', '.join(s.value for s in RunStatus)}") from None
        if workflow is not None and not workflow.strip():  # `--workflow "$WF"` with WF unset listed nothing
            raise UserError("--workflow '' names no workflow: give a workflow's name, or leave --workflow out")
        cli_input.int_in_range("--limit", limit, 1, MAX_LIST)
        cli_input.check_run_id(before, "--before run id")
        tags = cli_input.labels("--label", label)
        store = _stores().open_for_reads(db)
        from raysaga.orchestrator import undriven
        from raysaga.state import queries

        cursor = _stores().page_cursor(store, before) if before is not None else None
        rows = store.list_runs(wanted, limit, workflow=workflow, before=cursor, labels=tags)
        nobody = undriven.of_summaries(store, [r for r in rows if not r.corrupt])  # as status tells them
        if as_json:
            tagged = queries.labels_of(store, [r.run_id for r in rows])
            sys.stdout.write(json.dumps([{
                "run_id": r.run_id, "workflow": r.workflow_name, "version": r.workflow_version,
                "status": r.status.value if r.status is not None else None,
                "reason": scrub(r.status_reason), "created_at": r.created_at, "updated_at": r.updated_at,
                "lease_owner": r.lease_owner, "lease_expires_at": r.lease_expires_at, "corrupt": r.corrupt,
                "labels": tagged.get(r.run_id, {}), "no_driver": (n := nobody.get(r.run_id)) and n.as_json(),
            } for r in rows]) + "\n")
            return
        if not rows:
            only = " and ".join(f for f in (f"in state {status}" if status else "",
                                             f"of workflow {workflow!r}" if workflow else "",
                                             f"labelled {_shown_labels(tags)}" if tags else "") if f)
            # "no runs in STORE" once read as an empty store when a filter matched nothing
            say(out, "no runs" + (f" {only}" if only else "") + (" on that page" if before else "")
                + f" in {_stores().describe(store.url)}")
            return
        table = [["run", "workflow", "status", "created (UTC)", "updated (UTC)", "reason"]]
        flat = _status().flat
        for r in rows:
            n = nobody.get(r.run_id)  # `running, no driver`; after its reason, why and what continues it
            state = f"corrupt: {r.corrupt}" if r.corrupt or r.status is None else n.headline() if n else r.status.value
            why = [flat(scrub_text(r.status_reason or ""))[:120], flat(f"{n.cause()}; {n.advice()}") if n else ""]
            table.append([flat(r.run_id), flat(f"{r.workflow_name} v{r.workflow_version}"), flat(state),
                          _status().utc(r.created_at).removesuffix(" UTC"),
                          _status().utc(r.updated_at).removesuffix(" UTC"), " — ".join(w for w in why if w)])
        for line in _status().columns(table):
            say(out, line)
        if len(rows) == limit:
            again = " ".join(a for a in (f"--status {status}" if status else "",
                                         f"--workflow {shlex.quote(workflow)}" if workflow else "",
                                         *(f"--label {shlex.quote(f'{k}={v}')}" for k, v in tags.items()),
                                         f"--limit {limit}" if limit != 50 else "", _stores().db_option(db)) if a)
            say(out, f"more: raysaga list --before {shlex.quote(rows[-1].run_id)}" + (f" {again}" if again else ""))


def _shown_labels(tags: dict[str, str]) -> str:
    return ", ".join(f"{k}={v}" for k, v in tags.items())


@app.command()
def graph(
    workflow: Annotated[str, typer.Argument(metavar="MODULE:WORKFLOW", help="The workflow to draw.")],
    format: Annotated[str, typer.Option("--format", "-f", help="mermaid or dot")] = "mermaid",
) -> None:
    """Print the workflow's DAG."""
    with errors():
        if format not in ("mermaid", "dot"):
            raise UserError(f"--format {format!r} is not known: use mermaid or dot")
        wf = _load_workflow(workflow)
        from raysaga.orchestrator.render import dot, mermaid

        sys.stdout.write(mermaid(wf) if format == "mermaid" else dot(wf))


for _command in (prune, cli_ops.submit, cli_ops.worker, cli_ops.approve, cli_ops.reject, cli_ops.pause,
                 cli_ops.unpause, cli_ops.inbox, cli_ops.stats,
                 __import__("raysaga.orchestrator.cli_workers", fromlist=["workers"]).workers):
    app.command()(_command)
app.command()(fork)
app.command()(replay)
app.command()(__import__("raysaga.orchestrator.cli_launch", fromlist=["launch"]).launch)
app.command()(dashboard)
app.command()(status)
app.command()(events)
db_app.command("upgrade")(db_upgrade)


def main() -> None:
    app()


if __name__ == "__main__":
    main()
