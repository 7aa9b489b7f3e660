"""The Ray executor against the session's local cluster (``ray_session`` in conftest).

Steps travel to the workers pickled by value, so the tests do not depend on the workers'
import path (pytest's cwd, ``--import-mode=importlib``); the same functions run inline and on Ray.
"""

from __future__ import annotations

import os
import select
import sys
import time
from pathlib import Path
from typing import Any

import pytest

import raysaga
from raysaga import RetryPolicy, RunStatus, StepContext, Workflow
from raysaga.state import NodeStatus, SqlStore

pytestmark = pytest.mark.ray


@pytest.fixture(scope="module", autouse=True)
def _pickle_this_module_by_value() -> None:
    cloudpickle = pytest.importorskip("ray.cloudpickle")
    cloudpickle.register_pickle_by_value(sys.modules[__name__])


def _fan_out_workflow() -> Workflow:
    wf = Workflow("squares")

    @wf.step()
    def plan(input: dict[str, int]) -> list[int]:
        return list(range(input["n"]))

    @wf.map("plan")
    def square(ctx: StepContext, plan: int) -> dict[str, int]:
        return {"i": plan, "sq": plan * plan, "fan_index": ctx.fan_index}

    @wf.step()
    def total(square: list[dict[str, int]], input: dict[str, int]) -> dict[str, Any]:
        return {"sum": sum(s["sq"] for s in square), "order": [s["i"] for s in square], "n": input["n"]}

    @wf.step()
    def side(plan: list[int]) -> int:
        return len(plan)

    return wf


def _outputs(url: str, run_id: str) -> dict[tuple[str, int], Any]:
    store = SqlStore(url)
    try:
        return {(n.node_id, n.fan_index): (n.status, n.output, n.attempt) for n in store.nodes(run_id)}
    finally:
        store.close()


def test_ray_and_inline_give_identical_outputs(ray_session: str, tmp_path: Any) -> None:
    wf = _fan_out_workflow()
    inline_url, ray_url = f"sqlite:///{tmp_path / 'inline.db'}", f"sqlite:///{tmp_path / 'ray.db'}"
    inline = raysaga.run(wf, {"n": 5}, store=inline_url, executor="inline", run_id="same-id")
    on_ray = raysaga.run(wf, {"n": 5}, store=ray_url, executor="ray", address=ray_session, run_id="same-id")
    assert inline.status == on_ray.status == RunStatus.COMPLETED
    assert on_ray.output == inline.output == {"total": {"sum": 30, "order": [0, 1, 2, 3, 4], "n": 5}, "side": 5}
    inline_nodes, ray_nodes = _outputs(inline_url, "same-id"), _outputs(ray_url, "same-id")
    assert ray_nodes == inline_nodes
    assert ray_nodes[("square", 3)] == (NodeStatus.COMPLETED, {"i": 3, "sq": 9, "fan_index": 3}, 1)
    assert len(ray_nodes) == 1 + 1 + 5 + 1 + 1  # plan, square parent, 5 items, total, side


def _wait_for_exit(pid: int, timeout: float) -> bool:
    """True once process ``pid`` has exited (a pidfd becomes readable), False on timeout."""
    try:
        fd = os.pidfd_open(pid)
    except ProcessLookupError:
        return True
    try:
        readable, _, _ = select.select([fd], [], [], timeout)
        return bool(readable)
    finally:
        os.close(fd)


def test_node_timeout_on_ray_is_cancelled_retried_and_exhausted(
        ray_session: str, sqlite_url: str, tmp_path: Path) -> None:
    pids = tmp_path / "pids"
    wf = Workflow("slow")

    # the timeout counts from dispatch, so it includes a Ray worker's start-up (~1 s on a loaded
    # 2-core machine): 0.5 s cut some attempts before they began, and the pid check below failed
    @wf.step(timeout=2.0, retry=RetryPolicy(max_attempts=2, base=0.01, cap=0.01))
    def stuck(ctx: StepContext, input: str) -> int:
        with open(input, "a") as fh:
            fh.write(f"{os.getpid()}\n")
        time.sleep(60)  # the workload: longer than the node timeout
        return ctx.attempt

    started = time.monotonic()
    record = raysaga.run(wf, str(pids), store=sqlite_url, executor="ray", address=ray_session)
    elapsed = time.monotonic() - started
    assert record.status == RunStatus.FAILED
    assert elapsed < 30, "the attempts were not cut at their timeout"
    store = SqlStore(sqlite_url)
    node = next(n for n in store.nodes(record.run_id) if n.node_id == "stuck")
    assert (node.status, node.attempt) == (NodeStatus.FAILED, 2)
    assert node.error is not None
    assert node.error["type"] == "TimeoutError" and node.error["transient"] is True
    assert "timeout" in node.error["message"] and node.error["reason"] == "2 attempts exhausted"
    retries = [e for e in store.events(record.run_id) if e.kind == "retry_scheduled"]
    assert [(e.node_id, e.data["attempt"], e.data["error"]["type"]) for e in retries] == [
        ("stuck", 1, "TimeoutError")]
    assert "'stuck'" in (record.status_reason or "")
    store.close()
    # each attempt ran in a Ray worker that the cancel killed: nothing keeps sleeping
    worker_pids = [int(p) for p in pids.read_text().split()]
    assert len(worker_pids) == 2
    for pid in worker_pids:
        assert _wait_for_exit(pid, timeout=20), f"worker {pid} of a timed-out attempt still runs"


def test_ray_task_names_are_run_and_node(ray_session: str, sqlite_url: str) -> None:
    wf = Workflow("names")

    @wf.step()
    def plan() -> list[int]:
        return [10, 20]

    @wf.map("plan")
    def item(plan: int) -> str:
        import ray

        return str(ray.get_runtime_context().get_task_name())

    @wf.step()
    def single(plan: list[int]) -> str:
        import ray

        return str(ray.get_runtime_context().get_task_name())

    record = raysaga.run(wf, None, store=sqlite_url, executor="ray", address=ray_session, run_id="named-run")
    assert record.status == RunStatus.COMPLETED
    nodes = _outputs(sqlite_url, "named-run")
    assert nodes[("single", -1)][1] == "named-run:single"
    assert [nodes[("item", i)][1] for i in range(2)] == ["named-run:item[0]", "named-run:item[1]"]


def test_a_chunk_of_items_is_named_for_the_items_it_carries(ray_session: str, sqlite_url: str) -> None:
    """Short items travel several to a task once measured: the task is ``<run>:<step>[i..j]``, and
    its range holds the item that reads it."""
    wf = Workflow("chunk-names")

    @wf.step()
    def plan() -> list[int]:
        return list(range(300))

    @wf.map("plan")
    def item(plan: int) -> str:
        import ray

        return str(ray.get_runtime_context().get_task_name())

    record = raysaga.run(wf, None, store=sqlite_url, executor="ray", address=ray_session, run_id="chunked-run")
    assert record.status == RunStatus.COMPLETED
    nodes = _outputs(sqlite_url, "chunked-run")
    chunked = 0
    for i in range(300):
        name = nodes[("item", i)][1]
        assert name.startswith("chunked-run:item["), name
        span = name.removeprefix("chunked-run:item[").removesuffix("]")
        first, _, last = span.partition("..")
        assert int(first) <= i <= int(last or first), (i, name)
        chunked += bool(last)
    assert chunked > 0  # some items went several to a task


def test_a_node_timeout_counts_from_its_start_not_from_its_wait_for_a_cpu(
        ray_session: str, sqlite_url: str, tmp_path: Path) -> None:
    """Eight 1 s items with a 3 s timeout on a 2-CPU cluster run in four waves: the last starts
    ~3 s after the fan-out is dispatched. Counted from dispatch, it (and only it) timed out while
    running for less than a second; counted from its start, none does.

    Two workers are started first (a warm-up fan-out): a worker's process start is counted in
    a timeout, which is neither the wait for a CPU nor the run, and on a loaded machine (two
    pytest processes and their Ray clusters on 2 cores) it alone took item[1] past 3 s."""
    warm = Workflow("warm")

    @warm.step()
    def two() -> list[int]:
        return [0, 1]

    @warm.map("two", timeout=60.0, retry=RetryPolicy(max_attempts=1))
    def started(two: int) -> int:
        time.sleep(0.5)  # both at once: two worker processes
        return two

    assert raysaga.run(warm, None, store=sqlite_url, executor="ray", address=ray_session).status == RunStatus.COMPLETED
    wf = Workflow("queued")

    @wf.step()
    def plan() -> list[int]:
        return list(range(8))

    @wf.map("plan", timeout=3.0, retry=RetryPolicy(max_attempts=1))
    def item(plan: int) -> int:
        time.sleep(1.0)  # the workload: one second of a CPU
        return plan

    record = raysaga.run(wf, None, store=sqlite_url, executor="ray", address=ray_session)
    assert record.status == RunStatus.COMPLETED, record.status_reason
    store = SqlStore(sqlite_url)
    try:
        items = [n for n in store.nodes(record.run_id) if n.node_id == "item" and n.fan_index >= 0]
        assert [(n.status, n.attempt) for n in sorted(items, key=lambda n: n.fan_index)] == [
            (NodeStatus.COMPLETED, 1)] * 8
        assert not [e for e in store.events(record.run_id) if e.kind in ("retry_scheduled", "node_failed")]
        # they did wait for a CPU: the last items started well after the first
        starts = sorted(n.started_at or 0.0 for n in items)
        assert starts[-1] - starts[0] > 2.0
    finally:
        store.close()
