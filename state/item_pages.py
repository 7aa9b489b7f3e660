"""A fan-out's items a page at a time, by index: ``raysaga status``'s stream, the dashboard's list.

The view ``node_rows`` shows every item, but a filter on ``fan_index`` cannot skip into the
chunks of schema 12 (an item's index there is computed: ``first_index`` + its place), so a page
read through the view expanded every item of the step, and a step of N items read in pages cost
O(N) a page: ``raysaga status`` of a 100,000-item fan-out pages 50 times. A page here reads the
rows by their key and the chunks by theirs (one that holds an index after ``after`` starts at
most ``MAX_CHUNK_ITEMS - 1`` before it), and merges them as the view does: the same columns and
values, a row winning over a chunk's entry for the same item.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Callable
from typing import Any

from sqlalchemy import (
    ColumnElement,
    Connection,
    Integer,
    Select,
    String,
    Text,
    and_,
    bindparam,
    func,
    literal,
    or_,
    select,
    tuple_,
    type_coerce,
)

from raysaga.state.chunk_codec import Element, elements, item_values
from raysaga.state.fork_rows import run_key_of
from raysaga.state.models import NodeStatus
from raysaga.state.schema import item_chunks, nodes, runs
from raysaga.state.statements import MAX_CHUNK_ITEMS, TICKS_PER_SECOND

_COMPLETED = NodeStatus.COMPLETED.value
#: A chunk's items as read back, undecoded (JSON text on SQLite; psycopg decodes json on
#: PostgreSQL): ``chunk_codec.elements`` decodes and checks them, the one decoder of the format.
_ITEMS = type_coerce(item_chunks.c["items"], Text).label("items")
#: The view's columns over ``raysaga_nodes`` (its first part, migration 0012), by name; ``run_id``
#: is the page's own.
_ROW: dict[str, ColumnElement[Any]] = {
    **{c.name: c for c in nodes.c if c.name != "run_key"},
    "status": func.coalesce(nodes.c.status, _COMPLETED).label("status"),
    "finished_at": func.coalesce(nodes.c.finished_at, nodes.c.started_at + nodes.c.duration).label("finished_at"),
}


def page(conn: Connection, run_id: str, node_id: str, after: int, limit: int, names: tuple[str, ...],
         status: str | None = None) -> list[dict[str, Any]]:
    """The items of ``node_id`` after index ``after``, by index, at most ``limit``, with the view's
    columns ``names`` (optionally only those in ``status``). Run it inside ``decoding.reading``: a
    chunk changed outside raysaga raises ``CorruptRecordError``."""
    query = select(*_columns(run_id, names)).where(nodes.c.run_key == run_key_of(run_id), nodes.c.node_id == node_id,
                                   nodes.c.fan_index > after)
    if status:
        query = query.where(_ROW["status"] == status)
    found = {row.fan_index: dict(row._mapping) for row in conn.execute(query.order_by(nodes.c.fan_index)
                                                                        .limit(limit)).all()}
    if not status or status == _COMPLETED:
        key = run_key_of(run_id)
        chunks = [(first, elements(run_id, node_id, first, items), origin) for first, items, origin in conn.execute(
            select(item_chunks.c.first_index, _ITEMS, item_chunks.c.origin_run_id)
            .where(item_chunks.c.run_key == key, item_chunks.c.node_id == node_id,
                   item_chunks.c.first_index > after - MAX_CHUNK_ITEMS)
            .order_by(item_chunks.c.first_index).limit(limit + MAX_CHUNK_ITEMS)).all()]
        shadowed: set[int] = set()
        if chunks:
            # the items a row stands for (whatever its status): the view shows the row, not the chunk's entry
            last = chunks[-1][0] + len(chunks[-1][1]) - 1
            shadowed = set(conn.execute(select(nodes.c.fan_index).where(
                nodes.c.run_key == key, nodes.c.node_id == node_id, nodes.c.fan_index > after,
                nodes.c.fan_index <= last)).scalars())
        taken = 0
        for first, items, origin in chunks:
            for place, item in enumerate(items):
                index = first + place
                if index > after and index not in shadowed and taken < limit:
                    taken += 1
                    found[index] = item_values(run_id, node_id, index, item, origin, names)
            if taken >= limit:
                break
    return [found[index] for index in sorted(found)[:limit]]


def _columns(run_id: str, names: tuple[str, ...]) -> list[Any]:
    return [literal(run_id).label("run_id") if name == "run_id" else _ROW[name].label(name) for name in names]


def _chunk_rows(conn: Connection, run_id: str, node_ids: list[str] | None = None,
                where: ColumnElement[bool] | None = None) -> list[tuple[str, int, list[Element], str | None]]:
    """``(node_id, first_index, items, origin_run_id)`` of the run's chunks (of ``node_ids``; under
    ``where``), by node and first index, their items decoded (``chunk_codec.elements``)."""
    query = select(item_chunks.c.node_id, item_chunks.c.first_index, _ITEMS,
                   item_chunks.c.origin_run_id).where(item_chunks.c.run_key == run_key_of(run_id))
    if node_ids is not None:
        query = query.where(item_chunks.c.node_id.in_(node_ids))
    if where is not None:
        query = query.where(where)
    return [(node_id, first, elements(run_id, node_id, first, items), origin) for node_id, first, items, origin
            in conn.execute(query.order_by(item_chunks.c.node_id, item_chunks.c.first_index)).all()]


def _row_keys(conn: Connection, run_id: str, node_ids: list[str]) -> set[tuple[str, int]]:
    """The items of ``node_ids`` that have a row: the view shows the row, not a chunk's entry."""
    return {(n, i) for n, i in conn.execute(select(nodes.c.node_id, nodes.c.fan_index).where(
        nodes.c.run_key == run_key_of(run_id), nodes.c.node_id.in_(node_ids), nodes.c.fan_index >= 0)).all()}


def rows_at(conn: Connection, run_id: str, keys: list[tuple[str, int]], names: tuple[str, ...]) -> list[dict[str, Any]]:
    """The rows of the nodes ``keys`` names (``(node_id, fan_index)``), as the view gives them, by
    key: items a chunk holds read from the chunks around them, not from every item of the run."""
    found: dict[tuple[str, int], dict[str, Any]] = {}
    for i in range(0, len(keys), 400):  # two parameters a key: well under SQLite's limit
        part = keys[i:i + 400]
        for row in conn.execute(select(*_columns(run_id, names), nodes.c.node_id.label("_n"),
                                       nodes.c.fan_index.label("_i")).where(
                nodes.c.run_key == run_key_of(run_id), tuple_(nodes.c.node_id, nodes.c.fan_index).in_(part))).all():
            values = dict(row._mapping)
            found[(values.pop("_n"), values.pop("_i"))] = values
    left: dict[str, set[int]] = {}
    for node_id, index in keys:
        if index >= 0 and (node_id, index) not in found:
            left.setdefault(node_id, set()).add(index)
    for node_id, indexes in left.items():
        for low in _clusters(sorted(indexes)):
            chunks = _chunk_rows(conn, run_id, [node_id], and_(item_chunks.c.first_index > low[0] - MAX_CHUNK_ITEMS,
                                                               item_chunks.c.first_index <= low[1]))
            for _, first, items, origin in chunks:
                for place, item in enumerate(items):
                    index = first + place
                    if index in indexes:
                        found[(node_id, index)] = item_values(run_id, node_id, index, item, origin, names)
    return [found[k] for k in sorted(found)]


def _clusters(indexes: list[int]) -> list[tuple[int, int]]:
    """Sorted indexes as (lowest, highest) groups no wider than a chunk: one chunk query each."""
    out: list[tuple[int, int]] = []
    for index in indexes:
        if out and index - out[-1][0] < MAX_CHUNK_ITEMS:
            out[-1] = (out[-1][0], index)
        else:
            out.append((index, index))
    return out


def first_items(conn: Connection, run_id: str, cap: int, names: tuple[str, ...]) -> list[dict[str, Any]]:
    """Every row of the run with ``fan_index < cap`` (its steps and the first ``cap`` items of
    each fan-out), by node and index, as the view gives them (``names`` holds ``node_id`` and
    ``fan_index``): chunks read from their first ones, not every item of the run."""
    found = {(r["node_id"], r["fan_index"]): r for r in (dict(row._mapping) for row in conn.execute(
        select(*_columns(run_id, names)).where(nodes.c.run_key == run_key_of(run_id), nodes.c.fan_index < cap)).all())}
    for node_id, first, items, origin in _chunk_rows(conn, run_id, where=item_chunks.c.first_index < cap):
        for place, item in enumerate(items[:max(0, cap - first)]):
            found.setdefault((node_id, first + place), item_values(run_id, node_id, first + place, item, origin, names))
    return [found[key] for key in sorted(found)]


def counts(conn: Connection, run_id: str, node_ids: list[str] | None,
           items_only: bool) -> dict[str, dict[str, tuple[int, float | None]]]:
    """node_id -> status -> (how many rows, the earliest ``started_at``) as the view grouped by
    node and status gives (of ``node_ids``, or every node; items only, or every row). The rows
    are counted by SQL; a chunk's items are counted from its JSON here, one pass over the step's
    chunks instead of the view's per-item expansion and per-item check for a row."""
    query = select(nodes.c.node_id, _ROW["status"], func.count(), func.min(nodes.c.started_at)).where(
        nodes.c.run_key == run_key_of(run_id))
    if node_ids is not None:
        query = query.where(nodes.c.node_id.in_(node_ids))
    if items_only:
        query = query.where(nodes.c.fan_index >= 0)
    out: dict[str, dict[str, tuple[int, float | None]]] = {}
    for node_id, status, count, started in conn.execute(query.group_by(nodes.c.node_id, _ROW["status"])).all():
        out.setdefault(node_id, {})[status] = (int(count), None if started is None else float(started))
    chunks = _chunk_rows(conn, run_id, node_ids)
    shadowed = _row_keys(conn, run_id, sorted({c[0] for c in chunks})) if chunks else set()
    for node_id, first, items, _ in chunks:
        count, earliest = out.setdefault(node_id, {}).get(_COMPLETED, (0, None))
        starts = [item[0] for place, item in enumerate(items) if (node_id, first + place) not in shadowed]
        if starts:
            started = min(starts) / TICKS_PER_SECOND  # as the view computes it: exact
            count, earliest = count + len(starts), started if earliest is None or started < earliest else earliest
        out[node_id][_COMPLETED] = (count, earliest)
    return out


def sub_rows(conn: Connection, run_id: str, node_id: str, fan_index: int, limit: int,
             names: tuple[str, ...]) -> list[dict[str, Any]]:
    """The rows at ``fan_index`` whose node id starts with ``node_id@`` or ``node_id:`` (an agent's
    turns and tool calls, its compensation), by ``started_at`` then node id, at most ``limit``,
    with the view's columns ``names`` (``node_id`` and ``started_at`` among them), as the view
    ordered so gives them: SQLite puts a NULL ``started_at`` first, PostgreSQL last (and NaN after
    every number). Through the view the chunk part scanned the run's chunks and expanded each one
    of a matching node id to find the index; here the rows come ordered and limited by SQL, and
    only the chunks whose span can hold ``fan_index`` are read (none, unless a chunk's node id has
    such a prefix: raysaga writes plain items' chunks, and a step's name holds no ``@`` or ``:``),
    an item skipped when a row stands for it. Run it inside ``decoding.reading``."""
    rows_sql, chunks_sql = _sub_sql(names, conn.dialect.name)
    escaped = node_id.replace("/", "//").replace("%", "/%").replace("_", "/_")
    values = {"run_id": run_id, "index": fan_index, "turns": escaped + "@%", "undo": escaped + ":%",
              "low": node_id + ":", "high": node_id + "A"}
    rows = [dict(r._mapping) for r in conn.execute(rows_sql, {**values, "limit": limit}).all()]
    held: list[tuple[str, int, list[Element], str | None]] = []
    for n, first, stored, origin in conn.execute(chunks_sql, values).all():
        items = elements(run_id, n, first, stored)
        if fan_index - first < len(items):
            held.append((n, first, items, origin))
    if not held:
        return rows
    shadowed = set(conn.execute(select(nodes.c.node_id).where(  # a row wins over a chunk's entry
        nodes.c.run_key == run_key_of(run_id), nodes.c.fan_index == fan_index,
        nodes.c.node_id.in_([h[0] for h in held]))).scalars())
    rows += [item_values(run_id, n, fan_index, items[fan_index - first], origin, names)
             for n, first, items, origin in held if n not in shadowed]
    return sorted(rows, key=_start_order(conn.dialect.name))[:limit]


@functools.cache
def _sub_sql(names: tuple[str, ...], dialect: str) -> tuple[Select[Any], Select[Any]]:
    """``sub_rows``' statements (the rows; the chunks that can hold the index), built once: bound
    ``run_id``, ``index``, the LIKE patterns ``turns`` and ``undo`` (escaped with '/'), ``limit``,
    and on SQLite the key range ``low`` to ``high`` (``node:`` to ``nodeA``: ':' < '@' < 'A') that
    holds both prefixes in its BINARY order, so the run's other rows and chunks are not scanned
    (LIKE, case-insensitive there, cannot use the key; a PostgreSQL collation other than "C" need
    not order text by code point, so there the LIKE alone filters the run's rows and chunks)."""
    run_id, index = bindparam("run_id", type_=String), bindparam("index", type_=Integer)
    key = select(runs.c.run_key).where(runs.c.run_id == run_id).scalar_subquery()

    def under(column: Any) -> ColumnElement[bool]:
        like = or_(column.like(bindparam("turns", type_=String), escape="/"),
                   column.like(bindparam("undo", type_=String), escape="/"))
        if dialect != "sqlite":
            return like
        return and_(column >= bindparam("low", type_=String), column < bindparam("high", type_=String), like)

    rows = (select(*(run_id.label(n) if n == "run_id" else _ROW[n].label(n) for n in names))
            .where(nodes.c.run_key == key, nodes.c.fan_index == index, under(nodes.c.node_id))
            .order_by(nodes.c.started_at, nodes.c.node_id).limit(bindparam("limit", type_=Integer)))
    chunks = (select(item_chunks.c.node_id, item_chunks.c.first_index, _ITEMS, item_chunks.c.origin_run_id)
              .where(item_chunks.c.run_key == key, under(item_chunks.c.node_id), item_chunks.c.first_index <= index,
                     item_chunks.c.first_index > index - MAX_CHUNK_ITEMS))
    return rows, chunks


def _start_order(dialect: str) -> Callable[[dict[str, Any]], tuple[bool, bool, float, str]]:
    """A sort key giving rows as ``ORDER BY started_at, node_id`` does on ``dialect`` (node ids by
    code point: SQLite's BINARY; PostgreSQL's "C" collation, as ``node_reads.by_start`` assumes)."""
    def key(row: dict[str, Any]) -> tuple[bool, bool, float, str]:
        s = row["started_at"]
        nan = s is not None and math.isnan(s)
        return (s is not None if dialect == "sqlite" else s is None, nan, 0.0 if s is None or nan else s,
                row["node_id"])
    return key
