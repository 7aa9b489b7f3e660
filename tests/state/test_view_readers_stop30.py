"""The last readers of node rows through the view ``raysaga_node_rows``, read by key instead: a
fork's inherited ledger rows (``Store.inherited_effects``: ``raysaga status`` and replay) and an
agent's turns, tool calls and compensation rows (``Store.sub_rows``: the dashboard, ``status``'
token counts). Each must be what the view gives, row for row and in its order, on SQLite and
PostgreSQL, whatever mix of chunks and rows the runs hold: retried and failed items, lone items,
a fork's inherited chunks and rows, a grandchild's (two origins), and rows written over a chunk's
entry (the row wins: what it says is the node's state, whoever ran it)."""

from __future__ import annotations

import random
import uuid
from typing import Any

import pytest
from sqlalchemy import and_, or_, select, text

from raysaga.state import Batch, NewRun, NodeStatus, NodeWrite, SqlStore
from raysaga.state.models import EffectRecord, EffectStatus, EffectWrite, ItemRow
from raysaga.state.schema import effects, node_columns, node_rows

T0 = 1_795_697_407.042_308_6


def _new(run_id: str, parent: str | None = None) -> NewRun:
    return NewRun(run_id=run_id, workflow_name="w", workflow_version="1", definition_hash="v" * 64,
                  trace_id=uuid.uuid4().hex, parent_run_id=parent)


def _effect(run_id: str, node_id: str, index: int) -> EffectWrite:
    return EffectWrite(idempotency_key=f"{run_id}/{node_id}/{index}", node_id=node_id, fan_index=index,
                       effect_name="charge", args_digest="d" * 64, status=EffectStatus.COMMITTED, result={"i": index})


def _items(store: SqlStore, run_id: str, rng: random.Random, indexes: list[int], *, node_id: str = "item",
           effect_odds: float = 0.5) -> None:
    """Commit the completed items ``indexes`` of ``node_id`` in random batches of runs of neighbours
    (chunks, and lone items), some retried first (a row the chunk replaces), some failed for good
    (rows), about ``effect_odds`` of them with a ledger row of their own."""
    lease = store.claim(run_id, "me", 30)
    order = list(indexes)
    rng.shuffle(order)
    order.sort(key=lambda i: (i // rng.choice((1, 5, 64)), rng.random()))
    failed = set(rng.sample(order, len(order) // 30))
    retried = set(rng.sample(order, len(order) // 30)) - failed
    for i in retried:
        store.commit(lease, Batch(nodes=[NodeWrite(node_id=node_id, fan_index=i, status=NodeStatus.RETRYING,
                                                   attempt=1, error={"message": "flaky"}, started_at=T0)]))
    batch: list[ItemRow] = []
    ledger: list[EffectWrite] = []
    for i in order:
        if rng.random() < effect_odds:
            ledger.append(_effect(run_id, node_id, i))
        if i in failed:
            store.commit(lease, Batch(nodes=[NodeWrite(node_id=node_id, fan_index=i, status=NodeStatus.FAILED,
                                                       attempt=2, error={"message": "no"}, started_at=T0 + i)]))
            continue
        batch.append((node_id, i, 2 if i in retried else 1, f'{{"i":{i}}}' if i % 3 else None, None,
                      T0 + i * 1e-3, T0 + i * 1e-3 + 2.5e-6 * (i % 11)))
        if rng.random() < 0.1:
            store.commit(lease, Batch(items=batch, effects=ledger))
            batch, ledger = [], []
    store.commit(lease, Batch(items=batch, effects=ledger))
    store.release(lease)


def _write_over_chunk(store: SqlStore, run_id: str, node_id: str, index: int, origin: str | None) -> None:
    """A row written over a chunk's entry (by hand: raysaga's writes replace the chunk's entry)."""
    with store.engine.begin() as conn:
        conn.execute(text("INSERT INTO raysaga_nodes (run_key, node_id, fan_index, status, attempt, origin_run_id) "
                          "SELECT run_key, :n, :i, 'cancelled', 9, :o FROM raysaga_runs WHERE run_id = :r"),
                     {"n": node_id, "i": index, "o": origin, "r": run_id})


def _chunked(store: SqlStore, run_id: str, node_id: str) -> list[tuple[int, int, str | None]]:
    """(first_index, item_count, origin_run_id) of the run's chunks of ``node_id``."""
    with store.reader.connect() as conn:
        return [(r[0], r[1], r[2]) for r in conn.execute(
            text("SELECT c.first_index, c.item_count, c.origin_run_id FROM raysaga_item_chunks c JOIN raysaga_runs r "
                 "ON r.run_key = c.run_key WHERE r.run_id = :r AND c.node_id = :n ORDER BY c.first_index"),
            {"r": run_id, "n": node_id}).all()]


def _view_ledger(store: SqlStore, run_id: str) -> list[dict[str, Any]]:
    """``inherited_effects`` as it was read: the ledger joined to the view on the node's origin."""
    origin = node_rows.alias("origin")
    query = (select(effects).join(origin, and_(effects.c.run_id == origin.c.origin_run_id,
                                               effects.c.node_id == origin.c.node_id,
                                               effects.c.fan_index == origin.c.fan_index))
             .where(origin.c.run_id == run_id, origin.c.origin_run_id.is_not(None))
             .order_by(effects.c.created_at, effects.c.idempotency_key))
    with store.reader.connect() as conn:
        return [EffectRecord.model_validate(r._asdict()).model_dump() for r in conn.execute(query).all()]


def _ledger(store: SqlStore, run_id: str) -> list[dict[str, Any]]:
    return [e.model_dump() for e in store.inherited_effects(run_id)]


@pytest.mark.parametrize("seed", [1, 2, 3])
def test_inherited_effects_are_the_views(store: SqlStore, seed: int) -> None:
    rng = random.Random(seed)
    parent = "p-" + uuid.uuid4().hex[:8]
    store.create_run(_new(parent))
    lease = store.claim(parent, "me", 30)
    store.commit(lease, Batch(
        nodes=[NodeWrite(node_id="plan", status=NodeStatus.COMPLETED, attempt=1, output={"n": 300}, started_at=T0),
               NodeWrite(node_id="agent", status=NodeStatus.COMPLETED, attempt=1, started_at=T0),
               NodeWrite(node_id="agent@1.1", status=NodeStatus.COMPLETED, attempt=1, started_at=T0)],
        effects=[_effect(parent, "plan", -1), _effect(parent, "agent@1.1", -1)]))
    store.release(lease)
    _items(store, parent, rng, list(range(300)))
    _items(store, parent, rng, list(range(40)), node_id="other", effect_odds=1.0)

    # the fork inherits a random part of what completed, then runs the rest itself (its own ledger)
    done = [(n.node_id, n.fan_index) for n in store.node_states(parent) if n.status == NodeStatus.COMPLETED]
    inherited = sorted(k for k in done if rng.random() < 0.7 or k[0] == "agent@1.1")
    child = "c-" + uuid.uuid4().hex[:8]
    store.fork_run(_new(child, parent), inherited, {"from": "item"})
    _items(store, child, rng, sorted({i for n, i in done if n == "item"} - {i for n, i in inherited if n == "item"}))
    # rows over the fork's inherited chunk entries whose items have a ledger row in the parent: one
    # the fork ran again (no origin: the parent's ledger row is not inherited), one still the parent's
    parents = {(e.node_id, e.fan_index) for e in store.effects(parent)}
    spans = [s for s in _chunked(store, child, "item") if s[2] == parent]
    over = sorted(i for first, count, _ in spans for i in range(first, first + count) if ("item", i) in parents)
    assert len(over) >= 2
    _write_over_chunk(store, child, "item", over[0], None)
    _write_over_chunk(store, child, "item", over[-1], parent)
    _write_over_chunk(store, child, "other", _chunked(store, child, "other")[0][0], "someone-else")

    want = _view_ledger(store, child)
    assert _ledger(store, child) == want
    kept = {(e["node_id"], e["fan_index"]) for e in want}
    assert ("item", over[0]) not in kept and ("item", over[-1]) in kept and ("agent@1.1", -1) in kept
    assert {e["run_id"] for e in want} == {parent}

    # a fork of the fork: its nodes came from two runs
    done = [(n.node_id, n.fan_index) for n in store.node_states(child) if n.status == NodeStatus.COMPLETED]
    grandchild = "g-" + uuid.uuid4().hex[:8]
    store.fork_run(_new(grandchild, child), sorted(k for k in done if rng.random() < 0.8), {"from": "sink"})
    spans = [s for s in _chunked(store, grandchild, "item") if s[2] == child]
    if spans:
        _write_over_chunk(store, grandchild, "item", spans[0][0], None)
    want = _view_ledger(store, grandchild)
    assert _ledger(store, grandchild) == want
    assert {e["run_id"] for e in want} == {parent, child}
    assert _ledger(store, parent) == _view_ledger(store, parent) == []  # nothing inherited
    assert store.inherited_effects("no-such-run") == []


def _view_subs(store: SqlStore, run_id: str, node_id: str, fan_index: int, limit: int) -> list[dict[str, Any]]:
    """``sub_rows`` as it was read: the view, filtered on the id's prefixes, by start."""
    view = node_rows
    query = select(*node_columns).where(view.c.run_id == run_id, view.c.fan_index == fan_index, or_(
        view.c.node_id.startswith(node_id + "@", autoescape=True),
        view.c.node_id.startswith(node_id + ":", autoescape=True)))
    with store.reader.connect() as conn:
        return [dict(r._mapping) for r in conn.execute(query.order_by(view.c.started_at, view.c.node_id)
                                                       .limit(limit)).all()]


@pytest.mark.parametrize("seed", [1, 2])
def test_sub_rows_are_the_views(store: SqlStore, seed: int) -> None:
    rng = random.Random(seed)
    run_id = "s-" + uuid.uuid4().hex[:8]
    store.create_run(_new(run_id))
    lease = store.claim(run_id, "me", 30)
    rows: list[NodeWrite] = []
    for owner in ("agent", "a_b", "axb", "agentx"):  # ('_' is LIKE's wildcard: 'axb@' is not under 'a_b')
        for index in (-1, 3, 5):
            for name in rng.sample(["@1", "@2", "@2.1", "@2.2", "@10", "@3", ":compensate", "@4.1"], 6):
                started = rng.choice([None, T0, T0 + rng.random(), T0 + 2.0])  # ties on start; never started
                rows.append(NodeWrite(node_id=owner + name, fan_index=index, status=NodeStatus.COMPLETED, attempt=1,
                                      output={"usage": {"input_tokens": 3}}, started_at=started,
                                      finished_at=None if started is None else started + 0.5))
    store.commit(lease, Batch(nodes=rows))
    # items under such ids (raysaga writes chunks for plain items only; the view shows any chunk):
    # chunks holding index 3 or 5 (an item's start ties a row's), a lone item (a row), and rows
    # written over some chunk entries
    for name, indexes in (("agent@7", range(8)), ("agent@8", range(2, 5)), ("agent:undo", range(4, 10)),
                          ("a_b@9", range(6)), ("agent@11", range(3, 4))):
        store.commit(lease, Batch(items=[(name, i, 1, f'{{"i":{i}}}', None, T0 + (i % 2) * 1e-3, T0 + 1.0)
                                         for i in indexes]))
    store.release(lease)
    for name, index in (("agent@7", 3), ("agent:undo", 5), ("a_b@9", 3)):
        _write_over_chunk(store, run_id, name, index, None)
    shown = 0
    for node_id in ("agent", "a_b", "axb", "agentx", "agent@2", "nothing"):
        for fan_index in (-1, 3, 4, 5, 200):
            for limit in (1, 3, 7, 400):
                want = _view_subs(store, run_id, node_id, fan_index, limit)
                assert store.sub_rows(run_id, node_id, fan_index, limit) == want, (node_id, fan_index, limit)
                shown += len(want)
    assert shown > 100
    with store.reader.connect() as conn:  # the mix holds chunks of such ids where the rows are
        assert conn.execute(text("SELECT count(*) FROM raysaga_item_chunks c JOIN raysaga_runs r ON r.run_key = "
                                 "c.run_key WHERE r.run_id = :r AND c.node_id LIKE 'agent@%' AND c.first_index <= 3 "
                                 "AND c.first_index + c.item_count > 3"), {"r": run_id}).scalar_one() >= 2
