"""A step that always holds the GIL past the lease no longer passes between drivers for ever.

Run in the driver's process (``--executor inline``, or ``local=True``), a step holding the GIL
starves the heartbeat: the lease expires while the driver computes on, and another driver takes
the run over (``taken_from_live``, no death) and runs the step again under its key. A step that
does so every time passed from driver to driver for ever. Now, when the run was taken from a live
driver more than ``max_driver_deaths`` times in a row with no attempt's outcome committed between
the take-overs, the claimer parks it as a crash loop is parked, with its own reason naming the step
and the way out; progress resets the count, and real deaths are counted exactly as before.

The end-to-end tests run two real inline workers whose step holds the GIL (``usleep`` through
``ctypes.PyDLL``) longer than their 1 s lease: they take the run from each other, alive. Real
SQLite files; the store test also on PostgreSQL.
"""

from __future__ import annotations

import json
import os
import subprocess
import time
import uuid
from pathlib import Path

import pytest

import raysaga
from raysaga.orchestrator import crash_loop
from raysaga.state import (
    Batch,
    EventRecord,
    NewEvent,
    NodeRecord,
    NodeStatus,
    NodeWrite,
    RunRecord,
    RunStatus,
    RunUpdate,
    SqlStore,
)
from raysaga.state import claims as claim_rows
from tests.support import live_takeover_flows as flows
from tests.support.cli import invoke
from tests.support.crash_driver import wait_until
from tests.support.live_takeover_procs import live_owners, start_worker, stop_all
from tests.support.worker_procs import dead_owner

pytestmark = pytest.mark.skipif(not os.path.exists("/proc/self/stat"), reason="needs Linux /proc")

LIMIT = 3  # RunOptions.max_driver_deaths' default, which the workers use
HOLD = 3.0  # seconds a step holds the GIL: three leases


# ---------------------------------------------------------------------- the count, from events


def _claim(seq: int, **data: str) -> EventRecord:
    return EventRecord(run_id="r", seq=seq, at=float(seq), kind="lease_claimed", data={"owner": f"o{seq}", **data})


def _live(seq: int) -> EventRecord:
    return _claim(seq, taken_from_live=f"o{seq - 1}")


def _event(seq: int, kind: str) -> EventRecord:
    return EventRecord(run_id="r", seq=seq, at=float(seq), kind=kind, data={})


def test_live_takeovers_count_in_a_row_until_progress_or_another_claim() -> None:
    chain = [_claim(1), _event(2, "node_completed"), _live(3), _event(4, "run_running"), _live(5), _live(6), _live(7)]
    assert crash_loop.live_takeovers_in_a_row(chain) == 4  # a transition is no progress
    assert crash_loop.deaths_in_a_row(chain) == 0  # and none of them a death
    # a node completed between take-overs: the count starts again after it
    assert crash_loop.live_takeovers_in_a_row([*chain[:5], _event(6, "node_completed"), _live(7)]) == 1
    # a claim of a released lease, or of a dead driver's, ends the chain: deaths are the crash loop's
    assert crash_loop.live_takeovers_in_a_row([_live(1), _live(2), _claim(3), _live(4)]) == 1
    died = [_claim(1), _live(2), _claim(3, abandoned_by="o2"), _live(4)]
    assert crash_loop.live_takeovers_in_a_row(died) == 1
    assert crash_loop.deaths_in_a_row(died) == 1
    # deaths interleaved with live take-overs are counted as before (the live ones neutral)
    mixed = [_claim(1), _live(2), _claim(3, abandoned_by="o2"), _live(4), _claim(5, abandoned_by="o4"), _live(6),
             _claim(7, abandoned_by="o6")]
    assert crash_loop.deaths_in_a_row(mixed) == 3 and crash_loop.live_takeovers_in_a_row(mixed) == 0


def test_a_rollback_parked_so_keeps_its_cause_and_says_retry_compensations() -> None:
    running = NodeRecord(run_id="r", node_id="undo_pay", fan_index=-1, status=NodeStatus.RUNNING, attempt=1)
    cause = {"type": "Permanent", "message": "card declined"}
    first, batch = crash_loop.silent_parking(RunStatus.COMPENSATING, 4, ["undo_pay"], "r 1", 2.0,
                                             running=["undo_pay"], cause=cause, nodes=[running])
    assert batch.run is not None and batch.run.status == RunStatus.COMPENSATION_FAILED and not first
    reason = batch.run.status_reason or ""
    assert "(running: undo_pay)" in reason and reason.endswith("then `raysaga retry 'r 1' --compensations`"), reason
    error = batch.run.error
    assert error is not None and (error if isinstance(error, dict) else error.as_dict())["cause"] == cause
    [row] = batch.nodes
    assert row.node_id == "undo_pay" and row.status == NodeStatus.CANCELLED


# ---------------------------------------------------------------------- parked by the claimer, in a store


def _chain(store: SqlStore, run: RunRecord, owners: list[str], start: float) -> claim_rows.Claim:
    """Each of ``owners`` in turn claims the run from the one before (alive), its lease lapsed."""
    claim = None
    for k, owner in enumerate(owners):
        claim = claim_rows.claim_next(store.engine, owner, 15, {run.workflow_name: run.definition_hash},
                                      now=start + 60 * k)
        assert claim is not None and claim.lease.run_id == run.run_id, k
    assert claim is not None
    return claim


def test_the_claimer_past_the_limit_parks_the_run(store_url: str, tmp_path: Path) -> None:
    name = f"live_bound_{uuid.uuid4().hex[:8]}"
    wf = flows.make_hog(name)
    store = SqlStore(store_url)
    try:
        run = raysaga.create_run(wf, {"log_dir": str(tmp_path), "hold": HOLD}, store=store, run_id=f"{name}-r",
                                 queue="default")
        with live_owners(LIMIT + 3) as owners:
            start = time.time() + 60
            first = _chain(store, run, owners[:1], start)
            store.commit(first.lease, Batch(run=RunUpdate(status=RunStatus.RUNNING)))
            # the first driver completes a step (progress before the loop), then holds the GIL
            store.commit(first.lease, Batch(events=[NewEvent(kind="node_completed", node_id="prep")], nodes=[
                NodeWrite(node_id="prep", status=NodeStatus.COMPLETED, attempt=1, output="ready"),
                NodeWrite(node_id="hog", status=NodeStatus.RUNNING, attempt=1)]))
            claim = _chain(store, run, owners[1:LIMIT + 1], start + 60)  # LIMIT take-overs: each gets its turn
            current = store.get_run(run.run_id)
            assert claim.taken_from_live == owners[LIMIT - 1]
            assert crash_loop.recent_live_takeovers(store, current, LIMIT) == LIMIT
            assert crash_loop.park_if_looping(store, claim.lease, current, [], wf, LIMIT) is None
            assert store.get_run(run.run_id).status == RunStatus.RUNNING
            claim = _chain(store, run, owners[LIMIT + 1:LIMIT + 2], start + 60 * (LIMIT + 2))  # one more
            current = store.get_run(run.run_id)
            parked = crash_loop.park_if_looping(store, claim.lease, current, store.nodes(run.run_id), wf, LIMIT)
        assert parked is not None and parked.status == RunStatus.FAILED
        reason = parked.status_reason or ""
        assert reason.startswith(f"live takeover loop: this run was taken over {LIMIT + 1} times in a row"), reason
        assert "(running: hog)" in reason and "--executor ray" in reason and "local=True" in reason, reason
        assert "--lease-ttl (this driver's: 15s)" in reason and f"raysaga retry {run.run_id}" in reason, reason
        assert "died" not in reason and "crash loop" not in reason, reason
        assert parked.error is not None
        error = parked.error.as_dict()
        assert error["type"] == "CrashLoop" and error["crash_loop"] == crash_loop.LIVE_LOOP, error
        assert error["live_takeovers"] == LIMIT + 1 and error["deaths"] == 0 and error["suspects"] == ["hog"]
        assert {n.node_id: n.status for n in store.nodes(run.run_id)} == {"prep": NodeStatus.COMPLETED,
                                                                            "hog": NodeStatus.CANCELLED}
        kinds = [e.kind for e in store.events(run.run_id)]
        assert crash_loop.LIVE_LOOP in kinds and "crash_loop" not in kinds
    finally:
        store.close()


def test_progress_or_a_death_resets_the_live_count(store_url: str, tmp_path: Path) -> None:
    name = f"live_reset_{uuid.uuid4().hex[:8]}"
    wf = flows.make_hog(name)
    store = SqlStore(store_url)
    try:
        run = raysaga.create_run(wf, {"log_dir": str(tmp_path), "hold": HOLD}, store=store, run_id=f"{name}-r",
                                 queue="default")
        with live_owners(LIMIT + 3) as owners:
            start = time.time() + 60
            claim = _chain(store, run, owners[:3], start)
            store.commit(claim.lease, Batch(run=RunUpdate(status=RunStatus.RUNNING),
                                            events=[NewEvent(kind="node_completed", node_id="prep")]))
            claim = _chain(store, run, owners[3:], start + 180)  # LIMIT take-overs since the progress
            current = store.get_run(run.run_id)
            assert crash_loop.recent_live_takeovers(store, current, LIMIT) == LIMIT
            assert crash_loop.park_if_looping(store, claim.lease, current, [], wf, LIMIT) is None
            # a driver that died holding it: its successor's claim is a death, and ends the live chain
            gone = dead_owner()
            claim = _chain(store, run, [gone, owners[0]], start + 600)
            current = store.get_run(run.run_id)
            assert claim.abandoned_by == gone and claim.taken_from_live is None
            assert crash_loop.recent_live_takeovers(store, current, LIMIT) == 0
            assert crash_loop.park_if_looping(store, claim.lease, current, [], wf, LIMIT) is None
    finally:
        store.close()


# ---------------------------------------------------------------------- real workers holding the GIL


def _live_claims(store: SqlStore, run_id: str) -> list[dict[str, object]]:
    return [e.data for e in store.events(run_id)
            if e.kind == "lease_claimed" and isinstance(e.data, dict) and e.data.get("taken_from_live")]


def test_workers_that_hold_the_gil_past_the_lease_park_the_run(tmp_path: Path) -> None:
    """Two inline workers take the run from each other, each frozen in ``hog`` (the GIL held three
    leases long): the fourth live take-over in a row parks it, naming ``hog``; it went on for ever."""
    db, run_id = f"sqlite:///{tmp_path / 'w.db'}", "gil-hog"
    store = SqlStore(db)
    workers: list[subprocess.Popen[str]] = []
    try:
        raysaga.create_run(flows.gil_hog, {"log_dir": str(tmp_path), "hold": HOLD}, store=store, run_id=run_id,
                           queue="default")
        workers = [start_worker(db, tmp_path, n, "gil_hog") for n in range(2)]

        def ended() -> RunRecord | None:
            record = store.get_run(run_id)
            if record.status == RunStatus.RUNNING:
                # the bound's claimer is the (LIMIT+1)th; one more means nothing stopped it
                assert len(_live_claims(store, run_id)) <= LIMIT + 1, "taken over past the bound, never parked"
                return None
            return record if record.status not in (RunStatus.PENDING,) else None

        parked = wait_until(ended, timeout=120, what="the run parked")
        logs = "\n".join((tmp_path / f"worker{n}.err").read_text()[-2000:] for n in range(2))
        assert parked.status == RunStatus.FAILED, (parked.status, parked.status_reason, logs)
        reason = parked.status_reason or ""
        assert reason.startswith(f"live takeover loop: this run was taken over {LIMIT + 1} times in a row"), reason
        assert "(running: hog)" in reason and "Run that step on Ray" in reason, reason
        assert "--lease-ttl (this driver's: 1s)" in reason, reason
        live = _live_claims(store, run_id)
        assert len(live) == LIMIT + 1
        claims = [e.data for e in store.events(run_id) if e.kind == "lease_claimed"]
        assert not [c for c in claims if isinstance(c, dict) and c.get("abandoned_by")]  # nobody died
        hogs = [pid for step, pid in flows.starts(tmp_path) if step == "hog"]
        assert len(hogs) == LIMIT + 1 and set(hogs) == {w.pid for w in workers}  # ran by each driver, then no more
        assert [s for s, _ in flows.starts(tmp_path)].count("prep") == 1
        rows = {n.node_id: n for n in store.nodes(run_id)}
        assert rows["prep"].status == NodeStatus.COMPLETED
        assert rows["hog"].status == NodeStatus.CANCELLED and rows["hog"].error is not None
        assert "a live takeover loop" in json.dumps(rows["hog"].error.as_dict())
        # ``raysaga status`` shows the reason: the header line, and the whole of it in --json
        code, out, _ = invoke("status", run_id, "--db", db)
        assert code == 0 and "failed — live takeover loop: this run was taken over" in " ".join(out.split()), out
        code, out, _ = invoke("status", run_id, "--db", db, "--json")
        assert code == 0 and json.loads(out)["reason"] == reason, out
    finally:
        stop_all(workers)
        store.close()


def test_takeovers_with_progress_between_them_go_on(tmp_path: Path) -> None:
    """Each of four steps holds the GIL past the lease on its first start, then completes under the
    driver that took it over: four live take-overs, more than the limit, but never two without a
    step completing between them. The run completes."""
    db, run_id = f"sqlite:///{tmp_path / 'o.db'}", "gil-once"
    store = SqlStore(db)
    workers: list[subprocess.Popen[str]] = []
    try:
        raysaga.create_run(flows.gil_once, {"log_dir": str(tmp_path), "hold": HOLD}, store=store, run_id=run_id,
                           queue="default")
        workers = [start_worker(db, tmp_path, n, "gil_once") for n in range(2)]

        def ended() -> RunRecord | None:
            record = store.get_run(run_id)
            return record if record.status in (RunStatus.COMPLETED, RunStatus.FAILED) else None

        done = wait_until(ended, timeout=120, what="the run ending")
        logs = "\n".join((tmp_path / f"worker{n}.err").read_text()[-2000:] for n in range(2))
        assert done.status == RunStatus.COMPLETED, (done.status_reason, logs)
        assert len(_live_claims(store, run_id)) > LIMIT  # taken over live past the limit, with progress each time
        assert [s for s, _ in flows.starts(tmp_path)] == ["s1", "s1", "s2", "s2", "s3", "s3", "s4", "s4"]
    finally:
        stop_all(workers)
        store.close()
