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
than ``UNTIMED_HOLD``) keeps its concurrency slot, where a second call was admitted beside it. A
call the executor runs inside ``submit`` (inline) has its hold renewed by a thread meanwhile.

A cancelled call (a timeout is a cancel, as are a pause and a run's cancel) keeps its grant, renewed
the same way, until the executor says it has stopped (``Executor.stopped``): a thread of the I/O
pool cannot be killed, only its actor, up to ``CANCEL_GRACE_S`` later. Released at the cancel, the
slot went to the timed-out call's retry, which ran beside the call it replaced (2 calls at once
under ``concurrent=1``).

An attempt that comes back from ``submit`` already finished (the inline executor runs it there)
is settled at once, before the next of its queue is admitted: its 429's ``retry-after`` then holds
the rest of the queue, which used to be sent whole before any outcome was read.
"""

from __future__ import annotations

import threading
import time
from collections import deque
from collections.abc import Callable, Collection
from dataclasses import dataclass

from pydantic import ValidationError

from raysaga.agents.messages import ModelResponse
from raysaga.orchestrator.executor import Executor, Handle
from raysaga.orchestrator.executor_base import GateHold
from raysaga.orchestrator.item_block import ItemBlock, ItemsDone
from raysaga.orchestrator.machine.speculating import CLIENT_TIMEOUT
from raysaga.orchestrator.spec import StepSpec
from raysaga.orchestrator.task import NodeCall, NodeOutcome
from raysaga.state import Store
from raysaga.state.rate_limits import RateRule
from raysaga.types import RateLimit

#: Seconds a concurrency slot stays held by a call that never ends (its driver died), beyond its
#: timeout (or its model client's); a call without either holds it for ``UNTIMED_HOLD``.
HOLD_SLACK = 30.0
UNTIMED_HOLD = 300.0
#: Seconds between looks at the hold of a call run inline (``RateGate._send``).
INLINE_RENEW_S = 0.5


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
    settled: bool = False
    """Its grant released: its call ended (a 429's retry-after recorded), or was cancelled and stopped."""


@dataclass(frozen=True)
class RateHold(GateHold):
    """``GateHold`` saying why its limits refused (``Admission.why``): the run's status reason tells
    a provider's block from the limit's own pacing (``rate_limits.waiting_reason``)."""

    why: tuple[str, ...] = ()


def rule_of(limit: RateLimit) -> RateRule:
    """The store's rule for ``limit``: its window counted ``per / 20`` longer (at most 1 s), for the
    time between a grant and its request reaching the provider."""
    return RateRule(name=limit.name, requests=limit.requests, tokens=limit.tokens, per=limit.per,
                    concurrent=limit.concurrent, margin=min(1.0, limit.per / 20))


def hold_of(spec: StepSpec) -> float:
    """How long a grant of ``spec``'s call is held if nothing renews it (its driver died): its
    timeout, or its model client's own (``CLIENT_TIMEOUT``: a call the client gives up on cannot
    hold a slot longer), plus slack; ``UNTIMED_HOLD`` without either."""
    timeout = spec.timeout if spec.timeout is not None else spec.options.get(CLIENT_TIMEOUT)
    if spec.timeout is None and isinstance(timeout, int | float):  # a model's own ``timeout`` attribute may
        return min(float(timeout) + HOLD_SLACK, UNTIMED_HOLD)  # not be seconds (a user's model, in ms)
    return float(timeout) + HOLD_SLACK if isinstance(timeout, int | float) else UNTIMED_HOLD


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
        self.effect_window = inner.effect_window
        self.store = store
        self.clock = clock
        self._queues: dict[str, deque[_Held]] = {}  # per limit: attempts waiting, first come first served
        self._retry_at: dict[str, float] = {}  # per limit: when asking again may succeed
        self._why: dict[str, str] = {}  # per limit: why its last ask was refused (``Admission.why``)
        self._sent: dict[Handle, _Held] = {}  # the inner handle of an admitted attempt -> its entry
        self._held: dict[Handle, _Held] = {}  # the driver's handle of a rate-limited attempt -> its entry
        self._stopping: list[_Held] = []  # cancelled after admission, not seen to stop: their grants held

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
                hold = hold_of(held.spec)
                admission = self.store.rate_acquire(rule_of(held.spec.rate_limit), now, hold)
                if admission.grant is None:
                    self._retry_at[name] = now + admission.wait
                    self._why[name] = admission.why
                    break
                queue.popleft()
                held.grant, held.hold, held.held_until = admission.grant, hold, now + hold
                held.inner = self._send(held)
                held.handle.sent = held.inner.sent
                self._sent[held.inner] = held
                if held.inner.outcome is not None:  # it ran in ``submit`` (inline): its 429 blocks the next
                    self._settle(held, held.inner.outcome)

    def _send(self, held: _Held) -> Handle:
        """Submit an admitted call. An executor that runs it in ``submit`` (inline) returns only when
        it ends, and ``wait`` renews no hold meanwhile: a call longer than its hold (an inline call's
        timeout cannot cut it) lost its ``concurrent=`` slot to a second call beside it. A thread
        renews its hold while it runs."""
        if not self.inner.runs_at_submit:
            return self.inner.submit(held.spec, held.call)
        stop = threading.Event()
        renewer = threading.Thread(target=self._renew_while, args=(held, stop), name="raysaga-rate-hold", daemon=True)
        renewer.start()
        try:
            return self.inner.submit(held.spec, held.call)
        finally:
            stop.set()
            renewer.join()

    def _renew_while(self, held: _Held, stop: threading.Event) -> None:
        """Renew ``held``'s grant, once half its hold has gone, until ``stop`` (its inline call ended)."""
        assert held.grant is not None
        while not stop.wait(min(held.hold / 4, INLINE_RENEW_S)):
            now = self.clock()
            if held.held_until - now >= held.hold / 2:
                continue
            try:
                self.store.rate_extend([held.grant], now + held.hold)
            except Exception:  # the store busy for a moment: asked again at the next tick, long before it expires
                continue
            held.held_until = now + held.hold

    def _next_admission(self) -> float | None:
        waiting = [self._retry_at.get(name, 0.0) for name, queue in self._queues.items() if queue]
        return min(waiting) if waiting else None

    def _renew(self) -> None:
        """Renew the holds of admitted calls still under way (cancelled ones too, until they stop)
        that have used half of theirs."""
        now = self.clock()
        due = [held for held in (*self._sent.values(), *self._stopping)
               if not held.settled and held.held_until - now < held.hold / 2]
        if not due:
            return
        for hold in {held.hold for held in due}:
            grants = [held.grant for held in due if held.hold == hold and held.grant is not None]
            self.store.rate_extend(grants, now + hold)
        for held in due:
            held.held_until = now + held.hold

    def wait(self, handles: Collection[Handle] | None, timeout: float) -> list[Handle]:
        if self._stopping:
            self._release_stopped()  # before admitting: a slot they held is free for the next
        self._admit()
        if self._sent or self._stopping:
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

    def queued(self, handle: Handle) -> bool:
        """Whether ``handle``'s attempt still waits here for its admission: never sent, so it never left."""
        held = self._held.get(handle)
        return held is not None and held.inner is None

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
        assert inner.outcome is not None
        held.handle.outcome = inner.outcome
        held.handle.sent = True
        self._settle(held, inner.outcome)
        return held.handle

    def _settle(self, held: _Held, outcome: NodeOutcome | None) -> None:
        """Release an admitted call's grant, once: with the tokens its ``outcome`` used, and its
        provider's ``retry-after`` blocking the limit; ``outcome`` None: cancelled, seen to stop."""
        if held.settled:
            return
        held.settled = True
        assert held.grant is not None and held.spec.rate_limit is not None
        limit = held.spec.rate_limit
        tokens = tokens_used(outcome) if outcome is not None and limit.tokens is not None else 0  # parsed if counted
        self.store.rate_release(held.grant, tokens, self.clock())
        if limit.concurrent is not None:  # a slot is free: the next in the queue asks now, not after its poll
            self._retry_at.pop(limit.name, None)
        retry_after = (outcome.error or {}).get("retry_after") if outcome is not None else None
        if isinstance(retry_after, int | float) and retry_after > 0:
            now = self.clock()
            self.store.rate_block(limit.name, now + retry_after, now)

    def _release_stopped(self) -> None:
        """Release the grants of the cancelled calls the executor has seen stop since."""
        running = []
        for held in self._stopping:
            assert held.inner is not None
            if self.inner.stopped(held.inner):
                self._settle(held, None)
            else:
                running.append(held)
        self._stopping = running

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
        ended = held.inner.outcome  # it finished before the cancel (not returned yet): counted as such
        self.inner.cancel(held.inner)
        if ended is not None:
            self._settle(held, ended)
        elif self.inner.stopped(held.inner):
            self._settle(held, None)
        else:  # still running (an I/O pool thread runs on until its actor is killed): its slot stays held
            self._stopping.append(held)

    def held_at_gate(self) -> GateHold | None:
        """The attempts queued here, none yet admitted (every limit of theirs refused its last ask),
        with nothing admitted still under way: the run then waits on the gate alone."""
        waiting = {name: queue for name, queue in self._queues.items() if queue}
        if not waiting or self._sent or self._stopping:
            return None
        return RateHold(attempts=sum(len(q) for q in waiting.values()),
                        until=min(self._retry_at.get(name, 0.0) for name in waiting), limits=tuple(sorted(waiting)),
                        why=tuple(sorted({self._why.get(name, "") for name in waiting} - {""})))

    def settle_cancelled(self, timeout: float) -> int:
        left = self.inner.settle_cancelled(timeout)
        if self._stopping:
            self._release_stopped()
        return left

    def stopped(self, handle: Handle) -> bool:
        held = self._held.get(handle) or next((h for h in self._stopping if h.handle is handle), None)
        if held is None:  # not rate-limited (the inner executor's own handle), or long settled
            return self.inner.stopped(handle)
        return held.inner is None or self.inner.stopped(held.inner)

    def shutdown(self) -> None:
        self.inner.shutdown()
