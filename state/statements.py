"""SQL built once and reused: the fence guard every driver transaction starts with, the driver
commit's hot statements as plain SQL per dialect, and cached insert-on-conflict statements.

On the commit path, building and cache-keying a Core statement costs more than running it
(~0.3 ms a commit), so each statement here is constructed once (per dialect) and kept.
"""

from __future__ import annotations

import functools
import operator
import sqlite3
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any, cast

from sqlalchemy import Column, Connection, Engine, Table, bindparam, update
from sqlalchemy.dialects import postgresql, sqlite
from sqlalchemy.engine import Dialect

from raysaga.errors import LeaseLostError
from raysaga.state import jsoncodec
from raysaga.state.chunk_codec import TICKS_PER_SECOND as TICKS_PER_SECOND  # a chunk's time unit, there
from raysaga.state.chunk_codec import elements
from raysaga.state.engine import as_sqlalchemy_error
from raysaga.state.models import ItemRow, Lease, NodeStatus
from raysaga.state.schema import JsonText, effects, events, item_chunks, nodes, runs
from raysaga.state.sqlite_readonly import READ_ONLY

#: The fence guard as Core: proves the fence, reserves ``g_n`` event seqs, returns the last one.
GUARD = (update(runs)
         .where(runs.c.run_id == bindparam("g_run"), runs.c.fence == bindparam("g_fence"))
         .values(event_seq=runs.c.event_seq + bindparam("g_n"), updated_at=bindparam("g_now"))
         .returning(runs.c.event_seq))

#: The column order of the row tuples ``SqlStore.commit`` hands to ``DriverSql.nodes`` / ``.events``.
NODE_COLUMNS = ("run_key", "node_id", "fan_index", "status", "attempt", "not_before", "output", "output_digest",
                "error", "started_at", "finished_at", "duration")
EVENT_COLUMNS = ("run_id", "seq", "at", "kind", "node_id", "fan_index", "data")
CHUNK_COLUMNS = ("run_key", "node_id", "first_index", "item_count", "items")
#: Node columns a driver never writes: a fork's inherited-row marker (``raysaga.state.fork_rows``), kept by an upsert.
NODE_FORK_COLUMNS = ("origin_run_id",)
assert tuple(nodes.c.keys()) == NODE_COLUMNS + NODE_FORK_COLUMNS and tuple(events.c.keys()) == EVENT_COLUMNS \
    and tuple(item_chunks.c.keys()) == CHUNK_COLUMNS + NODE_FORK_COLUMNS, \
    "the schema changed: update driver_sql and SqlStore.commit's row tuples"


#: The most a run's ``cost_used`` (USD) holds: the counting guard saturates there. A model call's
#: cost is bounded far below (``machine.budgets.MAX_CALL_COST``), so no run reaches it; it keeps
#: the sum finite in both databases (PostgreSQL refused an overflowing ``cost_used + ?`` and the
#: driver's commit with it; SQLite stored inf) and heals a row that holds inf already.
MAX_COST_USED = 1e300


def _saturated_cost(dialect: str, mark: str) -> str:
    """``cost_used`` plus the parameter ``mark``, at most ``MAX_COST_USED``: each term is bounded
    before the sum, so the sum cannot overflow (nor raise, on PostgreSQL)."""
    cap = f"CAST({MAX_COST_USED!r} AS DOUBLE PRECISION)" if dialect != "sqlite" else repr(MAX_COST_USED)
    least = "LEAST" if dialect != "sqlite" else "min"  # SQLite's scalar min(), PostgreSQL's LEAST
    return f"{least}({least}(cost_used, {cap}) + {least}({mark}, {cap}), {cap})"


def stale_fence(lease: Lease) -> LeaseLostError:
    return LeaseLostError(f"run {lease.run_id!r}: fence {lease.fence} is stale; another driver took the run, "
                          "this one stops without writing")


def fence_guard(conn: Connection, lease: Lease, n_events: int, now: float) -> int:
    """First statement of every driver transaction: proves the fence and reserves event seqs.

    It also takes the run row's write lock, so a claim by another driver waits for this
    transaction, and any claim that already happened makes it write nothing.
    """
    row = conn.execute(GUARD, {"g_run": lease.run_id, "g_fence": lease.fence, "g_n": n_events, "g_now": now}).first()
    if row is None:
        raise stale_fence(lease)
    return int(row[0])


@dataclass(frozen=True)
class DriverSql:
    """The driver commit's hot statements as plain SQL for one dialect."""

    guard: str
    """Proves the fence, reserves event seqs; returns the last one, the run's status (which the
    guard does not change: a transition is checked against it, with no read of its own) and its
    ``run_key``, which the node rows carry (schema 8): the run row is read anyway, so the key
    costs no statement nor lookup of its own, and is never stale."""
    counting_guard: str
    """The guard that also adds to the run's counters (retries, tokens, cost): a batch whose run
    update is only counters (a model turn's tokens) needs no statement of its own, nor a read."""
    nodes: str
    chunks: str
    """Upserts a run of completed items (``item_writes``): the same row again after an ambiguous
    commit's retry is the same write."""
    chunk_rows_gone: str
    """Deletes the node rows of a chunk's items (a retried item's ``retrying`` row): the chunk is
    their latest state, and the view ``node_rows`` would show such a row instead."""
    chunks_overlapped: str
    """Deletes the run's chunks holding any item of the new chunks' spans (one JSON parameter,
    ``overlap_spans``: every span of the commit in one statement), returning their ``node_id``,
    ``first_index`` and ``items``: no item is ever in two chunks (the view would show it twice),
    and a chunk written again shorter (an item written again with fewer neighbours) would drop
    the others (``write_items`` keeps them as rows)."""
    item_rows_kept: str
    """Inserts an item's row unless the item has one (a later write, which the view shows)."""
    events: str
    abandon_effects: str
    """A run ends or is parked: its ledger rows still pending become abandoned (EffectStatus)."""


def _chunks_overlapped(dialect: str) -> str:
    """``DriverSql.chunks_overlapped``: params (run_key, ``overlap_spans`` JSON, run_key).

    Each span ``[node_id, low, last, first]`` finds its chunks on the key's range: a chunk holding
    index ``first`` starts at most MAX_CHUNK_ITEMS - 1 before it (``low``); ``first_index > first -
    item_count``, not ``first_index + item_count > first``: no overflow at 2**31 - 1. The spans
    drive the primary-key lookups, in that order (SQLite's CROSS JOIN; PostgreSQL's LATERAL, kept
    from being flattened by ``OFFSET 0``): left to the planners, both scanned every chunk of the
    run at each commit. A chunk two spans overlap is deleted, and returned, once."""
    if dialect == "sqlite":
        node, low, last, first = (f"json_extract(s.value, '$[{i}]')" for i in range(4))
        found = (f"SELECT c.node_id, c.first_index FROM json_each(?) s CROSS JOIN {item_chunks.name} c "
                 f"WHERE c.run_key = ? AND c.node_id = {node} AND c.first_index BETWEEN {low} AND {last} "
                 f"AND c.first_index > {first} - c.item_count")
    else:
        node, low, last, first = "s.v ->> 0", *(f"(s.v ->> {i})::bigint" for i in range(1, 4))
        found = (f"SELECT c.node_id, c.first_index FROM json_array_elements(CAST(%s AS JSON)) AS s(v) CROSS JOIN "
                 f"LATERAL (SELECT node_id, first_index FROM {item_chunks.name} c WHERE c.run_key = %s "
                 f"AND c.node_id = {node} AND c.first_index BETWEEN {low} AND {last} "
                 f"AND c.first_index > {first} - c.item_count OFFSET 0) c")
    mark = "?" if dialect == "sqlite" else "%s"
    return (f"DELETE FROM {item_chunks.name} WHERE run_key = {mark} AND (node_id, first_index) IN ({found}) "
            "RETURNING node_id, first_index, items")


@functools.cache
def driver_sql(dialect: str) -> DriverSql:
    """The driver commit's hot statements as plain SQL for ``dialect`` (qmark or format params)."""
    mark = "?" if dialect == "sqlite" else "%s"

    def value(column: Column[Any]) -> str:
        # PostgreSQL takes JSON text into a json column only with a cast; SQLite stores it as text
        return f"CAST({mark} AS JSON)" if dialect != "sqlite" and isinstance(column.type, JsonText) else mark

    def insert_sql(table: Table, names: tuple[str, ...]) -> str:
        return (f"INSERT INTO {table.name} ({', '.join(names)}) "
                f"VALUES ({', '.join(value(table.c[n]) for n in names)})")

    keys = [c.name for c in nodes.primary_key.columns]
    updates = ", ".join(f"{name} = excluded.{name}" for name in NODE_COLUMNS if name not in keys)
    return DriverSql(
        guard=(f"UPDATE {runs.name} SET event_seq = event_seq + {mark}, updated_at = {mark} "
               f"WHERE run_id = {mark} AND fence = {mark} RETURNING event_seq, status, run_key"),
        counting_guard=(f"UPDATE {runs.name} SET event_seq = event_seq + {mark}, updated_at = {mark}, "
                        f"retries_used = retries_used + {mark}, tokens_used = tokens_used + {mark}, "
                        f"cost_used = {_saturated_cost(dialect, mark)} WHERE run_id = {mark} AND fence = {mark} "
                        "RETURNING event_seq, status, run_key"),
        nodes=f"{insert_sql(nodes, NODE_COLUMNS)} ON CONFLICT ({', '.join(keys)}) DO UPDATE SET {updates}",
        chunks=(f"{insert_sql(item_chunks, CHUNK_COLUMNS)} ON CONFLICT (run_key, node_id, first_index) "
                "DO UPDATE SET item_count = excluded.item_count, items = excluded.items"),
        chunk_rows_gone=(f"DELETE FROM {nodes.name} WHERE run_key = {mark} AND node_id = {mark} "
                         f"AND fan_index BETWEEN {mark} AND {mark}"),
        chunks_overlapped=_chunks_overlapped(dialect),
        item_rows_kept=f"{insert_sql(nodes, NODE_COLUMNS)} ON CONFLICT ({', '.join(keys)}) DO NOTHING",
        events=insert_sql(events, EVENT_COLUMNS),
        abandon_effects=(f"UPDATE {effects.name} SET status = {mark}, updated_at = {mark} "
                         f"WHERE run_id = {mark} AND status = {mark}"),
    )


class HotSql:
    """Runs the driver commit's plain SQL (``DriverSql``) in the transaction of ``conn``.

    On SQLite on the connection's own DBAPI cursor: SQLAlchemy's execution context (cursor
    wrapper, result proxy, events) cost about as much CPU as SQLite's work on these few-row
    statements, which a chain of steps pays at every commit. An error is raised as the
    SQLAlchemy error ``exec_driver_sql`` would raise. Elsewhere through ``exec_driver_sql``
    (psycopg's disconnect handling, which invalidates the pooled connection, stays SQLAlchemy's)."""

    def __init__(self, conn: Connection) -> None:
        self.conn: Connection | None = conn
        self.dialect: Dialect = conn.dialect
        plain = conn.dialect.name == "sqlite" and not conn.get_execution_options().get(READ_ONLY)
        self.raw = conn.connection.driver_connection if plain else None

    @classmethod
    def on_dbapi(cls, raw: sqlite3.Connection, dialect: Dialect) -> HotSql:
        """On a SQLite DBAPI connection with no ``Connection`` around it (``sqlite_write``)."""
        hot = cls.__new__(cls)
        hot.conn, hot.dialect, hot.raw = None, dialect, raw
        return hot

    def core(self) -> Connection:
        """The transaction's ``Connection``, for Core statements (there is none in ``sqlite_write``)."""
        assert self.conn is not None, "a sqlite_write transaction runs plain SQL only"
        return self.conn

    def one(self, statement: str, params: tuple[Any, ...]) -> Any:
        """The first row of ``statement``, or None."""
        if self.raw is None:
            return self.core().exec_driver_sql(statement, params).first()
        return self._raw(statement, lambda cur: cur.execute(statement, params).fetchone())

    def all(self, statement: str, params: tuple[Any, ...]) -> list[Any]:
        """Every row of ``statement``."""
        if self.raw is None:
            return list(self.core().exec_driver_sql(statement, params).all())
        return self._raw(statement, lambda cur: cur.execute(statement, params).fetchall())  # type: ignore[no-any-return]

    def many(self, statement: str, rows: list[tuple[Any, ...]]) -> None:
        if self.raw is None:
            self.core().exec_driver_sql(statement, rows)
        else:
            self._raw(statement, lambda cur: cur.executemany(statement, rows))

    def _raw(self, statement: str, run: Callable[[Any], Any]) -> Any:
        assert self.raw is not None
        cur = self.raw.cursor()
        try:
            return run(cur)
        except sqlite3.Error as exc:
            raise as_sqlalchemy_error(statement, exc, self.dialect) from exc
        finally:
            cur.close()


@contextmanager
def hot_transaction(engine: Engine) -> Iterator[HotSql]:
    """``engine.begin()``, as a ``HotSql`` (whose ``core()`` is the ``Connection``)."""
    with engine.begin() as conn:
        yield HotSql(conn)


@contextmanager
def sqlite_write(engine: Engine) -> Iterator[HotSql]:
    """A write transaction of plain SQL (``HotSql``) on a pooled SQLite connection, without a
    SQLAlchemy ``Connection`` around it: ``BEGIN IMMEDIATE``, the body's statements, ``COMMIT``;
    ``ROLLBACK`` when the body or the commit raises.

    The transaction ``engine.begin()`` makes on the writer engine (the same pool and pooled
    connection, so the same pragmas: ``synchronous=FULL``, WAL, the busy timeout; the same BEGIN),
    minus the ``Connection``'s own work: its transaction objects and event dispatch cost more CPU
    than SQLite's work in a plain step's commit (nodes and events only), which a chain pays at
    every step. Errors are raised as the SQLAlchemy errors ``engine.begin()`` raises; a
    connection SQLAlchemy would call disconnected is discarded, as it would."""
    pooled = engine.raw_connection()
    try:
        raw = pooled.driver_connection
        assert isinstance(raw, sqlite3.Connection)
        statement = "BEGIN IMMEDIATE"
        try:
            raw.execute(statement)
            try:
                yield HotSql.on_dbapi(raw, engine.dialect)
                statement = "COMMIT"
                raw.commit()
            except BaseException:
                if raw.in_transaction:
                    raw.rollback()
                raise
        except sqlite3.Error as exc:  # BEGIN or COMMIT (or the ROLLBACK): the body's are converted already
            if engine.dialect.is_disconnect(cast(Any, exc), pooled, None):
                pooled.invalidate(exc)
            raise as_sqlalchemy_error(statement, exc, engine.dialect) from exc
    finally:
        pooled.close()


def stored_status(status: NodeStatus) -> str | None:
    """A node status as ``raysaga_nodes.status`` stores it (schema 9): NULL for ``completed``, the
    status of most rows, 9 bytes less each on SQLite; the view ``schema.node_rows`` reads it back."""
    return None if status is NodeStatus.COMPLETED else status.value


def item_rows(run_key: int, items: list[ItemRow]) -> list[tuple[Any, ...]]:
    """``DriverSql.nodes`` rows of completed plain fan-out items, compactly: status NULL
    (``stored_status``), ``finished_at`` NULL and ``duration`` set (readers derive both back: the
    view ``schema.node_rows``), 17 bytes less a row.

    Exact: two timestamps within a factor of two of each other (any two epoch times) subtract
    exactly (Sterbenz), so ``started + (finished - started) == finished`` to the bit; a row for which
    that does not hold (a clock that said 0) is written whole."""
    return [(run_key, node_id, index, None, attempt, None, output, digest, None, started,
             None if started + (duration := finished - started) == finished else finished, duration)
            for node_id, index, attempt, output, digest, started, finished in items]


#: A chunk's tick counts stay below this (35,000 years from 1970): their sum is a 64-bit integer
#: in both databases, exact. A time beyond it gets a row.
TICKS_LIMIT = 2.0**62
#: The most items one ``raysaga_item_chunks`` row holds (a Ray task of the fan-out lane runs up to
#: ``RayExecutor.MAX_CHUNK`` = 64; two tasks' items that land in one commit may join).
MAX_CHUNK_ITEMS = 128
#: The longest output (JSON text, characters) an item in a chunk has, and the most a chunk's
#: outputs add up to: a reader of one item through the view (plain SQL; ``node_row`` before it read
#: by key) expands every chunk of its step and parses their outputs whole. With 50 KB outputs,
#: 2,000 items: one item 0.8 ms as rows, 475 ms as chunks (SQLite, helper-32). Chunks are for many
#: small items (the writes they save); a bigger output is most of its row's cost anyway.
MAX_CHUNK_OUTPUT = 512
MAX_CHUNK_OUTPUTS = 32_768


@dataclass
class ItemWrites:
    """A batch's completed plain items as the commit writes them (``item_writes``)."""

    chunks: list[tuple[Any, ...]]
    """``DriverSql.chunks`` rows."""
    spans: list[tuple[Any, ...]]
    """``DriverSql.chunk_rows_gone`` parameters, one per chunk."""
    rows: list[tuple[Any, ...]]
    """``DriverSql.nodes`` rows of the items no chunk holds (``item_rows``)."""


def item_writes(run_key: int, items: list[ItemRow]) -> ItemWrites:
    """Runs of 2 or more consecutive indexes of one step, in the order they completed, become
    chunk rows (schema 12); the rest compact node rows (``item_rows``). An item whose output is a
    blob (its row names the digest: prune and the blob index read it), longer than
    ``MAX_CHUNK_OUTPUT``, or whose times are not whole ``TICKS_PER_SECOND`` (a clock before 2004,
    an infinite one: see there) gets a row of its own; a chunk's outputs add up to
    ``MAX_CHUNK_OUTPUTS`` at most. An item written twice in the batch is written once, as its last
    write (as an upsert of rows leaves it): two chunks holding it would show it twice."""
    if len(set(map(_item_key, items))) != len(items):
        last = {(item[0], item[1]): n for n, item in enumerate(items)}
        items = [item for n, item in enumerate(items) if last[(item[0], item[1])] == n]
    out = ItemWrites([], [], [])
    # the run being gathered: its first item, and each item's element of the chunk's JSON
    first: ItemRow | None = None
    elements: list[list[Any]] = []
    held = 0  # the characters of the outputs it holds
    last_index = 0
    for item in items:  # (one pass, locals only: ~10,000 items a commit on a wide fan-out)
        node_id, index, attempt, output, digest, started, finished = item
        start, end = started * TICKS_PER_SECOND, finished * TICKS_PER_SECOND  # exact: a power of two
        size = 0 if output is None else len(output)
        if digest is not None or size > MAX_CHUNK_OUTPUT or not (start.is_integer() and end.is_integer()) \
                or not -TICKS_LIMIT < start < TICKS_LIMIT or not -TICKS_LIMIT < end < TICKS_LIMIT:
            if first is not None:  # (is_integer is False for inf and NaN)
                _close(out, run_key, first, elements)
                first, elements, held = None, [], 0
            out.rows.extend(item_rows(run_key, [item]))
            continue
        if first is not None and (index != last_index + 1 or node_id != first[0] or len(elements) == MAX_CHUNK_ITEMS
                                  or held + size > MAX_CHUNK_OUTPUTS):
            _close(out, run_key, first, elements)
            first, elements, held = None, [], 0
        if first is None:
            first = item
        tick = int(start)
        elements.append([tick, int(end) - tick, output] if attempt == 1 else [tick, int(end) - tick, output, attempt])
        held += size
        last_index = index
    if first is not None:
        _close(out, run_key, first, elements)
    return out


_item_key = operator.itemgetter(0, 1)


def _close(out: ItemWrites, run_key: int, first: ItemRow, elements: list[list[Any]]) -> None:
    """A gathered run of items: one chunk row, or the row of an item alone."""
    if len(elements) == 1:
        out.rows.extend(item_rows(run_key, [first]))
        return
    node_id, first_index = first[0], first[1]
    # ints and JSON text only: plain JSON, no walk to check it
    out.chunks.append((run_key, node_id, first_index, len(elements), jsoncodec.encode_plain(elements)))
    out.spans.append((run_key, node_id, first_index, first_index + len(elements) - 1))


def overlap_spans(spans: list[tuple[Any, ...]]) -> str:
    """``DriverSql.chunks_overlapped``'s JSON parameter for ``ItemWrites.spans``: ``[node_id, the
    lowest first_index of a chunk that can hold the span's first item, last, first]`` each."""
    return jsoncodec.encode_plain([[node_id, first - MAX_CHUNK_ITEMS + 1, last, first]
                                   for _, node_id, first, last in spans])


def write_items(hot: HotSql, sql: DriverSql, run_id: str, run_key: int, items: list[ItemRow]) -> None:
    """A batch's completed plain items (``item_writes``), in the driver's commit of ``run_id``. A
    chunk already holding one of the new chunks' items (the item written again: an ambiguous
    commit's retry) is deleted, its items the batch does not write kept as rows: one chunk per
    item at most. One statement finds and deletes them for every chunk of the batch."""
    writes = item_writes(run_key, items)
    if writes.chunks:
        older: list[ItemRow] = []
        for node_id, start, held in hot.all(sql.chunks_overlapped, (run_key, overlap_spans(writes.spans), run_key)):
            older += chunk_items(run_id, node_id, start, held)
        if older:
            written = {(item[0], item[1]) for item in items}
            kept = [item for item in older if (item[0], item[1]) not in written]
            if kept:
                hot.many(sql.item_rows_kept, item_rows(run_key, kept))
        hot.many(sql.chunk_rows_gone, writes.spans)
        hot.many(sql.chunks, writes.chunks)
    if writes.rows:
        hot.many(sql.nodes, writes.rows)


def chunk_items(run_id: str, node_id: str, first_index: int, items: Any) -> list[ItemRow]:
    """The items of a ``raysaga_item_chunks`` row of ``run_id`` (``items`` as the driver reads it
    back: JSON text on SQLite, decoded on PostgreSQL), as the ``ItemRow`` each was written from
    (times exact), decoded by ``chunk_codec.elements``: a damaged chunk is a ``CorruptRecordError``
    naming the run, as every reader of chunks says it."""
    return [(node_id, first_index + i, attempt, output, None, start / TICKS_PER_SECOND,
             (start + took) / TICKS_PER_SECOND)
            for i, (start, took, output, attempt) in enumerate(elements(run_id, node_id, first_index, items))]


def json_param(value: Any) -> str | None:
    """A JSON column's parameter: canonical JSON text, or SQL NULL for None (read back as None either way)."""
    if isinstance(value, jsoncodec.JSONText):
        return str(value)
    return None if value is None else jsoncodec.dumps(value)


def insert_for(conn: Connection, table: Table) -> Any:
    """An INSERT of the connection's dialect (for its ``on_conflict_*`` clauses)."""
    if conn.dialect.name == "postgresql":
        return postgresql.insert(table)
    return sqlite.insert(table)


_UPSERTS: dict[tuple[str, str, tuple[str, ...], tuple[str, ...]], Any] = {}


def upsert(conn: Connection, table: Table, rows: list[dict[str, Any]], keys: list[str],
           keep: tuple[str, ...] = ()) -> None:
    """Insert ``rows``, or update the row with the same ``keys`` (every column but ``keep``)."""
    # one row per key, the last one written wins: PostgreSQL refuses an INSERT ... ON CONFLICT
    # that would touch the same row twice
    rows = list({tuple(r[k] for k in keys): r for r in rows}.values())
    cols = tuple(c for c in rows[0] if c not in keys and c not in keep)
    cache_key = (table.name, conn.dialect.name, tuple(keys), cols)
    stmt = _UPSERTS.get(cache_key)
    if stmt is None:
        base = insert_for(conn, table)
        stmt = _UPSERTS[cache_key] = base.on_conflict_do_update(
            index_elements=keys, set_={c: base.excluded[c] for c in cols})
    conn.execute(stmt, rows)
