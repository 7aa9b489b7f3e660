"""An effect fan-out's items, issued a window at a time.

Issuing an effect's attempt writes its pending ledger row, committed before the call leaves (the
ledger's rule). When every item of a 1,000-item effect fan-out was issued at once, the executor
ran a few at a time, but all 1,000 rows said "pending": a driver killed then left 1,000 effects
in doubt, and a rollback refunded each of them (their calls may have happened), nearly all for
charges never made; a resume asked ``reconcile=`` 1,000 times. Holding the items back here, at
most ``window`` of a step in flight (the executor's own bound: ``Executor.effect_window``), keeps
what a crash leaves in doubt to what was really sent. A held item has no row and no key yet: it
was never issued, so nothing compensates it and a resume issues it as new.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Collection, Iterable

from raysaga.node_key import NodeKey


class EffectWindow:
    """Items held back per effect fan-out step, in order."""

    def __init__(self) -> None:
        self.window: int | None = None
        """At most this many items of one effect fan-out step in flight; None: no bound."""
        self._held: dict[str, deque[NodeKey]] = {}

    def hold(self, key: NodeKey, inflight: Collection[NodeKey]) -> bool:
        """Whether to hold ``key`` (an item of an effect fan-out) back: ``window`` items of its
        step are in flight already."""
        if self.window is None or _live(inflight, key.step) < self.window:
            return False
        self._held.setdefault(key.step, deque()).append(key)
        return True

    def release(self, inflight: Collection[NodeKey]) -> list[NodeKey]:
        """The held items that fit now, each step's in order."""
        if self.window is None:
            return []
        out: list[NodeKey] = []
        for step, held in self._held.items():
            room = self.window - _live(inflight, step) if held else 0
            while held and room > 0:
                out.append(held.popleft())
                room -= 1
        return out

    def drop(self, steps: Iterable[str]) -> None:
        """Forget the held items of steps that failed or were skipped: they are never issued."""
        for step in steps:
            self._held.pop(step, None)

    def holding(self) -> bool:
        return any(self._held.values())


def _live(inflight: Collection[NodeKey], step: str) -> int:
    """Items of ``step`` in flight (not its undos, not an agent's calls)."""
    return sum(1 for k in inflight if k.step == step and k.fan_index >= 0 and k.turn is None and not k.compensates)
