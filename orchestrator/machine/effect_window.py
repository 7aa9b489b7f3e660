"""An effect fan-out's items, issued a window at a time.

Issuing an effect's attempt writes its pending ledger row, committed before the call leaves (the
ledger's rule). When every item of a 1,000-item effect fan-out was issued at once, the executor
ran a few at a time, but all 1,000 rows said "pending": a driver killed then left 1,000 effects
in doubt, and a rollback refunded each of them (their calls may have happened), nearly all for
charges never made; a resume asked ``reconcile=`` 1,000 times. Holding the items back here keeps
what a crash leaves in doubt to ``window`` items a step (the executor's own bound:
``Executor.effect_window``). An item counts from its first issue until it settles (completed, or
failed for good), so one waiting out a retry's backoff, its row still pending, holds its place;
only a fresh item (no attempt yet this round) is ever held back, so a retry or a resumed call in
doubt goes out at once. A held item has no row and no key yet: nothing compensates it, and a
resume issues it as new.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Iterable

from raysaga.node_key import NodeKey


class EffectWindow:
    """Per effect fan-out step: its items issued and not settled, and those held back, in order."""

    def __init__(self) -> None:
        self.window: int | None = None
        """At most this many items of one effect fan-out step unsettled at once; None: no bound."""
        self._held: dict[str, deque[NodeKey]] = {}
        self._open: dict[str, set[NodeKey]] = {}

    def hold(self, key: NodeKey) -> bool:
        """Whether to hold the fresh item ``key`` back: ``window`` items of its step are open."""
        if self.window is None or len(self._open.get(key.step, ())) < self.window:
            return False
        self._held.setdefault(key.step, deque()).append(key)
        return True

    def opened(self, key: NodeKey) -> None:
        """``key`` was issued: it holds a place until it settles."""
        if self.window is not None:
            self._open.setdefault(key.step, set()).add(key)

    def settled(self, key: NodeKey) -> None:
        """``key`` completed or failed for good: its place frees."""
        open_ = self._open.get(key.step)
        if open_ is not None:
            open_.discard(key)

    def release(self, stuck: bool = False) -> list[NodeKey]:
        """The held items that fit now, each step's in order. ``stuck``: nothing is in flight, due
        or waiting on a timer, so no open item can still settle (a path that settled one without
        saying so): the places are freed rather than the run left waiting for ever."""
        if self.window is None:
            return []
        out: list[NodeKey] = []
        for step, held in self._held.items():
            if not held:
                continue
            if stuck:
                self._open.pop(step, None)
            room = self.window - len(self._open.get(step, ()))
            while held and room > 0:
                out.append(held.popleft())
                room -= 1
        return out

    def drop(self, steps: Iterable[str]) -> None:
        """Forget the steps that failed or were skipped: their held items are never issued."""
        for step in steps:
            self._held.pop(step, None)
            self._open.pop(step, None)

    def holding(self) -> bool:
        return any(self._held.values())
