"""The gate between a driver and its executor that holds rate-limited attempts until they fit.

An attempt whose spec names a ``RateLimit`` (an agent's model call, a tool's call) is admitted
through the store (``Store.rate_acquire``: fleet-wide, every driver and worker on the store) before
it reaches the executor; until then it waits here, holding no Ray task, CPU or slot, and its
timeout has not started (its handle is not ``sent``). When it ends, its grant is released with
the tokens it used; a failure that carries a provider's ``retry-after`` blocks the limit for the
whole fleet. Attempts without a limit pass straight through.

Crash semantics do not change: the machine issued the attempt, its ledger row (for an effect)
is already durable, and a driver that dies while the attempt waits here re-issues it under the
same key after a resume; a grant whose call never ended frees its slot when its hold expires.
While the driver waits for an admitted call, it renews the call's hold once half of it has gone
(``Store.rate_extend``): a live call longer than its hold (a tool without a timeout taking more
than ``UNTIMED_HOLD``) keeps its concurrency slot, where a second call was admitted beside it.
"""

from __future__ import annotations

import time
from collections import deque
from collections.abc import Callable, Collection
from dataclasses import dataclass

from pydantic import ValidationError

from raysaga.agents.messages import ModelResponse
from raysaga.orchestrator.executor import Executor, Handle
from raysaga.orchestrator.item_block import ItemBlock, ItemsDone
from raysaga.orchestrator.spec import StepSpec
from raysaga.orchestrator.task import NodeCall, NodeOutcome
from raysaga.state import Store
from raysaga.state.rate_limits import RateRule
from raysaga.types import RateLimit

#: Seconds a concurrency slot stays held by a call that never ends (its driver died), beyond its
#: timeout; a call without a timeout holds it for ``UNTIMED_HOLD``.
HOLD_SLACK = 30.0
UNTIMED_HOLD = 300.0


@dataclass(eq=False)
class _Held:
    handle: Handle
    spec: StepSpec
    call: NodeCall
    grant: int | None = None
    inner: Handle | None = None
    hold: float = 0.0
    """Seconds the grant is held at a time (renewed while the call is under way)."""
    held_until: float = 0.0


def rule_of(limit: RateLimit) -> RateRule:
    """The store's rule for ``limit``: its window counted ``per / 20`` longer (at most 1 s), for the
    time between a grant and its request reaching the provider."""
    return RateRule(name=limit.name, requests=limit.requests, tokens=limit.tokens, per=limit.per,
                    concurrent=limit.concurrent, margin=min(1.0, limit.per / 20))


def tokens_used(outcome: NodeOutcome) -> int:
    """The model tokens a finished model call reports (its ``usage``, as the agents count it for
    budgets); 0 for anything else."""
    if not outcome.ok or not outcome.output_json:
        return 0
    try:
        return ModelResponse.model_validate_json(outcome.output_json).usage.total
    except ValidationError:
        return 0


class RateGate(Executor):
    """An ``Executor`` that admits rate-limited attempts through the store before sending them."""

    def __init__(self, inner: Executor, store: Store, clock: Callable[[], float] = time.time) -> None:
        self.inner = inner
        self.name = inner.name
        self.runs_at_submit = inner.runs_at_submit
        self.store = store
        self.clock = clock
        self._queues: dict[str, deque[_Held]] = {}  # per limit: attempts waiting, first come first served
        self._retry_at: dict[str, float] = {}  # per limit: when asking again may succeed
        self._sent: dict[Handle, _Held] = {}  # the inner handle of an admitted attempt -> its entry
        self._held: dict[Handle, _Held] = {}  # the driver's handle of a rate-limited attempt -> its entry

    def submit(self, spec: StepSpec, call: NodeCall) -> Handle:
        if spec.rate_limit is None:
            return self.inner.submit(spec, call)
        handle = Handle(key=(call.node_id, call.fan_index))
        held = self._held[handle] = _Held(handle, spec, call)
        self._queues.setdefault(spec.rate_limit.name, deque()).append(held)
        self._admit()
        return handle

    def submit_items(self, spec: StepSpec, calls: list[NodeCall]) -> list[Handle]:
        if spec.rate_limit is None:
            return self.inner.submit_items(spec, calls)
        return super().submit_items(spec, calls)

    def submit_block(self, block: ItemBlock) -> bool:
        return block.spec.rate_limit is None and self.inner.submit_block(block)  # a limited item waits its turn

    def take_items(self) -> list[ItemsDone]:
        return self.inner.take_items()

    def cancel_item(self, block: ItemBlock, position: int) -> None:
        self.inner.cancel_item(block, position)

    def pump(self) -> None:
        self.inner.pump()

    def _admit(self) -> None:
        """Send what the store admits now, each limit's queue in order (stop at its first refusal)."""
        for name, queue in self._queues.items():
            if not queue or self._retry_at.get(name, 0.0) > self.clock():
                continue
            while queue:
                now = self.clock()  # each grant dated when it is made: an inline submit takes time
                held = queue[0]
                assert held.spec.rate_limit is not None
                timeout = held.spec.timeout
                hold = timeout + HOLD_SLACK if timeout is not None else UNTIMED_HOLD
                admission = self.store.rate_acquire(rule_of(held.spec.rate_limit), now, hold)
                if admission.grant is None:
                    self._retry_at[name] = now + admission.wait
                    break
                queue.popleft()
                held.grant, held.hold, held.held_until = admission.grant, hold, now + hold
                held.inner = self.inner.submit(held.spec, held.call)
                held.handle.sent = held.inner.sent
                self._sent[held.inner] = held

    def _next_admission(self) -> float | None:
        waiting = [self._retry_at.get(name, 0.0) for name, queue in self._queues.items() if queue]
        return min(waiting) if waiting else None

    def _renew(self) -> None:
        """Renew the holds of admitted calls still under way that have used half of theirs."""
        now = self.clock()
        due = [held for held in self._sent.values() if held.held_until - now < held.hold / 2]
        if not due:
            return
        for hold in {held.hold for held in due}:
            grants = [held.grant for held in due if held.hold == hold and held.grant is not None]
            self.store.rate_extend(grants, now + hold)
        for held in due:
            held.held_until = now + held.hold

    def wait(self, handles: Collection[Handle] | None, timeout: float) -> list[Handle]:
        self._admit()
        if self._sent:
            self._renew()
        wake = self._next_admission()
        if wake is not None:
            timeout = max(0.0, min(timeout, wake - self.clock()))
        if handles is None:
            finished = self.inner.wait(None, timeout)
        else:
            inner = [self._inner_of(h) for h in handles]
            finished = self.inner.wait([h for h in inner if h is not None], timeout)
        done = [self._finished(h) for h in finished] if self._sent else finished
        for held in self._sent.values():
            assert held.inner is not None
            held.handle.sent = held.inner.sent  # a queued Ray attempt's timeout starts when it is sent
        return done

    def _inner_of(self, handle: Handle) -> Handle | None:
        held = self._held.get(handle)
        if held is None:
            return handle  # not rate-limited: the inner executor's own handle
        return held.inner  # None while it waits for its admission

    def _finished(self, inner: Handle) -> Handle:
        held = self._sent.pop(inner, None)
        if held is None:
            return inner
        del self._held[held.handle]
        assert held.grant is not None and held.spec.rate_limit is not None and inner.outcome is not None
        held.handle.outcome = inner.outcome
        held.handle.sent = True
        limit = held.spec.rate_limit
        tokens = tokens_used(inner.outcome) if limit.tokens is not None else 0  # parsed only when counted
        self.store.rate_release(held.grant, tokens, self.clock())
        retry_after = (inner.outcome.error or {}).get("retry_after")
        if isinstance(retry_after, int | float) and retry_after > 0:
            now = self.clock()
            self.store.rate_block(limit.name, now + retry_after, now)
        return held.handle

    def cancel(self, handle: Handle) -> None:
        held = self._held.pop(handle, None)
        if held is None:
            self.inner.cancel(handle)
            return
        if held.inner is None:  # still waiting: it never left
            assert held.spec.rate_limit is not None
            self._queues[held.spec.rate_limit.name].remove(held)
            return
        del self._sent[held.inner]
        self.inner.cancel(held.inner)
        assert held.grant is not None
        self.store.rate_release(held.grant, 0, self.clock())

    def settle_cancelled(self, timeout: float) -> int:
        return self.inner.settle_cancelled(timeout)

    def shutdown(self) -> None:
        self.inner.shutdown()
