"""The commands that look at one run: ``raysaga status`` (the table, ``--dag``, ``--watch``,
``--json``, ``--format mermaid|dot|svg``) and ``raysaga events`` (``--follow``). Registered on the
app in ``cli.py``; each imports the store and its views only when it runs (``raysaga --help``
loads no SQLAlchemy)."""

from __future__ import annotations

import re
import sys
import threading
import time
from types import ModuleType
from typing import TYPE_CHECKING, Annotated, Any, NoReturn

import typer

from raysaga.errors import UserError
from raysaga.orchestrator import cli_input
from raysaga.orchestrator.cli_errors import EXIT_NOT_COMPLETED, err, errors, out, say
from raysaga.orchestrator.cli_options import DbOpt, RunIdArg
from raysaga.state.redact import scrub

if TYPE_CHECKING:
    from raysaga.state import RunRecord, SqlStore

#: Events read per round trip by ``raysaga events``.
EVENT_PAGE = 1000
#: Run states a run rests in: ``--watch`` and ``--follow`` stop there.
RESTING = frozenset({"completed", "failed", "compensated", "compensation_failed", "cancelled", "paused",
                     "waiting_human", "waiting_timer"})
FORMATS = ("text", "mermaid", "dot", "svg")


def _status() -> ModuleType:
    from raysaga.orchestrator import cli_status

    return cli_status


def _stores() -> ModuleType:
    from raysaga.orchestrator import cli_store

    return cli_store


def _run_id(value: str) -> str:
    checked = cli_input.check_run_id(value)
    assert checked is not None
    return checked


def status(
    run_id: RunIdArg,
    db: DbOpt = None,
    as_json: Annotated[bool, typer.Option(
        "--json", help="Every node's status, attempts and timings as JSON (streamed; schema_version 1).")] = False,
    summary: Annotated[bool, typer.Option(
        "--summary", help="With --json: counts per state per step and the failures, instead of every node.")] = False,
    errors_: Annotated[bool, typer.Option(
        "--errors", help="Every failed attempt of every failed node, with the latest traceback.")] = False,
    node: Annotated[str | None, typer.Option(
        "--node", help="One node's attempts and traceback, an approval's decisions; e.g. charge, square[3].")] = None,
    nodes_limit: Annotated[int | None, typer.Option(
        "--nodes-limit", help="With --json: at most this many nodes (see next_nodes_after).")] = None,
    nodes_after: Annotated[str | None, typer.Option(
        "--nodes-after", help="With --json: the nodes after this one (the previous page's next_nodes_after).")] = None,
    workflow: Annotated[str | None, typer.Option(
        "--workflow", help="MODULE:WORKFLOW to list steps that never started (imports that code).")] = None,
    dag: Annotated[bool, typer.Option(
        "--dag", help="Also draw the DAG by generation (imports the run's recorded workflow, or --workflow).")
    ] = False,
    watch: Annotated[bool, typer.Option(
        "--watch", help="Redraw live until the run rests (completed, failed, waiting...).")] = False,
    interval: Annotated[float, typer.Option(help="With --watch: seconds between redraws.")] = 1.0,
    format: Annotated[str, typer.Option(
        "--format", help="text (default), or the DAG coloured by state: mermaid, dot or svg.")] = "text",
) -> None:
    """Where a run stands: every node in the order it ran, the driver, the store."""
    with errors():
        _run_id(run_id)
        cli_input.int_in_range("--nodes-limit", nodes_limit, 1, cap=cli_input.INT64_MAX)
        shaping = [name for name, given in (("--summary", summary), ("--nodes-limit", nodes_limit is not None),
                                            ("--nodes-after", nodes_after is not None)) if given]
        if shaping and not as_json:  # the human view lists every node and counts each fan-out's items itself
            raise UserError(f"{' and '.join(shaping)} shape{'s' if len(shaping) == 1 else ''} the JSON document: "
                            "add --json, or leave it out for the human view")
        if format not in FORMATS:
            raise UserError(f"--format {format!r} is not known: use {', '.join(FORMATS)}")
        if watch and (as_json or format != "text" or errors_ or node is not None):
            raise UserError("--watch draws the human view: leave out --json, --format, --errors and --node")
        if not 0.05 <= interval <= 3600:
            raise UserError(f"--interval {interval} is not between 0.05 and 3600 seconds")
        if node is not None:
            _status().parse_label(node, "--node")
        if nodes_after is not None:
            _status().parse_label(nodes_after, "--nodes-after")
        wf = None
        if workflow:
            from raysaga.orchestrator.loader import load_workflow

            wf = load_workflow(workflow)
        store = _stores().open_for_reads(db, run_id)
        record = store.get_run(run_id)
        if wf is not None and wf.name != record.workflow_name:
            raise UserError(f"run {run_id!r} belongs to workflow {record.workflow_name!r}, not {wf.name!r}: "
                            "drop --workflow, or name that run's workflow")
        if errors_ or node is not None:
            from raysaga.orchestrator.status_errors import print_errors

            print_errors(out, store, record, node, as_json=as_json)
        elif as_json:
            _status().stream_json(store, record, sys.stdout, wf=wf, summary=summary, nodes_limit=nodes_limit,
                                   nodes_after=nodes_after)
        elif format != "text":
            _export(store, record, format, workflow)
        elif watch:
            _watch(store, record, wf=wf, workflow=workflow if dag else None, dag=dag, interval=interval)
        else:
            _status().print_status(out, store, record, store_text=_stores().describe(store.url), wf=wf)
            if dag:
                _status().print_dag(out, store, record, workflow)


def _export(store: SqlStore, record: RunRecord, format: str, workflow: str | None) -> None:
    from raysaga.orchestrator import run_views, undriven

    graph = run_views.run_graph(store, record, workflow)
    none = undriven.of_run(store, record)  # nobody drives it: what the store records running is interrupted
    views = run_views.step_views(store, record.run_id, graph, no_driver=none)
    if format == "mermaid":
        sys.stdout.write(run_views.mermaid(graph, views))
    elif format == "dot":
        sys.stdout.write(run_views.dot(graph, views, record.run_id))
    else:
        state = record.status.value if none is None else none.headline()
        sys.stdout.write(run_views.svg(graph, views, f"{record.run_id} ({record.workflow_name}): {state}"))


def _watch(store: SqlStore, record: RunRecord, *, wf: Any, workflow: str | None, dag: bool, interval: float) -> None:
    """Redraw the status view in place (rich Live) until the run rests; Ctrl-C stops watching.
    Not on a terminal (a pipe, a log), each view that differs from the last is printed instead
    (``change_key``). A launched run no driver will take stops the watch with exit 1
    (``_give_up_on_launch``)."""
    from rich.live import Live

    where = _stores().describe(store.url)
    jobs = JobLook()
    if not out.is_terminal:
        last = ""
        while True:
            run = store.get_run(record.run_id, lenient=True)
            shown = _render(store, run, where, wf, workflow, dag, interval)
            key = change_key(shown.plain)
            if key != last:  # the clock alone (the driver's countdown, the run's age) is no change
                out.print(shown)
                sys.stdout.flush()
                last = key
            if run.status.value in RESTING:
                return
            given_up = _give_up_on_launch(store, run, jobs)
            if given_up is not None:
                _stop(given_up)
            time.sleep(interval)  # a redraw period, not a synchronisation
    why: str | None = None
    with Live(console=out, auto_refresh=False, transient=False) as live:
        while True:
            run = store.get_run(record.run_id, lenient=True)
            live.update(_render(store, run, where, wf, workflow, dag, interval), refresh=True)
            if run.status.value in RESTING:
                break
            why = _give_up_on_launch(store, run, jobs)
            if why is not None:
                break
            time.sleep(interval)  # a redraw period, not a synchronisation
    if why is not None:
        _stop(why)


#: The run's age on the ``created ...`` line of a run not at rest ("(13.2s so far)"): it changes
#: with the clock alone, as the driver line's lease countdown does.
_AGE = re.compile(r" \([^()]*\bso far\)$")


def change_key(plain: str) -> str:
    """A view's text without what the clock alone changes: piped, ``--watch`` prints a view only
    when this differs from the last one's (an unchanging run is printed once, not every interval)."""
    return "\n".join(_AGE.sub("", line) if line.startswith("created ") else line
                     for line in plain.splitlines() if not line.startswith("driver:"))


#: Seconds between two questions to the Ray Job API about a launched run's jobs while watching;
#: after one went unanswered, the next is asked this many times later.
JOB_EVERY = 5.0
JOB_RETRY_FACTOR = 6
#: Seconds a question may go unanswered before it counts as failed (Ray's SDK sets no timeout: a
#: request to a head that stopped answering can hang for ever); it is left to end on its own.
JOB_ASK_DEADLINE = 10.0
#: Questions given up on that may still hang at once: no new one is asked beyond (a flaky API
#: answering now and then restarted the grace while a thread a question piled up, without bound).
HUNG_KEPT = 2
#: Seconds a redraw waits for the answer to the question it just asked (a Job API that answers
#: at once is seen in the same redraw); longer, the redraw goes on and a later one reads it.
JOB_ANSWER_WAIT = 0.5


class JobLook:
    """Whether any of a launched run's Ray jobs is live, asked of the Job API its launch recorded
    (at most every ``JOB_EVERY`` seconds) on a daemon thread: the redraw never blocks on the API.
    ``ended``: True (none live), False (one is), or None while it cannot be told (no route, no
    token, no Ray here, a question that hangs). A verdict is kept until an answer replaces it or
    the API fails: ``unknown_since`` then says since when nothing was known (the last answer, or
    the first question when none was ever answered), for ``launch_marks.watch_stop``'s grace."""

    def __init__(self) -> None:
        self.client: Any = None
        self.address = ""
        self.next_at = 0.0
        self.known: bool | None = None
        self.state = ""
        """The launch's job's state as Ray said it last (e.g. FAILED; "gone" when the cluster has no such job)."""
        self.answered_at: float | None = None
        self.first_asked_at: float | None = None
        self.created = time.time()
        self._asking: threading.Thread | None = None
        self._hung: list[threading.Thread] = []  # questions given up on: at most HUNG_KEPT hang at once
        self._asked_at = 0.0
        self._round = 0
        self._answer: tuple[int, Any, str, bool | None, str] | None = None
        self._lock = threading.Lock()  # the answer's hand-over between the question's thread and the redraw

    @property
    def unknown_since(self) -> float:
        return self.answered_at or self.first_asked_at or self.created

    def ended(self, run_id: str, job: str, address: str) -> bool | None:
        now = time.time()
        if self.first_asked_at is None:
            self.first_asked_at = now
        self._take_answer(now)
        if self._asking is not None and now - self._asked_at >= JOB_ASK_DEADLINE:  # hung: given up on
            self._hung.append(self._asking)
            self._asking, self.client, self.known = None, None, None
            with self._lock:
                self._round += 1  # its answer, should it come, is too old to use
            self.next_at = now + JOB_EVERY * JOB_RETRY_FACTOR
        self._hung = [t for t in self._hung if t.is_alive()]
        if self._asking is None and len(self._hung) < HUNG_KEPT and now >= self.next_at:  # (no pile of threads)
            with self._lock:
                self._round += 1
            self._asked_at = now
            client = self.client if self.address == address else None
            self._asking = threading.Thread(target=self._ask, args=(self._round, client, run_id, job, address),
                                            name="raysaga-watch-job", daemon=True)
            self._asking.start()
            self._asking.join(JOB_ANSWER_WAIT)
            self._take_answer(time.time())
        return self.known

    def _ask(self, round_: int, client: Any, run_id: str, job: str, address: str) -> None:
        """On the question's thread: the run's jobs (``launch.jobs_of``: a relaunch's job counts
        before its note is written), as ``(round, client, address, ended, state)``; no client on failure."""
        from raysaga.orchestrator import launch as lx

        try:
            if client is None:
                client = lx.connect(address)
            jobs = [j for j in lx.jobs_of(client, run_id) if j.drives(run_id)]
        except Exception:  # out of reach from here: the grace after the last answer decides (launch_marks)
            self._hand_over((round_, None, address, None, ""))
            return
        mine = next((j for j in jobs if j.submission_id == job), jobs[-1] if jobs else None)
        state = "gone" if mine is None else mine.status
        self._hand_over((round_, client, address, not any(j.live for j in jobs), state))

    def _hand_over(self, answer: tuple[int, Any, str, bool | None, str]) -> None:
        with self._lock:
            if answer[0] == self._round:  # (a question given up on says nothing)
                self._answer = answer

    def _take_answer(self, now: float) -> None:
        with self._lock:
            answer, self._answer = self._answer, None
        if answer is None or answer[0] != self._round:
            return
        _, client, address, ended, state = answer
        self._asking = None
        if client is None:
            self.client, self.known, self.next_at = None, None, now + JOB_EVERY * JOB_RETRY_FACTOR
            return
        self.client, self.address, self.known, self.state = client, address, ended, state
        self.answered_at, self.next_at = now, now + JOB_EVERY


def _stop(why: str) -> NoReturn:
    say(err, f"stopped watching: {why}")
    raise typer.Exit(EXIT_NOT_COMPLETED)


def _give_up_on_launch(store: SqlStore, run: RunRecord, jobs: JobLook) -> str | None:
    """Why to stop watching (exit 1) a launched run no driver will take: its job ended before starting
    it, or nothing could tell for ``launch_marks.NO_DRIVER_GRACE`` (``launch_marks.watch_stop``).
    A run not launched (a worker's to take) is never given up on."""
    from raysaga.orchestrator import launch_marks

    launch = launch_marks.latest(store, run)
    if launch_marks.not_started(run, launch, time.time()) is None or launch is None:
        return None
    ended = jobs.ended(run.run_id, launch.job, launch.address) if launch.address else None
    run = store.get_run(run.run_id, lenient=True)  # a driver may have taken it as its job ended
    return launch_marks.watch_stop(run, launch_marks.latest(store, run), ended, time.time(), jobs.state,
                                   jobs.unknown_since)


def _render(store: SqlStore, run: RunRecord, where: str, wf: Any, workflow: str | None, dag: bool,
            interval: float) -> Any:
    from rich.text import Text

    # the CLI's own console class: user text (a step's error, a reason) is escaped as it is
    # captured, as `status` shows it. A plain Console wrote its ESC sequences raw, and
    # ``Text.from_ansi`` below read them as styles: an error could draw a hyperlink or hide text.
    capture = type(out)(width=out.width, highlight=False, soft_wrap=True, force_terminal=out.is_terminal,
                        color_system="truecolor" if out.is_terminal else None)
    with capture.capture() as got:
        _status().print_status(capture, store, run, store_text=where, wf=wf)
        if dag:
            _status().print_dag(capture, store, run, workflow)
    shown = Text.from_ansi(got.get())
    if run.status.value not in RESTING:
        from raysaga.orchestrator import undriven

        idle = "" if undriven.of_run(store, run) is None else \
            "; nobody drives it: it changes once a resume or a worker takes it up"
        shown.append(f"watching: redrawn every {interval:g}s until the run rests (Ctrl-C stops){idle}\n", style="dim")
    return shown


def events(
    run_id: RunIdArg,
    db: DbOpt = None,
    after: Annotated[int, typer.Option(help="Only events after this sequence number.")] = 0,
    limit: Annotated[int | None, typer.Option(help="At most this many events.")] = None,
    follow: Annotated[bool, typer.Option(
        "--follow", "-f", help="Keep printing new events until the run rests (Ctrl-C stops).")] = False,
    interval: Annotated[float, typer.Option(help="With --follow: seconds between reads of the log.")] = 0.5,
) -> None:
    """The run's append-only event log, one JSON object per line."""
    with errors():
        _run_id(run_id)
        cli_input.int_in_range("--after", after, 0, cap=cli_input.INT64_MAX)
        cli_input.int_in_range("--limit", limit, 1, cap=cli_input.INT64_MAX)
        if not 0.05 <= interval <= 3600:
            raise UserError(f"--interval {interval} is not between 0.05 and 3600 seconds")
        store = _stores().open_for_reads(db, run_id)
        store.get_run(run_id)
        left, seq = limit, after
        while left is None or left > 0:
            page = store.events(run_id, after_seq=seq, limit=EVENT_PAGE if left is None else min(EVENT_PAGE, left))
            for e in page:
                # scrubbed as the dashboard's events are: a store written before a secret's shape
                # was known (or by a process that knew other secrets) keeps what it was given
                sys.stdout.write((e if e.data is None else e.model_copy(update={"data": scrub(e.data)}))
                                 .model_dump_json() + "\n")
            if page:
                seq = page[-1].seq
                left = None if left is None else left - len(page)
                continue
            if not follow or (store.get_run(run_id, lenient=True).status.value in RESTING
                              and not store.events(run_id, after_seq=seq, limit=1)):
                break
            sys.stdout.flush()
            time.sleep(interval)  # the log's poll period, not a synchronisation
