"""The store's fork rows (``raysaga.state.fork_rows``) on SQLite and PostgreSQL: a fork is created
whole or not at all, its inherited rows reference the parent's blobs (never copies), keep the run
that executed them through a fork of a fork, and keep the parent from being pruned while they stay; lineage and
inherited ledger rows read back; a definition re-pin is fenced."""

from __future__ import annotations

import uuid

import pytest
from sqlalchemy import func, select

from raysaga.errors import LeaseLostError, RunExistsError, RunNotFoundError
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


def test_prune_keeps_the_runs_a_fork_that_stays_inherits_from(store: SqlStore) -> None:
    """A fork reads the ledger rows of the runs it inherits from (a call's key, whether it took
    effect: ``Store.inherited_effects``) to roll back or be forked again. Stop 50 (a review): a prune
    deleted the parent while its fork stayed, and the fork's rollback then read an inherited payment
    as never sent and skipped its refund. The parent, and its own parent, stay while the fork does;
    pruned in the same call, they all go."""
    parent = f"p-{uuid.uuid4().hex[:6]}"
    digest = _completed_parent(store, parent)
    child = store.fork_run(_new(f"{parent}-c", parent, "b"), _keys(store, parent), {})
    grandchild = store.fork_run(_new(f"{parent}-g", child.run_id, "b"), _keys(store, child.run_id), {})
    lone = f"l-{uuid.uuid4().hex[:6]}"
    _completed_parent(store, lone)  # no fork: pruned
    for run_id in (child.run_id,):  # the middle run at rest too: the grandchild (pending) keeps both
        lease = store.claim(run_id, "me", 30)
        store.commit(lease, Batch(run=RunUpdate(status=RunStatus.RUNNING)))
        store.commit(lease, Batch(run=RunUpdate(status=RunStatus.COMPLETED)))
        store.release(lease)
    report = store.prune(older_than=0.0, statuses=[RunStatus.COMPLETED])
    assert {parent, child.run_id} <= set(report.kept), report
    assert store.get_run(parent).status == RunStatus.COMPLETED
    with pytest.raises(RunNotFoundError):
        store.get_run(lone)
    assert [(e.node_id, e.run_id, e.status) for e in store.inherited_effects(grandchild.run_id)] == \
        [("a", parent, EffectStatus.COMMITTED)]
    with store.engine.connect() as conn:
        rows = conn.execute(select(func.count()).select_from(node_rows).where(node_rows.c.run_id == child.run_id))
        assert rows.scalar_one() == 2
    assert store.load_blobs({digest: "a"})[digest] == BIG

    lease = store.claim(grandchild.run_id, "me", 30)  # the last fork ends: the three go together
    store.commit(lease, Batch(run=RunUpdate(status=RunStatus.RUNNING)))
    store.commit(lease, Batch(run=RunUpdate(status=RunStatus.COMPLETED)))
    store.release(lease)
    report = store.prune(older_than=0.0, statuses=[RunStatus.COMPLETED])
    assert not {parent, child.run_id, grandchild.run_id} & set(report.kept), report
    for run_id in (parent, child.run_id, grandchild.run_id):
        with pytest.raises(RunNotFoundError):
            store.get_run(run_id)


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


def test_a_run_kept_for_a_fork_keeps_the_fork_that_records_its_refund(store: SqlStore) -> None:
    """O ran a and b; U, a fork of O, rolled both back; V, a fork of O from b, undid a and is still
    compensating. V keeps O (it inherits from it), and O kept keeps U, the only record that O's b
    was given back: the rule that keeps undoers counted O as going, deleted U, and a later fork of O
    read b as standing (a review of the rule above)."""
    from raysaga.orchestrator.fork_refusals import undone_elsewhere

    o = f"o-{uuid.uuid4().hex[:6]}"
    _completed_parent(store, o)
    u = store.fork_run(_new(f"{o}-u", o, "c"), [("a", -1), ("b", -1)], {}).run_id
    lease = store.claim(u, "me", 30)
    for status in (RunStatus.RUNNING, RunStatus.COMPENSATING):
        store.commit(lease, Batch(run=RunUpdate(status=status)))
    store.commit(lease, Batch(nodes=[NodeWrite(node_id="b:compensate", status=NodeStatus.COMPLETED, attempt=1),
                                     NodeWrite(node_id="a:compensate", status=NodeStatus.COMPLETED, attempt=1)]))
    store.commit(lease, Batch(run=RunUpdate(status=RunStatus.COMPENSATED)))
    store.release(lease)
    v = store.fork_run(_new(f"{o}-v", o, "b"), [("a", -1)], {}).run_id
    lease = store.claim(v, "me", 30)
    for status in (RunStatus.RUNNING, RunStatus.COMPENSATING):  # it stays compensating: not prunable
        store.commit(lease, Batch(run=RunUpdate(status=status)))
    store.commit(lease, Batch(nodes=[NodeWrite(node_id="a:compensate", status=NodeStatus.COMPLETED, attempt=1)]))
    before = sorted(undone_elsewhere(store, o, store.nodes(o)))
    assert before == [("a", -1), ("b", -1)]
    report = store.prune(older_than=0.0)
    assert {o, u} <= set(report.kept), report
    assert sorted(undone_elsewhere(store, o, store.nodes(o))) == before
