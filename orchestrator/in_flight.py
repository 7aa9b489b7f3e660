"""The attempts a driver handed to its executor and has not seen back, with their deadlines.

A step's ``timeout`` runs from the moment the executor sends its attempt (a queued attempt has
not started); an attempt past it is cancelled and comes back as a transient ``TimeoutError``,
retried like any transient failure.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterable
from dataclasses import dataclass

from raysaga.errors import LeaseLostError
from raysaga.node_key import NodeKey
from raysaga.orchestrator.executor import Executor, Handle
from raysaga.orchestrator.item_block import ItemBlock, ItemsDone
from raysaga.orchestrator.task import NodeOutcome


@dataclass(slots=True)
class Sent:
    handle: Handle
    started_at: float
    timeout: float | None
    key: NodeKey
    deadline: float | None = None

    def deadline_from(self, now: float) -> float | None:
        """The attempt's deadline; its clock starts at ``now`` if it was sent since last asked."""
        if self.deadline is None and self.timeout is not None and self.handle.sent:
            self.deadline = now + self.timeout
        return self.deadline


class InFlight:
    def __init__(self, executor: Executor) -> None:
        self.executor = executor
        self.sent: dict[NodeKey, Sent] = {}
        self._timed: dict[NodeKey, Sent] = {}  # sent with a timeout (may hold stale entries)
        self.blocks: dict[ItemBlock, None] = {}  # taken whole by the executor, items still out (oldest first)

    def add_block(self, block: ItemBlock) -> None:
        """Track a block of items the executor took whole (``Executor.submit_block``)."""
        self.blocks[block] = None

    def took(self, done: list[ItemsDone]) -> list[ItemsDone]:
        """Blocks' items back from the executor: a block with none left out is forgotten."""
        for back in done:
            block = back.block
            block.left -= len(back.positions)
            if block.left <= 0:
                self.blocks.pop(block, None)
        return done

    def add(self, key: NodeKey, handle: Handle, now: float, timeout: float | None) -> None:
        """Track an attempt just handed to the executor; its handle learns its node."""
        handle.node = key
        sent = self.sent[key] = Sent(handle, now, timeout, key)
        if timeout is not None:
            sent.deadline_from(now)
            self._timed[key] = sent

    def add_items(self, keys: list[NodeKey], handles: list[Handle], now: float, timeout: float | None) -> None:
        """``add`` each of a fan-out's items sent together; each handle learns its node."""
        sent = self.sent
        for key, handle in zip(keys, handles, strict=True):
            if timeout is None:
                handle.node = key
                sent[key] = Sent(handle, now, None, key)
            else:
                self.add(key, handle, now, timeout)

    def pop(self, key: NodeKey) -> Sent | None:
        return self.sent.pop(key, None)

    def cancel(self, keys: list[NodeKey]) -> None:
        for key in keys:
            sent = self.sent.pop(key, None)
            if sent is not None:
                self.executor.cancel(sent.handle)
            elif self.blocks:
                self._cancel_item(key)

    def _cancel_item(self, key: NodeKey) -> None:
        # newest block first: an item retried is in flight in a later block than its first attempt's
        for block in reversed(self.blocks):
            position = block.position(key)
            if position is None:
                continue
            if position not in block.cancelled:
                self.executor.cancel_item(block, position)
                block.left -= 1
                if block.left <= 0:
                    del self.blocks[block]
            return

    def cancel_all(self) -> None:
        for sent in self.sent.values():
            self.executor.cancel(sent.handle)
        self.sent.clear()
        for block in self.blocks:
            for position in range(len(block)):
                self.executor.cancel_item(block, position)
        self.blocks.clear()

    def horizon(self, now: float, horizon: float) -> float:
        """The earliest deadline before ``horizon`` (or ``horizon``)."""
        for key, sent in list(self._timed.items()):
            if self.sent.get(key) is not sent:
                del self._timed[key]  # finished or cancelled
            elif (deadline := sent.deadline_from(now)) is not None:
                horizon = min(horizon, deadline)
        return horizon

    def expire(self, now: float) -> list[Handle]:
        """Attempts past their deadline: cancelled, each with a transient timeout as its outcome."""
        if not self._timed:
            return []
        expired = []
        for key, sent in list(self._timed.items()):
            if self.sent.get(key) is not sent:
                del self._timed[key]  # finished or cancelled
                continue
            deadline = sent.deadline_from(now)
            if deadline is not None and now >= deadline and sent.handle.outcome is None:
                self.executor.cancel(sent.handle)
                sent.handle.outcome = NodeOutcome.failure(
                    TimeoutError(f"step {sent.key.label!r} exceeded its timeout of {sent.timeout}s"),
                    transient=True, started_at=sent.started_at)
                expired.append(sent.handle)
        return expired

    def drain(self, keys: Iterable[NodeKey], absorb: Callable[[list[tuple[NodeKey, NodeOutcome]], float], None], *,
              lost: threading.Event, clock: Callable[[], float], timeout: Callable[[], float], run_id: str) -> None:
        """Before a pause: let these attempts (the agents' model calls in flight) finish, and hand
        their answers to ``absorb`` (committed with the pause). They used to be cancelled with the
        rest: an answer already given, and billed, was lost, so the resume asked that turn again
        (a re-roll, invariant 3) and the run counted fewer tokens than the provider billed. A call
        that fails, or passes its timeout, is cancelled as before: it left no answer to keep."""
        sent = self.sent
        waiting = {key for key in keys if key in sent}
        while waiting:
            if lost.is_set():
                raise LeaseLostError(f"run {run_id!r}: lease lost; stopping without further calls")
            now = clock()
            waiting = {key for key in waiting if (sent[key].deadline_from(now) or now + 1) > now}
            handles = [sent[key].handle for key in waiting]
            for handle in self.executor.wait(handles, timeout()) if handles else []:
                key = NodeKey.parse(*handle.key)  # executors key a handle by (node_id, fan_index)
                waiting.discard(key)
                if handle.outcome is not None and handle.outcome.ok:
                    self.pop(key)
                    absorb([(key, handle.outcome)], now)
