"""What a crash loop's park reason blames, on SQLite and PostgreSQL.

A run parked straight from ``pending`` had no step started under any of its dead drivers (a driver
commits ``pending → running`` before it starts one): it named its first steps as suspects, as if
they killed the process, though the killer came before any step. Now its reason says no step had
started and blames none (the error says ``"started": False``). A run
parked while running tells the steps recorded in flight from those only ready to start.

The deaths are claims of a lease whose holder never let go (``Store.claim(take_from=...)``, what a
resume or a worker does to a dead driver's lease); real killed processes are in
``tests/fleet/test_poison_fleet_stop29.py`` and ``tests/fleet/test_crash_neighbours_stop30.py``.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import raysaga
from raysaga import RunOptions, Workflow
from raysaga.orchestrator import crash_loop
from raysaga.state import Batch, Lease, NodeStatus, NodeWrite, RunStatus, RunUpdate, SqlStore

wf = Workflow("stop30_reason", version="1")


@wf.step()
def first(input: dict[str, Any]) -> str:
    Path(input["log"]).write_text("first\n")
    return "done"


@wf.step()
def second(input: dict[str, Any]) -> str:
    return "done"


@wf.step()
def third(input: dict[str, Any], first: str) -> str:
    return first


DEATHS = RunOptions().max_driver_deaths


def _dead_drivers(store: SqlStore, run_id: str, deaths: int, first: Lease | None = None) -> None:
    """``deaths`` drivers, each taking the lease its predecessor never let go; the last one's lease
    has lapsed, so a resume claims it (and counts one death more)."""
    lease = first or store.claim(run_id, "d0", 15)
    for i in range(1, deaths + 1):
        lease = store.claim(run_id, f"d{i}", 15 if i < deaths else -1.0, take_from=lease.owner)


def test_a_run_parked_from_pending_blames_no_step(store: SqlStore, tmp_path: Path) -> None:
    log = tmp_path / "log"
    run = raysaga.create_run(wf, {"log": str(log)}, store=store)
    _dead_drivers(store, run.run_id, DEATHS - 1)
    parked = raysaga.resume(wf, run.run_id, store=store, executor="inline")
    assert parked.status == RunStatus.FAILED and parked.error is not None, parked.status_reason
    assert parked.error["type"] == "CrashLoop" and parked.error["deaths"] == DEATHS
    assert parked.error["started"] is False  # the steps listed were only to start
    assert parked.error["suspects"] == ["first", "second"]
    reason = parked.status_reason or ""
    assert "no step had started" in reason and "no step is to blame" in reason, reason
    assert "its first steps, first, second, never ran" in reason
    assert "may be killing its process" not in reason and "in flight" not in reason
    assert reason.endswith(f"`raysaga retry {run.run_id}`")
    assert not log.exists()


def test_a_running_run_names_the_steps_in_flight_apart_from_those_ready(store: SqlStore, tmp_path: Path) -> None:
    """``first`` completed; ``second`` was recorded running when the drivers died; ``third`` was
    ready (it may have started: a quick step has no row before it ends)."""
    run = raysaga.create_run(wf, {"log": str(tmp_path / "log")}, store=store)
    lease = store.claim(run.run_id, "d0", 15)
    store.commit(lease, Batch(run=RunUpdate(status=RunStatus.RUNNING), nodes=[
        NodeWrite(node_id="first", fan_index=-1, status=NodeStatus.COMPLETED, attempt=1, output="done"),
        NodeWrite(node_id="second", fan_index=-1, status=NodeStatus.RUNNING, attempt=1)]))
    _dead_drivers(store, run.run_id, DEATHS - 1, first=lease)
    parked = raysaga.resume(wf, run.run_id, store=store, executor="inline")
    assert parked.status == RunStatus.FAILED and parked.error is not None, parked.status_reason
    assert parked.error["suspects"] == ["second", "third"] and "started" not in parked.error
    reason = parked.status_reason or ""
    assert "in flight: second; ready to start, perhaps started: third" in reason, reason
    assert "may be killing its process" in reason


def test_one_death_is_told_as_one() -> None:
    _, batch = crash_loop.parking(RunStatus.RUNNING, 1, ["a"], "r", running=["a"])
    assert batch.run is not None and (batch.run.status_reason or "").startswith(
        "crash loop: its last driver died before committing any step's outcome (in flight: a)")
