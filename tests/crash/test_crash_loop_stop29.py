"""The crash-loop count in the store: a ``pending`` run's dead drivers, a limit larger than one
read of events, ``max_driver_deaths``' bad values, and the way out (``retry``) of a run parked
before it ever ran.

The deaths here are claims of a lease whose holder never let go (``Store.claim(take_from=...)``,
what a resume or a worker does to a dead driver's lease); real processes killed by a step or an
external killer are in ``tests/fleet/test_poison_fleet_stop29.py``.
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

import pytest

import raysaga
from raysaga import RunOptions, Workflow
from raysaga.errors import InvalidOptionError
from raysaga.orchestrator import crash_loop
from raysaga.state import Lease, RunStatus, SqlStore

wf = Workflow("stop29_counted", version="1")


@wf.step()
def work(input: dict[str, Any]) -> str:
    log = Path(input["log"])
    log.write_text(log.read_text() + "work\n" if log.exists() else "work\n")
    return "done"


def _dead_drivers(store: SqlStore, run_id: str, deaths: int, last_ttl: float = 15.0) -> Lease:
    """A first driver, then ``deaths`` drivers each taking the lease its predecessor never let go;
    the last claim's lease (held for ``last_ttl`` seconds: below 0, lapsed at once)."""
    lease = store.claim(run_id, "d0", 15 if deaths else last_ttl)
    for i in range(1, deaths + 1):
        lease = store.claim(run_id, f"d{i}", 15 if i < deaths else last_ttl, take_from=f"d{i - 1}")
    return lease


def test_claims_of_a_pending_run_say_whom_they_took_it_from(store: SqlStore, tmp_path: Path) -> None:
    run = raysaga.create_run(wf, {"log": str(tmp_path / "log")}, store=store)
    _dead_drivers(store, run.run_id, 2)
    claims = [e.data for e in store.events(run.run_id) if e.kind == "lease_claimed"]
    assert [c.get("abandoned_by") for c in claims] == [None, "d0", "d1"]
    assert store.get_run(run.run_id).status == RunStatus.PENDING


def test_a_limit_beyond_one_window_of_events_is_reached(store: SqlStore, tmp_path: Path) -> None:
    """130 deaths, one event each: the first read (``WINDOW`` = 100 events) holds 99 of them. With
    one fixed read a limit of 120 was never reached: the run was resumed for ever."""
    run = raysaga.create_run(wf, {"log": str(tmp_path / "log")}, store=store)
    lease = _dead_drivers(store, run.run_id, 130)
    current = store.get_run(run.run_id)
    assert crash_loop.recent_deaths(store, current, 10**9) == 130  # read back to the first claim
    assert crash_loop.recent_deaths(store, current, 50) == 99  # one read was enough to reach 50
    assert crash_loop.park_if_looping(store, lease, current, [], wf, 10**9) is None
    parked = crash_loop.park_if_looping(store, lease, current, [], wf, 120)
    assert parked is not None and parked.status == RunStatus.FAILED
    assert parked.error is not None and parked.error["deaths"] == 130 and parked.error["suspects"] == ["work"]


def test_a_run_parked_before_it_ran_is_retried_and_runs_its_step_once(store: SqlStore, tmp_path: Path) -> None:
    """Three drivers died before the run's first commit; the third one's lease has lapsed, so the
    resume claims it (``abandoned_by`` the third): it parks the run from ``pending`` and calls
    nothing. ``retry`` then runs the step, once."""
    log = tmp_path / "log"
    run = raysaga.create_run(wf, {"log": str(log)}, store=store)
    _dead_drivers(store, run.run_id, RunOptions().max_driver_deaths - 1, last_ttl=-1.0)
    parked = raysaga.resume(wf, run.run_id, store=store, executor="inline")
    assert parked.status == RunStatus.FAILED, parked.status_reason
    assert parked.error is not None and parked.error["type"] == "CrashLoop"
    assert parked.error["deaths"] == RunOptions().max_driver_deaths and parked.error["suspects"] == ["work"]
    assert not log.exists(), "a parked run called its step"
    assert "run_running" not in [e.kind for e in store.events(run.run_id)]

    done = raysaga.retry(wf, run.run_id, store=store, executor="inline")
    assert done.status == RunStatus.COMPLETED and done.output == {"work": "done"}
    assert log.read_text() == "work\n"


def test_two_deaths_before_the_first_commit_do_not_park(store: SqlStore, tmp_path: Path) -> None:
    log = tmp_path / "log"
    run = raysaga.create_run(wf, {"log": str(log)}, store=store)
    _dead_drivers(store, run.run_id, RunOptions().max_driver_deaths - 2, last_ttl=-1.0)
    done = raysaga.resume(wf, run.run_id, store=store, executor="inline")
    assert done.status == RunStatus.COMPLETED and log.read_text() == "work\n"


@pytest.mark.parametrize("value", [0, -1, -(10**9), 2.5, 3.0, "3", True, None, math.nan, math.inf])
def test_bad_max_driver_deaths_are_refused_naming_the_option(value: Any) -> None:
    with pytest.raises(InvalidOptionError) as err:
        RunOptions(max_driver_deaths=value)
    assert str(err.value) == f"RunOptions.max_driver_deaths must be a whole number >= 1, got {value!r}"


def test_a_huge_max_driver_deaths_is_taken_and_means_never_park() -> None:
    assert RunOptions(max_driver_deaths=10**12).max_driver_deaths == 10**12
