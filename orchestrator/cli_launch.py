"""``raysaga launch``: record a run and leave its driving to a Ray Job on a cluster (see
``launch.py`` for why, and docs/cluster.md for the cluster).

stdout gets the run id alone (``RUN=$(raysaga launch ...)``); what happened goes to stderr.
With ``--wait`` the command follows the run until it rests and exits like ``raysaga run``.
"""

from __future__ import annotations

import os
import shlex
import time
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any

import typer

from raysaga.errors import LeaseHeldError, RunExistsError, UserError, WorkflowLoadError
from raysaga.orchestrator import cli_input
from raysaga.orchestrator.cli_errors import EXIT_NOT_COMPLETED, err, errors, out, say
from raysaga.orchestrator.cli_options import DbOpt, LabelOpt, LeaseOpt, MaxDeathsOpt
from raysaga.state.models import PARKED, TERMINAL, RunRecord, RunStatus

if TYPE_CHECKING:
    from collections.abc import Callable

    from ray.job_submission import JobSubmissionClient

    from raysaga.orchestrator.launch import Submitted
    from raysaga.orchestrator.workflow import Workflow
    from raysaga.state import SqlStore

#: A run in one of these has no driver to wait for: ``--wait`` stops there.
AT_REST = frozenset(TERMINAL | PARKED | {RunStatus.WAITING_HUMAN, RunStatus.WAITING_TIMER, RunStatus.PAUSED})
#: Seconds between two looks at the run and its job while following them.
FOLLOW_EVERY = 0.5


def launch(
    ctx: typer.Context,
    workflow: Annotated[str, typer.Argument(metavar="MODULE:WORKFLOW", help="e.g. flows:wf, importable from here.")],
    address: Annotated[str, typer.Option(
        "--address", envvar="RAY_API_SERVER_ADDRESS",
        help="The Ray head's dashboard URL (Job API), e.g. http://HEAD:8265.")],
    input: Annotated[str | None, typer.Option(
        "--input", "-i", help="Run input: JSON text, @file.json, or @- for stdin.")] = None,
    run_id: Annotated[str | None, typer.Option(
        "--run-id", help="Id for the run; launching an existing id starts no second driver.")] = None,
    env: Annotated[list[str] | None, typer.Option(
        "--env", help="NAME of a variable of this environment the run needs on the cluster (repeatable).")] = None,
    db: DbOpt = None,
    wait: Annotated[bool, typer.Option("--wait", help="Follow the run until it rests; exit like `raysaga run`.")]
    = False,
    lease_ttl: LeaseOpt = 15.0,
    deadline: Annotated[float | None, typer.Option(help="Seconds until the run stops with reason 'deadline'.")] = None,
    retry_budget: Annotated[int | None, typer.Option(help="Retries the whole run may spend.")] = None,
    python: Annotated[str, typer.Option(
        "--python", help="The cluster's Python with raysaga installed (the job's entrypoint).")] = "python",
    max_driver_deaths: MaxDeathsOpt = None,
    label: LabelOpt = None,
) -> None:
    """Record a run of WORKFLOW and start it on a Ray cluster as a Ray Job; print the run id and return."""
    started = time.monotonic()
    with errors():
        cli_input.check_run_id(run_id, "--run-id")
        cli_input.positive_seconds("--lease-ttl", lease_ttl)
        from raysaga.orchestrator.options import RunOptions

        RunOptions(lease_ttl=lease_ttl)  # the job's `resume --lease-ttl` checks it so: refused here, no job sent
        cli_input.positive_seconds("--deadline", deadline)
        cli_input.int_in_range("--retry-budget", retry_budget, 0, cap=cli_input.INT32_MAX)
        deaths = cli_input.max_driver_deaths(max_driver_deaths)
        tags = cli_input.run_labels("--label", label)
        from raysaga.orchestrator import launch as lx

        url = lx.dashboard_url(address)
        shipped_env = lx.env_vars(env or [], os.environ)
        value = cli_input.parse_input(input)
        from raysaga.orchestrator.loader import load_workflow, recordable_ref

        wf = load_workflow(workflow)
        ref = recordable_ref(workflow)
        if ref is None:
            raise WorkflowLoadError(f"{workflow!r} is not importable as MODULE:WORKFLOW from this folder, so the "
                                    "cluster could not import it either: launch from the folder that holds the "
                                    "module, naming it as module:attribute (e.g. flows:wf)")
        _same_module_as_loaded(workflow, ref)
        root = lx.source_root(ref)
        if root is not None:
            from raysaga.orchestrator.launch_ignored import warning_lines

            for line in warning_lines(root, os.environ):
                say(err, f"warning: {line}")
        client = lx.connect(url)  # the cluster (and its token) first: a refusal records nothing
        from raysaga.orchestrator import cli_store

        store = cli_store.open_for_writes(db)
        where = cli_store.describe(store.url)
        cluster_env = lx.runtime_env(root, shipped_env, lx.cluster_db_url(store.url))
        record = _existing_run(store, wf, run_id, value, input is not None)
        recorded: RunRecord | None = None  # a run this launch recorded, until its job is submitted
        restore = _signals_raise()  # a closed terminal (SIGHUP), a kill (SIGTERM): said as Ctrl-C is
        try:
            if record is not None:  # before any job: a refusal submits nothing
                _same_identity(record, deadline, retry_budget, deaths, labels=tags)
            else:
                cli_input.check_input(wf, value, input is not None)
                if run_id is not None:  # a new run's: refused before any upload (one recorded with it is launched)
                    from raysaga.state.run_creation import check_new_run_id

                    check_new_run_id(run_id)
                _upload_code(client, cluster_env)  # before the run is recorded: a refused upload leaves none
                record = recorded = _record(store, wf, value, run_id, ref, lease_ttl, deadline, retry_budget,
                                            deaths, labels=tags, given=input is not None)
            job = _drive_on_cluster(client, store, record, cluster_env,
                                    lx.entrypoint(record.run_id, lease_ttl, python))
        except BaseException as exc:  # Ctrl-C, a closed terminal, a refusal: the id is all that finds the run
            # (a refused submit says so itself; an Exit is a run found at rest, said already)
            if recorded is not None and not isinstance(exc, typer.Exit) and "recorded, not started" not in str(exc):
                rid = shlex.quote(recorded.run_id)
                say(err, f"run {recorded.run_id} is recorded, not started: launch again with --run-id {rid}")
            raise
        finally:
            restore()
        if job is None:
            return
        from raysaga.orchestrator.ray_auth import cluster_uses_token

        token = cluster_uses_token(url)  # the cluster's own mode, not this shell's RAY_AUTH_MODE
        _note_launch(store, record.run_id, job.job.submission_id, url, token)
        took = time.monotonic() - started
        say(out, record.run_id)
        verb = "launched as" if job.started else "already launched:"
        say(err, f"run {record.run_id} {verb} Ray job {job.job.submission_id} ({job.job.status}) on {url} "
                 f"in {took:.1f}s")
        if lx.is_local_file_store(store.url):
            say(err, f"note: the store is the SQLite file {where}: only a cluster on this machine can reach it "
                     "(use --db postgresql://... for a cluster of several machines)")
        if not wait:
            option, hidden = _db_hint(ctx, db, where)
            say(err, f"follow it: raysaga status {shlex.quote(record.run_id)}{option}  ({hidden}the driver's log: "
                     f"{'RAY_AUTH_MODE=token ' if token else ''}ray job logs {job.job.submission_id} --address {url})")
            return
        final = _follow(store, client, record.run_id, job.job.submission_id, url)
        from raysaga.orchestrator import cli_status

        cli_status.print_status(out, store, final, store_text=where)
    if final.status != RunStatus.COMPLETED:
        raise typer.Exit(EXIT_NOT_COMPLETED)


def _db_hint(ctx: typer.Context, db: str | None, where: str) -> tuple[str, str]:
    """`` --db DB`` for the command a launch prints to follow the run, and a note on it: none when
    the store is the default or came from ``RAYSAGA_DB`` (the shell that follows has it too; shown
    with its password hidden, the line pasted failed to authenticate), a placeholder when the URL
    given holds a password (never printed), else the store as ``where`` names it."""
    from raysaga.orchestrator import cli_store
    from raysaga.orchestrator.cli_options import given_on_command_line

    if db is None or not given_on_command_line(ctx, "db"):
        return "", ""
    if cli_store.db_option(db) == "--db ...":  # (its password, in the userinfo or the query)
        return " --db <your store URL>", "the store URL is not printed: it holds a password; "
    return f" --db {shlex.quote(where)}", ""


def _same_module_as_loaded(workflow: str, ref: str) -> None:
    """A ``path.py:wf`` is loaded here with the file's own folder first on ``sys.path`` (its
    sibling modules import by their bare names); the cluster imports the recorded ``ref`` from
    the folder shipped. Launched from a folder above the file (``proj/flows.py:wf`` recorded as
    ``proj.flows:wf``), the two differ, and siblings it imports by bare names (``from helper
    import``) would not be found there: refused, naming the launch that ships the file's folder.
    A package's module importing its siblings by dotted names (``pkg/flows.py:wf`` doing ``from
    pkg.helper import``) is found there as here: launched as it is."""
    path, sep, attr = workflow.rpartition(":")
    if not sep or not path.endswith(".py"):
        return
    file = Path(path)
    if ref.partition(":")[0] == file.stem or not _siblings_imported_bare(file):
        return  # (its siblings, if any, imported by dotted names: found on the cluster as here)
    raise WorkflowLoadError(f"{workflow!r} would be imported on the cluster as {ref.partition(':')[0]!r} from "
                            f"this folder, not as {file.stem!r} from its own folder as it is here (its sibling "
                            "modules would not be found): launch takes MODULE:WORKFLOW from the folder that holds "
                            f"the module: cd {shlex.quote(str(file.parent))} && raysaga launch "
                            f"{shlex.quote(f'{file.stem}:{attr}')} ...")


def _siblings_imported_bare(file: Path) -> bool:
    """Whether loading ``file`` imported modules of its own folder by their bare names (``from
    helper import ...``, found here through the file's folder on ``sys.path``, not on the cluster).
    A package's module importing them by dotted names (``from pkg.helper import ...``) has none."""
    import sys

    folder, own = file.resolve().parent, file.stem
    if _names_a_sibling(file.resolve(), folder, own):
        return True
    for name, module in list(sys.modules.items()):
        origin = getattr(module, "__file__", None)
        if "." in name or name == own or not isinstance(origin, str):
            continue
        at = Path(origin).resolve()
        if at.name == "__init__.py":  # a package: the folder's own (its dotted name's head), or a bare sibling
            if at.parent.parent == folder:
                return True
        elif at.parent == folder:
            return True
    return False


def _names_a_sibling(file: Path, folder: Path, own: str) -> bool:
    """Whether ``file``'s source imports a module of its own folder by its bare name anywhere (in a
    function's body too: such an import is made when the step runs, on the cluster, where it fails)."""
    import ast

    try:
        tree = ast.parse(file.read_text(encoding="utf-8"))
    except (OSError, SyntaxError, UnicodeDecodeError, ValueError):
        return False  # (the loader has said what is wrong with it)
    named = {alias.name.partition(".")[0] for node in ast.walk(tree) if isinstance(node, ast.Import)
             for alias in node.names}
    named |= {node.module.partition(".")[0] for node in ast.walk(tree)
              if isinstance(node, ast.ImportFrom) and node.level == 0 and node.module}
    siblings = {p.stem for p in folder.glob("*.py") if p.stem not in (own, "__init__")}
    siblings |= {d.name for d in folder.iterdir() if d.is_dir() and (d / "__init__.py").exists()}
    return bool(named & siblings)


def _signals_raise() -> Callable[[], None]:
    """Make SIGHUP (the terminal closing) and SIGTERM raise ``SystemExit(128 + signal)`` in this
    (main) thread, so a launch cut off between recording the run and submitting its job names the
    run as a Ctrl-C does; the returned function puts the handlers back."""
    import signal
    import threading

    if threading.current_thread() is not threading.main_thread():
        return lambda: None

    def stop(signum: int, frame: object) -> None:
        raise SystemExit(128 + signum)

    names = [name for name in ("SIGHUP", "SIGTERM") if hasattr(signal, name)
             and signal.getsignal(getattr(signal, name)) is not signal.SIG_IGN]  # (nohup: the launch goes on)
    saved = {name: signal.signal(getattr(signal, name), stop) for name in names}

    def restore() -> None:
        for name, handler in saved.items():
            signal.signal(getattr(signal, name), handler)

    return restore


def _note_launch(store: SqlStore, run_id: str, sid: str, url: str, token: bool = False) -> None:
    """Record in the run that job ``sid`` drives it (``launch_marks.record``), once per job: a
    launch that found the job live notes it only if the launch that started it could not."""
    from raysaga.orchestrator import launch_marks

    try:
        run = store.get_run(run_id, lenient=True)
        latest = launch_marks.latest(store, run)
        if run.status == RunStatus.PENDING and (latest is None or latest.job != sid):
            launch_marks.record(store, run_id, sid, url, token)
    except Exception as exc:  # the job is submitted: the launch stands, only `status`'s note is missing
        say(err, f"warning: could not note the launch in run {run_id}'s events ({type(exc).__name__}: {exc}); "
                 "`raysaga status` names an earlier job of the run, or none; `status --watch` asks the cluster "
                 "about all the run's jobs")


def _existing_run(store: SqlStore, wf: Workflow, run_id: str | None, value: Any, given: bool) -> RunRecord | None:
    """The run ``--run-id`` names, if recorded, after the checks ``raysaga run`` makes on it
    (same workflow; an ``--input`` given must equal the recorded one)."""
    if run_id is None:
        return None
    from raysaga.orchestrator.runner import NO_INPUT, existing_run

    return existing_run(wf, store, run_id, value if given else NO_INPUT)


def _same_identity(record: RunRecord, deadline: float | None, retry_budget: int | None,
                   max_driver_deaths: int | None, *, labels: dict[str, str] | None = None) -> None:
    """The identity options a launch of an existing run gives must be the recorded ones (a
    ``UserError`` naming the option, the recorded and the given value), as ``raysaga run`` and a
    retried submit check them: the job's driver reads them from the row, so a differing one was
    silently ignored. Options left out (``--label`` included: none given) are not compared:
    ``launch --run-id RUN`` alone is how a run whose job died is taken over; labels given are
    compared as ``run --run-id`` compares them (``run_identity.same_labels``). ``--max-driver-deaths``
    is the run's own limit here (what launch records), compared as a submit compares it."""
    from raysaga.orchestrator.options import RunOptions
    from raysaga.orchestrator.run_identity import same_deaths, same_options

    same_options(record, RunOptions(deadline=deadline, retry_budget=retry_budget, labels=labels or {}), "launch")
    if max_driver_deaths is not None:
        same_deaths(record, RunOptions(max_driver_deaths=max_driver_deaths), "launch")


def _record(store: SqlStore, wf: Workflow, value: Any, run_id: str | None, ref: str, lease_ttl: float,
            deadline: float | None, retry_budget: int | None, max_driver_deaths: int | None, *,
            labels: dict[str, str] | None = None, given: bool = True) -> RunRecord:
    """Record the run with its options: the job's driver (``raysaga resume``) reads them from the
    row, a ``max_driver_deaths`` of its own and the labels included. ``given``: whether ``value``
    came from ``--input`` (JSON null is an input; no ``--input`` is none).

    A launch of the same ``--run-id`` that recorded it a moment ago (``RunExistsError``, between
    ``_existing_run`` and this insert) makes it an existing run: it is driven only after the checks
    an existing run gets (same workflow, same input if given: ``runner.existing_run``; the identity
    options: ``_same_identity``), else the job would drive another workflow's run, or another input
    than this launch was given, and report it launched."""
    from raysaga.orchestrator.options import RunOptions
    from raysaga.orchestrator.runner import create_run

    options = RunOptions(lease_ttl=lease_ttl, deadline=deadline, retry_budget=retry_budget, labels=labels or {},
                         max_driver_deaths=cli_input.run_limit(max_driver_deaths))
    try:
        return create_run(wf, value, store=store, run_id=run_id, options=options, workflow_ref=ref)
    except RunExistsError:  # a launch of the same --run-id recorded it a moment ago: drive that one
        assert run_id is not None
        # None: pruned since the insert failed; the lenient read then names the run not found
        raced = _existing_run(store, wf, run_id, value, given) or store.get_run(run_id, lenient=True)
        _same_identity(raced, deadline, retry_budget, max_driver_deaths, labels=labels)
        return raced


def _upload_code(client: JobSubmissionClient, cluster_env: dict[str, Any]) -> None:
    """Upload the working_dir now (Ray's SDK would at submit): ``cluster_env`` then names the
    uploaded package, and submitting is a single small request."""
    if "working_dir" in cluster_env:
        client._upload_working_dir_if_needed(cluster_env)


def _drive_on_cluster(client: JobSubmissionClient, store: SqlStore, record: RunRecord, cluster_env: dict[str, Any],
                      entry: str) -> Submitted | None:
    """The job driving ``record``: a live one found, or one started now. None (after saying
    why) when the run needs no driver: it is at rest."""
    from raysaga.orchestrator import launch as lx
    from raysaga.orchestrator.ownership import owner_is_gone
    from raysaga.orchestrator.runner import check_resumable

    if record.status in TERMINAL or record.status in PARKED:
        say(err, f"run {record.run_id} is already {record.status.value}: nothing to launch")
        say(out, record.run_id)
        if record.status != RunStatus.COMPLETED:
            raise typer.Exit(EXIT_NOT_COMPLETED)
        return None
    # refused as `resume` refuses it: the job's driver would (after its id was used up), and exit 0 said "launched"
    check_resumable(record)
    jobs = lx.jobs_of(client, record.run_id)
    live = next((j for j in jobs if j.live and j.drives(record.run_id)), None)
    if live is not None:
        return lx.Submitted(live, started=False)
    lease_live = record.lease_owner is not None and (record.lease_expires_at or 0.0) > time.time() \
        and not owner_is_gone(record.lease_owner)
    if lease_live:
        left = (record.lease_expires_at or 0.0) - time.time()
        raise LeaseHeldError(f"run {record.run_id!r} has a live driver ({record.lease_owner}; its lease ends in "
                             f"{left:.0f}s unless renewed): not launched again; if that driver is gone, launch "
                             "again once its lease has expired")
    _upload_code(client, cluster_env)  # a no-op when already uploaded
    metadata = {"raysaga_run_id": record.run_id, "raysaga_workflow": record.workflow_name}
    return lx.submit(client, record.run_id, len(jobs) + 1, env=cluster_env, entry=entry, metadata=metadata)


def _follow(store: SqlStore, client: JobSubmissionClient, run_id: str, sid: str, url: str) -> RunRecord:
    """Poll the run (the store) and its jobs (the cluster) until the run rests; a job that ended
    first is an error naming how the run continues. The Job API is asked on a daemon thread
    (``cli_watch.JobLook``): Ray's SDK sets no timeout, and a head that stopped answering hung
    ``--wait`` for ever, the run completed in the store; one failed request (a dashboard
    restarting) ended ``--wait`` of a running job. Out of reach, the run is followed in the store."""
    from raysaga.orchestrator import launch_marks
    from raysaga.orchestrator.cli_watch import JobLook

    look = JobLook()
    look.client, look.address = client, url
    seen: tuple[str, str] | None = None
    while True:
        run = store.get_run(run_id, lenient=True)
        if run.status in AT_REST:
            return run
        ended = look.ended(run_id, sid, url)
        state = (run.status.value, look.state if ended is not None else "not known (the Job API does not answer)")
        if state != seen:
            say(err, f"run {run_id}: {state[0]}; Ray job {sid}: {state[1]}")
            seen = state
        run = store.get_run(run_id, lenient=True)  # it may have come to rest as the job ended
        if run.status in AT_REST:
            return run
        if run.status == RunStatus.PENDING:  # its driver never started: no worker claims a launched run
            why = launch_marks.watch_stop(run, launch_marks.latest(store, run), ended, time.time(), look.state,
                                          look.unknown_since)
            if why is not None:
                _say_log_tail(look.client, sid)
                raise UserError(why)
        elif ended:
            _say_log_tail(look.client, sid)
            raise UserError(f"Ray job {sid} ended ({look.state}) with run {run_id} still {run.status.value}: once "
                            "its lease expires, a `raysaga worker`, `raysaga resume` or another `raysaga launch "
                            f"--run-id {shlex.quote(run_id)}` takes it over")
        time.sleep(FOLLOW_EVERY)  # polling the store and the cluster for another process's progress


def _say_log_tail(client: JobSubmissionClient | None, sid: str) -> None:
    """The job's last log lines, asked on a daemon thread for at most ``JOB_ASK_DEADLINE`` seconds
    (a Job API that hangs must not hang the command's last word)."""
    import threading

    from raysaga.orchestrator import launch as lx
    from raysaga.orchestrator.cli_watch import JOB_ASK_DEADLINE

    if client is None:
        return
    lines: list[str] = []
    asking = threading.Thread(target=lambda: lines.extend(lx.job_log_tail(client, sid)),
                              name="raysaga-launch-log", daemon=True)
    asking.start()
    asking.join(JOB_ASK_DEADLINE)
    for line in list(lines):
        say(err, f"  {line}")
