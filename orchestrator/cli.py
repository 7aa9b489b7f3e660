"""The ``raysaga`` command line (typer).

Exit codes: 0 the run completed (or the command succeeded); 1 the run ended failed, cancelled
or needing an operator; 2 a usage error (bad module path, unknown workflow or run, malformed
input); 3 another live driver owns the run; 4 this driver lost its lease mid-run.
"""

from __future__ import annotations

import json
import sys
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Annotated, Any

import typer
from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn
from rich.table import Table
from rich.text import Text

from raysaga.errors import LeaseHeldError, LeaseLostError, RaySagaError, UserError
from raysaga.orchestrator import runner
from raysaga.orchestrator.loader import load_workflow
from raysaga.orchestrator.options import RunOptions
from raysaga.orchestrator.render import dot, mermaid, status_json
from raysaga.state import RunRecord, RunStatus, SqlStore, open_store
from raysaga.state.engine import default_url, make_engine, redact
from raysaga.state.migrate import upgrade

app = typer.Typer(add_completion=False, no_args_is_help=True,
                  help="raysaga: crash-proof multi-agent workflows on Ray.")
db_app = typer.Typer(no_args_is_help=True, help="Database maintenance.")
app.add_typer(db_app, name="db")
out = Console(soft_wrap=True)
err = Console(stderr=True, soft_wrap=True)

DbOpt = Annotated[str | None, typer.Option("--db", envvar="RAYSAGA_DB",
                                           help="Store URL (default: sqlite file ./.raysaga/raysaga.db).")]
ExecutorOpt = Annotated[str, typer.Option("--executor", help="ray (default) or inline (in this process).")]
AddressOpt = Annotated[str | None, typer.Option("--address", envvar="RAY_ADDRESS",
                                                help="Ray cluster to join (default: a local Ray started on demand).")]
LeaseOpt = Annotated[float, typer.Option("--lease-ttl", help="Seconds a dead driver's lease blocks a takeover.")]


@contextmanager
def _errors() -> Iterator[None]:
    """One-line messages and the documented exit codes instead of tracebacks."""
    try:
        yield
    except LeaseHeldError as exc:
        err.print(f"[yellow]busy:[/] {exc}")
        raise typer.Exit(3) from None
    except LeaseLostError as exc:
        err.print(f"[red]lease lost:[/] {exc}")
        raise typer.Exit(4) from None
    except RaySagaError as exc:
        err.print(f"[red]error:[/] {exc}", highlight=False)
        raise typer.Exit(2) from None


def _parse_input(raw: str | None) -> Any:
    if raw is None:
        return None
    source = "--input"
    if raw.startswith("@"):
        path = Path(raw[1:])
        if not path.is_file():
            raise UserError(f"--input file {str(path)!r} does not exist")
        source, raw = f"--input file {str(path)!r}", path.read_text(encoding="utf-8")
    try:
        return json.loads(raw, parse_constant=_reject_constant)
    except (json.JSONDecodeError, ValueError) as exc:
        raise UserError(f"{source} is not valid JSON: {exc}") from None


def _reject_constant(name: str) -> Any:
    raise ValueError(f"{name} is not JSON")


def _options(lease_ttl: float, deadline: float | None = None, retry_budget: int | None = None) -> RunOptions:
    return RunOptions(lease_ttl=lease_ttl, deadline=deadline, retry_budget=retry_budget)


def _drive(action: Callable[[Callable[[Any], None]], RunRecord], total_hint: int, quiet: bool) -> RunRecord:
    if quiet or not err.is_terminal:
        return action(lambda _p: None)
    with Progress(TextColumn("[bold]{task.description}"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(),
                  console=err, transient=True) as progress:
        task = progress.add_task("steps", total=total_hint)

        def update(p: Any) -> None:
            progress.update(task, completed=p.done, total=p.total or total_hint)

        return action(update)


def _summary(store: SqlStore, run: RunRecord, as_json: bool) -> None:
    data = status_json(store, run)
    if as_json:
        out.print_json(json.dumps(data, default=str))
        return
    colour = {"completed": "green", "failed": "red", "cancelled": "yellow", "compensated": "yellow",
              "compensation_failed": "red"}.get(run.status.value, "cyan")
    line = Text.assemble("run ", (run.run_id, "bold"), f" ({run.workflow_name} v{run.workflow_version}): ",
                         (run.status.value, colour), f" — {run.status_reason}" if run.status_reason else "")
    out.print(line, highlight=False)
    table = Table(show_header=True, header_style="bold", box=None, pad_edge=False)
    for col in ("node", "status", "attempts", "seconds", "note"):
        table.add_column(col)
    nodes = data["nodes"]
    shown = [n for n in nodes if n["index"] is None] + [n for n in nodes if n["index"] is not None
                                                        and n["status"] != "completed"][:20]
    for n in shown:
        note = ""
        if n["error"]:
            note = str(n["error"].get("message") or n["error"].get("reason") or "")[:70]
        secs = f"{n['duration']:.3f}" if n["duration"] is not None else ""
        table.add_row(Text(n["node"]), n["status"], str(n["attempts"]), secs, Text(note))
    out.print(table)
    items = [n for n in nodes if n["index"] is not None]
    if items:
        done = sum(1 for n in items if n["status"] == "completed")
        out.print(f"fan-out items: {done}/{len(items)} completed")
    if run.output is not None:
        text = json.dumps(run.output)
        out.print("output: " + (text if len(text) < 600 else text[:600] + " …"), highlight=False, markup=False)
    if run.error:
        out.print(f"error: {run.error}", highlight=False, markup=False)


def _exit_for(run: RunRecord, success: RunStatus = RunStatus.COMPLETED) -> None:
    if run.status != success:
        raise typer.Exit(1)


@app.command()
def run(
    workflow: Annotated[str, typer.Argument(help="MODULE:WORKFLOW, e.g. examples.order.workflow:wf")],
    input: Annotated[str | None, typer.Option("--input", "-i", help="Run input: JSON text or @file.json")] = None,
    run_id: Annotated[str | None, typer.Option("--run-id", help="Id for the run; an existing id resumes it.")] = None,
    db: DbOpt = None,
    executor: ExecutorOpt = "ray",
    address: AddressOpt = None,
    deadline: Annotated[float | None, typer.Option(help="Seconds until the run stops with reason 'deadline'.")] = None,
    retry_budget: Annotated[int | None, typer.Option(help="Retries the whole run may spend.")] = None,
    lease_ttl: LeaseOpt = 15.0,
    as_json: Annotated[bool, typer.Option("--json", help="Print the final status as JSON.")] = False,
    quiet: Annotated[bool, typer.Option("--quiet", "-q", help="No progress bar.")] = False,
) -> None:
    """Start a run of WORKFLOW and drive it to the end (Ctrl-C or a kill: `raysaga resume` continues it)."""
    with _errors():
        value = _parse_input(input)
        wf = load_workflow(workflow)
        store = open_store(db)
        result = _drive(lambda hook: runner.run(
            wf, value, store=store, run_id=run_id, executor=executor, address=address,
            options=_options(lease_ttl, deadline, retry_budget), on_progress=hook, workflow_ref=workflow,
        ), len(wf.steps), quiet or as_json)
        _summary(store, result, as_json)
    _exit_for(result)


def _workflow_for(store: SqlStore, run_id: str, ref: str | None) -> Any:
    run = store.get_run(run_id)
    ref = ref or run.workflow_ref
    if not ref:
        raise UserError(f"run {run_id!r} does not record where its workflow lives: pass --workflow MODULE:WORKFLOW")
    return load_workflow(ref)


@app.command()
def resume(
    run_id: Annotated[str, typer.Argument(help="The run to continue.")],
    workflow: Annotated[str | None, typer.Option("--workflow", help="MODULE:WORKFLOW (default: as recorded)")] = None,
    db: DbOpt = None,
    executor: ExecutorOpt = "ray",
    address: AddressOpt = None,
    lease_ttl: LeaseOpt = 15.0,
    as_json: Annotated[bool, typer.Option("--json")] = False,
    quiet: Annotated[bool, typer.Option("--quiet", "-q")] = False,
) -> None:
    """Continue a run from the store: completed nodes are not re-run, committed effects not repeated."""
    with _errors():
        store = open_store(db)
        wf = _workflow_for(store, run_id, workflow)
        result = _drive(lambda hook: runner.resume(wf, run_id, store=store, executor=executor, address=address,
                                                   options=_options(lease_ttl), on_progress=hook),
                        len(wf.steps), quiet or as_json)
        _summary(store, result, as_json)
    _exit_for(result)


@app.command()
def retry(
    run_id: Annotated[str, typer.Argument(help="A failed run to retry with the same idempotency keys.")],
    workflow: Annotated[str | None, typer.Option("--workflow", help="MODULE:WORKFLOW (default: as recorded)")] = None,
    db: DbOpt = None,
    executor: ExecutorOpt = "ray",
    address: AddressOpt = None,
    lease_ttl: LeaseOpt = 15.0,
    compensations: Annotated[bool, typer.Option(
        "--compensations", help="Retry the failed compensations of a compensation_failed run.")] = False,
    as_json: Annotated[bool, typer.Option("--json")] = False,
    quiet: Annotated[bool, typer.Option("--quiet", "-q")] = False,
) -> None:
    """Operator retry of a parked run (same idempotency keys): a failed run's failed and skipped
    nodes run again; with --compensations, a compensation_failed run's rollback is completed."""
    with _errors():
        store = open_store(db)
        wf = _workflow_for(store, run_id, workflow)
        result = _drive(lambda hook: runner.retry(wf, run_id, store=store, executor=executor, address=address,
                                                  options=_options(lease_ttl), on_progress=hook,
                                                  compensations=compensations),
                        len(wf.steps), quiet or as_json)
        _summary(store, result, as_json)
    _exit_for(result, RunStatus.COMPENSATED if compensations else RunStatus.COMPLETED)


@app.command()
def cancel(
    run_id: Annotated[str, typer.Argument()],
    reason: Annotated[str, typer.Option(help="Recorded with the cancellation.")] = "cancelled by operator",
    compensate: Annotated[bool, typer.Option(
        "--compensate", help="Also roll back committed effects (compensations in reverse).")] = False,
    workflow: Annotated[str | None, typer.Option("--workflow", help="MODULE:WORKFLOW (default: as recorded)")] = None,
    db: DbOpt = None,
    executor: ExecutorOpt = "ray",
    address: AddressOpt = None,
) -> None:
    """Stop a run: no more dispatching, in-flight tasks cancelled. Committed effects stand,
    unless --compensate rolls them back."""
    with _errors():
        store = open_store(db)
        wf = _workflow_for(store, run_id, workflow) if compensate else None
        result = runner.cancel(run_id, store=store, reason=reason, compensate=compensate, workflow=wf,
                               executor=executor, address=address)
        out.print(f"run {run_id}: {result.status.value}" + (f" — {result.status_reason}"
                                                             if result.status_reason else ""), highlight=False)
    if result.status not in (RunStatus.CANCELLED, RunStatus.COMPENSATED):
        raise typer.Exit(1)


@app.command()
def status(
    run_id: Annotated[str, typer.Argument()],
    db: DbOpt = None,
    as_json: Annotated[bool, typer.Option("--json", help="Every node's status, attempts and timings as JSON.")] = False,
) -> None:
    """Where a run stands."""
    with _errors():
        store = open_store(db)
        _summary(store, store.get_run(run_id), as_json)


@app.command("list")
def list_runs(
    status: Annotated[str | None, typer.Option("--status", help="Only runs in this state.")] = None,
    limit: Annotated[int, typer.Option(help="At most this many, newest first.")] = 50,
    db: DbOpt = None,
    as_json: Annotated[bool, typer.Option("--json")] = False,
) -> None:
    """The runs in the store, newest first."""
    with _errors():
        wanted = None
        if status is not None:
            try:
                wanted = RunStatus(status)
            except ValueError:
                raise UserError(f"--status {status!r} is not a run state; use one of "
                                f"{', '.join(s.value for s in RunStatus)}") from None
        runs = open_store(db).list_runs(wanted, limit)
        if as_json:
            out.print_json(json.dumps([{"run_id": r.run_id, "workflow": r.workflow_name, "status": r.status.value,
                                        "created_at": r.created_at} for r in runs]))
            return
        table = Table("run", "workflow", "status", "reason", box=None)
        for r in runs:
            table.add_row(r.run_id, f"{r.workflow_name} v{r.workflow_version}", r.status.value, r.status_reason or "")
        out.print(table)


@app.command()
def events(
    run_id: Annotated[str, typer.Argument()],
    db: DbOpt = None,
    after: Annotated[int, typer.Option(help="Only events after this sequence number.")] = 0,
) -> None:
    """The run's append-only event log, one JSON object per line."""
    with _errors():
        store = open_store(db)
        store.get_run(run_id)
        for e in store.events(run_id, after_seq=after):
            sys.stdout.write(e.model_dump_json() + "\n")


@app.command()
def graph(
    workflow: Annotated[str, typer.Argument(help="MODULE:WORKFLOW")],
    format: Annotated[str, typer.Option("--format", "-f", help="mermaid or dot")] = "mermaid",
) -> None:
    """Print the workflow's DAG."""
    with _errors():
        wf = load_workflow(workflow)
        if format == "mermaid":
            sys.stdout.write(mermaid(wf))
        elif format == "dot":
            sys.stdout.write(dot(wf))
        else:
            raise UserError(f"--format {format!r} is not known: use mermaid or dot")


@db_app.command("upgrade")
def db_upgrade(db: DbOpt = None) -> None:
    """Create or migrate the store's schema (also done automatically on first use)."""
    with _errors():
        url = db or default_url()
        version = upgrade(make_engine(url))
        out.print(f"{redact(url)}: schema version {version}", highlight=False)


def main() -> None:
    app()


if __name__ == "__main__":
    main()
