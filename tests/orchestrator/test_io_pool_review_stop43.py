"""Review stop 43 (I/O pool and executors): a queued call on a retired actor, the inline executor's timeouts."""

from __future__ import annotations

import logging
import os
import pickle  # noqa: TID251 - the wire format: what the driver and its pool actors exchange
import sys
import time
from pathlib import Path
from typing import Any

import pytest

import raysaga
from raysaga import RetryPolicy, RunStatus, StepContext, Workflow
from raysaga.orchestrator.io_pool import CANCEL_GRACE_S, IoPool, NotStarted, _reported, is_actor_death
from raysaga.orchestrator.task import NodeCall
from raysaga.orchestrator.wire import SpecPacker, unpack_outcomes
from raysaga.state import NodeStatus, SqlStore
from tests.support import crash_driver as harness

cloudpickle = pytest.importorskip("ray.cloudpickle")


def test_the_inline_executor_warns_once_per_run_and_step_that_it_ignores_a_timeout(
        sqlite_url: str, caplog: pytest.LogCaptureFixture) -> None:
    wf = Workflow("inline-timeouts")

    @wf.step()
    def plan() -> list[int]:
        return [1, 2, 3]

    @wf.map("plan", timeout=5)
    def slow(plan: int) -> int:
        return plan

    @wf.step()
    def untimed(slow: list[int]) -> int:
        return sum(slow)

    def warnings() -> list[str]:
        return [r.getMessage() for r in caplog.records
                if r.levelno == logging.WARNING and "inline executor ignores" in r.getMessage()]

    with caplog.at_level(logging.WARNING, logger="raysaga"):
        first = raysaga.run(wf, None, store=sqlite_url, executor="inline")
        assert first.status == RunStatus.COMPLETED and first.output == {"untimed": 6}
        assert len(warnings()) == 1  # three items, one warning
        assert "step 'slow' has timeout=5s" in warnings()[0] and first.run_id in warnings()[0]
        second = raysaga.run(wf, None, store=sqlite_url, executor="inline")
    assert len(warnings()) == 2 and second.run_id in warnings()[1]


LIMIT = 60.0


def _gated_workflow() -> Workflow:
    wf = Workflow("io-withdraw")

    @wf.step(io_bound=True)
    def call(input: dict[str, Any]) -> dict[str, Any]:
        gate = input.get("gate")
        if gate:  # blocks until the test releases it (or its actor is killed)
            Path(gate, f".partial-{input['n']}").write_text(str(os.getpid()))
            os.replace(Path(gate, f".partial-{input['n']}"), Path(gate, f"started-{input['n']}"))
            deadline = time.monotonic() + LIMIT
            while not Path(gate, "release").exists() and time.monotonic() < deadline:
                time.sleep(0.01)
        return {"n": input["n"], "pid": os.getpid()}

    return wf.validate()


def _payload(packer: SpecPacker, n: int, value: dict[str, Any]) -> tuple[bytes, str]:
    spec = _gated_workflow().steps["call"]
    ctx = StepContext(run_id="run-w", node_id="call", fan_index=n, attempt=1, trace_id="t", idempotency_key=f"key-{n}")
    return packer.pack_calls(spec, [NodeCall(ctx=ctx, kwargs={"input": value}, max_output_bytes=1 << 20)]), f"tag-{n}"


@pytest.mark.ray
def test_calls_queued_on_a_retired_actor_go_to_another_actor_as_the_same_attempt(
        ray_session: str, tmp_path: Path) -> None:
    """Two threads, one actor: ``a`` and ``d`` run (gated), ``b`` waits in the actor's thread pool,
    ``c`` in Ray's queue for the actor (its stream not begun). ``a`` is cancelled: its actor
    retires. ``b`` and ``c`` never started: they come back and run on a fresh actor, at once, not
    failed by the kill at the end of the grace. ``d`` may have started: it fails with the actor's
    death when the actor is killed (transient, retried by the driver under the same key)."""
    import ray

    cloudpickle.register_pickle_by_value(sys.modules[__name__])
    pool = IoPool(ray, 2)  # 1 actor x 2 threads (its Ray concurrency: 3, so a third stream waits)
    packer = SpecPacker()
    gate = str(tmp_path)
    try:
        started = time.monotonic()
        [a] = pool.send_many([_payload(packer, 0, {"n": 0, "gate": gate})], "run-w:a")
        [d] = pool.send_many([_payload(packer, 3, {"n": 3, "gate": gate})], "run-w:d")
        harness.wait_until(lambda: len(list(tmp_path.glob("started-*"))) == 2, timeout=LIMIT,
                           what="the two gated calls to start")
        [b] = pool.send_many([_payload(packer, 1, {"n": 1})], "run-w:b")
        [c] = pool.send_many([_payload(packer, 2, {"n": 2})], "run-w:c")
        assert a.actor is b.actor is c.actor is d.actor
        pool.cancel_call(a.gen, "tag-0")  # a's timeout, say: its actor retires
        ended: dict[str, tuple[Any, bool]] = {}
        open_ = [a.gen, b.gen, c.gen]
        deadline = time.monotonic() + LIMIT
        while not {"tag-1", "tag-2"} <= set(ended) and time.monotonic() < deadline:
            ready, _ = ray.wait(open_, num_returns=1, timeout=1.0)
            for gen in ready:
                calls, over, moved = pool.collect_moving(gen)
                for tag, result, died in calls:
                    ended[tag] = (unpack_outcomes(result)[0] if isinstance(result, bytes) else result, died)
                open_ += [s.gen for s in moved]
                assert all(s.actor is not a.actor for s in moved)
                if over:
                    open_.remove(gen)
        for tag, n in (("tag-1", 1), ("tag-2", 2)):
            outcome, died = ended[tag]
            assert not died and getattr(outcome, "ok", False), (tag, outcome)
            pid = int((tmp_path / "started-0").read_text())
            assert f'"n":{n}' in outcome.output_json.replace(" ", "") and str(pid) not in outcome.output_json
        assert time.monotonic() - started < CANCEL_GRACE_S  # not after the grace, not killed by it
        pool.kill_retired()  # the driver settles a's cancel: d, which may have started, dies with it
        deadline = time.monotonic() + LIMIT
        while "tag-3" not in ended and time.monotonic() < deadline:
            ready, _ = ray.wait([d.gen], num_returns=1, timeout=1.0)
            if ready:
                for tag, result, died in pool.collect_moving(d.gen)[0]:
                    ended[tag] = (result, died)
        exc, died = ended["tag-3"]
        assert died and is_actor_death(exc)  # a crash's semantics: transient, the same key again
        assert "tag-0" not in ended or ended["tag-0"][1]
    finally:
        (tmp_path / "release").touch()
        pool.shutdown()


def test_a_call_given_back_unstarted_is_reported_as_not_started() -> None:
    """What an actor's stream says of a call ``withdraw`` gave back: ``NotStarted`` (the pool
    re-sends it), not the ``CancelledError`` a cancelled future raises."""
    from concurrent.futures import Future

    given_back: Future[bytes] = Future()
    assert given_back.cancel()
    index, result = pickle.loads(pickle.dumps(_reported(4, given_back)))
    assert index == 4 and isinstance(result, NotStarted) and "given back before it started" in str(result)


@pytest.mark.ray
def test_a_call_queued_behind_a_timed_out_one_runs_and_its_attempt_is_not_lost(
        ray_session: str, sqlite_url: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A pool of one thread: ``other`` waits in the actor's queue behind ``block``, which times
    out. ``other`` never started: it must run (on a fresh actor), not fail for good with the
    actor's death at the end of the grace (max_attempts=1)."""
    cloudpickle.register_pickle_by_value(sys.modules[__name__])
    monkeypatch.setenv("RAYSAGA_IO_CONCURRENCY", "1")
    gate = str(tmp_path)
    wf = Workflow("io-queued-behind-timeout")

    @wf.step(io_bound=True, timeout=1, critical=False, retry=RetryPolicy(max_attempts=1))
    def block() -> int:
        deadline = time.monotonic() + 30
        while not Path(gate, "release").exists() and time.monotonic() < deadline:
            time.sleep(0.01)
        return 1

    @wf.step(io_bound=True, retry=RetryPolicy(max_attempts=1))
    def other() -> int:
        Path(gate, "other-ran").touch()
        return 2

    try:
        started = time.monotonic()
        record = raysaga.run(wf, None, store=sqlite_url, executor="ray", address=ray_session)
        took = time.monotonic() - started
    finally:
        Path(gate, "release").touch()
    store = SqlStore(sqlite_url)
    try:
        nodes = {n.label: n for n in store.nodes(record.run_id)}
    finally:
        store.close()
    assert (nodes["other"].status, nodes["other"].attempt) == (NodeStatus.COMPLETED, 1), nodes["other"].error
    assert Path(gate, "other-ran").exists()
    assert nodes["block"].status == NodeStatus.FAILED and record.status == RunStatus.COMPLETED
    assert took < CANCEL_GRACE_S  # nothing waited out the retired actor's grace
