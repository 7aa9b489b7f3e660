"""``raysaga workers``: the worker fleet as its registry (``raysaga_workers``) says it is.

Each live worker on one line: host, pid, how long it has run, its last beat, busy slots of its
total, its queues and the workflows it serves (version and short definition hash). ``--all`` adds
those that stopped or went silent (no beat within ``LIVE_BEATS`` of their intervals: killed,
frozen, cut off from the store) in the last 24 hours, saying which. ``--json``: a list of objects,
each a ``WorkerRecord`` with its ``state`` (live, stopped, silent) and ``live_until``.
"""

from __future__ import annotations

import json
import sys
import time
from typing import TYPE_CHECKING, Annotated, Any

import typer

from raysaga.orchestrator.cli_errors import errors, out, say
from raysaga.orchestrator.cli_options import DbOpt

if TYPE_CHECKING:  # (``raysaga --help`` loads no SQLAlchemy: the store's modules are imported when used)
    from raysaga.state.worker_rows import WorkerRecord


def _queues(w: WorkerRecord) -> str:
    from raysaga.state.worker_rows import ANY_QUEUE

    return "any" if ANY_QUEUE in w.queues else ",".join(w.queues)


def _served(w: WorkerRecord) -> str:
    from raysaga.orchestrator.fleet_view import short

    return ", ".join(f"{wf.name} v{wf.version} ({short(wf.definition_hash)})" for wf in w.workflows)


def _ago(at: float, now: float) -> str:
    from raysaga.orchestrator.status_text import seconds

    return f"{seconds(max(0.0, now - at))} ago"


def rows(found: list[WorkerRecord], now: float, *, with_state: bool) -> list[str]:
    """The table's lines (a header first); printable text only (host names are read from the store)."""
    from raysaga.orchestrator.cli_status import columns
    from raysaga.orchestrator.status_text import flat, seconds

    head = ["HOST", "PID", *(["STATE"] if with_state else []), "UP", "LAST BEAT", "SLOTS", "QUEUES", "WORKFLOWS"]
    table = [head]
    for w in found:
        state: str = w.state(now)
        if state == "stopped" and w.stopped_at is not None:
            state = f"stopped {_ago(w.stopped_at, now)}"
        until = w.stopped_at or (w.beat_at if w.state(now) == "silent" else now)  # (a silent one: its last beat)
        table.append([flat(w.host), str(w.pid), *([state] if with_state else []),
                      seconds(max(0.0, until - w.started_at)), _ago(w.beat_at, now),
                      f"{w.busy}/{w.slots} busy", flat(_queues(w)), flat(_served(w))])
    return columns(table)


def _json(w: WorkerRecord, now: float) -> dict[str, Any]:
    return {**w.model_dump(), "state": w.state(now), "live_until": w.live_until()}


def workers(
    db: DbOpt = None,
    as_json: Annotated[bool, typer.Option("--json", help="Print the workers as a JSON list.")] = False,
    all_: Annotated[bool, typer.Option(
        "--all", help="Also the workers that stopped or went silent (no beat) in the last 24 hours.")] = False,
) -> None:
    """The live workers: host, pid, age, last beat, busy slots, queues, the workflows they serve."""
    with errors():
        from raysaga.orchestrator import cli_store
        from raysaga.orchestrator.client import Client

        client = Client(cli_store.open_for_reads(db))
        try:
            found = client.workers(include_gone=all_)
        finally:
            client.close()
        now = time.time()
        if as_json:
            sys.stdout.write(json.dumps([_json(w, now) for w in found], indent=2) + "\n")
            return
        if not found:
            say(out, "no worker beat or stopped in the last 24 hours" if all_ else
                "no live worker (`raysaga workers --all` shows those stopped or silent in the last 24 hours)")
            return
        for line in rows(found, now, with_state=all_):
            say(out, line)
