"""Store maintenance commands: ``raysaga prune`` and ``raysaga db upgrade`` (registered on the
app in ``cli.py``). Each imports the store only when it runs."""

from __future__ import annotations

from typing import Annotated

import typer

from raysaga.errors import UserError
from raysaga.orchestrator import cli_input
from raysaga.orchestrator.cli_errors import errors, out, say
from raysaga.orchestrator.cli_options import DbOpt
from raysaga.state.models import PRUNABLE, RunStatus

_PRUNABLE = sorted(s.value for s in PRUNABLE)


def prune(
    older_than: Annotated[str, typer.Option(
        "--older-than", help="Delete runs not updated for this long: 30d, 12h, 90m, 3600s.")],
    status: Annotated[str | None, typer.Option(
        "--status", help=f"States to delete, comma-separated (default: all of {','.join(_PRUNABLE)}).")] = None,
    dry_run: Annotated[bool, typer.Option("--dry-run", help="Count what would go; delete nothing.")] = False,
    batch_size: Annotated[int, typer.Option(help="Runs deleted per transaction (1 to 10000).")] = 500,
    db: DbOpt = None,
) -> None:
    """Delete finished runs (and their nodes, events, effects and unshared blobs) older than
    --older-than. Running, waiting and compensating runs are never touched."""
    with errors():
        seconds = cli_input.parse_duration("--older-than", older_than)
        cli_input.int_in_range("--batch-size", batch_size, 1, 10_000)
        statuses: list[RunStatus] | None = None
        if status is not None:
            statuses = []
            for name in (s.strip() for s in status.split(",") if s.strip()):
                try:
                    state = RunStatus(name)
                except ValueError:
                    raise UserError(f"--status {name!r} is not a run state; prunable: {', '.join(_PRUNABLE)}") \
                        from None
                if state not in PRUNABLE:
                    raise UserError(f"--status {name!r} is not a state at rest: only {', '.join(_PRUNABLE)} "
                                    "runs can be pruned (cancel a live run first)")
                statuses.append(state)
            if not statuses:
                raise UserError(f"--status names no state; prunable: {', '.join(_PRUNABLE)}")
        from raysaga.orchestrator import cli_status, cli_store
        from raysaga.state.pruning import prune as prune_runs

        store = cli_store.open_for_writes(db, must_exist=True)
        report = prune_runs(store, seconds, statuses=statuses, batch_size=batch_size, dry_run=dry_run)
        verb = "would delete" if dry_run else "deleted"
        say(out, f"{verb} {report.runs} run(s) in {', '.join(report.statuses)} not updated since "
                 f"{cli_status.utc(report.cutoff)} ({older_than} ago) from {cli_store.describe(store.url)}")
        say(out, f"  with {report.nodes} nodes, {report.events} events, {report.effects} effects, "
                 f"{report.signals} signals, {report.memory} memory keys, {report.blobs} blobs "
                 f"({report.blob_bytes} bytes)")
        if report.kept:
            say(out, f"  kept {len(report.kept)} run(s) that runs still in the store need: runs a fork that stays "
                     "was made from (it reads their ledger to roll back), forks whose rollback undid nodes of runs "
                     "still in the store and the forks between (pruned, a later fork would inherit an effect they "
                     "gave back): "
                     f"{', '.join(report.kept[:20])}{' ...' if len(report.kept) > 20 else ''}")


def db_upgrade(db: DbOpt = None, force: Annotated[bool, typer.Option(
        "--force", help="Migrate even while runs are being driven by an older raysaga (their steps in flight "
                        "are lost and run again on resume)")] = False) -> None:
    """Create or migrate the store's schema (also done automatically on first use; refused while
    an older raysaga drives runs on it, unless --force)."""
    with errors():
        from raysaga.orchestrator import cli_store
        from raysaga.state.engine import make_engine
        from raysaga.state.migrate import upgrade

        url = cli_store.store_url(db)
        version = upgrade(make_engine(url), force=force)
        say(out, f"{cli_store.describe(url)}: schema version {version}")
