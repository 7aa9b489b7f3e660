"""A fan-out step measured by a recent run of this process sizes the next run's first chunks
(``ray_lanes.remembered_item_seconds``): its first wave carries chunks, not one item a task; a memory older
than ``REMEMBER_S``, or of another function, is not used, and the run's own first measure
replaces it. Checked on the session's local Ray cluster, with the chunks the driver packs recorded.
"""

from __future__ import annotations

import sys
import time
from pathlib import Path

import pytest

import raysaga
from raysaga import RunStatus, Workflow
from raysaga.orchestrator import ray_lanes
from raysaga.orchestrator.executor import RayExecutor
from raysaga.orchestrator.ray_lanes import Lane
from raysaga.orchestrator.task import NodeOutcome
from raysaga.state import SqlStore
from tests.support.chunk_recording import record_chunks

cloudpickle = pytest.importorskip("ray.cloudpickle")

wf = Workflow("lane_prior_stop33")


@wf.step
def plan(input: int) -> list[int]:
    return list(range(input))


@wf.map("plan")
def quick(plan: int) -> int:
    return plan * 2


@wf.step
def total(quick: list[int]) -> int:
    return sum(quick)


@pytest.fixture(autouse=True)
def _by_value() -> None:
    cloudpickle.register_pickle_by_value(sys.modules[__name__])


@pytest.fixture(autouse=True)
def _forget() -> None:
    """No memory from another test's runs."""
    ray_lanes._item_seconds.pop(quick, None)


@pytest.fixture
def chunks(monkeypatch: pytest.MonkeyPatch) -> list[list[int]]:
    """The fan indexes of each block task the driver packs, in order."""
    return record_chunks(monkeypatch)


def _run(where: Path, ray_address: str, n: int = 400) -> None:
    store = SqlStore(f"sqlite:///{where / f'r-{time.monotonic_ns()}.db'}")
    try:  # a new executor each run: its lanes have measured nothing themselves
        record = raysaga.run(wf, n, store=store, executor=RayExecutor(address=ray_address))
        assert record.status == RunStatus.COMPLETED, record.status_reason
        assert record.output == {"total": n * (n - 1)}
    finally:
        store.close()


def test_a_second_run_sends_chunks_at_once(tmp_path: Path, ray_session: str, chunks: list[list[int]]) -> None:
    _run(tmp_path, ray_session)
    first_run = list(chunks)
    cpus = ray_lanes.cluster_cpus(__import__("ray"))
    assert [len(c) for c in first_run[:cpus]] == [1] * cpus, f"no probe wave in a first run: {first_run[:4]}"
    assert ray_lanes.remembered_item_seconds(wf.steps["quick"]) is not None
    chunks.clear()
    _run(tmp_path, ray_session)
    assert len(chunks[0]) > 1, f"the second run probed again: {chunks[:4]}"
    assert sorted(i for c in chunks for i in c) == list(range(400))  # every item once


def test_a_stale_memory_is_not_used(tmp_path: Path, ray_session: str, chunks: list[list[int]],
                                    monkeypatch: pytest.MonkeyPatch) -> None:
    _run(tmp_path, ray_session)
    monkeypatch.setattr(ray_lanes, "REMEMBER_S", -1.0)  # whatever was measured is too old now
    assert ray_lanes.remembered_item_seconds(wf.steps["quick"]) is None
    chunks.clear()
    _run(tmp_path, ray_session)
    assert len(chunks[0]) == 1, f"a stale memory sized the first chunk: {chunks[:4]}"


def _outcomes(seconds: float, n: int) -> list[NodeOutcome]:
    return [NodeOutcome(ok=True, started_at=100.0, finished_at=100.0 + seconds) for _ in range(n)]


def test_the_runs_own_measure_replaces_the_memory() -> None:
    """A step fast last time and slow now: the memory sizes the first chunks only; the first
    items back (slow) size every later one."""
    spec = wf.steps["quick"]
    lane = Lane(limit=8, chunked=True, spec=spec, probes=2, prior=0.0001)
    assert lane.room() == 8  # the first wave: the whole lane, each task a chunk (no probing)
    assert lane.chunk_size(0.01, 64) == 64
    lane.measured(_outcomes(0.5, 1))
    assert lane.chunk_size(0.01, 64) == 1
    assert lane.room() == 8
    assert ray_lanes.remembered_item_seconds(spec) == pytest.approx(0.5)


def test_without_memory_a_lane_probes() -> None:
    lane = Lane(limit=8, chunked=True, spec=wf.steps["quick"], probes=2)
    assert lane.room() == 2
    assert lane.chunk_size(0.01, 64) == 1


def test_the_memory_is_bounded(monkeypatch: pytest.MonkeyPatch) -> None:
    """A service that builds its workflows on the fly makes a new function per workflow: the
    memory keeps at most ``REMEMBER_STEPS`` of them, the most recent."""
    monkeypatch.setattr(ray_lanes, "_item_seconds", {})
    monkeypatch.setattr(ray_lanes, "REMEMBER_STEPS", 4)
    made = []
    for i in range(10):
        flow = Workflow(f"made_{i}")

        @flow.step
        def plan(input: int) -> list[int]:
            return [input]

        @flow.map("plan")
        def each(plan: int) -> int:
            return plan

        made.append(flow.steps["each"])
        ray_lanes.remember_item_seconds(flow.steps["each"], 0.001 * (i + 1))
    assert len(ray_lanes._item_seconds) == 4
    assert ray_lanes.remembered_item_seconds(made[-1]) == pytest.approx(0.010)
    assert ray_lanes.remembered_item_seconds(made[0]) is None
