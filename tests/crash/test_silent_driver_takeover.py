"""A driver whose lease expires while its process still runs went silent, it did not die.

An inline step holding the GIL in C code (a catastrophic regex) starves the driver's heartbeat
thread; its lease expires and another worker takes the run over while the first computes on.
Such a take-over was written ``abandoned_by`` (a death), and after three of them the run was
parked ``failed`` as a crash loop though no driver had died. Now a claim of a lease whose owner is
provably alive on this host (same kernel and pid namespace, its pid running with the start time it
recorded) says ``taken_from_live`` and why, counts no death, and ``status`` calls that driver alive.

Real worker processes stand in for the silent drivers: SIGSTOP stops one inside its step (alive,
its heartbeat silent, as under the GIL). Real SQLite files; the claim tests also on PostgreSQL.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

import raysaga
from raysaga.orchestrator import crash_loop
from raysaga.orchestrator.ownership import describe_lease, new_owner
from raysaga.state import Batch, RunRecord, RunStatus, RunUpdate, SqlStore
from raysaga.state import claims as claim_rows
from tests.support import REPO, silent_flows
from tests.support import crash_driver as harness
from tests.support.worker_procs import dead_owner

pytestmark = pytest.mark.skipif(not os.path.exists("/proc/self/stat"), reason="needs Linux /proc")

FLOWS = "tests.support.silent_flows"


@pytest.fixture
def live_owner() -> Iterator[str]:
    """The lease owner string of a driver process that stays alive (it prints it, then sleeps)."""
    code = "from raysaga.orchestrator.ownership import new_owner; print(new_owner(), flush=True); input()"
    proc = subprocess.Popen([sys.executable, "-c", code], text=True, stdin=subprocess.PIPE, stdout=subprocess.PIPE)
    assert proc.stdout is not None
    yield proc.stdout.readline().strip()
    proc.kill()
    proc.communicate()


def _store_with_expired_lease(url: str, tmp_path: Path, held_by: str, name: str) -> tuple[SqlStore, RunRecord]:
    """A running run of a workflow of its own (``name``) whose lease ``held_by`` holds and lets lapse
    (its ttl is 0.5 s; a claim reads it at ``time.time() + 60``)."""
    store = SqlStore(url)
    run = raysaga.create_run(silent_flows.make_gated(name), {"log_dir": str(tmp_path)}, store=store,
                             run_id=f"{name}-{uuid.uuid4().hex[:8]}")
    lease = store.claim(run.run_id, held_by, 0.5)
    store.commit(lease, Batch(run=RunUpdate(status=RunStatus.RUNNING)))
    return store, run


def _claim(store: SqlStore, run: RunRecord, owner: str) -> claim_rows.Claim:
    claim = claim_rows.claim_next(store.engine, owner, 15, {run.workflow_name: run.definition_hash},
                                  now=time.time() + 60)
    assert claim is not None and claim.lease.run_id == run.run_id and claim.reason == "takeover"
    return claim


def test_a_claim_of_a_live_silent_owner_is_no_death(store_url: str, tmp_path: Path, live_owner: str) -> None:
    name = f"silent_live_{uuid.uuid4().hex[:8]}"
    store, run = _store_with_expired_lease(store_url, tmp_path, live_owner, name)
    try:
        claim = _claim(store, run, "w1")
        assert claim.abandoned_by is None and claim.taken_from_live == live_owner  # no suspect, driven beside others
        [*_, taken] = [e.data for e in store.events(run.run_id) if e.kind == "lease_claimed"]
        assert taken["taken_from_live"] == live_owner and "abandoned_by" not in taken
        pid = live_owner.split(":")[1]
        assert f"(pid {pid} on " in taken["why"] and "still runs" in taken["why"] and "not a death" in taken["why"]
        again = claim_rows.claim_of(store.engine, "w1", 15)  # a claim whose answer was lost reads the same
        assert again is not None and again.abandoned_by is None and again.taken_from_live == live_owner
        assert crash_loop.recent_deaths(store, store.get_run(run.run_id), 3) == 0
    finally:
        store.close()


def test_a_claim_of_a_dead_or_uncheckable_owner_is_still_a_death(store_url: str, tmp_path: Path) -> None:
    dead = dead_owner()
    elsewhere = ":".join(["host-b", *new_owner().split(":")[1:]])  # another host: never provably alive
    for held_by in [dead, elsewhere, "host:1:d-old"]:
        store, run = _store_with_expired_lease(store_url, tmp_path, held_by, f"silent_dead_{uuid.uuid4().hex[:8]}")
        try:
            claim = _claim(store, run, "w1")
            assert claim.abandoned_by == held_by and claim.taken_from_live is None
            [*_, taken] = [e.data for e in store.events(run.run_id) if e.kind == "lease_claimed"]
            assert taken["abandoned_by"] == held_by and "taken_from_live" not in taken
            assert crash_loop.recent_deaths(store, store.get_run(run.run_id), 3) == 1
        finally:
            store.close()


def test_status_calls_a_live_driver_whose_lease_expired_alive(tmp_path: Path, live_owner: str) -> None:
    store, run = _store_with_expired_lease(f"sqlite:///{tmp_path / 's.db'}", tmp_path, live_owner, "silent_status")
    try:
        record = store.get_run(run.run_id)
        assert record.lease_expires_at is not None
        line = describe_lease(record, record.lease_expires_at + 30)
        pid = live_owner.split(":")[1]
        assert "no live driver" not in line, line
        assert line.startswith(f"driver pid {pid} on ") and "is alive but silent: its lease expired at " in line, line
    finally:
        store.close()
    store, run = _store_with_expired_lease(f"sqlite:///{tmp_path / 'd.db'}", tmp_path, dead_owner(), "dead_status")
    try:
        record = store.get_run(run.run_id)
        assert record.lease_expires_at is not None
        assert describe_lease(record, record.lease_expires_at + 30).startswith("no live driver since ")
    finally:
        store.close()


# ---------------------------------------------------------------------- real workers gone silent


def _worker(db: str, tmp_path: Path, n: int) -> subprocess.Popen[str]:
    args = [sys.executable, "-m", "raysaga", "worker", "--db", db, "--executor", "inline", "--lease-ttl", "1",
            "--poll", "0.05", "--concurrency", "1", "--workflow", f"{FLOWS}:gated"]
    err = (tmp_path / f"worker{n}.err").open("w")
    proc = subprocess.Popen(args, cwd=REPO, env={**os.environ, "PYTHONPATH": str(REPO)}, text=True,
                            stdout=subprocess.PIPE, stderr=err)
    err.close()
    assert proc.stdout is not None
    banner = proc.stdout.readline()  # printed once its signal handlers are in place ('' if it died)
    assert banner.startswith("worker "), (banner, (tmp_path / f"worker{n}.err").read_text())
    return proc


def test_workers_that_go_silent_in_a_step_are_no_crash_loop(tmp_path: Path) -> None:
    """Three workers in turn take the run over from the one before, stopped (alive) inside its
    step: three take-overs of live drivers. The fourth drives the run to the end; it was parked
    ``failed — crash loop: the last 3 drivers of this run died`` though none had died."""
    db, run_id = f"sqlite:///{tmp_path / 'w.db'}", "silent-workers"
    store = SqlStore(db)
    workers: list[subprocess.Popen[str]] = []
    try:
        raysaga.create_run(silent_flows.gated, {"log_dir": str(tmp_path)}, store=store, run_id=run_id,
                           queue="default")
        for n in range(3):
            workers.append(proc := _worker(db, tmp_path, n))
            harness.wait_until(lambda: proc.pid in silent_flows.starts(tmp_path), timeout=60,
                               what=f"worker {n} starting the step")
            proc.send_signal(signal.SIGSTOP)  # alive, silent: its lease lapses as under the GIL
        (tmp_path / "open").touch()
        workers.append(last := _worker(db, tmp_path, 3))
        def ended_run() -> RunRecord | None:
            record = store.get_run(run_id)
            return record if record.status in (RunStatus.COMPLETED, RunStatus.FAILED) else None

        ended = harness.wait_until(ended_run, timeout=60, what="the run ending")
        assert ended.status == RunStatus.COMPLETED, (ended.status_reason, (tmp_path / "worker3.err").read_text())
        assert ended.output is not None and last.pid in silent_flows.starts(tmp_path)
        events = store.events(run_id)
        assert not [e for e in events if e.kind == "crash_loop"]
        claims = [e.data for e in events if e.kind == "lease_claimed"]
        owners = [c["owner"] for c in claims]
        assert [c.get("taken_from_live") for c in claims] == [None, *owners[:3]]
        assert not [c for c in claims if c.get("abandoned_by")]
        assert [int(o.split(":")[1]) for o in owners] == [w.pid for w in workers]
    finally:
        for proc in workers:
            proc.kill()  # (a stopped process is killed all the same)
            proc.communicate()
        store.close()


def test_deaths_that_follow_live_takeovers_still_make_a_crash_loop() -> None:
    """Stop 47's diff review: each driver froze (holding the GIL), was taken over while alive, then
    died (its step's ``os._exit``); a ``taken_from_live`` claim ended the count, so at most one death
    was ever counted and the loop ran for ever (12 worker processes killed in 45 s). Such a claim is
    neutral now: neither a death nor progress."""
    from raysaga.orchestrator.crash_loop import _count
    from raysaga.state import EventRecord

    def claim(seq: int, **data: str) -> EventRecord:
        return EventRecord(run_id="r", seq=seq, at=float(seq), kind="lease_claimed", data={"owner": f"o{seq}", **data})

    events = [claim(1), claim(2, taken_from_live="o1"), claim(3, abandoned_by="o1"), claim(4, taken_from_live="o3"),
              claim(5, abandoned_by="o3"), claim(6, taken_from_live="o5"), claim(7, abandoned_by="o5")]
    deaths, _ = _count(events)
    assert deaths >= 3, deaths
    # live take-overs alone (a step holding the GIL past the lease) count no death
    assert _count([claim(1), claim(2, taken_from_live="o1"), claim(3, taken_from_live="o2")])[0] == 0
