"""The rows of forked runs and of re-pinned definitions (``SqlStore`` mixes these in).

A fork (``raysaga.orchestrator.fork``) is a new run whose inherited nodes start completed: their
rows are copied from the parent into the new run in the transaction that creates it, each
marked with ``origin_run_id`` (the run that executed the node, so its effects keep that run's
idempotency keys). The fork keeps its parent's labels (``raysaga_runs.labels``) unless it is given
its own. Outputs kept as blobs are referenced by digest, never copied; the ledger rows
stay with the run that wrote them and are read across (``inherited_effects``). The fork's
shared memory is what its inherited agents' winning ``memory_write`` calls left (``_copy_memory``):
a reader it runs again sees what the writers it did not run again wrote.
"""

from __future__ import annotations

import json
import time
from bisect import bisect_right
from collections.abc import Callable, Iterable, Sequence
from typing import Any

from sqlalchemy import (
    ColumnElement,
    CompoundSelect,
    Connection,
    Engine,
    Row,
    Text,
    and_,
    func,
    insert,
    literal,
    select,
    tuple_,
    type_coerce,
    union,
    update,
)
from sqlalchemy.exc import IntegrityError

from raysaga.errors import ForkError, RunExistsError
from raysaga.state import blob_rows
from raysaga.state.chunk_codec import as_stored, elements
from raysaga.state.decoding import reading, records
from raysaga.state.error_record import ErrorRecord
from raysaga.state.models import (
    EffectRecord,
    Lease,
    NewRun,
    NodeRecord,
    NodeStatus,
    NodeWrite,
    RunRecord,
    RunStatus,
)
from raysaga.state.node_reads import node_records
from raysaga.state.redact import scrub
from raysaga.state.run_creation import check_new_run_id
from raysaga.state.run_labels import stored_labels
from raysaga.state.schema import effects, events, item_chunks, memory, nodes, runs
from raysaga.state.schema import nodes as node_rows
from raysaga.state.statements import fence_guard

#: Rows copied per statement (two parameters each: well under SQLite's limit on parameters).
_CHUNK = 400


def run_key_of(run_id: str) -> Any:
    """SQL: the ``run_key`` of the run ``run_id`` (node rows are keyed by it, schema 8)."""
    return select(runs.c.run_key).where(runs.c.run_id == run_id).scalar_subquery()


def _copy_rows(conn: Connection, parent: str, child: str, keys: list[tuple[str, int]]) -> None:
    """Copy the parent's rows ``keys`` into ``child``, each marked with the run that executed it."""
    names = [c.name for c in nodes.c]
    chosen = [run_key_of(child).label(n) if n == "run_key" else
              func.coalesce(nodes.c.origin_run_id, literal(parent)).label(n) if n == "origin_run_id" else
              literal(None).label(n) if n == "not_before" else nodes.c[n] for n in names]
    conn.execute(insert(nodes).from_select(names, select(*chosen).where(
        nodes.c.run_key == run_key_of(parent), tuple_(nodes.c.node_id, nodes.c.fan_index).in_(keys))))


def _copy_chunks(conn: Connection, parent: str, child: str, keys: list[tuple[str, int]]) -> None:
    """Copy the items of ``keys`` that the parent's chunks hold (schema 12) into ``child`` as chunks,
    marked with the run that executed them: a chunk whose items are all inherited whole, else each
    run of consecutive inherited items as a chunk of its own. Read a step's chunks once, not per
    key: the view cannot find a chunk's item by its index without expanding every item of the step."""
    wanted: dict[str, set[int]] = {}
    for node_id, index in keys:
        if index >= 0:
            wanted.setdefault(node_id, set()).add(index)
    rows: list[dict[str, Any]] = []
    for node_id, indexes in wanted.items():
        chunks = conn.execute(select(item_chunks.c.first_index, type_coerce(item_chunks.c["items"], Text),
                                     item_chunks.c.origin_run_id)
                              .where(item_chunks.c.run_key == run_key_of(parent), item_chunks.c.node_id == node_id)
                              .order_by(item_chunks.c.first_index)).all()
        for first, stored, origin in chunks:
            # decoded and checked (chunk_codec): a damaged chunk is the error every reader gives, never copied
            items = as_stored(elements(parent, node_id, first, stored))
            start = None  # the place where the current run of inherited items began
            for place in range(len(items) + 1):
                if place < len(items) and first + place in indexes:
                    start = place if start is None else start
                elif start is not None:
                    rows.append({"node_id": node_id, "first_index": first + start, "item_count": place - start,
                                 "items": items[start:place], "origin_run_id": origin or parent})
                    start = None
    for i in range(0, len(rows), _CHUNK):
        conn.execute(insert(item_chunks).values(run_key=run_key_of(child)), rows[i:i + _CHUNK])


def _copy_memory(conn: Connection, child: str, now: float) -> None:
    """Give ``child`` the shared memory its inherited agent turns wrote: per key, the inherited
    winning ``memory_write`` of the highest version, with that version (a later write of a turn
    the fork runs again goes on from it) and the value the turn's model asked to write. The writer
    is the origin run's row's when it is that very write, else unknown."""
    rows = conn.execute(select(nodes.c.node_id, nodes.c.fan_index, nodes.c.output, nodes.c.output_digest,
                               nodes.c.origin_run_id)
                        .where(nodes.c.run_key == run_key_of(child), nodes.c.node_id.like("%@%"),
                               nodes.c.origin_run_id.is_not(None))).all()
    if not rows:
        return
    blobbed = {r.output_digest: f"{child}/{r.node_id}" for r in rows if r.output is None and r.output_digest}
    loaded = blob_rows.load(conn, blobbed) if blobbed else {}
    outputs = {(r.node_id, r.fan_index): r.output if r.output is not None else loaded.get(r.output_digest)
               for r in rows}
    best: dict[str, tuple[int, Any, str]] = {}
    for r in rows:
        turn_id, dot, call = r.node_id.partition(".")
        result, response = outputs[(r.node_id, r.fan_index)], outputs.get((turn_id, r.fan_index))
        if not dot or not call.isdigit() or not isinstance(result, dict) or result.get("is_error") \
                or not isinstance(response, dict) or not isinstance(response.get("content"), list):
            continue
        uses = [b for b in response["content"] if isinstance(b, dict) and b.get("type") == "tool_use"]
        if int(call) >= len(uses) or uses[int(call)].get("name") != "memory_write":
            continue
        try:
            told = json.loads(str(result.get("content")))
            key, version = str(told["key"]), int(told["version"])
        except (TypeError, ValueError, KeyError):
            continue
        args = uses[int(call)].get("input")
        if told.get("ok") is True and isinstance(args, dict) and version > best.get(key, (0, None, ""))[0]:
            best[key] = (version, args.get("value"), r.origin_run_id)
    for key, (version, value, origin) in sorted(best.items()):
        there = conn.execute(select(memory.c.version, memory.c.writer)
                             .where(memory.c.run_id == origin, memory.c.key == key)).first()
        writer = there.writer if there is not None and there.version == version else None
        conn.execute(insert(memory).values(run_id=child, key=key, value=value, version=version, writer=writer,
                                           updated_at=now))


def inherited_ledger(conn: Connection, run_id: str) -> list[Row[Any]]:
    """The ledger rows of the nodes ``run_id`` inherited, oldest first: those a join with the view
    ``node_rows`` on ``(origin_run_id, node_id, fan_index)`` gives, read by key.

    Through the view the database expanded every item of the fork's chunks and, for each, looked
    the origin run's ledger up by ``run_id`` alone (its one index): ~19 ms a call on a 10,000-item
    fork, and ~29 s when each item had recorded an effect (10,000 x 10,000 on SQLite; PostgreSQL
    hashed the whole ledger table). Here the fork's row keys and its chunks' spans are read by its
    run key (never their outputs or items), the ledger rows of the runs they name as origins by
    ``run_id``, and each ledger row is kept when the fork's node of its key came from that run: the
    fork's row of that key, else (a row wins over a chunk's entry, as in the view) the chunk whose
    span holds the index. A span is ``first_index`` and ``item_count``, which the writer sets to
    the length of ``items`` (``statements``; prune counts items by it too): nothing is decoded."""
    key = run_key_of(run_id)
    owner: dict[tuple[str, int], str | None] = {(n, i): origin for n, i, origin in conn.execute(
        select(nodes.c.node_id, nodes.c.fan_index, nodes.c.origin_run_id).where(nodes.c.run_key == key)).all()}
    spans: dict[str, list[tuple[int, int, str]]] = {}
    for node_id, first, count, origin in conn.execute(
            select(item_chunks.c.node_id, item_chunks.c.first_index, item_chunks.c.item_count,
                   item_chunks.c.origin_run_id)
            .where(item_chunks.c.run_key == key, item_chunks.c.origin_run_id.is_not(None))
            .order_by(item_chunks.c.node_id, item_chunks.c.first_index)).all():
        spans.setdefault(node_id, []).append((first, count, origin))
    origins = {o for o in owner.values() if o is not None} | {s[2] for found in spans.values() for s in found}
    if not origins:
        return []
    starts = {node_id: [s[0] for s in found] for node_id, found in spans.items()}

    def inherited(run: str, node_id: str, index: int) -> bool:
        if (node_id, index) in owner:  # the row, whatever a chunk holds for the same item
            return owner[(node_id, index)] == run
        place = bisect_right(starts.get(node_id, ()), index) - 1
        if place < 0:
            return False
        first, count, origin = spans[node_id][place]
        return index - first < count and origin == run

    ledger = conn.execute(select(effects).where(effects.c.run_id.in_(sorted(origins)))
                          .order_by(effects.c.created_at, effects.c.idempotency_key)).all()
    return [e for e in ledger if inherited(e.run_id, e.node_id, e.fan_index)]


class ForkRows:
    """Fork and definition-pin methods of ``SqlStore`` (it provides the engines and helpers)."""

    engine: Engine
    reader: Engine

    def _run_value(self, conn: Connection, value: Any, what: str) -> tuple[Any, str | None, str | None]:
        raise NotImplementedError  # SqlStore's

    def get_run(self, run_id: str, *, lenient: bool = False) -> RunRecord:
        raise NotImplementedError  # SqlStore's

    def fork_run(self, new: NewRun, inherited: list[tuple[str, int]], data: dict[str, Any]) -> RunRecord:
        """Create the run ``new`` (``pending``, ``parent_run_id`` set) with the parent's rows
        ``inherited`` (``(node_id, fan_index)``) copied into it, in one transaction: a crash leaves
        the whole fork or nothing. The rows are copied inside the database (``INSERT ... SELECT``),
        so their outputs never pass through this process; blobs are referenced by digest."""
        assert new.parent_run_id is not None, "a fork has a parent"
        check_new_run_id(new.run_id)  # as every new run's (``run_creation``): a fork's too
        now = time.time()
        values = new.model_dump(exclude={"input", "labels"})
        # the parent's labels, copied inside the database, unless the fork was given its own
        values["labels"] = stored_labels(new.labels) if new.labels is not None else \
            select(runs.c.labels).where(runs.c.run_id == new.parent_run_id).scalar_subquery()
        values.update(status=RunStatus.PENDING.value, version=0, fence=0, event_seq=2, retries_used=0,
                      tokens_used=0, cost_used=0.0, created_at=now, updated_at=now)
        try:
            with self.engine.begin() as conn:
                # the parent is locked before its rows are copied (FOR SHARE; SQLite's BEGIN IMMEDIATE
                # already serialises writers): a prune deleting it either finishes first (refused here)
                # or waits for this copy, and then sees the blobs the fork's rows reference
                parent = select(runs.c.run_id).where(runs.c.run_id == new.parent_run_id)
                if conn.dialect.name == "postgresql":
                    parent = parent.with_for_update(read=True)
                if conn.execute(parent).first() is None:
                    raise ForkError(f"run {new.parent_run_id!r} was deleted while it was being forked (a "
                                    "`raysaga prune`?): nothing of the fork was recorded")
                values["input"], values["input_digest"], _ = self._run_value(conn, new.input, "input")
                conn.execute(insert(runs).values(**values))
                conn.execute(insert(events), [
                    {"run_id": new.run_id, "seq": 1, "at": now, "kind": "run_created",
                     "data": scrub({"workflow": new.workflow_name})},
                    {"run_id": new.run_id, "seq": 2, "at": now, "kind": "run_forked", "data": scrub(data)}])
                for i in range(0, len(inherited), _CHUNK):
                    _copy_rows(conn, new.parent_run_id, new.run_id, inherited[i:i + _CHUNK])
                _copy_chunks(conn, new.parent_run_id, new.run_id, inherited)
                _copy_memory(conn, new.run_id, now)
        except IntegrityError:
            raise RunExistsError(new.run_id) from None
        return self.get_run(new.run_id)

    def node_states(self, run_id: str) -> list[NodeRecord]:
        """A run's node rows without their outputs (``output`` None; ``output_digest`` kept): what a
        fork decides from, at the cost of the rows' metadata only."""
        with self.reader.connect() as conn:  # rows and item chunks by key, not through the view
            return node_records(conn, run_id, outputs=False)

    def inherited_effects(self, run_id: str) -> list[EffectRecord]:
        """The ledger rows of the nodes ``run_id`` inherited (they belong to the runs that executed
        them), oldest first: ``inherited_ledger``."""
        with self.reader.connect() as conn, reading(run_id, effects.name):
            return records(EffectRecord, inherited_ledger(conn, run_id))

    def node_outputs(self, run_id: str, keys: Iterable[tuple[str, int]]
                     ) -> dict[tuple[str, int], tuple[str, Any, str | None]]:
        """``(status, output, output_digest)`` of the node rows ``keys`` names, by key (a key with no
        row left out): an agent's turns and tool calls, which are rows, never a chunk's items. What
        ``fork`` reads to tell which of a run's agent calls owe an undo: a query per 400 node ids
        (of any item: the keys are picked out here), where ``node_row`` cost one per row (2,000
        calls: 2,000 queries, 10-30 s). By node id, not by ``(node_id, fan_index)`` pairs, which
        PostgreSQL turns into a filter of ORs: 0.1 s per 400 keys."""
        wanted = set(keys)
        ids = sorted({node_id for node_id, _ in wanted})
        found: dict[tuple[str, int], tuple[str, Any, str | None]] = {}
        with self.reader.connect() as conn, reading(run_id, nodes.name):
            for i in range(0, len(ids), _CHUNK):
                for node_id, index, status, output, digest in conn.execute(
                        select(nodes.c.node_id, nodes.c.fan_index, nodes.c.status, nodes.c.output,
                               nodes.c.output_digest)
                        .where(nodes.c.run_key == run_key_of(run_id), nodes.c.node_id.in_(ids[i:i + _CHUNK]))).all():
                    if (node_id, index) in wanted:
                        found[(node_id, index)] = (status or NodeStatus.COMPLETED.value, output, digest)
        return found

    def children(self, run_id: str) -> list[dict[str, Any]]:
        """The runs forked from ``run_id``, oldest first: ``run_id``, ``status``, ``forked_from``, ``created_at``."""
        query = (select(runs.c.run_id, runs.c.status, runs.c.forked_from, runs.c.created_at)
                 .where(runs.c.parent_run_id == run_id).order_by(runs.c.created_at, runs.c.run_id))
        with self.reader.connect() as conn:
            return [r._asdict() for r in conn.execute(query).all()]

    def repin_definition(self, lease: Lease, definition_hash: str, step_hashes: dict[str, str],
                         data: dict[str, Any], *, workflow: tuple[str, str, str | None] | None = None,
                         nodes: Sequence[NodeWrite] = ()) -> RunRecord:
        """Pin the run to another definition (a resume allowed to use changed code), fenced by the
        lease, with a ``definition_changed`` event holding ``data`` (what changed). ``workflow``:
        the (name, version, module ref) the run now records; ``nodes``: rows of steps the new
        definition removed, closed in the same transaction (their status, error and end)."""
        now = time.time()
        values: dict[str, Any] = {"definition_hash": definition_hash, "step_hashes": step_hashes}
        if workflow is not None:
            values.update(workflow_name=workflow[0], workflow_version=workflow[1], workflow_ref=workflow[2])
        with self.engine.begin() as conn:
            seq = fence_guard(conn, lease, 1, now)
            conn.execute(update(runs).where(runs.c.run_id == lease.run_id, runs.c.fence == lease.fence)
                         .values(**values))
            if nodes:
                run_key = conn.execute(select(runs.c.run_key).where(runs.c.run_id == lease.run_id)).scalar_one()
                for n in nodes:  # (a few rows: those of removed steps still open)
                    error = n.error.as_dict() if isinstance(n.error, ErrorRecord) else n.error
                    conn.execute(update(node_rows).where(node_rows.c.run_key == run_key,
                                                         node_rows.c.node_id == n.node_id,
                                                         node_rows.c.fan_index == n.fan_index)
                                 .values(status=n.status.value, error=error, finished_at=now))
            conn.execute(insert(events).values(run_id=lease.run_id, seq=seq, at=now, kind="definition_changed",
                                               data=scrub(data)))
        return self.get_run(lease.run_id, lenient=True)


def undos(of_runs: ColumnElement[bool],
          origin: Callable[[ColumnElement[Any]], ColumnElement[bool]]) -> CompoundSelect[Any]:
    """Compensation rows of the runs ``of_runs`` selects, joined to the rows (or item chunks) they
    undo in the same run, whose ``origin_run_id`` satisfies ``origin``: ``(run, undone node_id,
    fan_index, the compensation's status, the run that executed the undone node)``. The join goes
    from the compensation to the undone row by its key (index lookups), never through every row."""
    from raysaga.types import COMPENSATE_SUFFIX

    undo, row, chunk = nodes.alias("undo"), nodes.alias("undone"), item_chunks.alias("undone_chunk")
    mine = and_(of_runs, undo.c.node_id.like("%" + COMPENSATE_SUFFIX))
    target = func.substr(undo.c.node_id, 1, func.length(undo.c.node_id) - len(COMPENSATE_SUFFIX))
    by_row = select(runs.c.run_id, row.c.node_id, undo.c.fan_index, undo.c.status, row.c.origin_run_id).select_from(
        runs.join(undo, undo.c.run_key == runs.c.run_key).join(row, and_(
            row.c.run_key == undo.c.run_key, row.c.fan_index == undo.c.fan_index, row.c.node_id == target))
    ).where(mine, origin(row.c.origin_run_id))
    last = chunk.c.first_index + (chunk.c.item_count - 1)
    by_chunk = select(runs.c.run_id, chunk.c.node_id, undo.c.fan_index, undo.c.status, chunk.c.origin_run_id
                      ).select_from(runs.join(undo, undo.c.run_key == runs.c.run_key).join(chunk, and_(
                          chunk.c.run_key == undo.c.run_key, chunk.c.node_id == target,
                          undo.c.fan_index.between(chunk.c.first_index, last)))
                      ).where(mine, origin(chunk.c.origin_run_id))
    return union(by_row, by_chunk)


def undone_in(conn: Connection, origin: str, run_ids: Sequence[str]) -> list[tuple[str, str, int, str]]:
    """Compensation rows in ``run_ids`` (forks of ``origin``'s tree) that undid a node ``origin``
    executed, as ``(run, undone node_id, fan_index, the compensation's status)`` (``undos``).

    Every run that undid the node did so under one key (``origin``'s), so the provider was called
    once: by the run that owns the key's ledger row (``ledger_rows``: a committed row never moves;
    a failed one moves to the run that takes it up); the others were answered from that row. A
    node is told as undone by that run alone when its compensation completed, and failed tries of
    a node some run undid are dropped (the effect no longer stands). When the owner is no undoer
    here (``origin`` itself, say), every run whose compensation completed is kept."""
    if not run_ids:
        return []
    found = [(str(r), str(n), int(i), st or "completed")  # NULL is 'completed' (schema 9)
             for r, n, i, st, _ in conn.execute(undos(runs.c.run_id.in_(list(run_ids)),
                                                       lambda executed: executed == origin)).all()]
    return _by_caller(conn, origin, found)


def _by_caller(conn: Connection, origin: str, found: list[tuple[str, str, int, str]]
               ) -> list[tuple[str, str, int, str]]:
    """``found`` (``undone_in``'s rows) with each node's undo told by the run that made the call."""
    from raysaga.types import COMPENSATE_SUFFIX

    done: dict[tuple[str, int], set[str]] = {}
    for run, node_id, index, status in found:
        if status == "completed":
            done.setdefault((node_id, index), set()).add(run)
    shared = {key: runs_ for key, runs_ in done.items() if len(runs_) > 1}
    writer: dict[tuple[str, int], str] = {}
    if shared:
        callers = sorted({run for runs_ in shared.values() for run in runs_} | {origin})
        ledger = conn.execute(select(effects.c.run_id, effects.c.node_id, effects.c.fan_index)
                              .where(effects.c.run_id.in_(callers),
                                     effects.c.node_id.in_(sorted({n + COMPENSATE_SUFFIX for n, _ in shared})))
                              .order_by(effects.c.created_at)).all()
        for run, comp, index in ledger:
            key = (str(comp)[:-len(COMPENSATE_SUFFIX)], int(index))
            # a run of the node's undoers (they share the origin's key): not a run that undid its own execution
            if key in shared and (run in shared[key] or run == origin):
                writer.setdefault(key, str(run))
    kept = []
    for run, node_id, index, status in found:
        key = (node_id, index)
        if status != "completed" and key in done:
            continue  # another run undid it: the effect no longer stands
        if status == "completed" and writer.get(key, run) != run and writer[key] in done[key]:
            continue  # answered from the row another run's call wrote
        kept.append((run, node_id, index, status))
    return kept
