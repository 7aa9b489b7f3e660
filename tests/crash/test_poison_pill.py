"""A poison pill: a step that kills its process every time is parked after a few deaths in a row,
instead of killing every driver (or worker) that resumes its run forever.

Real processes and SIGKILL: ``tests.support.crash_driver`` drives ``tests.support.poison_flows``
inline; the step itself kills the driver. Each resume happens in a new process on the same host,
which takes the dead driver's lease at once (its process is provably gone). The step's own log
counts the attempts that started, across processes.
"""

from __future__ import annotations

import signal
import time
from pathlib import Path
from typing import Any

import raysaga
from raysaga.orchestrator import crash_loop
from raysaga.state import Batch, EventRecord, RunStatus, RunUpdate, SqlStore
from raysaga.state import claims as claim_rows
from tests.support import crash_driver as harness
from tests.support import poison_flows

FLOWS = "tests.support.poison_flows"
DEFAULT_DEATHS = raysaga.RunOptions().max_driver_deaths


def drive(flow: str, db: str, run_id: str, log_dir: Path, *, resume: bool) -> harness.Finished:
    return harness.run_driver(flow, db, run_id, flows=FLOWS, run_input={"log_dir": str(log_dir)}, resume=resume,
                              any_state_ok=True)


def calls(log_dir: Path) -> list[str]:
    path = log_dir / "calls"
    return path.read_text().split() if path.exists() else []


def test_a_step_that_kills_its_process_every_time_is_parked(tmp_path: Path) -> None:
    db, run_id = f"sqlite:///{tmp_path / 'p.db'}", "poison-1"
    for i in range(DEFAULT_DEATHS):
        died = drive("poison", db, run_id, tmp_path, resume=i > 0)
        assert died.returncode == -signal.SIGKILL, died.describe()
    assert calls(tmp_path) == ["swallow"] * DEFAULT_DEATHS
    before = calls(tmp_path)

    parked = drive("poison", db, run_id, tmp_path, resume=True)  # the next driver calls nothing
    assert parked.returncode == 0, parked.describe()
    result = parked.result
    assert result is not None and result["status"] == "failed", parked.describe()
    assert result["error"]["type"] == "CrashLoop" and result["error"]["deaths"] == DEFAULT_DEATHS
    assert result["error"]["suspects"] == ["swallow"]
    assert "crash loop" in result["status_reason"] and "swallow" in result["status_reason"]
    assert calls(tmp_path) == before, "a parked run called a step again"

    again = drive("poison", db, run_id, tmp_path, resume=True)  # parked stays parked
    assert again.result is not None and again.result["status"] == "failed"
    assert calls(tmp_path) == before
    store = SqlStore(db)
    try:
        [event] = [e for e in store.events(run_id) if e.kind == "crash_loop"]
        assert event.data == {"deaths": DEFAULT_DEATHS, "suspects": ["swallow"]}
        assert store.get_run(run_id).lease_owner is None  # released: no worker is stuck on it
    finally:
        store.close()


def test_deaths_with_progress_in_between_are_no_crash_loop(tmp_path: Path) -> None:
    """Four steps each kill the process once: five drivers, four deaths, but each driver after the
    first got a step done, so the run completes (the count is of deaths *in a row*)."""
    db, run_id = f"sqlite:///{tmp_path / 's.db'}", "stumbles-1"
    deaths = 0
    for i in range(8):
        finished = drive("stumbles", db, run_id, tmp_path, resume=i > 0)
        if finished.returncode != -signal.SIGKILL:
            break
        deaths += 1
    assert finished.returncode == 0 and finished.result is not None, finished.describe()
    assert finished.result["status"] == "completed", finished.describe()
    assert deaths == 4 > DEFAULT_DEATHS
    # each step died once, on its first attempt, and ran once more: a finished step is committed
    # before the next one starts (inline, the next one runs inside the driver), so none ran again
    assert sorted(calls(tmp_path)) == sorted(["s1", "s2", "s3", "s4"] * 2)


def _event(seq: int, kind: str, **data: Any) -> EventRecord:
    return EventRecord(run_id="r", seq=seq, at=float(seq), kind=kind, data=data or None)


def test_deaths_are_counted_back_to_the_last_progress_or_release() -> None:
    created = [_event(1, "run_created"), _event(2, "lease_claimed", owner="d1"), _event(3, "run_running")]
    dead = [_event(4, "lease_claimed", owner="d2", abandoned_by="d1"),
            _event(5, "lease_claimed", owner="d3", abandoned_by="d2")]
    assert crash_loop.deaths_in_a_row(created) == 0
    assert crash_loop.deaths_in_a_row(created + dead[:1]) == 1
    assert crash_loop.deaths_in_a_row(created + dead) == 2
    progress = [_event(6, "node_completed"), _event(7, "lease_claimed", owner="d4", abandoned_by="d3")]
    assert crash_loop.deaths_in_a_row(created + dead + progress) == 0  # d3 got a node done before dying
    released = [_event(8, "lease_claimed", owner="d5")]  # d4 let go (a pause, a rest, a hand-back)
    assert crash_loop.deaths_in_a_row(created + dead + progress + released) == 0
    assert crash_loop.deaths_in_a_row(created + dead + progress + released + [
        _event(9, "lease_claimed", owner="d6", abandoned_by="d5")]) == 1


def test_a_claim_says_whose_lease_it_took_from_a_dead_driver(tmp_path: Path) -> None:
    """Both ways a run changes hands after its driver died: a resume (``claim``, here taking over a
    provably gone owner) and a worker (``claim_next``, an expired lease) note ``abandoned_by``;
    a claim of a released lease does not."""
    store = SqlStore(f"sqlite:///{tmp_path / 'c.db'}")
    try:
        run = raysaga.create_run(poison_flows.poison, {"log_dir": str(tmp_path)}, store=store, run_id="c-1")
        first = store.claim(run.run_id, "d1", 15)
        store.commit(first, Batch(run=RunUpdate(status=RunStatus.RUNNING)))
        store.claim(run.run_id, "d2", 15, take_from="d1")
        claim = claim_rows.claim_next(store.engine, "w1", 15, {run.workflow_name: run.definition_hash},
                                      now=time.time() + 60)  # d2's lease has expired by then
        assert claim is not None and claim.reason == "takeover"
        taken = [e.data for e in store.events(run.run_id) if e.kind == "lease_claimed"]
        assert [d.get("abandoned_by") for d in taken] == [None, "d1", "d2"]
        store.release(claim.lease)
        store.claim(run.run_id, "d3", 15)
        assert "abandoned_by" not in store.events(run.run_id)[-1].data
    finally:
        store.close()
