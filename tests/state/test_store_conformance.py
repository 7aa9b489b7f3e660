"""Store conformance: every behaviour of the ``Store`` contract, on SQLite and PostgreSQL.

Each test runs twice through the ``store`` fixture (a fresh SQLite file; the session's
PostgreSQL database when ``RAYSAGA_TEST_PG_URL`` is set). The PostgreSQL database is shared
by the whole session, so every test uses its own run ids, effect keys and blob contents and
inspects rows by ``run_id``.

"Writes nothing" is checked with ``footprint``: every row that belongs to a run (the run row,
its nodes, effects, events and signals) read straight from the tables, plus the blob count,
compared before and after the refused call.
"""

from __future__ import annotations

import math
import os
import time
import uuid
from collections import deque
from collections.abc import Callable
from typing import Any

import pytest
from sqlalchemy import func, select, update

from raysaga.errors import (
    ConcurrencyConflict,
    IllegalTransitionError,
    LeaseHeldError,
    LeaseLostError,
    NotJSONableError,
    RunExistsError,
    RunNotFoundError,
)
from raysaga.state import (
    Batch,
    EffectStatus,
    EffectWrite,
    Lease,
    NewEvent,
    NewRun,
    NodeStatus,
    NodeWrite,
    RunStatus,
    RunUpdate,
    SqlStore,
)
from raysaga.state.jsoncodec import digest
from raysaga.state.models import ALLOWED, TERMINAL
from raysaga.state.schema import blobs, effects, events, node_rows, nodes, runs, signals

# ------------------------------------------------------------------ helpers


def uid(prefix: str) -> str:
    return f"{prefix}-{uuid.uuid4().hex[:12]}"


def new_run(run_id: str | None = None, **fields: Any) -> NewRun:
    values: dict[str, Any] = {
        "run_id": run_id or uid("run"),
        "workflow_name": "wf",
        "workflow_version": "1",
        "definition_hash": "d" * 64,
        "trace_id": uuid.uuid4().hex,
    }
    values.update(fields)
    return NewRun(**values)


def footprint(store: SqlStore, run_id: str) -> dict[str, Any]:
    """Every stored row of ``run_id``, read from the tables in primary-key order, plus the blob count."""
    order = {
        runs: [runs.c.run_id],
        node_rows: [node_rows.c.node_id, node_rows.c.fan_index],  # by run id: the view (schema 8)
        effects: [effects.c.idempotency_key],
        events: [events.c.seq],
        signals: [signals.c.id],
    }
    out: dict[str, Any] = {}
    with store.engine.connect() as conn:
        for table, keys in order.items():
            rows = conn.execute(select(table).where(table.c.run_id == run_id).order_by(*keys)).all()
            out[nodes.name if table is node_rows else table.name] = [r._asdict() for r in rows]
        out["blob_count"] = conn.execute(select(func.count()).select_from(blobs)).scalar_one()
    return out


def expire_lease(store: SqlStore, run_id: str) -> None:
    """Move the lease's expiry into the past, as if its driver had stopped heartbeating."""
    with store.engine.begin() as conn:
        conn.execute(update(runs).where(runs.c.run_id == run_id).values(lease_expires_at=time.time() - 1.0))


def effect(key: str, status: EffectStatus, **fields: Any) -> EffectWrite:
    values: dict[str, Any] = {"idempotency_key": key, "node_id": "charge", "effect_name": "stripe.charge",
                              "args_digest": "a" * 64, "status": status}
    values.update(fields)
    return EffectWrite(**values)


def path_to(target: RunStatus) -> list[RunStatus]:
    """The shortest legal sequence of statuses leading from pending to ``target``."""
    queue: deque[tuple[RunStatus, list[RunStatus]]] = deque([(RunStatus.PENDING, [])])
    seen = {RunStatus.PENDING}
    while queue:
        status, path = queue.popleft()
        if status == target:
            return path
        for nxt in sorted(ALLOWED[status]):
            if nxt not in seen:
                seen.add(nxt)
                queue.append((nxt, [*path, nxt]))
    raise AssertionError(f"{target} is unreachable from pending")


def drive_to(store: SqlStore, target: RunStatus) -> str:
    run_id = store.create_run(new_run()).run_id
    for i, status in enumerate(path_to(target)):
        store.transition(run_id, i, status)
    assert store.get_run(run_id).status == target
    return run_id


def seqs(store: SqlStore, run_id: str) -> list[int]:
    return [e.seq for e in store.events(run_id)]


# ------------------------------------------------------------------ runs


def test_create_run_starts_pending_with_one_event(store: SqlStore) -> None:
    payload = {"name": "Zoë ✓", "n": 2**53, "x": 0.1, "items": [1, None, True, {"k": "v"}], "empty": {}}
    new = new_run(input=payload, deadline_at=1.5e9, retry_budget=7)
    before = time.time()
    rec = store.create_run(new)

    assert rec.run_id == new.run_id
    assert rec.status == RunStatus.PENDING
    assert (rec.version, rec.fence, rec.event_seq) == (0, 0, 1)
    assert rec.input == payload
    assert (rec.workflow_name, rec.workflow_version, rec.definition_hash) == ("wf", "1", "d" * 64)
    assert (rec.deadline_at, rec.retry_budget, rec.trace_id) == (1.5e9, 7, new.trace_id)
    assert rec.lease_owner is None and rec.lease_expires_at is None
    assert before <= rec.created_at <= time.time()
    assert store.get_run(new.run_id) == rec
    [event] = store.events(new.run_id)
    assert (event.seq, event.kind) == (1, "run_created")


def test_create_duplicate_id_raises_and_keeps_original(store: SqlStore) -> None:
    original = store.create_run(new_run(input={"v": 1}))
    before = footprint(store, original.run_id)

    with pytest.raises(RunExistsError) as exc:
        store.create_run(new_run(original.run_id, workflow_name="other", input={"v": 2}))

    assert exc.value.run_id == original.run_id
    assert footprint(store, original.run_id) == before
    assert store.get_run(original.run_id).input == {"v": 1}


def test_unknown_run_raises_not_found(store: SqlStore) -> None:
    missing = uid("missing")
    calls: dict[str, Callable[[], object]] = {
        "get_run": lambda: store.get_run(missing),
        "snapshot": lambda: store.snapshot(missing),
        "transition": lambda: store.transition(missing, 0, RunStatus.RUNNING),
        "claim": lambda: store.claim(missing, "driver", 30.0),
        "send_signal": lambda: store.send_signal(missing, "cancel"),
    }
    for name, call in calls.items():
        with pytest.raises(RunNotFoundError) as exc:
            call()
        assert exc.value.run_id == missing, name
    assert footprint(store, missing)["raysaga_runs"] == []
    assert footprint(store, missing)["raysaga_signals"] == []


def test_list_runs_newest_first_filter_and_limit(store: SqlStore) -> None:
    ids = [store.create_run(new_run()).run_id for _ in range(3)]
    store.transition(ids[1], 0, RunStatus.RUNNING)

    listed = [r.run_id for r in store.list_runs(limit=1000) if r.run_id in ids]
    assert listed == ids[::-1]

    running = store.list_runs(status=RunStatus.RUNNING, limit=1000)
    assert all(r.status == RunStatus.RUNNING for r in running)
    assert [r.run_id for r in running if r.run_id in ids] == [ids[1]]
    assert [r.run_id for r in store.list_runs(status=RunStatus.PENDING, limit=1000) if r.run_id in ids] == [
        ids[2], ids[0]]

    everything = store.list_runs(limit=1000)
    assert [r.created_at for r in everything] == sorted((r.created_at for r in everything), reverse=True)
    top = store.list_runs(limit=2)
    assert len(top) == 2
    assert top == everything[:2]


# ------------------------------------------------------------------ transitions (compare-and-set)


def test_transition_bumps_version_and_appends_event(store: SqlStore) -> None:
    run_id = store.create_run(new_run()).run_id

    rec = store.transition(run_id, 0, RunStatus.RUNNING, reason="started", data={"by": "op"})
    assert (rec.status, rec.version, rec.status_reason, rec.event_seq) == (RunStatus.RUNNING, 1, "started", 2)
    assert store.get_run(run_id) == rec
    event = store.events(run_id)[-1]
    assert (event.seq, event.kind) == (2, "run_running")
    assert event.data["from"] == "pending"
    assert event.data["reason"] == "started"
    assert event.data["by"] == "op"

    rec = store.transition(run_id, 1, RunStatus.WAITING_HUMAN)
    assert (rec.status, rec.version) == (RunStatus.WAITING_HUMAN, 2)


@pytest.mark.parametrize("expected", [0, 2, 99])
def test_stale_or_future_version_conflicts_and_writes_nothing(store: SqlStore, expected: int) -> None:
    run_id = store.create_run(new_run()).run_id
    store.transition(run_id, 0, RunStatus.RUNNING)  # now at version 1
    before = footprint(store, run_id)

    with pytest.raises(ConcurrencyConflict):
        store.transition(run_id, expected, RunStatus.COMPLETED)

    assert footprint(store, run_id) == before
    assert store.get_run(run_id).status == RunStatus.RUNNING


def test_illegal_transition_raises_and_writes_nothing(store: SqlStore) -> None:
    run_id = drive_to(store, RunStatus.COMPLETED)
    before = footprint(store, run_id)
    version = store.get_run(run_id).version

    with pytest.raises(IllegalTransitionError):
        store.transition(run_id, version, RunStatus.RUNNING)

    assert footprint(store, run_id) == before


@pytest.mark.parametrize("terminal", sorted(TERMINAL))
def test_terminal_states_never_change(store: SqlStore, terminal: RunStatus) -> None:
    run_id = drive_to(store, terminal)
    version = store.get_run(run_id).version
    before = footprint(store, run_id)

    for status in RunStatus:
        with pytest.raises(IllegalTransitionError):
            store.transition(run_id, version, status)

    # nor through a driver's commit
    lease = store.claim(run_id, "driver", 30.0)
    after_claim = footprint(store, run_id)
    for status in RunStatus:
        with pytest.raises(IllegalTransitionError):
            store.commit(lease, Batch(run=RunUpdate(status=status), events=[NewEvent(kind="x")]))
    assert footprint(store, run_id) == after_claim
    assert after_claim["raysaga_runs"][0]["status"] == before["raysaga_runs"][0]["status"] == terminal.value


@pytest.mark.parametrize("old", list(RunStatus))
def test_state_machine_table_is_enforced(store: SqlStore, old: RunStatus) -> None:
    """Every (old, new) pair: allowed ones succeed with one event, the rest raise and write nothing."""
    run_id = drive_to(store, old)
    version = store.get_run(run_id).version
    before = footprint(store, run_id)
    for new in sorted(set(RunStatus) - ALLOWED[old]):
        with pytest.raises(IllegalTransitionError):
            store.transition(run_id, version, new)
        assert footprint(store, run_id) == before, new
    for new in sorted(ALLOWED[old]):
        run_id = drive_to(store, old)
        rec = store.transition(run_id, version, new)
        assert (rec.status, rec.version, rec.event_seq) == (new, version + 1, version + 2)
        assert store.get_run(run_id) == rec
        assert seqs(store, run_id) == list(range(1, version + 3))


def seqs_of(fp: dict[str, Any]) -> list[int]:
    return [e["seq"] for e in fp["raysaga_events"]]


def test_every_transition_appends_exactly_one_event_with_monotonic_seq(store: SqlStore) -> None:
    walk = [RunStatus.RUNNING, RunStatus.WAITING_HUMAN, RunStatus.RUNNING, RunStatus.WAITING_TIMER,
            RunStatus.RUNNING, RunStatus.PAUSED, RunStatus.RUNNING, RunStatus.FAILED, RunStatus.RUNNING,
            RunStatus.COMPENSATING, RunStatus.COMPENSATION_FAILED, RunStatus.COMPENSATING,
            RunStatus.COMPENSATED]
    run_id = store.create_run(new_run()).run_id
    for version, status in enumerate(walk):
        before = store.events(run_id)
        rec = store.transition(run_id, version, status)
        after = store.events(run_id)
        assert after[: len(before)] == before
        assert len(after) == len(before) + 1
        assert after[-1].seq == before[-1].seq + 1 == rec.event_seq
        assert after[-1].kind == f"run_{status.value}"
        assert after[-1].at >= before[-1].at
    assert seqs(store, run_id) == list(range(1, len(walk) + 2))


def test_commit_transition_appends_its_event_after_the_batch_events(store: SqlStore) -> None:
    run_id = store.create_run(new_run()).run_id
    lease = store.claim(run_id, "driver", 30.0)
    start = store.get_run(run_id)

    rec = store.commit(lease, Batch(events=[NewEvent(kind="a"), NewEvent(kind="b")],
                                    run=RunUpdate(status=RunStatus.RUNNING, status_reason="go")))

    assert rec is not None
    assert (rec.status, rec.version, rec.status_reason) == (RunStatus.RUNNING, start.version + 1, "go")
    tail = store.events(run_id, after_seq=start.event_seq)
    assert [(e.seq, e.kind) for e in tail] == [
        (start.event_seq + 1, "a"), (start.event_seq + 2, "b"), (start.event_seq + 3, "run_running")]
    assert rec.event_seq == start.event_seq + 3
    assert seqs(store, run_id) == list(range(1, rec.event_seq + 1))


# ------------------------------------------------------------------ leases


def test_claim_takes_lease_and_increments_fence(store: SqlStore) -> None:
    run_id = store.create_run(new_run()).run_id
    before = time.time()
    lease = store.claim(run_id, "driver-a", 30.0)

    assert (lease.run_id, lease.owner, lease.fence, lease.ttl) == (run_id, "driver-a", 1, 30.0)
    assert before + 30.0 <= lease.expires_at <= time.time() + 30.0
    rec = store.get_run(run_id)
    assert (rec.lease_owner, rec.fence, rec.lease_expires_at) == ("driver-a", 1, lease.expires_at)
    event = store.events(run_id)[-1]
    assert event.kind == "lease_claimed"
    assert event.data == {"owner": "driver-a", "fence": 1}


def test_second_claim_while_live_names_owner_and_writes_nothing(store: SqlStore) -> None:
    run_id = store.create_run(new_run()).run_id
    store.claim(run_id, "driver-a", 60.0)
    before = footprint(store, run_id)

    for owner in ("driver-b", "driver-a"):  # not even the holder may claim twice
        with pytest.raises(LeaseHeldError) as exc:
            store.claim(run_id, owner, 60.0)
        assert "driver-a" in str(exc.value)

    assert footprint(store, run_id) == before


def test_claim_after_expiry_increments_fence_and_fences_out_the_old_driver(store: SqlStore) -> None:
    run_id = store.create_run(new_run()).run_id
    old = store.claim(run_id, "driver-a", 60.0)
    store.commit(old, Batch(run=RunUpdate(status=RunStatus.RUNNING)))
    expire_lease(store, run_id)

    new = store.claim(run_id, "driver-b", 60.0)
    assert (new.owner, new.fence) == ("driver-b", old.fence + 1)
    assert store.get_run(run_id).lease_owner == "driver-b"
    key = uid("key")
    blob = b"stale driver " + uuid.uuid4().bytes
    store.send_signal(run_id, "approve", node_id="gate")
    signal_id = store.pending_signals(run_id)[0].id
    before = footprint(store, run_id)

    stale_batch = Batch(
        nodes=[NodeWrite(node_id="step", status=NodeStatus.COMPLETED, output={"v": 1})],
        effects=[effect(key, EffectStatus.PENDING)],
        events=[NewEvent(kind="node_completed", node_id="step")],
        blobs={digest(blob): blob},
        run=RunUpdate(status=RunStatus.COMPLETED, set_output=True, output={"done": True}, tokens_delta=5),
        consumed_signals=[signal_id],
    )
    with pytest.raises(LeaseLostError):
        store.commit(old, stale_batch)
    with pytest.raises(LeaseLostError):
        store.renew(old)
    store.release(old)  # a stale release is silent and frees nothing

    assert footprint(store, run_id) == before
    assert store.get_blobs([digest(blob)]) == {}
    rec = store.get_run(run_id)
    assert (rec.lease_owner, rec.fence, rec.lease_expires_at) == ("driver-b", new.fence, new.expires_at)

    # the new holder's fence still works
    store.commit(new, Batch(nodes=[NodeWrite(node_id="step", status=NodeStatus.RUNNING)]))
    assert [n.status for n in store.nodes(run_id)] == [NodeStatus.RUNNING]


def test_renew_extends_expiry_and_keeps_fence(store: SqlStore) -> None:
    run_id = store.create_run(new_run()).run_id
    lease = store.claim(run_id, "driver-a", 5.0)
    before = time.time()

    renewed = store.renew(lease.model_copy(update={"ttl": 120.0}))

    assert (renewed.owner, renewed.fence) == ("driver-a", lease.fence)
    assert renewed.expires_at >= before + 120.0 > lease.expires_at
    rec = store.get_run(run_id)
    assert (rec.lease_owner, rec.fence, rec.lease_expires_at) == ("driver-a", lease.fence, renewed.expires_at)
    # the renewed lease still guards commits
    store.commit(renewed, Batch(events=[NewEvent(kind="heartbeat")]))
    assert store.events(run_id)[-1].kind == "heartbeat"


def test_release_frees_the_lease_for_the_next_claim(store: SqlStore) -> None:
    run_id = store.create_run(new_run()).run_id
    lease = store.claim(run_id, "driver-a", 60.0)

    store.release(lease)
    rec = store.get_run(run_id)
    assert (rec.lease_owner, rec.lease_expires_at) == (None, None)
    store.release(lease)  # twice is fine

    nxt = store.claim(run_id, "driver-b", 60.0)
    assert (nxt.owner, nxt.fence) == ("driver-b", lease.fence + 1)
    with pytest.raises(LeaseLostError):
        store.commit(lease, Batch(events=[NewEvent(kind="late")]))
    assert [e.kind for e in store.events(run_id)] == ["run_created", "lease_claimed", "lease_claimed"]


def test_commit_with_forged_lease_of_unknown_run_is_lost(store: SqlStore) -> None:
    lease = Lease(run_id=uid("ghost"), owner="x", fence=1, expires_at=time.time() + 60, ttl=60.0)
    with pytest.raises(LeaseLostError):
        store.commit(lease, Batch(nodes=[NodeWrite(node_id="a", status=NodeStatus.RUNNING)]))
    assert footprint(store, lease.run_id)["raysaga_nodes"] == []


# ------------------------------------------------------------------ commit


def claimed_run(store: SqlStore, status: RunStatus = RunStatus.PENDING) -> tuple[str, Lease]:
    run_id = drive_to(store, status)
    return run_id, store.claim(run_id, "driver", 60.0)


def test_commit_applies_every_part_of_a_batch(store: SqlStore) -> None:
    run_id, lease = claimed_run(store)
    blob = b"\x00big output\x00" + uuid.uuid4().bytes
    key = uid("key")
    start = store.get_run(run_id)

    rec = store.commit(lease, Batch(
        nodes=[
            NodeWrite(node_id="fetch", status=NodeStatus.COMPLETED, attempt=1, output={"rows": [1, 2]},
                      started_at=10.0, finished_at=12.5, duration=2.5),
            NodeWrite(node_id="fan", fan_index=3, status=NodeStatus.RETRYING, attempt=2, not_before=99.0,
                      error={"type": "Timeout"}, output_digest=digest(blob), started_at=11.0),
        ],
        effects=[effect(key, EffectStatus.PENDING, node_id="fan", fan_index=3)],
        events=[NewEvent(kind="node_completed", node_id="fetch", data={"ms": 2500})],
        blobs={digest(blob): blob},
        run=RunUpdate(status=RunStatus.RUNNING, retries_delta=1, tokens_delta=1200, cost_delta=0.25),
    ))

    assert rec is not None and rec.status == RunStatus.RUNNING
    assert (rec.version, rec.retries_used, rec.tokens_used, rec.cost_used) == (start.version + 1, 1, 1200, 0.25)
    got = {(n.node_id, n.fan_index): n for n in store.nodes(run_id)}
    assert set(got) == {("fetch", -1), ("fan", 3)}
    fetch, fan = got["fetch", -1], got["fan", 3]
    assert (fetch.status, fetch.attempt, fetch.output, fetch.duration) == (
        NodeStatus.COMPLETED, 1, {"rows": [1, 2]}, 2.5)
    assert (fan.status, fan.attempt, fan.not_before) == (NodeStatus.RETRYING, 2, 99.0)
    assert fan.error == {"type": "Timeout"}
    assert fan.label == "fan[3]" and fan.output_digest == digest(blob)
    [eff] = store.effects(run_id)
    assert (eff.idempotency_key, eff.status, eff.node_id, eff.fan_index) == (key, EffectStatus.PENDING, "fan", 3)
    assert store.get_blobs([digest(blob)]) == {digest(blob): blob}
    tail = store.events(run_id, after_seq=start.event_seq)
    assert [(e.kind, e.node_id) for e in tail] == [("node_completed", "fetch"), ("run_running", None)]
    assert tail[0].data == {"ms": 2500}

    # counters add up; output and error are set only when asked
    store.commit(lease, Batch(run=RunUpdate(tokens_delta=300, cost_delta=0.5, set_output=True, output={"answer": 42})))
    rec2 = store.get_run(run_id)
    assert (rec2.status, rec2.version, rec2.tokens_used, rec2.cost_used, rec2.output, rec2.error) == (
        RunStatus.RUNNING, start.version + 1, 1500, 0.75, {"answer": 42}, None)


def test_commit_without_run_update_returns_none_and_upserts_nodes(store: SqlStore) -> None:
    run_id, lease = claimed_run(store, RunStatus.RUNNING)
    assert store.commit(lease, Batch(nodes=[NodeWrite(node_id="a", status=NodeStatus.RUNNING, attempt=1,
                                                       started_at=1.0)])) is None
    assert store.commit(lease, Batch(nodes=[NodeWrite(node_id="a", status=NodeStatus.COMPLETED, attempt=1,
                                                       output="ok", started_at=1.0, finished_at=2.0)])) is None
    [node] = store.nodes(run_id)
    assert (node.status, node.output, node.finished_at) == (NodeStatus.COMPLETED, "ok", 2.0)


def test_batch_with_illegal_transition_writes_none_of_it(store: SqlStore) -> None:
    run_id, lease = claimed_run(store)  # pending: pending -> completed is illegal
    store.commit(lease, Batch(nodes=[NodeWrite(node_id="old", status=NodeStatus.RUNNING)]))
    signal = store.send_signal(run_id, "approve", node_id="gate")
    blob = b"never stored " + uuid.uuid4().bytes
    before = footprint(store, run_id)

    with pytest.raises(IllegalTransitionError):
        store.commit(lease, Batch(
            nodes=[NodeWrite(node_id="old", status=NodeStatus.COMPLETED, output=1),
                   NodeWrite(node_id="new", status=NodeStatus.COMPLETED, output=2)],
            effects=[effect(uid("key"), EffectStatus.PENDING), effect(uid("key"), EffectStatus.COMMITTED)],
            events=[NewEvent(kind="node_completed", node_id="new")],
            blobs={digest(blob): blob},
            run=RunUpdate(status=RunStatus.COMPLETED, set_output=True, output={"x": 1}, tokens_delta=9),
            consumed_signals=[signal.id],
        ))

    assert footprint(store, run_id) == before
    assert store.get_blobs([digest(blob)]) == {}
    assert [s.id for s in store.pending_signals(run_id)] == [signal.id]
    # the lease is intact: the same driver can carry on
    store.commit(lease, Batch(events=[NewEvent(kind="after")]))
    assert seqs(store, run_id) == [*seqs_of(before), seqs_of(before)[-1] + 1]


# ------------------------------------------------------------------ effect ledger


def test_ledger_pending_twice_keeps_the_first_row(store: SqlStore) -> None:
    run_id, lease = claimed_run(store, RunStatus.RUNNING)
    key = uid("key")
    store.commit(lease, Batch(effects=[effect(key, EffectStatus.PENDING, args_digest="1" * 64)]))
    [first] = store.effects(run_id)

    store.commit(lease, Batch(effects=[effect(key, EffectStatus.PENDING, args_digest="2" * 64,
                                              effect_name="other", node_id="other")]))

    [again] = store.effects(run_id)
    assert again == first
    assert (again.status, again.args_digest, again.effect_name) == (EffectStatus.PENDING, "1" * 64, "stripe.charge")


def test_ledger_pending_after_committed_does_not_regress(store: SqlStore) -> None:
    run_id, lease = claimed_run(store, RunStatus.RUNNING)
    key = uid("key")
    store.commit(lease, Batch(effects=[effect(key, EffectStatus.PENDING)]))
    [pending] = store.effects(run_id)
    store.commit(lease, Batch(effects=[effect(key, EffectStatus.COMMITTED, result={"charge": "ch_1"},
                                              external_id="ch_1")]))
    [committed] = store.effects(run_id)
    assert (committed.status, committed.result, committed.external_id) == (
        EffectStatus.COMMITTED, {"charge": "ch_1"}, "ch_1")
    assert committed.created_at == pending.created_at
    assert committed.updated_at >= pending.updated_at

    store.commit(lease, Batch(effects=[effect(key, EffectStatus.PENDING, result=None)]))

    [after] = store.effects(run_id)
    assert after == committed


def test_ledger_failed_then_pending_again_is_allowed(store: SqlStore) -> None:
    run_id, lease = claimed_run(store, RunStatus.RUNNING)
    key = uid("key")
    store.commit(lease, Batch(effects=[effect(key, EffectStatus.PENDING)]))
    [pending] = store.effects(run_id)
    store.commit(lease, Batch(effects=[effect(key, EffectStatus.FAILED, result={"error": "card declined"})]))
    [failed] = store.effects(run_id)
    assert failed.status == EffectStatus.FAILED

    store.commit(lease, Batch(effects=[effect(key, EffectStatus.PENDING)]))
    [retried] = store.effects(run_id)
    assert retried.status == EffectStatus.PENDING
    assert (retried.idempotency_key, retried.created_at) == (key, pending.created_at)
    assert retried.updated_at >= failed.updated_at

    store.commit(lease, Batch(effects=[effect(key, EffectStatus.COMMITTED, result={"charge": "ch_2"})]))
    [done] = store.effects(run_id)
    assert (done.status, done.result, done.created_at) == (EffectStatus.COMMITTED, {"charge": "ch_2"},
                                                           pending.created_at)


# ------------------------------------------------------------------ blobs


def test_blob_round_trips_binary_and_large(store: SqlStore) -> None:
    every_byte = bytes(range(256)) * 4 + uuid.uuid4().bytes
    zeros = b"\x00" * 1000 + uuid.uuid4().bytes + b"\x00"
    big = os.urandom(5 * 1024 * 1024)
    data = {digest(b): b for b in (every_byte, zeros, big)}

    store.put_blobs({digest(every_byte): every_byte, digest(zeros): zeros})
    _, lease = claimed_run(store)
    store.commit(lease, Batch(blobs={digest(big): big}))

    missing = digest(b"absent " + uuid.uuid4().bytes)
    got = store.get_blobs([*data, missing, digest(big)])
    assert set(got) == set(data)
    for d, b in data.items():
        assert type(got[d]) is bytes
        assert len(got[d]) == len(b) and got[d] == b
    assert store.get_blobs([]) == {}
    with store.engine.connect() as conn:
        sizes = dict(conn.execute(select(blobs.c.digest, blobs.c.size).where(blobs.c.digest.in_(list(data)))).all())
    assert sizes == {d: len(b) for d, b in data.items()}


def test_blobs_are_insert_once_by_digest(store: SqlStore) -> None:
    first = b"first " + uuid.uuid4().bytes
    key = digest(first)
    store.put_blobs({key: first})
    count = footprint(store, "-")["blob_count"]

    store.put_blobs({key: b"a different body under the same digest"})
    _, lease = claimed_run(store)
    store.commit(lease, Batch(blobs={key: b"yet another"}))

    assert store.get_blobs([key]) == {key: first}
    assert footprint(store, "-")["blob_count"] == count


# ------------------------------------------------------------------ events


def test_events_after_seq_and_limit(store: SqlStore) -> None:
    run_id, lease = claimed_run(store)  # seq 1 run_created, seq 2 lease_claimed
    other, other_lease = claimed_run(store)
    store.commit(lease, Batch(events=[NewEvent(kind=f"e{i}", data={"i": i}) for i in range(5)]))
    store.commit(other_lease, Batch(events=[NewEvent(kind="other")]))

    assert seqs(store, run_id) == [1, 2, 3, 4, 5, 6, 7]
    assert [(e.seq, e.kind, e.data) for e in store.events(run_id, after_seq=4)] == [
        (5, "e2", {"i": 2}), (6, "e3", {"i": 3}), (7, "e4", {"i": 4})]
    assert [e.seq for e in store.events(run_id, after_seq=3, limit=2)] == [4, 5]
    assert [e.seq for e in store.events(run_id, limit=1)] == [1]
    assert store.events(run_id, after_seq=7) == []
    assert {e.run_id for e in store.events(run_id)} == {run_id}
    assert [e.kind for e in store.events(other)] == ["run_created", "lease_claimed", "other"]
    assert store.events(uid("missing")) == []


# ------------------------------------------------------------------ signals and snapshot


def test_signals_send_pending_and_consume(store: SqlStore) -> None:
    run_id, lease = claimed_run(store, RunStatus.RUNNING)
    other = store.create_run(new_run()).run_id
    foreign = store.send_signal(other, "cancel")
    before = time.time()
    approve = store.send_signal(run_id, "approve", node_id="gate", payload={"by": "ana", "note": "ok ✓"})
    cancel = store.send_signal(run_id, "cancel")

    assert (approve.run_id, approve.kind, approve.node_id, approve.payload) == (
        run_id, "approve", "gate", {"by": "ana", "note": "ok ✓"})
    assert approve.consumed_at is None and approve.created_at >= before
    assert cancel.id > approve.id
    assert store.pending_signals(run_id) == [approve, cancel]
    assert store.snapshot(run_id).signals == [approve, cancel]

    # a driver consumes only its own run's signals
    store.commit(lease, Batch(consumed_signals=[approve.id, foreign.id]))

    assert store.pending_signals(run_id) == [cancel]
    assert store.snapshot(run_id).signals == [cancel]
    assert store.pending_signals(other) == [foreign]
    [row] = [s for s in footprint(store, run_id)["raysaga_signals"] if s["id"] == approve.id]
    assert row["consumed_at"] is not None and row["consumed_at"] >= approve.created_at


def test_snapshot_returns_run_nodes_effects_and_unconsumed_signals(store: SqlStore) -> None:
    run_id, lease = claimed_run(store, RunStatus.RUNNING)
    other, other_lease = claimed_run(store, RunStatus.RUNNING)
    other_key = uid("key")
    keys = [uid("key"), uid("key")]
    store.commit(lease, Batch(
        nodes=[NodeWrite(node_id="a", status=NodeStatus.COMPLETED, output={"a": 1}),
               NodeWrite(node_id="b", fan_index=0, status=NodeStatus.RUNNING)],
        effects=[effect(keys[0], EffectStatus.COMMITTED, result={"ok": True}), effect(keys[1], EffectStatus.PENDING)],
    ))
    store.commit(other_lease, Batch(nodes=[NodeWrite(node_id="z", status=NodeStatus.RUNNING)],
                                    effects=[effect(other_key, EffectStatus.PENDING)]))
    consumed = store.send_signal(run_id, "approve", node_id="a")
    waiting = store.send_signal(run_id, "reject", node_id="b", payload={"why": "no"})
    store.commit(lease, Batch(consumed_signals=[consumed.id]))

    snap = store.snapshot(run_id)

    assert snap.run == store.get_run(run_id)
    assert sorted((n.node_id, n.fan_index, n.status) for n in snap.nodes) == [
        ("a", -1, NodeStatus.COMPLETED), ("b", 0, NodeStatus.RUNNING)]
    assert sorted(snap.nodes, key=lambda n: n.label) == sorted(store.nodes(run_id), key=lambda n: n.label)
    assert sorted(e.idempotency_key for e in snap.effects) == sorted(keys)
    key_of = {e.idempotency_key: e for e in snap.effects}
    assert (key_of[keys[0]].status, key_of[keys[0]].result) == (EffectStatus.COMMITTED, {"ok": True})
    assert snap.signals == [waiting]
    assert [e.idempotency_key for e in store.snapshot(other).effects] == [other_key]


# ------------------------------------------------------------------ strict JSON at rest


NOT_JSON = {
    "nan": {"x": [1.0, math.nan]},
    "inf": {"deep": {"x": math.inf}},
    "neg_inf": -math.inf,
    "lone_surrogate": {"s": "\ud800"},
    "set": {"s": {1, 2}},
}


def assert_not_jsonable(exc: BaseException) -> None:
    """The value's own error, on every dialect: pysqlite serializes bind parameters before
    executing and SQLAlchemy wraps what that raises in ``StatementError``, which state/engine.py's
    ``handle_error`` hook unwraps."""
    assert isinstance(exc, NotJSONableError), repr(exc)


@pytest.mark.parametrize("bad", NOT_JSON.values(), ids=list(NOT_JSON))
def test_non_json_run_input_raises_and_writes_nothing(store: SqlStore, bad: Any) -> None:
    run_id = uid("nan")
    blob_count = footprint(store, run_id)["blob_count"]
    with pytest.raises(Exception) as exc:
        store.create_run(new_run(run_id, input=bad))
    fp = footprint(store, run_id)
    assert {k: v for k, v in fp.items() if k != "blob_count"} == {
        "raysaga_runs": [], "raysaga_nodes": [], "raysaga_effects": [], "raysaga_events": [],
        "raysaga_signals": []}
    assert fp["blob_count"] == blob_count
    assert_not_jsonable(exc.value)


def test_non_json_in_driver_and_operator_writes_raises_and_writes_nothing(store: SqlStore) -> None:
    run_id, lease = claimed_run(store, RunStatus.RUNNING)
    before = footprint(store, run_id)
    writes: dict[str, Callable[[], object]] = {
        "node output": lambda: store.commit(lease, Batch(
            nodes=[NodeWrite(node_id="n", status=NodeStatus.COMPLETED, output={"score": math.nan})])),
        "effect result": lambda: store.commit(lease, Batch(
            effects=[effect(uid("key"), EffectStatus.COMMITTED, result=[math.inf])])),
        "event data": lambda: store.commit(lease, Batch(events=[NewEvent(kind="k", data={"v": math.nan})])),
        "run output": lambda: store.commit(lease, Batch(run=RunUpdate(set_output=True, output=math.nan))),
        "signal payload": lambda: store.send_signal(run_id, "approve", payload={"v": -math.inf}),
        "transition data": lambda: store.transition(run_id, store.get_run(run_id).version, RunStatus.PAUSED,
                                                    data={"v": math.nan}),
    }
    raised: dict[str, BaseException | None] = {}
    for name, write in writes.items():
        try:
            write()
            raised[name] = None
        except Exception as exc:
            raised[name] = exc
        assert footprint(store, run_id) == before, name
    assert all(exc is not None for exc in raised.values()), raised
    assert {name: type(exc).__name__ for name, exc in raised.items()} == dict.fromkeys(writes, "NotJSONableError")


# ---------------------------------------------------------------------- large run input and output


def test_a_large_run_input_and_output_live_in_blobs_and_read_back_whole(store: SqlStore) -> None:
    """DESIGN: rows stay small. A run's input or output above the inline limit is a blob; the
    row holds its digest, and every reader (get_run, list_runs, snapshot, commit) gets the value."""
    big_in = {"pages": ["é" * 1000 + uuid.uuid4().hex for _ in range(80)]}  # ~160 KB of UTF-8
    small_out = {"ok": True}
    run_id = uid("big")
    created = store.create_run(new_run(run_id, input=big_in))
    assert created.input == big_in and created.input_digest is not None
    assert store.get_blobs([created.input_digest]) != {}
    with store.engine.connect() as conn:
        row = conn.execute(select(runs.c.input, runs.c.input_digest).where(runs.c.run_id == run_id)).one()
    assert row[0] is None and row[1] == created.input_digest

    lease = store.claim(run_id, "driver", 30.0)
    store.commit(lease, Batch(run=RunUpdate(status=RunStatus.RUNNING)))
    big_out = {"report": "x" * (store.run_value_inline_limit + 1)}
    done = store.commit(lease, Batch(run=RunUpdate(status=RunStatus.COMPLETED, output=big_out, set_output=True)))
    assert done is not None and done.output == big_out and done.output_digest is not None
    for record in (store.get_run(run_id), store.snapshot(run_id).run,
                   next(r for r in store.list_runs(limit=1000) if r.run_id == run_id)):
        assert (record.input, record.output) == (big_in, big_out)
    with store.engine.connect() as conn:
        assert conn.execute(select(runs.c.output).where(runs.c.run_id == run_id)).scalar_one() is None

    # at the limit it stays inline: no blob, no digest
    small_id = uid("small")
    store.create_run(new_run(small_id, input={"n": 1}))
    lease = store.claim(small_id, "driver", 30.0)
    store.commit(lease, Batch(run=RunUpdate(status=RunStatus.RUNNING)))
    store.commit(lease, Batch(run=RunUpdate(status=RunStatus.COMPLETED, output=small_out, set_output=True)))
    small = store.get_run(small_id)
    assert (small.input, small.output, small.input_digest, small.output_digest) == ({"n": 1}, small_out, None, None)
