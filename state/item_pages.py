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

from typing import Any

from sqlalchemy import ColumnElement, Connection, func, literal, select

from raysaga.errors import CorruptRecordError
from raysaga.state import jsoncodec
from raysaga.state.models import NodeStatus
from raysaga.state.schema import item_chunks, nodes, runs
from raysaga.state.statements import MAX_CHUNK_ITEMS, TICKS_PER_SECOND

_COMPLETED = NodeStatus.COMPLETED.value
#: The view's columns over ``raysaga_nodes`` (its first part, migration 0012), by name; ``run_id``
#: is the page's own.
_ROW: dict[str, ColumnElement[Any]] = {
    **{c.name: c for c in nodes.c if c.name != "run_key"},
    "status": func.coalesce(nodes.c.status, _COMPLETED).label("status"),
    "finished_at": func.coalesce(nodes.c.finished_at, nodes.c.started_at + nodes.c.duration).label("finished_at"),
}


def _run_key(run_id: str) -> Any:
    return select(runs.c.run_key).where(runs.c.run_id == run_id).scalar_subquery()


def page(conn: Connection, run_id: str, node_id: str, after: int, limit: int, names: tuple[str, ...],
         status: str | None = None) -> list[dict[str, Any]]:
    """The items of ``node_id`` after index ``after``, by index, at most ``limit``, with the view's
    columns ``names`` (optionally only those in ``status``). Run it inside ``decoding.reading``: a
    chunk changed outside raysaga raises ``CorruptRecordError``."""
    columns = [literal(run_id).label("run_id") if name == "run_id" else _ROW[name].label(name) for name in names]
    query = select(*columns).where(nodes.c.run_key == _run_key(run_id), nodes.c.node_id == node_id,
                                   nodes.c.fan_index > after)
    if status:
        query = query.where(_ROW["status"] == status)
    found = {row.fan_index: dict(row._mapping) for row in conn.execute(query.order_by(nodes.c.fan_index)
                                                                        .limit(limit)).all()}
    if not status or status == _COMPLETED:
        key = _run_key(run_id)
        chunks = conn.execute(select(item_chunks.c.first_index, item_chunks.c["items"], item_chunks.c.origin_run_id)
                              .where(item_chunks.c.run_key == key, item_chunks.c.node_id == node_id,
                                     item_chunks.c.first_index > after - MAX_CHUNK_ITEMS)
                              .order_by(item_chunks.c.first_index).limit(limit + MAX_CHUNK_ITEMS)).all()
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
                    found[index] = _item(run_id, node_id, index, item, origin, names)
            if taken >= limit:
                break
    return [found[index] for index in sorted(found)[:limit]]


def _item(run_id: str, node_id: str, index: int, item: Any, origin: str | None,
          names: tuple[str, ...]) -> dict[str, Any]:
    """A chunk's item as the view shows it (migration 0012's SQL, computed alike: exact)."""
    if not (isinstance(item, list) and 3 <= len(item) <= 4 and all(type(v) is int for v in (*item[:2], *item[3:]))
            and (item[2] is None or isinstance(item[2], str))):
        raise CorruptRecordError(f"{item_chunks.name}.items holds {jsoncodec.dumps(item)[:80]!r} for item "
                                 f"{index}, not [start, duration, output(, attempt)]")
    start, took, output = item[0], item[1], item[2]
    started, finished = start / TICKS_PER_SECOND, (start + took) / TICKS_PER_SECOND
    values = {"run_id": run_id, "node_id": node_id, "fan_index": index, "status": _COMPLETED,
              "attempt": item[3] if len(item) == 4 else 1, "not_before": None, "output_digest": None, "error": None,
              "started_at": started, "finished_at": finished, "duration": finished - started, "origin_run_id": origin}
    if "output" in names:
        values["output"] = None if output is None else jsoncodec.loads(output)
    return {name: values[name] for name in names}
