"""The I/O pool's batched transport (``IoPool.send_many``): the calls a driver sends together go as
one streaming actor call per pool actor, yet each keeps its own outcome, and a killed or retired
actor fails its calls as a dead actor's call always did (transient, retried by the driver)."""

from __future__ import annotations

import os
import pickle  # noqa: TID251 - the wire format: what the driver sends its pool actors
import signal
import sys
import time
from pathlib import Path
from typing import Any

import pytest

from raysaga import StepContext, Workflow
from raysaga.orchestrator.io_pool import IoPool, is_actor_death
from raysaga.orchestrator.task import NodeCall
from raysaga.orchestrator.wire import SpecPacker, unpack_outcomes
from tests.support import crash_driver as harness

cloudpickle = pytest.importorskip("ray.cloudpickle")

LIMIT = 60.0


@pytest.fixture(autouse=True)
def _by_value() -> None:
    cloudpickle.register_pickle_by_value(sys.modules[__name__])


def _workflow() -> Workflow:
    wf = Workflow("io-streams")

    @wf.step(io_bound=True)
    def call(ctx: StepContext, input: dict[str, Any]) -> dict[str, Any]:
        if input.get("fail"):
            raise ValueError(f"call {input['n']} refused")
        gate = input.get("gate")
        if gate:  # blocks until the test releases it (or kills this process)
            # written whole, then renamed: the test reads the pid as soon as the name exists
            # (a plain write_text showed it empty once, under load: CI, 2026-11-29)
            Path(gate, f".partial-{input['n']}").write_text(str(os.getpid()))
            os.replace(Path(gate, f".partial-{input['n']}"), Path(gate, f"started-{input['n']}"))
            deadline = time.monotonic() + LIMIT
            while not Path(gate, "release").exists() and time.monotonic() < deadline:
                time.sleep(0.01)
        return {"n": input["n"], "pid": os.getpid(), "key": ctx.idempotency_key}

    return wf.validate()


def _payloads(packer: SpecPacker, values: list[dict[str, Any]]) -> list[tuple[bytes, Any]]:
    spec = _workflow().steps["call"]
    out = []
    for i, value in enumerate(values):
        ctx = StepContext(run_id="run-s", node_id="call", fan_index=i, attempt=1, trace_id="t",
                          idempotency_key=f"key-{i}")
        out.append((packer.pack_calls(spec, [NodeCall(ctx=ctx, kwargs={"input": value}, max_output_bytes=1 << 20)]),
                    f"tag-{i}"))
    return out


def _drain(ray: Any, pool: IoPool, gens: list[Any]) -> dict[str, tuple[Any, bool]]:
    """Every call's end, as the executor reads them: ``ray.wait`` on the streams, ``collect`` each."""
    ended: dict[str, tuple[Any, bool]] = {}
    open_ = list(gens)
    deadline = time.monotonic() + LIMIT
    while open_ and time.monotonic() < deadline:
        ready, _ = ray.wait(open_, num_returns=1, timeout=1.0)
        for gen in ready:
            calls, over = pool.collect(gen)
            for tag, result, died in calls:
                assert tag not in ended, f"{tag} reported twice"
                ended[tag] = (unpack_outcomes(result)[0] if isinstance(result, bytes) else result, died)
            if over:
                open_.remove(gen)
    assert not open_, "a stream never ended"
    return ended


def test_a_burst_is_one_actor_call_per_actor_and_each_call_keeps_its_own_outcome(ray_session: str) -> None:
    import ray

    pool = IoPool(ray, 8)  # 1 actor x 8 threads
    try:
        values: list[dict[str, Any]] = [{"n": i, "fail": i == 3} for i in range(6)]
        streams = pool.send_many(_payloads(SpecPacker(), values), "run-s:io")
        assert len(streams) == 1 and len(streams[0].tags) == 6  # one actor call, not six
        assert pool.room() == 2
        ended = _drain(ray, pool, [s.gen for s in streams])
        assert sorted(ended) == [f"tag-{i}" for i in range(6)]
        for i in range(6):
            outcome, died = ended[f"tag-{i}"]
            assert not died
            if i == 3:  # the step's own error: a permanent failure of that call alone
                assert not outcome.ok and outcome.error["type"] == "ValueError" and not outcome.transient
            else:
                assert outcome.ok and f'"n":{i}' in outcome.output_json.replace(" ", "")
        assert pool.room() == 8 and pool.unsettled() == []
    finally:
        pool.shutdown()


def test_a_killed_actor_fails_every_call_of_its_stream_not_ended_and_is_replaced(
        ray_session: str, tmp_path: Path) -> None:
    import ray

    pool = IoPool(ray, 8)
    try:
        values: list[dict[str, Any]] = [{"n": 0}, *({"n": i, "gate": str(tmp_path)} for i in (1, 2))]
        [stream] = pool.send_many(_payloads(SpecPacker(), values), "run-s:io")
        first = _drain_until(ray, pool, stream.gen, {"tag-0"})
        assert first["tag-0"][0].ok  # the quick call ended on its own, before the kill
        harness.wait_until(lambda: len(list(tmp_path.glob("started-*"))) == 2, timeout=LIMIT,
                           what="both gated calls to start")
        pid = int((tmp_path / "started-1").read_text())
        os.kill(pid, signal.SIGKILL)
        ended = _drain(ray, pool, [stream.gen])
        assert sorted(ended) == ["tag-1", "tag-2"]
        for exc, died in ended.values():
            assert died and is_actor_death(exc)
        assert pool.room() == 8 and pool.actors() == []  # dropped: a fresh one takes the next send
        [again] = pool.send_many(_payloads(SpecPacker(), [{"n": 9}]), "run-s:io")
        (outcome, died), = _drain(ray, pool, [again.gen]).values()
        assert outcome.ok and not died and str(pid) not in outcome.output_json
    finally:
        (tmp_path / "release").touch()
        pool.shutdown()


def _drain_until(ray: Any, pool: IoPool, gen: Any, tags: set[str]) -> dict[str, tuple[Any, bool]]:
    ended: dict[str, tuple[Any, bool]] = {}
    deadline = time.monotonic() + LIMIT
    while not tags <= set(ended) and time.monotonic() < deadline:
        ready, _ = ray.wait([gen], num_returns=1, timeout=1.0)
        if ready:
            calls, _ = pool.collect(gen)
            ended.update({tag: (unpack_outcomes(r)[0] if isinstance(r, bytes) else r, d) for tag, r, d in calls})
    assert tags <= set(ended)
    return ended


def test_a_cancelled_call_retires_its_actor_which_is_killed_once_settled(ray_session: str, tmp_path: Path) -> None:
    import ray

    pool = IoPool(ray, 8)
    try:
        values: list[dict[str, Any]] = [{"n": i, "gate": str(tmp_path)} for i in range(2)]
        [stream] = pool.send_many(_payloads(SpecPacker(), values), "run-s:io")
        harness.wait_until(lambda: len(list(tmp_path.glob("started-*"))) == 2, timeout=LIMIT,
                           what="both calls to start")
        pool.cancel_call(stream.gen, "tag-0")
        assert pool.room() == 7 and pool.actors() == []  # retired: no new call goes to it
        assert pool.unsettled() == [stream.gen]
        pool.kill_retired()  # what the executor does when the driver settles its cancellations
        ended = _drain(ray, pool, [stream.gen])
        assert set(ended) == {"tag-0", "tag-1"} and all(died for _, died in ended.values())
        assert pool.unsettled() == [] and pool.room() == 8
        pid = int((tmp_path / "started-0").read_text())
        harness.wait_until(lambda: harness.process_gone(pid), timeout=LIMIT, what=f"process {pid} to exit")
    finally:
        (tmp_path / "release").touch()
        pool.shutdown()


def test_packed_groups_round_trip() -> None:
    """What a stream item carries: (index, packed outcomes | exception) pairs, pickled once."""
    from concurrent.futures import Future

    from raysaga.orchestrator.io_pool import _reported

    ok: Future[bytes] = Future()
    ok.set_result(b"x")
    bad: Future[bytes] = Future()
    bad.set_exception(ModuleNotFoundError("no module named 'flows'"))
    items = pickle.loads(pickle.dumps([_reported(0, ok), _reported(1, bad)]))
    assert items[0] == (0, b"x")
    assert items[1][0] == 1 and isinstance(items[1][1], ModuleNotFoundError)
