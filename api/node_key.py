"""Which node a row, an attempt or a timer is about: a typed key, its string form only at the edges.

A run's nodes are the workflow's steps, a fan-out step's items, an agent node's model turns and
tool calls, and the compensations of any of them. The store keys a node by ``(node_id,
fan_index)`` text; the engine works with ``NodeKey`` fields and builds or parses the text only
where a row is written or read (``node_id`` / ``parse``):

    ===============================  ================================  =========================
    node                             node_id, fan_index                NodeKey
    ===============================  ================================  =========================
    step ``pay``                     ``"pay", -1``                     ``NodeKey("pay")``
    item 3 of fan-out ``fetch``      ``"fetch", 3``                    ``NodeKey("fetch", 3)``
    turn 2 of agent ``research``     ``"research@2", -1``              ``.turn == 2``
    its tool call 1                  ``"research@2.1", -1``            ``.turn == 2, .call == 1``
    the undo of ``pay``              ``"pay:compensate", -1``          ``.compensates``
    ===============================  ================================  =========================
"""

from __future__ import annotations

from collections.abc import Iterator
from enum import StrEnum
from functools import partial
from itertools import repeat
from typing import Any, NamedTuple

from raysaga.types import COMPENSATE_SUFFIX

__all__ = ["AGENT_SEP", "NodeKey", "NodeKind", "item_fields", "item_keys"]

#: Between an agent step's name and its turn (``research@2``); names never contain it.
AGENT_SEP = "@"


class NodeKind(StrEnum):
    STEP = "step"
    ITEM = "item"
    TURN = "turn"
    TOOL_CALL = "tool_call"
    COMPENSATION = "compensation"


class NodeKey(NamedTuple):
    """A node of a run. A tuple underneath, so it hashes and sorts as fast as one."""

    step: str
    fan_index: int = -1
    """The fan-out item (or the agent node's item, for an agent mapped over a list); -1: none."""
    turn: int | None = None
    """An agent's model turn (with ``call``: a tool call asked for in that turn)."""
    call: int | None = None
    compensates: bool = False

    @property
    def kind(self) -> NodeKind:
        if self.compensates:
            return NodeKind.COMPENSATION
        if self.call is not None:
            return NodeKind.TOOL_CALL
        if self.turn is not None:
            return NodeKind.TURN
        return NodeKind.ITEM if self.fan_index >= 0 else NodeKind.STEP

    @property
    def is_agent_call(self) -> bool:
        """A model turn or a tool call of an agent node (not the undo of a tool call)."""
        return self.turn is not None and not self.compensates

    @property
    def owner(self) -> NodeKey:
        """The step-level node this one belongs to: the agent node of a turn or tool call, the
        step (or item) a compensation undoes, the node itself otherwise."""
        return NodeKey(self.step, self.fan_index)

    def undo(self) -> NodeKey:
        """The compensation of this node."""
        return self._replace(compensates=True)

    def undone(self) -> NodeKey:
        """The node a compensation undoes."""
        return self._replace(compensates=False)

    def with_turn(self, turn: int, call: int | None = None) -> NodeKey:
        return NodeKey(self.step, self.fan_index, turn, call)

    @property
    def node_id(self) -> str:
        """The store's text form of everything but the fan-out index."""
        if self.turn is None and not self.compensates:
            return self.step  # a step or an item: the common case, on every attempt's path
        text = self.step
        if self.turn is not None:
            text = f"{text}{AGENT_SEP}{self.turn}" if self.call is None else f"{text}{AGENT_SEP}{self.turn}.{self.call}"
        return text + COMPENSATE_SUFFIX if self.compensates else text

    @property
    def label(self) -> str:
        """How people see it: ``fetch[3]``, ``research@2.1``, ``pay:compensate``."""
        return self.node_id if self.fan_index < 0 else f"{self.node_id}[{self.fan_index}]"

    @classmethod
    def parse(cls, node_id: str, fan_index: int = -1) -> NodeKey:
        """A stored ``(node_id, fan_index)`` as a key (step names cannot contain ``@ . :``)."""
        compensates = node_id.endswith(COMPENSATE_SUFFIX)
        if compensates:
            node_id = node_id[: -len(COMPENSATE_SUFFIX)]
        step, sep, rest = node_id.partition(AGENT_SEP)
        if not sep:
            return cls(step, fan_index, None, None, compensates)
        turn, _, call = rest.partition(".")
        return cls(step, fan_index, int(turn), int(call) if call else None, compensates)


_new_key = partial(tuple.__new__, NodeKey)


def item_fields(step: str, count: int) -> Iterator[tuple[Any, ...]]:
    """The fields of items 0..count-1 of ``step`` as plain tuples: equal to their ``NodeKey`` and
    hashed alike, so they look up a dict keyed by ``NodeKey`` with no key object made per item."""
    return zip(repeat(step), range(count), repeat(None), repeat(None), repeat(False))


def item_keys(step: str, count: int) -> list[NodeKey]:
    """``[NodeKey(step, i) for i in range(count)]``, built in one pass of builtins: a wide
    fan-out's keys are made before its first item can leave (~0.3 us a key through ``__new__``)."""
    return list(map(_new_key, item_fields(step, count)))
