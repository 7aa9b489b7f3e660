"""Paging a fan-out's items (``raysaga status``'s stream, the dashboard's item list) reads rows and
item chunks by their keys (``state/item_pages``), not every item through the view: the pages must
be what the view gives, item for item, on SQLite and PostgreSQL, whatever mix of chunks and rows
(retried items, lone items, a row written over a chunk's entry, other steps) a run holds."""

from __future__ import annotations

import random
import uuid
from typing import Any

import pytest
from sqlalchemy import event, select, text

from raysaga.errors import CorruptRecordError
from raysaga.state import Batch, NewRun, NodeStatus, NodeWrite, SqlStore, queries
from raysaga.state.models import ItemRow
from raysaga.state.schema import node_rows

T0 = 1_795_697_407.042_308_6
_LIGHT = tuple(c for c in node_rows.c if c.name not in ("run_id", "output", "error"))


def _new(run_id: str) -> NewRun:
    return NewRun(run_id=run_id, workflow_name="w", workflow_version="1", definition_hash="p" * 64,
                  trace_id=uuid.uuid4().hex)


def _mixed_run(store: SqlStore, rng: random.Random) -> str:
    """A run of step 'item' (and 'other') written in random batches: consecutive runs become
    chunks, lone items rows; some items retried first (a 'retrying' row the chunk replaces), some
    failed for good, one row written by hand over a chunk's entry."""
    run_id = "pages-" + uuid.uuid4().hex[:8]
    store.create_run(_new(run_id))
    lease = store.claim(run_id, "me", 30)
    order = list(range(400))
    rng.shuffle(order)
    order.sort(key=lambda i: (i // rng.choice((1, 7, 64)), rng.random()))  # runs of neighbours, some lone
    failed = set(rng.sample(range(400), 12))
    retried = set(rng.sample(range(400), 12)) - failed
    for i in retried:
        store.commit(lease, Batch(nodes=[NodeWrite(node_id="item", fan_index=i, status=NodeStatus.RETRYING,
                                                   attempt=1, error={"message": "flaky"}, started_at=T0)]))
    batch: list[ItemRow] = []
    for i in order:
        if i in failed:
            store.commit(lease, Batch(nodes=[NodeWrite(node_id="item", fan_index=i, status=NodeStatus.FAILED,
                                                       attempt=2, error={"message": "no"}, started_at=T0 + i)]))
            continue
        batch.append(("item", i, 2 if i in retried else 1, None if i % 3 else f'{{"i":{i}}}', None,
                      T0 + i * 1e-3, T0 + i * 1e-3 + 2.5e-6 * (i % 11)))
        if rng.random() < 0.1:
            store.commit(lease, Batch(items=batch))
            batch = []
    store.commit(lease, Batch(items=[*batch, *(("other", i, 1, "1", None, T0, T0 + 1.0) for i in range(5))]))
    shadow_a_chunked_item(store, run_id)
    return run_id


def shadow_a_chunked_item(store: SqlStore, run_id: str) -> None:
    """A hand-written row over the second item of the run's first chunk of ``item``: the row is the
    item's state (what a hand repair does), and every reader must say so."""
    with store.engine.begin() as conn:
        (shadow,) = conn.execute(text("SELECT c.first_index + 1 FROM raysaga_item_chunks c JOIN raysaga_runs r "
                                      "ON r.run_key = c.run_key WHERE r.run_id = :r AND c.node_id = 'item' "
                                      "ORDER BY c.first_index LIMIT 1"), {"r": run_id}).one()
        conn.execute(text("INSERT INTO raysaga_nodes (run_key, node_id, fan_index, status, attempt) "
                          "SELECT run_key, 'item', :i, 'cancelled', 9 FROM raysaga_runs WHERE run_id = :r"),
                     {"i": shadow, "r": run_id})


def _through_view(store: SqlStore, run_id: str, after: int, limit: int, status: str | None) -> list[dict[str, Any]]:
    query = select(*_LIGHT).where(node_rows.c.run_id == run_id, node_rows.c.node_id == "item",
                                  node_rows.c.fan_index > after)
    if status:
        query = query.where(node_rows.c.status == status)
    with store.reader.connect() as conn:
        return [dict(r._mapping) for r in conn.execute(query.order_by(node_rows.c.fan_index).limit(limit)).all()]


@pytest.mark.parametrize("seed", [1, 2])
def test_pages_are_what_the_view_gives(store: SqlStore, seed: int) -> None:
    rng = random.Random(seed)
    run_id = _mixed_run(store, rng)
    with store.reader.connect() as conn:
        chunked = conn.execute(text("SELECT count(*) FROM raysaga_item_chunks c JOIN raysaga_runs r "
                                    "ON r.run_key = c.run_key WHERE r.run_id = :r"), {"r": run_id}).scalar_one()
    assert chunked > 3  # the mix holds chunks
    for after in (-2, -1, 0, 5, 63, 64, 127, 128, 200, 398, 399, 1000):
        for limit in (1, 3, 64, 129, 500):
            for status in (None, "completed", "failed", "cancelled", "retrying"):
                want = _through_view(store, run_id, after, limit, status)
                assert store.fan_items(run_id, "item", after=after, limit=limit, status=status) == want, \
                    (after, limit, status)
    # the CLI's stream, in pages of 7: every row once, as the view gives them (no outputs)
    streamed = list(queries.iter_nodes(store, run_id, ["item", "other"], chunk=7))
    names = [c.name for c in node_rows.c if c.name not in ("run_id", "output")]
    with store.reader.connect() as conn:
        whole = [dict(r._mapping) for r in conn.execute(
            select(*[node_rows.c[n] for n in names]).where(node_rows.c.run_id == run_id)
            .order_by(node_rows.c.node_id, node_rows.c.fan_index)).all()]
    assert streamed == whole and len(whole) == 405


def test_a_damaged_chunk_is_one_error_naming_the_run(store: SqlStore) -> None:
    run_id = "pages-" + uuid.uuid4().hex[:8]
    store.create_run(_new(run_id))
    lease = store.claim(run_id, "me", 30)
    store.commit(lease, Batch(items=[("item", i, 1, None, None, T0 + i, T0 + i + 1.0) for i in range(4)]))
    with store.engine.begin() as conn:
        conn.execute(text("UPDATE raysaga_item_chunks SET items = '[[1, \"x\", null]]'"))
    with pytest.raises(CorruptRecordError, match=f"run {run_id!r}: .*raysaga_item_chunks.items"):
        store.fan_items(run_id, "item")
    with pytest.raises(CorruptRecordError, match=f"run {run_id!r}"):
        list(queries.iter_nodes(store, run_id, ["item"]))


def _view(store: SqlStore, run_id: str, where: Any = None) -> list[dict[str, Any]]:
    query = select(*_LIGHT).where(node_rows.c.run_id == run_id)
    if where is not None:
        query = query.where(where)
    with store.reader.connect() as conn:
        return [dict(r._mapping) for r in conn.execute(query.order_by(node_rows.c.node_id,
                                                                      node_rows.c.fan_index)).all()]


@pytest.mark.parametrize("seed", [3])
def test_the_dashboards_and_the_status_reads_are_what_the_view_gives(store: SqlStore, seed: int) -> None:
    """The run page's rows (first items of each fan-out), a live update's named rows, the item
    counts by status, and ``raysaga status``' step summary: read by key and from the chunks' JSON,
    equal to the view's (grouped) rows."""
    rng = random.Random(seed)
    run_id = _mixed_run(store, rng)
    with store.engine.begin() as conn:  # a plain step too, and a node that never started
        conn.execute(text("INSERT INTO raysaga_nodes (run_key, node_id, fan_index, status, attempt, started_at) "
                          "SELECT run_key, 'plan', -1, NULL, 1, :t FROM raysaga_runs WHERE run_id = :r"),
                     {"t": T0 - 5, "r": run_id})
    rows = _view(store, run_id)
    for cap in (0, 1, 63, 64, 65, 200, 1000):
        assert store.step_rows(run_id, cap) == [r for r in rows if r["fan_index"] < cap], cap
    keys = [(r["node_id"], r["fan_index"]) for r in rows]
    for size in (1, 5, 24, 60):
        wanted = sorted([*rng.sample(keys, size), ("item", 5000), ("nothing", 1)])
        assert store.node_rows(run_id, wanted) == [r for r in rows if (r["node_id"], r["fan_index"]) in wanted]
    by_status: dict[str, dict[str, int]] = {}
    first: dict[str, float] = {}
    for r in rows:
        if r["fan_index"] >= 0:
            by_status.setdefault(r["node_id"], {})
            by_status[r["node_id"]][r["status"]] = by_status[r["node_id"]].get(r["status"], 0) + 1
        if r["started_at"] is not None:
            first[r["node_id"]] = min(first.get(r["node_id"], r["started_at"]), r["started_at"])
    assert store.step_counts(run_id, ["item", "other", "plan", "nothing"]) == {
        "item": by_status["item"], "other": by_status["other"], "plan": {}, "nothing": {}}
    summary = {s.node_id: (s.first_started, s.rows, s.counts) for s in queries.steps(store, run_id)}
    assert summary == {
        node: (first.get(node), sum(1 for r in rows if r["node_id"] == node),
               {st: sum(1 for r in rows if r["node_id"] == node and r["status"] == st)
                for st in {r["status"] for r in rows if r["node_id"] == node}})
        for node in {r["node_id"] for r in rows}}


def test_one_node_row_is_read_by_key_as_the_view_gives_it(store: SqlStore) -> None:
    """The dashboard's node page (``node_row``: one node with its output and error) and ``raysaga
    status``' error of one node (``queries.node_error``) read the node's row, else the one chunk
    whose span holds its index, never the view (which expanded every item of the step to find
    one): the same columns, in the view's order, and values."""
    run_id = _mixed_run(store, random.Random(4))
    with store.engine.begin() as conn:  # a plain step with an output and one whose error is kept
        conn.execute(text("INSERT INTO raysaga_nodes (run_key, node_id, fan_index, status, attempt, output, error, "
                          "started_at) SELECT run_key, 'plan', -1, NULL, 1, '[1,2]', NULL, 5.0 "
                          "FROM raysaga_runs WHERE run_id = :r"), {"r": run_id})
    with store.reader.connect() as conn:
        view = {(r["node_id"], r["fan_index"]): r for r in (dict(row._mapping) for row in conn.execute(
            select(*node_rows.c).where(node_rows.c.run_id == run_id)).all())}
    assert len(view) == 406
    statements: list[str] = []

    def seen(conn: Any, cursor: Any, statement: str, *args: Any) -> None:
        statements.append(statement)

    event.listen(store.reader, "before_cursor_execute", seen)
    try:
        for key in [*view, ("item", 400), ("item", -1), ("nothing", 0), ("plan", 0)]:
            got = store.node_row(run_id, *key)
            want = view.get(key)
            assert (None if got is None else list(got.items())) == (None if want is None else list(want.items())), key
            # and ``raysaga status``' error of one node, alike
            assert queries.node_error(store, run_id, *key) == (None if want is None else
                                                               (want["status"], want["error"])), key
    finally:
        event.remove(store.reader, "before_cursor_execute", seen)
    assert statements and not [s for s in statements if "raysaga_node_rows" in s]
