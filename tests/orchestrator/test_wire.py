"""The driver-worker envelope (``raysaga.orchestrator.wire``), in one process: what the worker
runs from a packed payload must be what ``execute`` gives for the call itself."""

from __future__ import annotations

import json
import pickle  # noqa: TID251 - the wire format: what the driver sends its Ray workers
import sys
from typing import Any

import pytest

from raysaga import StepContext, Workflow
from raysaga.errors import Permanent
from raysaga.orchestrator import wire
from raysaga.orchestrator.task import NodeCall, execute

cloudpickle = pytest.importorskip("ray.cloudpickle")


@pytest.fixture(autouse=True)
def _by_value() -> None:
    cloudpickle.register_pickle_by_value(sys.modules[__name__])
    wire._specs.clear()


def _workflow() -> Workflow:
    wf = Workflow("wire")

    @wf.step()
    def echo(ctx: StepContext, input: dict[str, Any]) -> dict[str, Any]:
        if input.get("fail") == "permanent":
            raise Permanent("no")
        if input.get("fail") == "transient":
            raise ConnectionError("flaky")
        return {"input": input, "ctx": [ctx.run_id, ctx.node_id, ctx.fan_index, ctx.attempt, ctx.trace_id,
                                        ctx.idempotency_key, ctx.reconciling]}

    return wf.validate()


def _call(value: dict[str, Any], *, index: int = -1, key: str | None = None, reconciling: bool = False) -> NodeCall:
    ctx = StepContext(run_id="run-1", node_id="echo", fan_index=index, attempt=3, trace_id="trace-9",
                      idempotency_key=key, reconciling=reconciling)
    return NodeCall(ctx=ctx, kwargs={"input": value}, max_output_bytes=1 << 20, reconcile=reconciling)


def _same(a: Any, b: Any) -> None:
    assert (a.ok, a.output_json, a.transient) == (b.ok, b.output_json, b.transient)
    if a.error is not None:
        assert b.error is not None
        assert {k: v for k, v in a.error.items() if k != "traceback"} == \
            {k: v for k, v in b.error.items() if k != "traceback"}
    else:
        assert b.error is None


def test_packed_calls_run_as_execute_would_each_classified_on_its_own() -> None:
    spec = _workflow().steps["echo"]
    calls = [_call({"n": 1}), _call({"n": 2}, index=4, key="k-1", reconciling=True),
             _call({"fail": "permanent"}), _call({"fail": "transient"}), _call({"unicode": "é ✓ \U0001f600"})]
    outcomes = wire.unpack_outcomes(wire.run_packed(wire.SpecPacker().pack_calls(spec, calls)))
    assert len(outcomes) == len(calls)
    for call, outcome in zip(calls, outcomes, strict=True):
        _same(outcome, execute(spec, call))
    assert [o.ok for o in outcomes] == [True, True, False, False, True]
    assert outcomes[2].transient is False and outcomes[3].transient is True
    assert json.loads(outcomes[1].output_json or "")["ctx"] == ["run-1", "echo", 4, 3, "trace-9", "k-1", True]


def test_a_spec_is_pickled_once_by_the_driver_and_unpickled_once_by_a_worker() -> None:
    spec = _workflow().steps["echo"]
    packer = wire.SpecPacker()
    first = packer.pack_calls(spec, [_call({"n": 1})])
    second = packer.pack_calls(spec, [_call({"n": 2})])
    digest, _, _ = pickle.loads(first)
    assert pickle.loads(second)[0] == digest
    assert pickle.loads(second)[1] is not None
    wire.run_packed(first)
    assert list(wire._specs) == [digest]
    # the worker keeps the spec by digest: a payload naming it runs even with unreadable spec bytes
    doctored = pickle.dumps((digest, b"not a pickle", [wire.pack_call(_call({"n": 5}))]))
    (outcome,) = wire.unpack_outcomes(wire.run_packed(doctored))
    assert outcome.ok and json.loads(outcome.output_json or "")["input"] == {"n": 5}
    # an equal spec built again (a tool call makes one per call) travels under the same digest
    again = _workflow().steps["echo"]
    assert again is not spec
    assert pickle.loads(packer.pack_calls(again, [_call({})]))[0] == digest


def test_a_spec_the_worker_cannot_load_fails_the_task() -> None:
    """Ray reports such a task failed; the executor classifies that transient (a dead worker's case)."""
    payload = pickle.dumps(("unknown-digest", b"not a pickle", [wire.pack_call(_call({}))]))
    with pytest.raises(pickle.UnpicklingError):
        wire.run_packed(payload)


def test_the_spec_tables_stay_bounded(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(wire, "CACHE_LIMIT", 3)
    packer = wire.SpecPacker()
    for _ in range(10):
        spec = _workflow().steps["echo"]
        wire.run_packed(packer.pack_calls(spec, [_call({})]))
        assert len(packer._packed) <= 3
    assert len(wire._specs) <= 3
