"""What every executor offers the driver (``Executor``, its ``Handle``), and the inline executor.

The Ray executor is ``raysaga.orchestrator.executor``; both are reached through it.
"""

from __future__ import annotations

import logging
import time
from abc import ABC, abstractmethod
from collections.abc import Callable, Collection
from dataclasses import dataclass
from typing import Any

from raysaga.node_key import NodeKey
from raysaga.orchestrator.item_block import ItemBlock, ItemsDone
from raysaga.orchestrator.spec import StepSpec
from raysaga.orchestrator.task import NodeCall, NodeOutcome, execute

log = logging.getLogger("raysaga.driver")


@dataclass(eq=False, slots=True)
class Handle:
    """An attempt in flight."""

    key: tuple[str, int]
    node: NodeKey | None = None
    """The driver's key of the attempt, set by the driver (so it need not parse ``key``)."""
    ref: Any = None
    outcome: NodeOutcome | None = None
    sent: bool = False
    """Handed to the engine. A queued attempt has not started: its timeout does not run yet."""
    held: bool = False
    """Held back by the inline executor, never started: a cancel or a pause came (``hold_new``)."""


@dataclass(frozen=True)
class GateHold:
    """What waits at a rate gate: how many attempts, the earliest they may be admitted, whose limits."""

    attempts: int
    until: float
    limits: tuple[str, ...]


class Executor(ABC):
    """Runs attempts, and tracks what it has in flight itself."""

    name: str
    #: The attempt runs inside ``submit``: nothing overlaps the caller, so the driver commits what
    #: finished before it sends the next attempt (else a death in that one would lose both).
    runs_at_submit: bool = False
    #: An effect fan-out's items issued at most at once (``Forward.effect_window``): an item's
    #: pending ledger row is written when it is issued, so a driver that dies leaves at most these
    #: in doubt (a rollback refunds each, a resume reconciles each), not every item of the step.
    effect_window: int | None = 8

    @abstractmethod
    def submit(self, spec: StepSpec, call: NodeCall) -> Handle:
        """Start (or queue) an attempt; a Ray task is named ``<run_id>:<node>`` (``task_name``)."""

    def submit_items(self, spec: StepSpec, calls: list[NodeCall]) -> list[Handle]:
        """Attempts of plain items of one fan-out step (``ItemsDispatch``) that ``submit_block``
        did not take: ``submit`` each."""
        return [self.submit(spec, call) for call in calls]

    def submit_block(self, block: ItemBlock) -> bool:
        """Take a block of plain items (``item_block``) whole: its items come back as ``ItemsDone``
        (``take_items``), with no handle each. False: this executor does not, and the driver
        submits them one by one (``submit_items``)."""
        return False

    def take_items(self) -> list[ItemsDone]:
        """Items of taken blocks that finished since the last call (a cancelled one never is).
        ``wait`` returns early when there are some, whatever it returns itself."""
        return []

    def cancel_item(self, block: ItemBlock, position: int) -> None:  # noqa: B027 - nothing taken, nothing to cancel
        """Cancel one item of a taken block (its task is cancelled once none of its items is wanted)."""

    def hold_new(self, run_id: str, asked: Callable[[], bool]) -> None:  # noqa: B027 - nothing to hold by default
        """``asked()``: whether an operator's cancel or pause waits for run ``run_id`` (its driver's
        heartbeat saw it; the driver obeys it at its loop's next turn). An executor that runs a
        round's attempts one by one in ``submit`` (inline) starts no more of them meanwhile: it holds
        them back (``Handle.held``), and the cancel settles them as never sent
        (``driver_signals.never_started``). Nothing by default: a Ray round leaves at once, and what a
        lane still queues is dropped by the cancel (the one ``wait`` before the driver takes it may
        still send some)."""

    def pump(self) -> None:  # noqa: B027 - optional hook, a no-op by default
        """Send what ``submit`` queued. The driver calls it once a round's attempts are all
        submitted: they leave together (chunks, one stream per pool actor), and before the
        round's commit, not after it at the next ``wait``."""

    @abstractmethod
    def wait(self, handles: Collection[Handle] | None, timeout: float) -> list[Handle]:
        """Block up to ``timeout`` for one attempt, then return every finished one (outcome set).

        ``handles=None`` means any attempt of this executor (the driver's main loop: O(finished),
        not O(in flight)); a collection waits for those only, and others that finish meanwhile
        are returned by a later wait. A cancelled attempt is never returned.
        """

    @abstractmethod
    def cancel(self, handle: Handle) -> None: ...

    def stopped(self, handle: Handle) -> bool:
        """Whether an attempt (a cancelled one, typically) can no longer be running: it was never
        sent, or it has been seen to end or its process to die. A cancel does not stop a call at
        once (an I/O pool thread runs on until its actor is killed): what it holds, a rate limit's
        concurrency slot, is freed only once this says so (``RateGate``). True by default: an
        inline attempt never runs past its ``submit``."""
        return True

    def held_at_gate(self) -> GateHold | None:
        """Attempts this executor holds unsent, waiting for a rate limit's gate to open, and when
        it may: the driver lets go of a run whose every attempt in flight waits there, far off
        (``RunMachine.rest_at_gate``). None: none held (no gate, by default)."""
        return None

    def settle_cancelled(self, timeout: float) -> int:
        """Block until every cancelled attempt has stopped, up to ``timeout``; return how many have not.

        A cancel is a request: until the attempt is seen to end, it may still be calling out. The
        driver settles before compensating (an effect must not land after its undo) and before
        recording a final state. Nothing to settle by default (an inline attempt is never running).
        """
        return 0

    def shutdown(self) -> None:  # noqa: B027 - optional hook, a no-op by default
        """Release what the executor started."""


def task_name(call: NodeCall) -> str:
    """What Ray's dashboard calls an attempt's task: ``<run_id>:<node>``."""
    return f"{call.fields[0]}:{call.label}"


def items_task_name(run_id: str, step: str, first: int, last: int) -> str:
    """A task carrying items ``first..last`` of a fan-out step: ``<run_id>:<step>[first..last]``
    (one item: ``<run_id>:<step>[first]``, as ``task_name`` names it)."""
    return f"{run_id}:{step}[{first}]" if first == last else f"{run_id}:{step}[{first}..{last}]"


CANCELLED = NodeOutcome(ok=False, error={"type": "Cancelled", "message": "cancelled"})


class InlineExecutor(Executor):
    """Runs each attempt synchronously at submit. Deterministic; no timeouts (nothing can interrupt
    it): a step's ``timeout=`` is ignored, with one warning per run and step (``_warn_timeout``).
    An agent's model turn or tool call runs at the next ``wait`` instead, one per wait
    (``_one_by_one``): the driver commits each answer before the next call starts. Run at submit, a
    round of four mapped agents asked the model four times before any answer was committed, and a
    SIGKILL then asked (and billed) the answered turns again on resume (invariant 3)."""

    name = "inline"
    runs_at_submit = True
    #: No window: a round's plain and effect attempts all run in ``submit`` before any is committed
    #: (the inline executor's crash window, docs/execution.md), so a window would only cut it short.
    effect_window = None
    #: Runs and steps warned about their ignored ``timeout=`` (kept at most this many).
    WARNED_KEPT = 4096

    def __init__(self) -> None:
        self._done: list[Handle] = []
        self._warned: dict[tuple[str, str], None] = {}
        self._asked: tuple[str, Callable[[], bool]] | None = None  # (run, a cancel or pause waits?): hold_new
        self._held: dict[Handle, tuple[StepSpec, NodeCall]] = {}  # held back, in the order they came
        self._turns: dict[Handle, tuple[StepSpec, NodeCall]] = {}  # ``_one_by_one``'s, run one per wait

    def hold_new(self, run_id: str, asked: Callable[[], bool]) -> None:
        """A round's attempts run one by one in ``submit``: with a cancel or pause waiting, the
        rest of the round is held back, not run (an operator's cancel let every item of an inline
        fan-out run first, effects included: 8 s for 8 one-second items, where Ctrl-C stopped
        after the item in progress). Not a compensation (the rollback's: an operator's cancel does
        not stop it), an agent's turn or tool call (a pause keeps a model's answer; its rows are the
        agent's), nor a rate-limited call (the gate's handle stands for it): those run as before."""
        self._asked = (run_id, asked)
        self._held.clear()  # (a previous drive's: cancelled with it)
        self._turns.clear()

    def _holds(self, spec: StepSpec, call: NodeCall) -> bool:
        asked = self._asked
        if asked is None or asked[0] != call.fields[0] or spec.rate_limit is not None or not asked[1]():
            return False
        key = NodeKey.parse(call.node_id, call.fan_index)
        return not (key.compensates or key.is_agent_call)

    def _warn_timeout(self, spec: StepSpec, call: NodeCall) -> None:
        """Say once per run and step that its ``timeout=`` does not apply here: silently ignored, a
        hanging step hung the run with nothing to say why."""
        key = (call.fields[0], spec.name)
        if key in self._warned:
            return
        if len(self._warned) >= self.WARNED_KEPT:
            self._warned.clear()
        self._warned[key] = None
        log.warning("run %s: step %r has timeout=%gs, which the inline executor ignores (it runs the step "
                       "in this process, and nothing can interrupt it): use --executor ray for timeouts",
                       call.fields[0], spec.name, spec.timeout)

    def submit(self, spec: StepSpec, call: NodeCall) -> Handle:
        if spec.timeout is not None:
            self._warn_timeout(spec, call)
        if self._holds(spec, call):
            handle = Handle(key=(call.node_id, call.fan_index), held=True)
            self._held[handle] = (spec, call)
            return handle
        if self._one_by_one(spec, call):  # (never started until it runs: ``held``)
            handle = Handle(key=(call.node_id, call.fan_index), held=True)
            self._turns[handle] = (spec, call)
            return handle
        handle = Handle(key=(call.node_id, call.fan_index), outcome=execute(spec, call), sent=True)
        self._done.append(handle)
        return handle

    def _run_held(self) -> None:
        """Run what was held back if no cancel or pause waits any more: the driver cancels what it
        held when it obeys one, so this only happens if the signal went without being obeyed
        (taken by another process): held for ever, the run would hang."""
        asked = self._asked
        while self._held and not (asked is not None and asked[1]()):
            handle, (spec, call) = next(iter(self._held.items()))
            del self._held[handle]
            handle.held, handle.sent, handle.outcome = False, True, execute(spec, call)
            self._done.append(handle)

    @staticmethod
    def _one_by_one(spec: StepSpec, call: NodeCall) -> bool:
        """Whether an attempt runs at a ``wait`` of its own (an agent's model turn or tool call), its
        outcome committed before the next starts. A rate-limited call runs at submit, where its
        gate sees a 429 before it admits the next (``rate_gate``), as plain steps and effects do."""
        if spec.rate_limit is not None:
            return False
        key = NodeKey.parse(call.node_id, call.fan_index)
        return key.is_agent_call and not key.compensates

    def _run_turn(self, handle: Handle) -> Handle:
        spec, call = self._turns.pop(handle)
        handle.held, handle.sent, handle.outcome = False, True, execute(spec, call)
        return handle

    def wait(self, handles: Collection[Handle] | None, timeout: float) -> list[Handle]:
        if handles is None:
            if self._held:
                self._run_held()
            done, self._done = self._done, []
            if not done and self._turns:  # one agent call, its outcome committed before the next runs
                done = [self._run_turn(next(iter(self._turns)))]
        else:
            wanted = set(handles)
            done = [h for h in self._done if h in wanted]
            self._done = [h for h in self._done if h not in wanted]
            done += [self._run_turn(h) for h in list(self._turns) if h in wanted]
        if not done and timeout > 0:
            time.sleep(timeout)  # nothing in flight can finish: this is a timer wait, not a sync
        return done

    def cancel(self, handle: Handle) -> None:
        handle.outcome = handle.outcome or CANCELLED
        self._held.pop(handle, None)
        self._turns.pop(handle, None)
        if handle in self._done:
            self._done.remove(handle)
