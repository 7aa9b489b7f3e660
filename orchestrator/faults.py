"""Fault injection for recovery tests: SIGKILL this process, raise, or stall at a named point.

``RAYSAGA_FAULTS="after_pending:charge,before_commit:*"`` kills the driver the first time it
reaches one of those points for a matching node label. Points: ``before_pending``,
``after_pending`` (the ledger row is durable, the call not made), ``before_commit`` (the
call returned, its result not yet durable), ``after_commit``, ``before_transition``.

A rule may name what happens instead of the SIGKILL, after ``=``::

    RAYSAGA_FAULTS="after_pending:charge=raise,before_commit:*=stall:2,after_commit:work[3]=kill"

- ``kill`` (the default): SIGKILL this process, there and then.
- ``raise``: raise ``FaultInjected`` (a ``RuntimeError`` the driver does not expect) out of
  the driver, as a bug in the engine or a failing library would.
- ``stall:SECONDS``: block the driver there for that long (a GC pause, a stopped VM, a slow
  disk), then go on; a stall longer than the lease lets another driver take the run over.
- ``drop`` or ``drop:P``: raise ``ConnectionDropped`` (a ``StoreUnavailableError``), as a
  connection lost right after the database committed does: at ``after_commit`` or
  ``after_pending`` the write is durable but the driver never heard so (an ambiguous commit).
  With ``P`` (0 < P <= 1) each pass drops with that chance (drawn from fresh entropy: a driver
  started again to find its own write must not meet the same draw at the same write forever).

A ``raise``, ``stall`` or ``drop`` rule fires once per ``Faults`` (one per driver), at its first match;
a later pass through the point goes on unharmed. Labels are node labels (``charge``,
``work[3]``, ``charge:compensate``) or ``*`` for any; ``before_transition``'s label is ``*``.
``before_commit`` and ``after_commit`` name the nodes whose state after the commit is an outcome
(``commit_labels``). With the variable unset this costs one attribute check.
"""

from __future__ import annotations

import os
import random
import signal
import time
from collections.abc import Iterable

from raysaga.errors import InvalidOptionError, StoreUnavailableError
from raysaga.state import NodeStatus, NodeWrite, node_label

ENV = "RAYSAGA_FAULTS"
POINTS = frozenset({"before_pending", "after_pending", "before_commit", "after_commit", "before_transition"})
KILL, RAISE, STALL, DROP = "kill", "raise", "stall", "drop"


class FaultInjected(RuntimeError):
    """Raised at a point armed with ``raise``: an error the driver does not expect."""

    def __init__(self, point: str, label: str) -> None:
        super().__init__(f"fault injected at {point}:{label} ({ENV})")
        self.point = point
        self.label = label

    def __reduce__(self) -> tuple[type[FaultInjected], tuple[str, str]]:
        return (type(self), (self.point, self.label))


class ConnectionDropped(StoreUnavailableError):
    """Raised at a point armed with ``drop``: the store's answer was lost (the write may be durable)."""

    def __init__(self, point: str, label: str) -> None:
        super().__init__(f"the connection to the store was lost at {point}:{label} (a fault injected by {ENV})")


def _parse_action(action: str) -> tuple[str, float]:
    """``kill`` | ``raise`` | ``stall:SECONDS`` -> (mode, seconds)."""
    mode, _, arg = action.partition(":")
    if mode in (KILL, RAISE) and not arg:
        return mode, 0.0
    if mode == DROP:
        try:
            chance = float(arg) if arg else 1.0
        except ValueError:
            chance = -1.0
        if 0 < chance <= 1:
            return mode, chance
        raise InvalidOptionError(f"{ENV}: {action!r}: drop takes a chance 0 < P <= 1, e.g. drop:0.3")
    if mode == STALL:
        try:
            seconds = float(arg)
        except ValueError:
            seconds = -1.0
        if seconds >= 0:
            return mode, seconds
        raise InvalidOptionError(f"{ENV}: {action!r}: stall takes seconds >= 0, e.g. stall:2")
    raise InvalidOptionError(f"{ENV}: unknown action {action!r}; use kill, raise, drop[:P] or stall:SECONDS")


def commit_labels(writes: Iterable[NodeWrite]) -> list[str]:
    """The labels ``before_commit`` / ``after_commit`` name for a batch's node writes (in the
    order the store applies them): the nodes whose **last** write is not ``running``, i.e. whose
    state after the commit is an outcome. Not a node whose only write is ``running`` (an effect's
    pending write: ``before_commit`` would fire before its call, and the window "call returned,
    result not durable" would go untested); nor one whose failed attempt and the start of its
    retry (due at once) share a batch, as they may on Ray: after that commit the node runs again,
    and a fault named for it would promise an outcome the store does not hold."""
    last: dict[str, NodeStatus] = {}
    for write in writes:
        label = node_label(write.node_id, write.fan_index)
        last.pop(label, None)  # (re-inserted: the order is that of each node's last write)
        last[label] = write.status
    return [label for label, status in last.items() if status != NodeStatus.RUNNING]


class Faults:
    def __init__(self, spec: str | None = None) -> None:
        spec = os.environ.get(ENV, "") if spec is None else spec
        self._rules: dict[tuple[str, str], tuple[str, float]] = {}
        for part in filter(None, (p.strip() for p in spec.split(","))):
            rule, eq, action = part.rpartition("=")
            if not eq:
                rule, action = part, KILL
            point, _, label = rule.partition(":")
            if point not in POINTS:
                raise InvalidOptionError(f"{ENV}: unknown point {point!r}; known: {sorted(POINTS)}")
            self._rules.setdefault((point, label or "*"), _parse_action(action))
        self.active = bool(self._rules)

    def hit(self, point: str, labels: Iterable[str]) -> None:
        if not self.active:
            return
        for label in labels:
            rule = (point, label) if (point, label) in self._rules else (point, "*")
            action = self._rules.get(rule)
            if action is None:
                continue
            mode, seconds = action
            if mode == KILL:
                os.kill(os.getpid(), signal.SIGKILL)
            if mode == DROP and seconds < 1 and random.random() >= seconds:  # seconds: the chance
                continue
            del self._rules[rule]  # raise and stall fire once
            self.active = bool(self._rules)
            if mode == RAISE:
                raise FaultInjected(point, label)
            if mode == DROP:
                raise ConnectionDropped(point, label)
            time.sleep(seconds)  # the injected stall itself
            return
