"""Stop 30: a decision reads the node it names (``decisions._node_row``) by key, as the other
readers of one node do, not through the view ``raysaga_node_rows``: through it, a decision naming
a fan-out item read every chunk of its step (0.8 ms at 10,000 items, 10-31 ms at 100,000 on
SQLite, helper-36). The record must be the view's, whatever mix of chunks and rows holds it: a
chunk's entry, a lone item's row, a failed or retried item, a row written over a chunk's entry
(the row wins), a key that is not there, on SQLite and PostgreSQL."""

from __future__ import annotations

import random
import uuid

import pytest
from sqlalchemy import and_, select

from raysaga.state import SqlStore
from raysaga.state.decisions import _node_row
from raysaga.state.decoding import records
from raysaga.state.models import NodeRecord
from raysaga.state.schema import node_columns, node_rows
from tests.state.test_view_readers_stop30 import _chunked, _items, _new, _write_over_chunk


def _through_view(store: SqlStore, run_id: str, node: str, index: int) -> NodeRecord | None:
    with store.reader.connect() as conn:
        rows = conn.execute(select(*node_columns).where(and_(
            node_rows.c.run_id == run_id, node_rows.c.node_id == node, node_rows.c.fan_index == index))).all()
    found = records(NodeRecord, rows)
    return found[0] if found else None


@pytest.mark.parametrize("seed", [1, 2])
def test_a_decision_reads_its_node_as_the_view_gives_it(store: SqlStore, seed: int) -> None:
    rng = random.Random(seed)
    run_id = f"dec-{uuid.uuid4().hex[:8]}"
    store.create_run(_new(run_id))
    _items(store, run_id, rng, list(range(300)), effect_odds=0.0)
    spans = _chunked(store, run_id, "item")
    assert spans, "the mix holds no chunk: the test would read rows only"
    covered = [first + rng.randrange(count) for first, count, _ in rng.sample(spans, min(4, len(spans)))]
    for index in covered[:2]:
        _write_over_chunk(store, run_id, "item", index, None)
    keys = [("item", i) for i in (*covered, *rng.sample(range(300), 40), 300, 10_000)] + [("nothing", 3), ("item", -1)]
    with store.engine.connect() as conn:
        for node, index in keys:
            assert _node_row(conn, run_id, node, index) == _through_view(store, run_id, node, index), (node, index)
