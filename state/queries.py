"""Read-only queries for the CLI's bounded views: the paging key of a run, a run's nodes
streamed step by step, per-step counts, and the per-attempt failures in the event log.

Each reads only the columns it shows (never a run's input or output, never a node's output), so
``raysaga status --json`` on a 50,000-node run stays small in memory (run summaries for
``raysaga list`` are ``Store.list_runs``). Everything here is a plain SELECT on the store's read
engine.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

from sqlalchemy import Connection, Text, cast, or_, select

from raysaga.errors import RunNotFoundError
from raysaga.state.dashboard_reads import fanout_sizes_in
from raysaga.state.decoding import reading as _reading
from raysaga.state.fork_rows import run_key_of
from raysaga.state.item_pages import counts as item_counts
from raysaga.state.item_pages import page as item_page
from raysaga.state.item_pages import rows_at
from raysaga.state.models import EventRecord, NodeStatus
from raysaga.state.schema import events, node_rows, nodes, runs
from raysaga.state.sql_store import SqlStore

#: Rows fetched per round trip when streaming nodes.
NODE_CHUNK = 2000
#: Event kinds that record one failed attempt of a node.
FAILURE_KINDS = ("retry_scheduled", "node_failed")
_PENDING = NodeStatus.PENDING.value


def run_cursor(store: SqlStore, run_id: str) -> tuple[float, str]:
    """The paging key (created_at, run_id) of a run; ``RunNotFoundError`` if absent."""
    with store.reader.connect() as conn:
        at = conn.execute(select(runs.c.created_at).where(runs.c.run_id == run_id)).scalar_one_or_none()
    if at is None:
        raise RunNotFoundError(run_id)
    return float(at), run_id


@dataclass(frozen=True)
class StepInfo:
    """One step of a run as its node rows record it, and a fan-out's items that have none yet."""

    node_id: str
    first_started: float | None
    rows: int
    counts: dict[str, int]
    """By status: the rows, and the items with no row (``no_row``) as ``pending``."""
    no_row: int = 0
    """Items of a fan-out the run expanded that have no row yet (``pending``, as a node with no row
    is): an effect fan-out's items its window holds back (``Executor.effect_window``: no row, no
    ledger key until issued), plain items issued and not recorded yet. Counted from what is
    stored: the fan-out's size (its ``fanout_expanded`` event) less its item rows; without it a
    40-item effect fan-out on 2 CPUs read "8 running", and its 32 held items were nowhere."""


def snapshot(conn: Connection) -> Connection:
    """``conn`` reading one snapshot for the whole of its transaction: SQLite's read transaction
    already does (``state/engine.py``); PostgreSQL's READ COMMITTED gives each statement its own."""
    return conn.execution_options(isolation_level="REPEATABLE READ") if conn.dialect.name == "postgresql" else conn


def steps(store: SqlStore, run_id: str) -> list[StepInfo]:
    """Every step that has node rows, and every fan-out expanded (``no_row``), in the order the run
    started them (a step starts only once what it depends on has completed, so this is a
    topological order of what ran); steps never started (skipped, pending) last, by name. One
    GROUP BY of the rows, the item chunks counted, the fan-outs' sizes read from their events, all
    in one snapshot (``snapshot``): a fan-out's own row committed between two reads made a phantom
    pending item on PostgreSQL."""
    with _reading(run_id, "nodes"), store.reader.connect() as conn:
        conn = snapshot(conn)
        sizes = fanout_sizes_in(conn, run_id)
        found = item_counts(conn, run_id, None, items_only=False)  # item chunks counted from their JSON
        parents = set(conn.execute(select(nodes.c.node_id).where(  # a fan-out's own row: not one of its items
            nodes.c.run_key == run_key_of(run_id), nodes.c.fan_index == -1,
            nodes.c.node_id.in_(sorted(sizes)))).scalars()) if sizes else set()
    by_step: dict[str, tuple[float | None, dict[str, int]]] = {}
    for node_id, by_status in found.items():
        firsts = [first for _, first in by_status.values() if first is not None]
        by_step[node_id] = (min(firsts) if firsts else None,
                            {status: count for status, (count, _) in by_status.items() if count})
    infos = []
    for step in by_step.keys() | sizes.keys():
        first, counts = by_step.get(step, (None, {}))
        rows = sum(counts.values())
        missing = max(sizes.get(step, 0) - (rows - (step in parents)), 0)
        if missing:
            counts = {**counts, _PENDING: counts.get(_PENDING, 0) + missing}
        infos.append(StepInfo(node_id=step, first_started=first, rows=rows, counts=counts, no_row=missing))
    infos.sort(key=lambda s: (s.first_started is None, s.first_started or 0.0, s.node_id))
    return infos


_NODE_COLUMNS = tuple(c for c in node_rows.c if c.name not in ("run_id", "output"))  # finished_at derived
_NODE_NAMES = tuple(c.name for c in _NODE_COLUMNS)


def iter_nodes(store: SqlStore, run_id: str, order: list[str], *, after: tuple[str, int] | None = None,
               limit: int | None = None, chunk: int = NODE_CHUNK) -> Iterator[dict[str, Any]]:
    """The run's node rows (no outputs), step by step in ``order`` and by fan-out index within a
    step, from just after ``after`` = (node_id, fan_index), at most ``limit``. Read in chunks on
    the primary key: memory stays bounded by ``chunk`` rows whatever the run's size."""
    start = 0
    last_index = -2
    if after is not None:
        if after[0] not in order:
            return
        start, last_index = order.index(after[0]), after[1]
    left = limit
    for position in range(start, len(order)):
        node_id = order[position]
        index = last_index if position == start else -2
        while left is None or left > 0:
            size = chunk if left is None else min(chunk, left)
            with _reading(run_id, "nodes"), store.reader.connect() as conn:
                # decoded here, before any row of the chunk is shown; rows and item chunks by their keys
                rows = item_page(conn, run_id, node_id, index, size, _NODE_NAMES)
            yield from rows
            if left is not None:
                left -= len(rows)
            if len(rows) < size:
                break
            index = rows[-1]["fan_index"]
        if left is not None and left <= 0:
            return


def attempt_failures(store: SqlStore, run_id: str, node_id: str | None = None,
                     fan_index: int | None = None) -> list[EventRecord]:
    """Every failed attempt recorded in the event log (retries scheduled and final failures), oldest
    first; for one node when ``node_id`` is given."""
    query = select(events).where(events.c.run_id == run_id, events.c.kind.in_(FAILURE_KINDS))
    if node_id is not None:
        query = query.where(events.c.node_id == node_id)
        if fan_index is not None and fan_index >= 0:
            query = query.where(events.c.fan_index == fan_index)
        elif fan_index is not None:
            query = query.where(or_(events.c.fan_index.is_(None), events.c.fan_index < 0))
    with _reading(run_id, "events"):
        with store.reader.connect() as conn:
            rows = conn.execute(query.order_by(events.c.seq)).all()
        return [EventRecord.model_validate(r._asdict()) for r in rows]


def labels_of(store: SqlStore, run_ids: list[str]) -> dict[str, dict[str, str]]:
    """The labels of the runs ``run_ids`` (a page of ``list``; summaries never read them), by run
    id, in one query. A run without labels is left out, and so is one whose labels cannot be read
    (read as text here, so one damaged row does not fail the page, as ``list`` lists a corrupt row)."""
    if not run_ids:
        return {}
    query = select(runs.c.run_id, cast(runs.c.labels, Text)).where(runs.c.run_id.in_(run_ids),
                                                                   runs.c.labels.is_not(None))
    with store.reader.connect() as conn:
        rows = conn.execute(query).all()
    found: dict[str, dict[str, str]] = {}
    for run_id, text in rows:
        try:
            value = json.loads(text)
        except (TypeError, ValueError):
            continue
        if isinstance(value, dict) and all(isinstance(k, str) and isinstance(v, str) for k, v in value.items()):
            found[run_id] = value
    return found


def node_error(store: SqlStore, run_id: str, node_id: str, fan_index: int) -> tuple[str, Any] | None:
    """(status, error) of one node row, or None when the node has no row: read by key (its row,
    else the chunk whose span holds the index: ``item_pages.rows_at``), not through the view,
    which expanded every item of the step to find one."""
    with _reading(run_id, "nodes"), store.reader.connect() as conn:
        found = rows_at(conn, run_id, [(node_id, fan_index)], ("status", "error"))
    return None if not found else (str(found[0]["status"]), found[0]["error"])


def unfinished_items(store: SqlStore, run_id: str, node_id: str, limit: int = 20) -> list[dict[str, Any]]:
    """Up to ``limit`` fan-out items of a step that did not complete, by index. Through the view, and
    bounded: its chunk part shows only 'completed' items, so the status filter is false there
    before any chunk is read (PostgreSQL drops that part from the plan, or with a generic plan
    gives it a one-time filter never passed; SQLite tests the constant once and jumps over its
    loops): only the step's rows are read, as ``failed_nodes`` reads only the run's."""
    query = (select(*_NODE_COLUMNS)
             .where(node_rows.c.run_id == run_id, node_rows.c.node_id == node_id, node_rows.c.fan_index >= 0,
                    node_rows.c.status != NodeStatus.COMPLETED.value)
             .order_by(node_rows.c.fan_index).limit(limit))
    with _reading(run_id, "nodes"), store.reader.connect() as conn:
        return [r._asdict() for r in conn.execute(query).all()]


def failed_nodes(store: SqlStore, run_id: str, limit: int = 50) -> list[dict[str, Any]]:
    """Up to ``limit`` failed nodes (status failed) with their errors: through the view, bounded by
    the run's rows (no chunk is read: ``unfinished_items`` says why)."""
    query = (select(node_rows.c.node_id, node_rows.c.fan_index, node_rows.c.attempt, node_rows.c.error)
             .where(node_rows.c.run_id == run_id, node_rows.c.status == NodeStatus.FAILED.value)
             .order_by(node_rows.c.node_id, node_rows.c.fan_index).limit(limit))
    with _reading(run_id, "nodes"), store.reader.connect() as conn:
        return [r._asdict() for r in conn.execute(query).all()]


__all__ = ["FAILURE_KINDS", "StepInfo", "attempt_failures", "failed_nodes", "iter_nodes", "labels_of", "node_error",
           "run_cursor", "steps", "unfinished_items"]
