"""The ``items_completed`` event: which plain fan-out items one commit completed, compactly.

One event per fan-out step per commit (``Calls._item_completed``) names its items in the order
they completed, as runs of consecutive indexes: ``{"ranges": [[0, 63], [128, 191], [70, 70]]}``
is items 0..63, then 128..191, then 70. A chunk's items complete together and in order, so a
commit of a wide fan-out is a few pairs where a list of every index was ~5 bytes an item (~49 KB
of a 10,000-item fan-out's events, and of the dashboard's live messages). Exactly reversible:
``item_indexes`` gives back the indexes in completion order.

Stores written before this (raysaga up to schema 10's first release) hold ``{"items": [3, 4,
...]}``; ``item_indexes`` reads both.
"""

from __future__ import annotations

from typing import Any

KIND = "items_completed"


def add_item(ranges: list[list[int]], index: int) -> None:
    """Append ``index`` to an event's ``ranges`` (extends the last run when it follows it)."""
    if ranges:
        last = ranges[-1]
        if last[1] + 1 == index:
            last[1] = index
            return
    ranges.append([index, index])


def add_items(ranges: list[list[int]], indexes: list[int]) -> None:
    """``add_item`` for each of ``indexes``, in order; consecutive ones (a chunk's) in one step."""
    if not indexes:
        return
    first, last = indexes[0], indexes[-1]
    if last - first + 1 != len(indexes) or indexes != list(range(first, last + 1)):
        for index in indexes:
            add_item(ranges, index)
        return
    add_item(ranges, first)
    ranges[-1][1] = last


def item_indexes(data: Any) -> list[int]:
    """The item indexes an ``items_completed`` event's data names, in completion order; [] for
    data of another shape (an event is read back from a store that may hold anything)."""
    if not isinstance(data, dict):
        return []
    ranges = data.get("ranges")
    if isinstance(ranges, list):
        out: list[int] = []
        for pair in ranges:
            if (isinstance(pair, list) and len(pair) == 2 and all(type(i) is int for i in pair)
                    and 0 <= pair[0] <= pair[1]):
                out.extend(range(pair[0], pair[1] + 1))
        return out
    items = data.get("items")
    return [i for i in items if type(i) is int] if isinstance(items, list) else []


__all__ = ["KIND", "add_item", "item_indexes"]
