"""Schema 12: a run of consecutive completed plain items is one ``raysaga_item_chunks`` row, and
every reader sees each item as it saw its own row: the same columns, the same values to the
bit, outputs exact; on SQLite and PostgreSQL.

The write side (``statements.item_writes``): which items join a chunk, which keep a row of their
own (a blob output, times that are no whole ticks, a lone item), and that a chunk replaces the
items' older rows (a retried item's ``retrying`` row) while a row written after it wins. The
rest of the store: a fork copies chunked items as rows, prune deletes and counts them.
"""

from __future__ import annotations

import uuid
from typing import Any

import pytest
from sqlalchemy import func, select, text, update

from raysaga.errors import CorruptRecordError
from raysaga.state import Batch, NewRun, NodeStatus, NodeWrite, SqlStore, queries
from raysaga.state.fork_rows import run_key_of
from raysaga.state.jsoncodec import loads
from raysaga.state.models import ItemRow
from raysaga.state.pruning import prune
from raysaga.state.schema import item_chunks, nodes, runs
from raysaga.state.statements import MAX_CHUNK_ITEMS, TICKS_PER_SECOND, HotSql, item_writes

T0 = 1_795_697_407.042_308_6
#: outputs a JSON function could re-render: escapes, a lone surrogate's escape, a NUL's, big and
#: small numbers, nesting, non-ASCII; and None (SQL NULL: the item returned None)
OUTPUTS = ['"a \\"quoted\\" \\\\ back"', '"\\ud800 lone"', '"\\u0000 nul"', "12345678901234567890123",
           "1e+308", "-0.0", '{"a":[1,{"b":null}],"z":"\u00e9\u4e2d\U0001f600"}', "true", None, '"\u2028"']


def _new(run_id: str) -> NewRun:
    return NewRun(run_id=run_id, workflow_name="w", workflow_version="1", definition_hash="c" * 64,
                  trace_id=uuid.uuid4().hex)


def _items(indexes: range | list[int], node_id: str = "item", attempt: int = 1) -> list[ItemRow]:
    return [(node_id, i, attempt, OUTPUTS[i % len(OUTPUTS)], None, T0 + i * 1e-3, T0 + i * 1e-3 + 3.7e-6 * (i + 1))
            for i in indexes]


def _chunks(store: SqlStore, run_id: str) -> list[tuple[str, int, int]]:
    with store.engine.connect() as conn:
        return [tuple(r) for r in conn.execute(
            select(item_chunks.c.node_id, item_chunks.c.first_index, item_chunks.c.item_count)
            .where(item_chunks.c.run_key == run_key_of(run_id)).order_by(item_chunks.c.node_id,
                                                                         item_chunks.c.first_index)).all()]


def _table_rows(store: SqlStore, run_id: str) -> set[tuple[str, int]]:
    with store.engine.connect() as conn:
        return {(r[0], r[1]) for r in conn.execute(select(nodes.c.node_id, nodes.c.fan_index).where(
            nodes.c.run_key == run_key_of(run_id))).all()}


def _run(store: SqlStore, batches: list[Batch]) -> str:
    run_id = "chunks-" + uuid.uuid4().hex[:8]
    store.create_run(_new(run_id))
    lease = store.claim(run_id, "me", 30)
    for batch in batches:
        store.commit(lease, batch)
    return run_id


def _want(items: list[ItemRow]) -> dict[tuple[str, int], tuple[Any, ...]]:
    """(node_id, fan_index) -> (status, attempt, output, digest, started, finished, duration) as read."""
    return {(n, i): ("completed", a, None if out is None else loads(out), d, s, f, f - s)
            for n, i, a, out, d, s, f in items}


def test_consecutive_items_are_one_row_and_every_reader_reads_each_item_back_exactly(store: SqlStore) -> None:
    items = _items(range(200))
    run_id = _run(store, [Batch(items=items)])
    assert _chunks(store, run_id) == [("item", 0, MAX_CHUNK_ITEMS), ("item", MAX_CHUNK_ITEMS, 200 - MAX_CHUNK_ITEMS)]
    assert _table_rows(store, run_id) == set()
    want = _want(items)

    def check(rows: list[tuple[Any, ...]], where: str) -> None:
        assert {(r[0], r[1]): tuple(r[2:]) for r in rows} == want, where

    light = {k: v[:2] + v[3:] for k, v in want.items()}  # readers without outputs
    for where, records in (("snapshot", store.snapshot(run_id).nodes), ("nodes", store.nodes(run_id))):
        check([(n.node_id, n.fan_index, n.status.value, n.attempt, n.output, n.output_digest, n.started_at,
                n.finished_at, n.duration) for n in records], where)
        assert all(n.run_id == run_id and n.error is None and n.not_before is None for n in records), where
    assert {(n.node_id, n.fan_index): (n.status.value, n.attempt, n.output_digest, n.started_at, n.finished_at,
                                       n.duration) for n in store.node_states(run_id)} == light
    for where, dicts in (("iter_nodes", list(queries.iter_nodes(store, run_id, ["item"], chunk=37))),
                         ("node_rows", store.node_rows(run_id, list(want))),
                         ("fan_items", store.fan_items(run_id, "item", limit=500))):
        assert {(r["node_id"], r["fan_index"]): (r["status"], r["attempt"], r["output_digest"], r["started_at"],
                                                 r["finished_at"], r["duration"]) for r in dicts} == light, where
    # paged on the key from the middle of a chunk, as the CLI and the dashboard page
    page = store.fan_items(run_id, "item", after=MAX_CHUNK_ITEMS - 3, limit=5)
    assert [r["fan_index"] for r in page] == list(range(MAX_CHUNK_ITEMS - 2, MAX_CHUNK_ITEMS + 3))
    for index in (0, 1, 2, 6, 9, MAX_CHUNK_ITEMS, 199):
        row = store.node_row(run_id, "item", index)
        assert row is not None and row["output"] == want[("item", index)][2], index
    assert store.step_counts(run_id, ["item"]) == {"item": {"completed": 200}}
    with store.engine.connect() as conn:  # plain SQL reads the view as it read the rows
        got = conn.execute(text("SELECT fan_index, status, finished_at FROM raysaga_node_rows WHERE run_id = :r "
                                "AND fan_index BETWEEN 126 AND 129 ORDER BY fan_index"), {"r": run_id}).all()
    assert [tuple(r) for r in got] == [(i, "completed", want[("item", i)][5]) for i in range(126, 130)]


def test_which_items_join_a_chunk() -> None:
    """Runs of 2+ consecutive indexes of one step, in completion order, capped; the rest rows."""
    blob = ("item", 5, 1, None, "sha256:" + "0" * 64, T0, T0 + 1.0)
    odd = ("item", 6, 1, "1", None, 1e-9, 3e-9)  # times that are no whole ticks (a clock before 2004)
    assert not (odd[5] * TICKS_PER_SECOND).is_integer()
    items = [*_items([0, 1, 2, 3, 4]), blob, odd, *_items([7, 8]), *_items([10]), *_items([20, 21], "other"),
             *_items([22]), *_items([12, 11])]
    writes = item_writes(9, items)
    assert [(c[1], c[2], c[3]) for c in writes.chunks] == [("item", 0, 5), ("item", 7, 2), ("other", 20, 2)]
    assert writes.spans == [(9, "item", 0, 4), (9, "item", 7, 8), (9, "other", 20, 21)]
    assert [(r[1], r[2]) for r in writes.rows] == [("item", 5), ("item", 6), ("item", 10), ("item", 22),
                                                   ("item", 12), ("item", 11)]
    assert [c[3] for c in item_writes(1, _items(range(MAX_CHUNK_ITEMS * 2 + 1))).chunks] == [
        MAX_CHUNK_ITEMS, MAX_CHUNK_ITEMS]  # and the last one alone, a row


def test_a_chunk_replaces_a_retried_items_row_and_a_later_row_wins(store: SqlStore) -> None:
    retrying = NodeWrite(node_id="item", fan_index=3, status=NodeStatus.RETRYING, attempt=1, not_before=T0 + 9,
                         error={"message": "flaky"}, started_at=T0, finished_at=T0 + 0.5)
    later = _items(range(8), attempt=2)
    run_id = _run(store, [Batch(items=_items([0, 1, 2]), nodes=[retrying]), Batch(items=later[3:])])
    assert _table_rows(store, run_id) == set()  # item 3's retrying row is gone: its chunk says completed
    states = {n.fan_index: (n.status, n.attempt, n.error) for n in store.nodes(run_id)}
    assert states == {**{i: (NodeStatus.COMPLETED, 1, None) for i in range(3)},
                      **{i: (NodeStatus.COMPLETED, 2, None) for i in range(3, 8)}}
    # a row written after the chunk (by hand, by a future writer) is the item's state: one row, not two
    with store.engine.begin() as conn:
        conn.execute(text("INSERT INTO raysaga_nodes (run_key, node_id, fan_index, status, attempt) VALUES "
                          "((SELECT run_key FROM raysaga_runs WHERE run_id = :r), 'item', 5, 'failed', 3)"),
                     {"r": run_id})
    rows = [n for n in store.nodes(run_id) if n.fan_index == 5]
    assert [(n.status, n.attempt) for n in rows] == [(NodeStatus.FAILED, 3)]
    assert len(store.nodes(run_id)) == 8


def test_a_batch_committed_twice_leaves_each_item_once(store: SqlStore) -> None:
    """An ambiguous commit's retry writes the same batch again: the same chunk, not a second one."""
    items = _items(range(70))
    run_id = "twice-" + uuid.uuid4().hex[:8]
    store.create_run(_new(run_id))
    lease = store.claim(run_id, "me", 30)
    store.commit(lease, Batch(items=items))
    store.commit(lease, Batch(items=items))
    assert _chunks(store, run_id) == [("item", 0, 70)]
    assert sorted(n.fan_index for n in store.nodes(run_id)) == list(range(70))


def test_one_statement_replaces_every_chunk_a_commit_overlaps(store: SqlStore, monkeypatch: pytest.MonkeyPatch) -> None:
    """A commit of several chunks, each written again over older ones (an ambiguous commit's retry
    with other neighbours), finds and deletes the older chunks in one statement, not one per
    chunk, and keeps their other items as rows: each item once, with its last write."""
    first = [*_items(range(0, 10)), *_items(range(20, 30)), *_items(range(40, 50), "other"), *_items(range(60, 64))]
    again = [*_items(range(5, 12), attempt=2), *_items(range(25, 27), attempt=3),
             *_items(range(44, 46), "other", attempt=4), *_items(range(200, 210))]
    run_id = _run(store, [Batch(items=first)])
    lease = store.claim(run_id, "again", 30, take_from="me")
    calls: list[str] = []
    real = HotSql.all

    def counted(hot: HotSql, statement: str, params: tuple[Any, ...]) -> list[Any]:
        calls.append(statement)
        return real(hot, statement, params)

    monkeypatch.setattr(HotSql, "all", counted)
    store.commit(lease, Batch(items=again))
    monkeypatch.undo()
    assert sum(1 for c in calls if c.startswith("DELETE FROM raysaga_item_chunks")) == 1
    assert _chunks(store, run_id) == [("item", 5, 7), ("item", 25, 2), ("item", 60, 4), ("item", 200, 10),
                                      ("other", 44, 2)]
    want = {**_want(first), **_want(again)}
    got = {(n.node_id, n.fan_index): (n.status.value, n.attempt, n.output, n.output_digest, n.started_at,
                                      n.finished_at, n.duration) for n in store.nodes(run_id)}
    assert got == want and len(store.nodes(run_id)) == len(want)


def test_a_fork_inherits_chunked_items_as_chunks_of_its_own(store: SqlStore) -> None:
    items = _items(range(10))
    parent = _run(store, [Batch(items=items, nodes=[NodeWrite(node_id="plan", status=NodeStatus.COMPLETED,
                                                              attempt=1, output=list(range(10)))])])
    child = "child-" + uuid.uuid4().hex[:8]
    store.fork_run(_new(child).model_copy(update={"parent_run_id": parent}),
                   [("plan", -1), *(("item", i) for i in (0, 1, 2, 7))], {"from": "item"})
    # each run of inherited items a chunk of the fork's (the step's chunks read once: a fork of a
    # 10,000-item run took 3.4 s through the view, quadratic), marked with the run that executed them
    assert _chunks(store, child) == [("item", 0, 3), ("item", 7, 1)] and _table_rows(store, child) == {("plan", -1)}
    want = _want(items)
    got = {(n.node_id, n.fan_index): n for n in store.nodes(child)}
    for i in (0, 1, 2, 7):
        n = got[("item", i)]
        assert (n.status.value, n.attempt, n.output, n.output_digest, n.started_at, n.finished_at,
                n.duration) == want[("item", i)]
        assert n.origin_run_id == parent
    assert got[("plan", -1)].output == list(range(10)) and len(got) == 5
    with store.engine.connect() as conn:  # stored as a driver stores a completed row: no status text
        stored = conn.execute(select(func.count()).where(nodes.c.run_key == run_key_of(child),
                                                         nodes.c.status.is_not(None))).scalar_one()
    assert stored == 0


def test_prune_deletes_chunks_and_counts_their_items(store: SqlStore) -> None:
    old = _run(store, [Batch(items=_items(range(150)))])
    kept = _run(store, [Batch(items=_items(range(30)))])
    old_key, kept_key = _keys(store, [old, kept])
    with store.engine.begin() as conn:
        conn.execute(update(runs).where(runs.c.run_id.in_([old, kept])).values(status="completed"))
        conn.execute(update(runs).where(runs.c.run_id == old).values(updated_at=1.0))
    dry = prune(store, 10, statuses=["completed"], dry_run=True, now=100.0)
    assert (dry.runs, dry.nodes) == (1, 150)
    done = prune(store, 10, statuses=["completed"], now=100.0)
    assert (done.runs, done.nodes) == (1, 150)
    with store.engine.connect() as conn:
        left = conn.execute(select(item_chunks.c.run_key, func.sum(item_chunks.c.item_count))
                            .group_by(item_chunks.c.run_key)).all()
    assert (kept_key, 30) in [tuple(r) for r in left] and old_key not in {r[0] for r in left}
    assert len(store.nodes(kept)) == 30


def _keys(store: SqlStore, run_ids: list[str]) -> list[int]:
    with store.engine.connect() as conn:
        return [int(conn.execute(select(runs.c.run_key).where(runs.c.run_id == r)).scalar_one()) for r in run_ids]


def test_a_chunk_changed_outside_raysaga_breaks_only_its_run(store: SqlStore) -> None:
    """Items that are not JSON (SQLite keeps any text) or a field of the wrong type: reading that
    run's nodes is one CorruptRecordError naming it; the other run reads as before."""
    damaged, fine = _run(store, [Batch(items=_items(range(5)))]), _run(store, [Batch(items=_items(range(5)))])
    bad_items = ['[[1, "x", 0.5, null]]', '{"a": 1}', '[[1]]']
    if store.engine.dialect.name == "sqlite":
        bad_items.insert(0, "not json")
    for bad in bad_items:
        with store.engine.begin() as conn:
            conn.execute(update(item_chunks).where(item_chunks.c.run_key == run_key_of(damaged))
                         .values(items=text(":bad" if store.engine.dialect.name == "sqlite" else "CAST(:bad AS JSON)")
                                 .bindparams(bad=bad)))
        # (a short element too: the view read its missing fields as NULL, an item with no finish;
        # the readers by key refuse it, as every reader in Python does since chunk_codec)
        with pytest.raises(CorruptRecordError, match=f"run {damaged!r}"):
            store.nodes(damaged)
        assert sorted(n.fan_index for n in store.nodes(fine)) == list(range(5)), bad


@pytest.mark.parametrize("bad", ["not json", '{"a": 1}', '[[1, "x", null]]', '[[1, 2, 3]]', "[[1, 2, null, true]]",
                                 "[[1]]", '[[1.5, 2, "1"]]', "[5]"])
def test_a_damaged_chunk_is_the_same_error_whether_a_page_or_the_commit_reads_it(store: SqlStore, bad: str) -> None:
    """One decoder of a chunk's items (``chunk_codec.elements``): a page of items (``item_pages``)
    and the driver's commit replacing the chunk (``statements.chunk_items``, an item written again)
    raise the same ``CorruptRecordError`` naming the run, the column and the item."""
    if bad == "not json" and store.engine.dialect.name != "sqlite":
        pytest.skip("PostgreSQL's json type refuses text that is not JSON")
    run_id = _run(store, [Batch(items=_items(range(4)))])
    with store.engine.begin() as conn:
        conn.execute(update(item_chunks).where(item_chunks.c.run_key == run_key_of(run_id))
                     .values(items=text(":bad" if store.engine.dialect.name == "sqlite" else "CAST(:bad AS JSON)")
                             .bindparams(bad=bad)))
    with pytest.raises(CorruptRecordError, match=f"run {run_id!r}: raysaga_item_chunks.items holds") as paged:
        store.fan_items(run_id, "item")
    lease = store.claim(run_id, "again", 30, take_from="me")
    with pytest.raises(CorruptRecordError) as committed:
        store.commit(lease, Batch(items=_items(range(1, 3))))
    assert str(committed.value) == str(paged.value)
    assert "the row was changed outside raysaga" in str(paged.value)
    # a fork inheriting the items copies no damaged chunk (nor fails with a TypeError): the same error
    child = _new("fork-" + uuid.uuid4().hex[:8]).model_copy(update={"parent_run_id": run_id})
    with pytest.raises(CorruptRecordError) as forked:
        store.fork_run(child, [("item", i) for i in range(4)], {"from": "sink"})
    assert str(forked.value) == str(paged.value)


def test_a_fork_of_a_fork_keeps_the_run_that_executed_the_items(store: SqlStore) -> None:
    items = _items(range(6))
    first = _run(store, [Batch(items=items)])
    middle, last = ("fork-" + uuid.uuid4().hex[:8] for _ in range(2))
    store.fork_run(_new(middle).model_copy(update={"parent_run_id": first}), [("item", i) for i in range(6)],
                   {"from": "sink"})
    store.fork_run(_new(last).model_copy(update={"parent_run_id": middle}), [("item", i) for i in (1, 2, 4)],
                   {"from": "item"})
    assert _chunks(store, middle) == [("item", 0, 6)] and _chunks(store, last) == [("item", 1, 2), ("item", 4, 1)]
    want = _want(items)
    for run_id, indexes in ((middle, range(6)), (last, (1, 2, 4))):
        got = {n.fan_index: n for n in store.nodes(run_id)}
        assert sorted(got) == list(indexes)
        for i in indexes:
            n = got[i]
            assert n.origin_run_id == first, (run_id, i)
            assert (n.status.value, n.attempt, n.output, n.output_digest, n.started_at, n.finished_at,
                    n.duration) == want[("item", i)]
        assert [r["origin_run_id"] for r in store.fan_items(run_id, "item")] == [first] * len(indexes)
