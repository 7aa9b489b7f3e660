"""Review of stop 31's probing lane (``ray_lanes.Lane.room``/``measured``): until one of its items is
measured, a fan-out step sends one item a task, one task per CPU; the first back sizes the chunks.
Slow items (0.3 s each, thirty times ``RayExecutor.CHUNK_SECONDS``) must then go one a task: a
chunk of them is a long task whose items are all lost by a crash, recorded late, and cancelled
late. Checked on the session's local Ray cluster, with the chunks the driver packs recorded.
"""

from __future__ import annotations

import os
import sys
import time
from pathlib import Path
from typing import Any

import pytest

import raysaga
from raysaga import BEST_EFFORT, Permanent, RetryPolicy, RunStatus, Workflow
from raysaga.node_key import NodeKey
from raysaga.orchestrator.executor import RayExecutor
from raysaga.orchestrator.item_block import ItemBlock
from raysaga.state import SqlStore
from tests.support.chunk_recording import record_chunks

cloudpickle = pytest.importorskip("ray.cloudpickle")

#: How long a slow item works (its own work, not a wait for anything).
SLOW = 0.3

wf = Workflow("review_stop32_lanes")


@wf.step
def plan(input: dict[str, Any]) -> list[dict[str, Any]]:
    return [{"n": n, "first": input["first"], "dir": input["dir"]} for n in range(input["count"])]


def _first_time(where: str, n: int) -> bool:
    try:
        os.close(os.open(os.path.join(where, f"probe-{n}"), os.O_CREAT | os.O_EXCL | os.O_WRONLY))
    except FileExistsError:
        return False
    return True


@wf.map("plan", retry=RetryPolicy(max_attempts=2, base=0.01, cap=0.01), policy=BEST_EFFORT)
def slow(plan: dict[str, Any]) -> int:
    n = int(plan["n"])
    if n == 0 and plan["first"] == "fails" and _first_time(plan["dir"], n):
        raise Permanent("the first probe fails at once")  # (best effort: the run goes on)
    if n == 0 and plan["first"] == "worker_dies" and _first_time(plan["dir"], n):
        os._exit(1)  # its Ray worker dies: a transient failure, retried
    deadline = time.perf_counter() + SLOW
    while time.perf_counter() < deadline:  # the item's work: CPU for SLOW seconds
        pass
    return n


@pytest.fixture(autouse=True)
def _by_value() -> None:
    cloudpickle.register_pickle_by_value(sys.modules[__name__])


@pytest.fixture
def chunks(monkeypatch: pytest.MonkeyPatch) -> list[list[int]]:
    """The fan indexes of each block task the driver packs, in order."""
    return record_chunks(monkeypatch)


@pytest.mark.parametrize("first", ["succeeds", "fails", "worker_dies"])
def test_slow_items_are_never_chunked_into_long_tasks(tmp_path: Path, ray_session: str,
                                                      chunks: list[list[int]], first: str) -> None:
    for attempt in ("warm", "measured"):  # the workers warm first (a cold one's first failure is slow)
        where = tmp_path / attempt
        where.mkdir()
        chunks.clear()
        store = SqlStore(f"sqlite:///{where / 'r.db'}")
        try:  # a new executor: its lanes have measured nothing yet
            record = raysaga.run(wf, {"count": 8, "first": first, "dir": str(where)}, store=store,
                                 executor=RayExecutor(address=ray_session))
            assert record.status == RunStatus.COMPLETED, record.status_reason
        finally:
            store.close()
    longest = max(chunks, key=len)
    # a slow item takes 30 x CHUNK_SECONDS: one a task, whatever the first probe did
    assert len(longest) == 1, f"slow items sent as a chunk of {len(longest)} ({longest}); tasks: {chunks}"


half = Workflow("review_stop32_half_cpu")


@half.step
def half_plan(input: int) -> list[int]:
    return list(range(input))


@half.map("half_plan", num_cpus=0.5)
def half_work(half_plan: int) -> int:
    return half_plan


def test_probes_fill_what_ray_can_run_of_a_fractional_cpu_step(ray_session: str) -> None:
    """A step declaring num_cpus=0.5 runs two items per CPU at once; its probes (one item per CPU)
    leave half the cluster idle for as long as its first item takes (an item may take minutes), so
    'a slow item loses nothing: only one per CPU runs anyway' (Lane.room) does not hold for it."""
    ex = RayExecutor(address=ray_session)
    spec = half.steps["half_work"]
    n = 12
    block = ItemBlock(spec, "rv-half", "t" * 32, 1 << 20, [NodeKey("half_work", i) for i in range(n)], [1] * n,
                      [{"half_plan": i} for i in range(n)])
    assert ex.submit_block(block)
    ex.pump()
    in_flight = ex._lanes["half_work"].tasks
    back = 0
    while back < n:  # let its tasks end before the next test
        ex.wait(None, 5.0)
        back += sum(len(done.positions) for done in ex.take_items())
    assert in_flight >= 2 * ex._cpus, f"{in_flight} probe tasks for {ex._cpus} CPUs of a 0.5-CPU step"
