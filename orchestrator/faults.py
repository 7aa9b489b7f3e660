"""Crash injection for recovery tests: SIGKILL this process at a named point.

``RAYSAGA_FAULTS="after_pending:charge,before_commit:*"`` kills the driver the first time it
reaches one of those points for a matching node label. Points: ``before_pending``,
``after_pending`` (the ledger row is durable, the call not made), ``before_commit`` (the
call returned, its result not yet durable), ``after_commit``, ``before_transition``.
With the variable unset this costs one attribute check.
"""

from __future__ import annotations

import os
import signal
from collections.abc import Iterable

ENV = "RAYSAGA_FAULTS"
POINTS = frozenset({"before_pending", "after_pending", "before_commit", "after_commit", "before_transition"})


class Faults:
    def __init__(self, spec: str | None = None) -> None:
        spec = os.environ.get(ENV, "") if spec is None else spec
        self._rules: set[tuple[str, str]] = set()
        for part in filter(None, (p.strip() for p in spec.split(","))):
            point, _, label = part.partition(":")
            if point not in POINTS:
                raise ValueError(f"{ENV}: unknown point {point!r}; known: {sorted(POINTS)}")
            self._rules.add((point, label or "*"))
        self.active = bool(self._rules)

    def hit(self, point: str, labels: Iterable[str]) -> None:
        if not self.active:
            return
        for label in labels:
            if (point, label) in self._rules or (point, "*") in self._rules:
                os.kill(os.getpid(), signal.SIGKILL)
