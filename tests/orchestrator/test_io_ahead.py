"""I/O-bound attempts beyond the pool's free threads: one wave waits in the actors, not the driver.

A fan-out of 200 calls at a concurrency of 64 ran in four waves, and each wave after the first
started only once the driver had read, absorbed and committed the one before. Now the executor
sends attempts without a timeout up to ``IO_AHEAD`` x the pool's threads, so a thread that frees
starts the next call at once; the threads still bound how many run (the barrier test in
``test_io_bound.py`` checks that no more than ``io_concurrency`` are ever in flight). An attempt with
a timeout is sent only to a free thread: its timeout starts when it is sent.

Real Ray (the session's cluster) and a real pool; the calls block on a file the test writes.
"""

from __future__ import annotations

import json
import os
import sys
import time
from pathlib import Path
from typing import Any

import pytest

import raysaga
from raysaga import RunStatus, StepContext, Workflow
from raysaga.orchestrator.executor import Handle, RayExecutor
from raysaga.orchestrator.task import NodeCall
from raysaga.state import NodeStatus, SqlStore
from tests.support import crash_driver as harness

cloudpickle = pytest.importorskip("ray.cloudpickle")

LIMIT = 60.0


@pytest.fixture(autouse=True)
def _by_value() -> None:
    cloudpickle.register_pickle_by_value(sys.modules[__name__])


def _workflow(timeout: float | None) -> Workflow:
    wf = Workflow("io-ahead")

    @wf.step(io_bound=True, timeout=timeout)
    def call(ctx: StepContext, input: dict[str, Any]) -> dict[str, Any]:
        gate = Path(input["gate"])
        pid_file = (gate / f"started-{input['n']}")  # written whole, then renamed: a reader never sees it empty
        pid_file.with_name(f".{pid_file.name}").write_text(str(os.getpid()))
        os.replace(pid_file.with_name(f".{pid_file.name}"), pid_file)
        deadline = time.monotonic() + LIMIT
        while not (gate / "release").exists() and time.monotonic() < deadline:
            time.sleep(0.01)
        return {"n": input["n"], "key": ctx.idempotency_key}

    return wf.validate()


def _submit(executor: RayExecutor, timeout: float | None, gate: Path, n: int) -> list[Handle]:
    spec = _workflow(timeout).steps["call"]
    handles = []
    for i in range(n):
        ctx = StepContext(run_id="run-ahead", node_id="call", fan_index=i, attempt=1, trace_id="t",
                          idempotency_key=f"key-{i}")
        call = NodeCall(ctx=ctx, kwargs={"input": {"gate": str(gate), "n": i}}, max_output_bytes=1 << 20)
        handles.append(executor.submit(spec, call))
    return handles


def _finish(executor: RayExecutor, handles: list[Handle], gate: Path) -> dict[Handle, Any]:
    """Release the calls and wait for every one's outcome."""
    (gate / "release").write_text("go")
    ended: dict[Handle, Any] = {}
    deadline = time.monotonic() + LIMIT
    while len(ended) < len(handles) and time.monotonic() < deadline:
        for handle in executor.wait(None, 1.0):
            assert handle not in ended, f"{handle.key} reported twice"
            ended[handle] = handle.outcome
    assert len(ended) == len(handles), "a call never ended"
    return ended


@pytest.mark.parametrize("timeout", [None, 30.0], ids=["untimed", "timed"])
def test_calls_beyond_the_free_threads_wait_in_the_actors_unless_they_have_a_timeout(
        ray_session: str, tmp_path: Path, timeout: float | None) -> None:
    executor = RayExecutor(address=ray_session, io_concurrency=2)
    try:
        # a call with a timeout also waits for the actors to start (the test below): started first
        harness.wait_until(executor.io_pool.all_started, timeout=LIMIT, what="the pool's actors to start")
        handles = _submit(executor, timeout, tmp_path, 6)
        assert executor.wait(None, 0.0) == []  # sends what may go now; nothing has ended
        ahead = RayExecutor.IO_AHEAD * 2 if timeout is None else 2
        assert [h.sent for h in handles] == [True] * ahead + [False] * (6 - ahead)
        # the threads run the first two; the sent ones beyond them are queued in their actor
        harness.wait_until(lambda: len(list(tmp_path.glob("started-*"))) >= 2, timeout=LIMIT,
                           what="the first two calls to start")
        ended = _finish(executor, handles, tmp_path)
    finally:
        (tmp_path / "release").write_text("go")  # a failed assertion leaves no call blocking the shared pool
        executor.shutdown()
    for i, handle in enumerate(handles):  # each call kept its own outcome
        outcome = ended[handle]
        assert outcome.ok, outcome
        assert outcome.output_json is not None and json.loads(outcome.output_json) == {"n": i, "key": f"key-{i}"}
    assert sorted(p.name for p in tmp_path.glob("started-*")) == sorted(f"started-{i}" for i in range(6))


def _wait_for_file(path: str) -> int:
    deadline = time.monotonic() + LIMIT
    while not Path(path).exists() and time.monotonic() < deadline:  # the workload: waits for the test
        time.sleep(0.01)
    return 0


def test_a_timed_call_waits_for_its_actor_to_start_not_in_its_timeout(ray_session: str, tmp_path: Path) -> None:
    """An actor's process takes ~0.5 s to start on 2 idle cores, seconds under load. A call with a
    timeout sent to one still starting counted that start in its timeout: a 1 s timeout could
    expire on a call that never ran, and the retry, on the fresh actor that replaced the one its
    timeout killed, again. Now it stays queued (its clock not started) until the pool's actors
    are up. Here an actor 'starts' when the test says so: its readiness is a task that waits for
    a file (the test's stand-in for a slow process start)."""
    import ray

    executor = RayExecutor(address=ray_session, io_concurrency=3)  # a pool of its own: no other test uses 3
    pool = executor.io_pool
    spawn = pool._spawn
    slow_start = ray.remote(_wait_for_file)
    up = tmp_path / "actors-up"

    def spawn_slowly() -> Any:
        actor = spawn()
        actor.ready = slow_start.remote(str(up))
        return actor

    pool._spawn = spawn_slowly  # type: ignore[method-assign]
    try:
        if pool.all_started():
            pytest.skip("this process's pool of 3 started in an earlier test")
        handles = _submit(executor, 1.0, tmp_path, 1)
        for _ in range(3):
            assert executor.wait(None, 0.0) == []
        assert not handles[0].sent, "a call with a timeout was sent to an actor not started"
        up.write_text("up")
        harness.wait_until(lambda: executor.wait(None, 0.05) == [] and handles[0].sent, timeout=LIMIT,
                           what="the call to leave once the actors are up")
        ended = _finish(executor, handles, tmp_path)
    finally:
        pool._spawn = spawn  # type: ignore[method-assign]
        up.write_text("up")
        (tmp_path / "release").write_text("go")
        executor.shutdown()
    outcome = ended[handles[0]]
    assert outcome.ok, outcome  # ran, within its timeout counted from its start


def test_a_rounds_io_calls_leave_before_its_commit(ray_session: str, sqlite_url: str) -> None:
    """A plain step's completion may overlap what it made ready (``RunMachine.may_overlap``): the
    items it readied are sent (``Executor.pump`` at the end of the driver's round), then the
    completion commits; they no longer wait in the executor's queue for the next ``wait``."""
    wf = Workflow("io-pump")

    @wf.step()
    def plan(input: int) -> list[int]:
        return list(range(input))

    @wf.map("plan", io_bound=True)
    def item(plan: int) -> int:
        return plan * 2

    @wf.step()
    def total(item: list[int]) -> int:
        return sum(item)

    executor = RayExecutor(address=ray_session)
    store = SqlStore(sqlite_url)
    order: list[str] = []
    send_io, commit = executor._send_io, store.commit

    def recording_send(items: list[Any]) -> None:
        order.append(f"send {len(items)}")
        send_io(items)

    def recording_commit(lease: Any, batch: Any) -> Any:
        done = sorted(w.node_id for w in batch.node_writes() if w.status == NodeStatus.COMPLETED)
        order.append(f"commit {','.join(dict.fromkeys(done))}")
        return commit(lease, batch)

    executor._send_io = recording_send  # type: ignore[method-assign]
    store.commit = recording_commit  # type: ignore[method-assign]
    try:
        record = raysaga.run(wf, 5, store=store, executor=executor)
    finally:
        store.close()
        executor.shutdown()
    assert record.status == RunStatus.COMPLETED and record.output == {"total": 20}, record
    plan_commit = next(i for i, e in enumerate(order) if e.startswith("commit ") and "plan" in e[7:].split(","))
    assert order.index("send 5") < plan_commit, order
