"""Third adversarial round, fleet-wide rate limits: a concurrency slot of a call still under way.

``RateLimit(concurrent=1)`` on a call without a timeout (a tool's default): its grant holds the
slot for ``UNTIMED_HOLD`` (300 s) unless released, so that a driver that died frees it. A live
call that simply takes longer than that (a long tool, a slow model) loses its slot at 300 s and
a second call is admitted beside it: two calls at once under a limit of one (the provider's own
concurrency limit answers 429s, or worse, a tool that must not run twice at once does). Nothing
renewed the hold of a call the driver still waits for. Now ``RateGate.wait`` renews it
(``Store.rate_extend``) once half of it has gone; a driver that died renews nothing, so its
slot is still freed when the hold expires.
"""

from __future__ import annotations

import dataclasses

from raysaga import RateLimit, Workflow
from raysaga.orchestrator.rate_gate import UNTIMED_HOLD, RateGate
from raysaga.orchestrator.spec import StepSpec
from raysaga.orchestrator.task import NodeCall
from raysaga.state import SqlStore
from tests.support.endless_executor import Endless


def _spec() -> StepSpec:
    wf = Workflow("stop28_slot")

    @wf.step()
    def call() -> int:
        return 1

    return dataclasses.replace(wf.steps["call"], rate_limit=RateLimit(name="stop28-slot", concurrent=1), timeout=None)


def _call(node: str) -> NodeCall:
    return NodeCall(fields=("run", node, -1, 1, "trace", None, False), kwargs={}, max_output_bytes=1 << 20)


def test_a_call_longer_than_its_hold_keeps_its_concurrency_slot(sqlite_url: str) -> None:
    now = [1_000_000.0]
    store = SqlStore(sqlite_url)
    try:
        inner = Endless()
        gate = RateGate(inner, store, clock=lambda: now[0])
        spec = _spec()
        gate.submit(spec, _call("first"))
        gate.submit(spec, _call("second"))  # waits for the slot
        assert inner.sent == ["first"]
        for _ in range(int(UNTIMED_HOLD // 10) + 5):  # the driver waits for the first call, 10 s a round
            now[0] += 10.0
            gate.wait(None, 0.0)
        assert inner.sent == ["first"], "a second call was admitted while the first still held the only slot"
    finally:
        store.close()


def test_a_dead_drivers_slot_is_still_freed_when_its_hold_expires(sqlite_url: str) -> None:
    """The renewal is the live driver's: a gate that stops waiting (its driver died) lets the
    hold run out, and another driver's call is admitted then."""
    now = [1_000_000.0]
    store = SqlStore(sqlite_url)
    try:
        dead, alive = Endless(), Endless()
        spec = _spec()
        RateGate(dead, store, clock=lambda: now[0]).submit(spec, _call("first"))
        gate = RateGate(alive, store, clock=lambda: now[0])
        gate.submit(spec, _call("second"))
        assert alive.sent == []
        now[0] += UNTIMED_HOLD + 1.0
        gate.wait(None, 0.0)
        assert alive.sent == ["second"]
    finally:
        store.close()
