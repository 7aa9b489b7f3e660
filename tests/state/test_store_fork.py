"""The store's fork rows (``raysaga.state.fork_rows``) on SQLite and PostgreSQL: a fork is created
whole or not at all, its inherited rows reference the parent's blobs (never copies), keep the run
that executed them through a fork of a fork, and survive the parent being pruned; lineage and
inherited ledger rows read back; a definition re-pin is fenced."""

from __future__ import annotations

import uuid

import pytest
from sqlalchemy import func, select

from raysaga.errors import LeaseLostError, RunExistsError
from raysaga.state import (
    Batch,
    EffectStatus,
    EffectWrite,
    NewRun,
    NodeStatus,
    NodeWrite,
    RunStatus,
    RunUpdate,
    SqlStore,
    jsoncodec,
)
from raysaga.state.schema import blobs, node_rows

BIG = {"text": "x" * 100_000}


def _new(run_id: str, parent: str | None = None, forked_from: str | None = None) -> NewRun:
    return NewRun(run_id=run_id, workflow_name="w", workflow_version="1", definition_hash="0" * 64,
                  trace_id=uuid.uuid4().hex, input={"n": 1}, parent_run_id=parent, forked_from=forked_from,
                  step_hashes={"a": "1" * 16, "b": "2" * 16})


def _completed_parent(store: SqlStore, run_id: str) -> str:
    """A completed run: node ``a`` with a blob output, node ``b`` inline, an effect on ``a``; the blob's digest."""
    store.create_run(_new(run_id))
    lease = store.claim(run_id, "me", 30)
    data = jsoncodec.dumps(BIG).encode()
    digest = jsoncodec.digest(data)
    store.commit(lease, Batch(
        blobs={digest: data}, run=RunUpdate(status=RunStatus.RUNNING),
        nodes=[NodeWrite(node_id="a", status=NodeStatus.COMPLETED, attempt=1, output_digest=digest),
               NodeWrite(node_id="b", status=NodeStatus.COMPLETED, attempt=1, output=2)],
        effects=[EffectWrite(idempotency_key=f"rs-{run_id}-a", node_id="a", effect_name="a", args_digest="d",
                             status=EffectStatus.COMMITTED, result={"ok": True})]))
    store.commit(lease, Batch(run=RunUpdate(status=RunStatus.COMPLETED)))
    store.release(lease)
    return digest


def _keys(store: SqlStore, run_id: str) -> list[tuple[str, int]]:
    return [(r.node_id, r.fan_index) for r in store.node_states(run_id)]


def _blob_count(store: SqlStore) -> int:
    with store.engine.connect() as conn:
        return int(conn.execute(select(func.count()).select_from(blobs)).scalar_one())


def test_a_fork_references_its_parents_blobs_and_reads_back(store: SqlStore) -> None:
    parent = f"p-{uuid.uuid4().hex[:6]}"
    digest = _completed_parent(store, parent)
    blobs_before = _blob_count(store)
    child = store.fork_run(_new(f"{parent}-c", parent, "b"), [("a", -1)], {"parent": parent, "from": "b"})
    assert (child.status, child.parent_run_id, child.forked_from) == (RunStatus.PENDING, parent, "b")
    assert child.step_hashes == {"a": "1" * 16, "b": "2" * 16}
    assert _blob_count(store) == blobs_before  # referenced, not copied
    [row] = store.nodes(child.run_id)
    assert (row.node_id, row.status, row.output_digest, row.origin_run_id) == ("a", NodeStatus.COMPLETED, digest,
                                                                               parent)
    assert store.load_blobs({digest: "a"})[digest] == BIG
    light = sorted(store.node_states(parent), key=lambda r: r.node_id)
    assert [(r.node_id, r.output, r.output_digest) for r in light] == [("a", None, digest), ("b", None, None)]
    assert [(e.node_id, e.run_id) for e in store.inherited_effects(child.run_id)] == [("a", parent)]
    assert store.effects(child.run_id) == []
    assert [(c["run_id"], c["forked_from"], c["status"]) for c in store.children(parent)] == \
        [(child.run_id, "b", "pending")]
    assert [e.kind for e in store.events(child.run_id)] == ["run_created", "run_forked"]

    # a fork of the fork keeps the run that executed the node
    grandchild = store.fork_run(_new(f"{parent}-g", child.run_id, "b"), _keys(store, child.run_id), {})
    assert [r.origin_run_id for r in store.nodes(grandchild.run_id)] == [parent]
    assert [e.run_id for e in store.inherited_effects(grandchild.run_id)] == [parent]


def test_a_fork_is_created_whole_or_not_at_all(store: SqlStore) -> None:
    parent = f"p-{uuid.uuid4().hex[:6]}"
    _completed_parent(store, parent)
    with pytest.raises(RunExistsError):
        store.fork_run(_new(parent, parent, "b"), _keys(store, parent), {})  # the id is taken: nothing is written
    assert len(store.nodes(parent)) == 2 and store.children(parent) == []


def test_the_forks_rows_survive_the_parents_prune(store: SqlStore) -> None:
    parent = f"p-{uuid.uuid4().hex[:6]}"
    digest = _completed_parent(store, parent)
    child = store.fork_run(_new(f"{parent}-c", parent, "b"), _keys(store, parent), {})
    report = store.prune(older_than=0.0, statuses=[RunStatus.COMPLETED])
    assert report.runs >= 1
    with store.engine.connect() as conn:
        kept = conn.execute(select(func.count()).select_from(node_rows).where(node_rows.c.run_id == child.run_id))
        assert kept.scalar_one() == 2
    assert store.load_blobs({digest: "a"})[digest] == BIG  # still referenced by the fork


def test_a_repin_is_fenced_and_recorded(store: SqlStore) -> None:
    run_id = f"r-{uuid.uuid4().hex[:6]}"
    store.create_run(_new(run_id))
    lease = store.claim(run_id, "me", 30)
    record = store.repin_definition(lease, "f" * 64, {"a": "9" * 16}, {"changed": ["a"]})
    assert (record.definition_hash, record.step_hashes) == ("f" * 64, {"a": "9" * 16})
    assert store.events(run_id)[-1].kind == "definition_changed"
    store.release(lease)
    store.claim(run_id, "other", 30)
    with pytest.raises(LeaseLostError):
        store.repin_definition(lease, "e" * 64, {}, {})
    assert store.get_run(run_id).definition_hash == "f" * 64
