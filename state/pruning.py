"""Retention: delete finished runs older than a cutoff, with everything that belongs to them.

Without it nothing is ever deleted and the store grows with every run. Only runs at rest are
touched: terminal (completed, compensated, cancelled) or parked for an operator (failed,
compensation_failed), and not updated for ``older_than`` seconds. A running, waiting or
compensating run is never touched, whatever its age.

Deletion goes in batches of ``batch_size`` runs and at most ``ROWS_PER_BATCH`` node and event
rows (whole runs, with the prunable runs forks link them to), each one short transaction, with a
pause between two on SQLite (whose lock is not fair), so a prune of a large store never holds the
write lock for long. A blob is deleted only when no remaining run
or node row references its digest; that is decided in the DELETE statement itself (NOT EXISTS),
on PostgreSQL under a lock that makes writers inserting blobs wait, so a concurrent commit that
re-uses an existing blob either commits first (and keeps it) or re-inserts it after.

A fork that undid nodes another run executed (its rollback refunded the parent's charge) is
kept while a run that may inherit those nodes is: the run that executed them, or any run of its
fork tree. Its compensation rows are what tells a later fork that the charge was given back
(``fork.undone_elsewhere``), and its ledger rows hold the refund's key; deleted, a fork would
build on the refunded charge. The report names the runs kept so (``kept``).
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable, Sequence
from typing import Any, Protocol

from pydantic import BaseModel
from sqlalchemy import ColumnElement, Connection, Engine, Table, and_, delete, exists, func, not_, or_, select, union

from raysaga.errors import UserError
from raysaga.state.fork_rows import undos
from raysaga.state.models import PRUNABLE, RunStatus
from raysaga.state.schema import blobs, effects, events, item_chunks, memory, nodes, runs, signals


class PrunableStore(Protocol):
    """What pruning needs of a ``raysaga.state.sql_store.SqlStore`` (which calls it: no cycle)."""

    @property
    def engine(self) -> Engine: ...

    @property
    def reader(self) -> Engine: ...

#: At most this many node and event rows are deleted in one transaction (whole runs: at least one
#: run a batch): 500 runs of 10,000-item fan-outs are 5 M rows, a write lock held for ~13 s on
#: SQLite, past leases' renewals (1 M rows: a lease claim waited 2.6 s on a 2-core VM).
ROWS_PER_BATCH = 100_000
#: The pause between two batches on SQLite, longer than its busy handler's longest sleep (100 ms).
YIELD_SECONDS = 0.15

_CHILDREN = (("nodes", nodes), ("events", events), ("effects", effects), ("signals", signals), ("memory", memory))
#: How many items a run's ``raysaga_item_chunks`` rows hold, by run key: node rows, as the report
#: and the batch cap count them (a chunk of 64 items is 64 items' bytes to delete, not one row's).
_CHUNK_ITEMS = select(item_chunks.c.run_key, func.sum(item_chunks.c.item_count)).group_by(item_chunks.c.run_key)
#: A ``raysaga_nodes`` row for an item a chunk of its run holds (a row written after the chunk):
#: the view shows the row, not the chunk's entry, so the item is counted once, as its row. (A
#: range on the rows' key, bounded both ways, the last index as ``first_index + (item_count - 1)``:
#: no overflow at 2**31 - 1.)
_ROW_OVER_CHUNK = and_(nodes.c.run_key == item_chunks.c.run_key, nodes.c.node_id == item_chunks.c.node_id,
                       nodes.c.fan_index.between(item_chunks.c.first_index,
                                                 item_chunks.c.first_index + (item_chunks.c.item_count - 1)))
#: How many of a run's chunked items have such a row, by run key.
_ROWS_OVER_CHUNKS = select(item_chunks.c.run_key, func.count()).select_from(item_chunks.join(nodes, _ROW_OVER_CHUNK)) \
    .group_by(item_chunks.c.run_key)


class PruneReport(BaseModel):
    """What a prune deleted (or, with ``dry_run``, would delete)."""

    cutoff: float
    statuses: list[str]
    dry_run: bool
    runs: int = 0
    nodes: int = 0
    events: int = 0
    effects: int = 0
    signals: int = 0
    memory: int = 0
    blobs: int = 0
    blob_bytes: int = 0
    #: Runs left although they qualified: their rollback undid nodes of a run still kept (or of
    #: its forks), which would otherwise inherit an effect that was given back; or a fork that
    #: stays inherits from them (it reads their ledger rows).
    kept: list[str] = []


def prune(store: PrunableStore | str, older_than: float, statuses: Iterable[RunStatus | str] | None = None,
          batch_size: int = 500, dry_run: bool = False, *, now: float | None = None) -> PruneReport:
    """Delete runs at rest whose ``updated_at`` is more than ``older_than`` seconds ago, with their
    nodes, events, effects, signals, memory and the blobs nothing else references.

    ``store``: an open store, or its URL or path (opened for this call; a missing store is an
    error, never created). ``statuses`` narrows which resting states qualify (default: all of
    them); naming a state that is not at rest is an error. ``dry_run`` counts and deletes nothing.
    """
    if isinstance(store, str):
        from raysaga.state import open_store

        opened = open_store(store, create=False)
        try:
            return prune(opened, older_than, statuses, batch_size, dry_run, now=now)
        finally:
            opened.close()
    if isinstance(older_than, bool) or not isinstance(older_than, int | float) or not older_than >= 0:
        raise UserError(f"older_than {older_than!r} must be a number of seconds, 0 or more (30 days: 2592000)")
    if isinstance(batch_size, bool) or not isinstance(batch_size, int) or not 1 <= batch_size <= 10_000:
        raise UserError(f"batch_size {batch_size!r} must be a whole number from 1 to 10000")
    wanted = _statuses(statuses)
    cutoff = (time.time() if now is None else now) - float(older_than)
    report = PruneReport(cutoff=cutoff, statuses=sorted(wanted), dry_run=dry_run)
    def due(table: Any) -> ColumnElement[bool]:  # (``runs`` or an alias of it)
        return and_(table.c.status.in_(wanted), table.c.updated_at < cutoff)

    prunable = due(runs)
    with store.reader.connect() as conn:
        held = _kept(conn, prunable)
        while True:  # each rule keeps runs the other must count as staying: until neither adds one
            more = _inherited_from(conn, due, held) - held
            if not more:
                break
            held = _kept(conn, prunable, held | more)
    report.kept = sorted(held)
    if dry_run:
        with store.reader.connect() as conn:
            _count(conn, report, _unless(prunable, held))
        return report
    # (an undoer is a fork of the run it undid: the two go in one transaction, ``_fork_family``)
    _delete(store, report, _unless(prunable, held), batch_size)
    return report


def _delete(store: PrunableStore, report: PruneReport, prunable: ColumnElement[bool], batch_size: int) -> None:
    while True:
        with store.engine.begin() as conn:
            more = _one_batch(conn, report, prunable, batch_size)
            sqlite = conn.dialect.name == "sqlite"
        if not more:
            return
        if sqlite:  # SQLite's lock is not fair: without a pause the next batch takes it before a waiting
            time.sleep(YIELD_SECONDS)  # writer's busy handler (sleeping up to 100 ms) looks again


def _unless(prunable: ColumnElement[bool], held: Iterable[str]) -> ColumnElement[bool]:
    held = list(held)
    return and_(prunable, runs.c.run_id.not_in(held)) if held else prunable


def _undoers(conn: Connection, prunable: ColumnElement[bool]) -> dict[str, set[str]]:
    """Prunable forks whose compensation rows undid a node they inherited: run -> the runs that
    executed those nodes (``origin_run_id`` of the undone row, or of the chunk holding the item:
    ``fork_rows.undos``). Only forks inherit, so only their rows are read."""
    found: dict[str, set[str]] = {}
    of_forks = and_(prunable, runs.c.parent_run_id.is_not(None))
    pairs = undos(of_forks, lambda executed: executed.is_not(None)).subquery()
    by_pair = select(pairs.c.run_id, pairs.c.origin_run_id).distinct()  # (one row per undone item otherwise)
    for run_id, origin in conn.execute(by_pair).all():
        if origin != run_id:
            found.setdefault(run_id, set()).add(origin)
    return found


def _inherited_from(conn: Connection, due: Callable[[Any], ColumnElement[bool]], held: set[str]) -> set[str]:
    """The prunable runs (``due``) a run that stays (not prunable now, or ``held``) was forked from,
    its parent's parent and so on: a fork reads the ledger rows of the runs it inherits from (their
    calls' keys, whether a call took effect) to roll back or fork again. Pruned before it, an
    inherited payment read as never sent and its refund was skipped. A run and its forks pruned in
    the same call go together. One join of the runs table with itself: no list of ids."""
    child, parent = runs.alias("child"), runs.alias("parent")
    pairs = conn.execute(select(child.c.run_id, due(child), parent.c.run_id).select_from(
        child.join(parent, child.c.parent_run_id == parent.c.run_id)).where(due(parent))).all()
    going = {r for r, child_due, _ in pairs if child_due} - held  # (the rest of the forks stay)
    kept: set[str] = set()
    while True:  # up the fork trees: a parent kept keeps its own parent
        more = {p for r, _, p in pairs if p not in held and p not in kept and (r not in going or r in kept)}
        if not more:
            return kept
        kept |= more


def _tree(conn: Connection, root: str) -> dict[str, str | None]:
    """The runs of ``root``'s fork tree that exist, ``root`` itself included if it does, each with
    its parent: those that may hold a node ``root`` executed (a fork of a fork keeps the row's
    ``origin_run_id``), reached as a later fork looks for undos (``Store.lineage``: by parent)."""
    found = {r: p for r, p in conn.execute(select(runs.c.run_id, runs.c.parent_run_id).where(runs.c.run_id == root))}
    frontier = [root]
    while frontier:
        children = [(r, p) for r, p in conn.execute(select(runs.c.run_id, runs.c.parent_run_id).where(
            runs.c.parent_run_id.in_(frontier))) if r not in found and r != root]
        found.update(children)
        frontier = [r for r, _ in children]
    return found


def _kept(conn: Connection, prunable: ColumnElement[bool], also: set[str] | None = None) -> set[str]:
    """The prunable runs to keep. An undoer of a node of ``o`` is kept while a run that may still
    inherit that node stays: a run of ``o``'s tree that is no undoer of ``o`` (whose copy of the
    node was not given back), not pruned now, or kept itself. With it are kept the runs between
    ``o`` and it (a later fork finds the undo by walking ``o``'s forks down: a deleted middle run
    hid it). Undoers never hold one another (two forks that both rolled back the parent's charge
    went for ever)."""
    undoers = _undoers(conn, prunable)
    if not undoers:
        return set(also or ())
    every = _undoers(conn, runs.c.parent_run_id.is_not(None))  # undoers of an origin, prunable or not
    of_origin: dict[str, set[str]] = {}
    for run, origins in every.items():
        for origin in origins:
            of_origin.setdefault(origin, set()).add(run)
    trees = {origin: _tree(conn, origin) for origins in undoers.values() for origin in origins}
    members = {r for tree in trees.values() for r in tree}
    going = {r for (r,) in conn.execute(select(runs.c.run_id).where(prunable, runs.c.run_id.in_(sorted(members))))}
    kept: set[str] = set(also or ())  # (kept for another reason: ``_inherited_from``)
    while True:  # the least fixed point: a run is kept only through a run that stays
        now = set(kept)
        for run, origins in undoers.items():
            for origin in origins:
                tree = trees[origin]
                holders = set(tree) - of_origin.get(origin, set()) - {run}
                if holders - (going - kept):
                    now.add(run)
                    now.update(_between(tree, origin, run) & going)
        if now == kept:
            return kept
        kept = now


def _between(tree: dict[str, str | None], origin: str, run: str) -> set[str]:
    """The runs of ``tree`` on the parent path from ``run`` up to ``origin``, both left out."""
    path: set[str] = set()
    at = tree.get(run)
    while at is not None and at != origin and at in tree and at not in path:
        path.add(at)
        at = tree.get(at)
    return path


def _statuses(given: Iterable[RunStatus | str] | None) -> set[str]:
    if given is None:
        return {s.value for s in PRUNABLE}
    out = set()
    for item in given:
        try:
            status = RunStatus(item)
        except ValueError:
            raise UserError(f"{item!r} is not a run state; prunable ones: "
                            f"{', '.join(sorted(s.value for s in PRUNABLE))}") from None
        if status not in PRUNABLE:
            raise UserError(f"runs in state {status.value!r} are not at rest and are never pruned; prunable: "
                            f"{', '.join(sorted(s.value for s in PRUNABLE))}")
        out.add(status.value)
    if not out:
        raise UserError("no run state given to prune")
    return out


def _of_runs(table: Table, chosen: Any) -> ColumnElement[bool]:
    """SQL: ``table``'s row belongs to a run that ``chosen`` (a SELECT of run ids) selects; node
    rows name their run by ``run_key`` (schema 8)."""
    if table is nodes or table is item_chunks:
        return table.c.run_key.in_(select(runs.c.run_key).where(runs.c.run_id.in_(chosen)))
    return table.c.run_id.in_(chosen)


def _chunked_items(conn: Connection, chosen: Any) -> int:
    """How many items the ``raysaga_item_chunks`` rows of the runs ``chosen`` selects hold that no
    node row stands for (those are counted as rows): each item once, as the view shows it."""
    held = conn.execute(select(func.coalesce(func.sum(item_chunks.c.item_count), 0))
                        .where(_of_runs(item_chunks, chosen))).scalar_one()
    shadowed = conn.execute(select(func.count()).select_from(item_chunks.join(nodes, _ROW_OVER_CHUNK))
                            .where(_of_runs(item_chunks, chosen))).scalar_one()
    return int(held) - int(shadowed)


def _referenced(kept: ColumnElement[bool] | None = None) -> ColumnElement[bool]:
    """SQL: the blob row's digest is referenced by a run or node row (of a run ``kept`` selects)."""
    node_ref = exists().where(nodes.c.output_digest == blobs.c.digest)
    input_ref = exists().where(runs.c.input_digest == blobs.c.digest)
    output_ref = exists().where(runs.c.output_digest == blobs.c.digest)
    if kept is not None:
        node_ref = node_ref.where(nodes.c.run_key.in_(select(runs.c.run_key).where(kept)))
        input_ref, output_ref = input_ref.where(kept), output_ref.where(kept)
    return or_(node_ref, input_ref, output_ref)


def _count(conn: Connection, report: PruneReport, prunable: ColumnElement[bool]) -> None:
    doomed = select(runs.c.run_id).where(prunable)
    report.runs = int(conn.execute(select(func.count()).select_from(runs).where(prunable)).scalar_one())
    for name, table in _CHILDREN:
        setattr(report, name, int(conn.execute(select(func.count()).select_from(table)
                                               .where(_of_runs(table, doomed))).scalar_one()))
    report.nodes += _chunked_items(conn, doomed)
    used = union(
        select(nodes.c.output_digest.label("d")).where(_of_runs(nodes, doomed), nodes.c.output_digest.is_not(None)),
        select(runs.c.input_digest.label("d")).where(prunable, runs.c.input_digest.is_not(None)),
        select(runs.c.output_digest.label("d")).where(prunable, runs.c.output_digest.is_not(None)),
    ).subquery()
    row = conn.execute(select(func.count(), func.coalesce(func.sum(blobs.c.size), 0))
                       .where(blobs.c.digest.in_(select(used.c.d)), not_(_referenced(not_(prunable))))).one()
    report.blobs, report.blob_bytes = int(row[0]), int(row[1])


def _one_batch(conn: Connection, report: PruneReport, prunable: ColumnElement[bool], batch_size: int) -> bool:
    """Delete the next batch of prunable runs; whether more may be left."""
    query = select(runs.c.run_id, runs.c.run_key, runs.c.input_digest, runs.c.output_digest).where(prunable) \
        .order_by(runs.c.updated_at, runs.c.run_id).limit(batch_size)
    if conn.dialect.name == "postgresql":
        # a run an operator revives meanwhile waits for this batch (and skipped ones are left)
        query = query.with_for_update(skip_locked=True)
    selected = conn.execute(query).all()
    if not selected:
        return False
    taken = _within_rows(conn, selected)
    rows = [*taken, *_fork_family(conn, [r.run_id for r in taken], prunable)]
    ids = [r.run_id for r in rows]
    candidates = {d for r in rows for d in (r.input_digest, r.output_digest) if d}
    candidates |= {d for (d,) in conn.execute(select(nodes.c.output_digest).distinct()
                                               .where(_of_runs(nodes, ids), nodes.c.output_digest.is_not(None)))}
    report.nodes += _chunked_items(conn, ids)
    conn.execute(delete(item_chunks).where(_of_runs(item_chunks, ids)))
    for name, table in _CHILDREN:
        setattr(report, name, getattr(report, name) + conn.execute(delete(table).where(_of_runs(table, ids)))
                .rowcount)
    report.runs += conn.execute(delete(runs).where(runs.c.run_id.in_(ids), prunable)).rowcount
    if candidates:
        if conn.dialect.name == "postgresql":
            # writers that inserted (or re-used) a blob in a transaction still open finish first,
            # so NOT EXISTS below sees their node rows; later writers re-insert a deleted blob
            conn.exec_driver_sql("LOCK TABLE raysaga_blobs IN SHARE ROW EXCLUSIVE MODE")
        unreferenced = and_(blobs.c.digest.in_(candidates), not_(_referenced()))
        sizes: dict[str, Any] = dict(conn.execute(select(blobs.c.digest, blobs.c.size).where(unreferenced)).all())
        if sizes:
            # the NOT EXISTS is repeated in the DELETE itself: it is what decides
            report.blobs += conn.execute(delete(blobs).where(blobs.c.digest.in_(list(sizes)), not_(_referenced())))\
                .rowcount
            report.blob_bytes += sum(int(v) for v in sizes.values())
    return len(selected) == batch_size or len(taken) < len(selected)


def _fork_family(conn: Connection, ids: list[str], prunable: ColumnElement[bool]) -> list[Any]:
    """The prunable runs, not among ``ids``, linked to them by forks (their parents and forks, and
    theirs): deleted in the same transaction, so a prune cut short between two batches never leaves
    a fork whose parent is gone (it reads the ledger rows of the runs it inherits from) nor a run
    whose refund record, its fork's compensation rows, is gone. Locked on PostgreSQL, as the batch."""
    family, frontier = set(ids), set(ids)
    child = runs.alias("child")
    while frontier:
        part = sorted(frontier)
        parents = select(child.c.parent_run_id).where(child.c.run_id.in_(part))
        linked = select(runs.c.run_id).where(prunable, or_(runs.c.run_id.in_(parents), runs.c.parent_run_id.in_(part)))
        frontier = {r for (r,) in conn.execute(linked)} - family
        family |= frontier
    extra = sorted(family - set(ids))
    if not extra:
        return []
    query = select(runs.c.run_id, runs.c.run_key, runs.c.input_digest, runs.c.output_digest) \
        .where(runs.c.run_id.in_(extra), prunable).order_by(runs.c.run_id)
    if conn.dialect.name == "postgresql":
        query = query.with_for_update()  # (in one order: two prunes at once do not deadlock)
    return list(conn.execute(query).all())


def _within_rows(conn: Connection, selected: Sequence[Any]) -> list[Any]:
    """The first of ``selected`` runs whose node and event rows add up to ``ROWS_PER_BATCH`` at most
    (the first run always: a run is deleted whole). Counted a growing slice at a time, so big runs
    are not all counted for the few a batch takes, nor small ones one query each."""
    taken: list[Any] = []
    total, start, chunk = 0, 0, 4
    while start < len(selected):
        part = selected[start:start + chunk]
        sizes = _sizes(conn, part)
        for row in part:
            total += sizes[row.run_key]
            if taken and total > ROWS_PER_BATCH:
                return taken
            taken.append(row)
        start, chunk = start + chunk, chunk * 2
    return taken


def _sizes(conn: Connection, part: Sequence[Any]) -> dict[Any, int]:
    """run_key -> its node rows (a chunk's items each, once), event rows, plus one (its run row)."""
    sizes: dict[Any, int] = {r.run_key: 1 for r in part}
    keys, by_id = list(sizes), {r.run_id: r.run_key for r in part}
    for key, count in conn.execute(select(nodes.c.run_key, func.count()).where(nodes.c.run_key.in_(keys))
                                   .group_by(nodes.c.run_key)).all():
        sizes[key] += int(count)
    for key, count in conn.execute(_CHUNK_ITEMS.where(item_chunks.c.run_key.in_(keys))).all():
        sizes[key] += int(count)
    for key, count in conn.execute(_ROWS_OVER_CHUNKS.where(item_chunks.c.run_key.in_(keys))).all():
        sizes[key] -= int(count)  # (counted as rows already)
    for run_id, count in conn.execute(select(events.c.run_id, func.count()).where(events.c.run_id.in_(list(by_id)))
                                      .group_by(events.c.run_id)).all():
        sizes[by_id[run_id]] += int(count)
    return sizes
