"""A whole run's node rows (``SqlStore.snapshot``, ``SqlStore.nodes``, ``node_states``) are read by
the run's key, its item chunks expanded in Python (``state/node_reads``), not through the view
``raysaga_node_rows``: the records must be the view's, value for value and to the bit (``repr``
compared: -0.0 is not 0.0), ``nodes`` in the view's order, on SQLite and PostgreSQL, whatever mix
of chunks and rows a run holds (retried and failed items, lone items, blob outputs, odd clocks, a
row written over a chunk's entry, never-started nodes, a fork's inherited chunks)."""

from __future__ import annotations

import random
import uuid

import pytest
from sqlalchemy import select, text

from raysaga.state import Batch, NewRun, NodeStatus, NodeWrite, SqlStore
from raysaga.state.models import ItemRow, NodeRecord
from raysaga.state.schema import node_rows
from tests.state.test_item_pages import shadow_a_chunked_item

T0 = 1_795_697_407.042_308_6
#: outputs a JSON function could re-render (escapes, big and small numbers, nesting), and None
OUTPUTS = ['"a \\"q\\" \\\\ b"', '"\\ud800 lone"', '"\\u0000 nul"', "12345678901234567890123", "1e+308", "-0.0",
           '{"a":[1,{"b":null}],"z":"\u00e9\U0001f600"}', "true", None, "[]"]


def _new(run_id: str) -> NewRun:
    return NewRun(run_id=run_id, workflow_name="w", workflow_version="1", definition_hash="w" * 64,
                  trace_id=uuid.uuid4().hex)


def _mixed_run(store: SqlStore, rng: random.Random) -> str:
    run_id = "whole-" + uuid.uuid4().hex[:8]
    store.create_run(_new(run_id))
    lease = store.claim(run_id, "me", 30)
    store.put_blobs({"sha256:" + "a" * 64: b'"big"'})
    store.commit(lease, Batch(nodes=[
        NodeWrite(node_id="plan", status=NodeStatus.COMPLETED, attempt=1, output={"n": 300}, started_at=T0 - 9,
                  finished_at=T0 - 8),
        NodeWrite(node_id="never", status=NodeStatus.RUNNING, attempt=1),  # never started: last in nodes()
        NodeWrite(node_id="sink", status=NodeStatus.SKIPPED, attempt=0)]))
    order = list(range(300))
    rng.shuffle(order)
    order.sort(key=lambda i: (i // rng.choice((1, 5, 64)), rng.random()))  # runs of neighbours, some lone
    failed = set(rng.sample(range(300), 9))
    retried = set(rng.sample(range(300), 9)) - failed
    for i in retried:
        store.commit(lease, Batch(nodes=[NodeWrite(node_id="item", fan_index=i, status=NodeStatus.RETRYING,
                                                   attempt=1, error={"message": "flaky"}, started_at=T0)]))
    batch: list[ItemRow] = []
    for n, i in enumerate(order):
        if i in failed:
            store.commit(lease, Batch(nodes=[NodeWrite(node_id="item", fan_index=i, status=NodeStatus.FAILED,
                                                       attempt=2, error={"message": "no"}, started_at=T0 + i)]))
            continue
        started = T0 + i * 1e-3 if n % 50 else 1e-9 * i  # (a clock that says 1970: no whole ticks, a row)
        digest = "sha256:" + "a" * 64 if i % 97 == 5 else None  # a blob output: a row naming it
        batch.append(("item", i, 2 if i in retried else 1, None if digest else OUTPUTS[i % len(OUTPUTS)], digest,
                      started, started + 2.5e-6 * (i % 11)))
        if rng.random() < 0.1:
            store.commit(lease, Batch(items=batch))
            batch = []
    store.commit(lease, Batch(items=[*batch, *(("other", i, 1, "1", None, T0, T0 + 1.0) for i in range(5))]))
    shadow_a_chunked_item(store, run_id)
    return run_id


def _view(store: SqlStore, run_id: str, *, ordered: bool = False, outputs: bool = True) -> list[NodeRecord]:
    """The run's rows through the view, as the readers read them before (``nodes``' ORDER BY)."""
    query = select(*[c for c in node_rows.c if outputs or c.name != "output"]).where(node_rows.c.run_id == run_id)
    if ordered:
        query = query.order_by(node_rows.c.started_at.is_(None), node_rows.c.started_at, node_rows.c.node_id,
                               node_rows.c.fan_index)
    with store.reader.connect() as conn:
        return [NodeRecord.model_validate(dict(r._mapping)) for r in conn.execute(query).all()]


def _exact(records: list[NodeRecord], *, by_key: bool = True) -> list[str]:
    """Each record as text to compare to the bit (``repr``: -0.0 is not 0.0, 1 is not 1.0)."""
    if by_key:
        records = sorted(records, key=lambda n: (n.node_id, n.fan_index))
    return [repr(n.model_dump()) for n in records]


def _assert_same_as_the_view(store: SqlStore, run_id: str) -> None:
    view = _view(store, run_id)
    assert _exact(store.snapshot(run_id).nodes) == _exact(view)
    assert _exact(store.nodes(run_id), by_key=False) == _exact(_view(store, run_id, ordered=True), by_key=False)
    assert _exact(store.node_states(run_id)) == _exact(_view(store, run_id, outputs=False))
    assert len({(n.node_id, n.fan_index) for n in view}) == len(view)  # each node once


@pytest.mark.parametrize("seed", [1, 2, 3])
def test_whole_run_reads_are_the_views_rows(store: SqlStore, seed: int) -> None:
    rng = random.Random(seed)
    run_id = _mixed_run(store, rng)
    with store.reader.connect() as conn:
        chunked = conn.execute(text("SELECT count(*) FROM raysaga_item_chunks c JOIN raysaga_runs r "
                                    "ON r.run_key = c.run_key WHERE r.run_id = :r"), {"r": run_id}).scalar_one()
    assert chunked > 3  # the mix holds chunks, and rows
    assert len(store.nodes(run_id)) == 300 + 5 + 3
    _assert_same_as_the_view(store, run_id)
    # a fork inherits some items (chunks of its own, marked with the run that executed them)
    keys = sorted({(n.node_id, n.fan_index) for n in store.node_states(run_id) if n.status == NodeStatus.COMPLETED
                   and n.fan_index % 3 != seed % 3})
    child = "fork-" + uuid.uuid4().hex[:8]
    store.fork_run(_new(child).model_copy(update={"parent_run_id": run_id}), keys, {"from": "sink"})
    assert {n.origin_run_id for n in store.nodes(child)} == {run_id}
    _assert_same_as_the_view(store, child)


def test_a_run_with_no_chunks_and_an_unknown_run(store: SqlStore) -> None:
    run_id = "whole-" + uuid.uuid4().hex[:8]
    store.create_run(_new(run_id))
    lease = store.claim(run_id, "me", 30)
    store.commit(lease, Batch(items=[("item", 0, 1, "1", None, T0, T0 + 1.0)],
                              nodes=[NodeWrite(node_id="plan", status=NodeStatus.COMPLETED, attempt=1, output=[0],
                                               started_at=T0 - 1, finished_at=T0)]))
    _assert_same_as_the_view(store, run_id)
    assert store.nodes("no-such-run") == [] and store.node_states("no-such-run") == []

