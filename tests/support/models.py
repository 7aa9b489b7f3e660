"""Module-level views of ``raysaga.testing.RecordingModel`` journals.

A test module builds many recording models (one per run, inside helpers) on one journal and
reads every request they were asked through one module-level name, shaped as that module's
assertions want it::

    JOURNAL = "test_agent_loop"
    SEEN = Recorded(JOURNAL, lambda r: r.messages)       # a live sequence of each request's messages
    model = RecordingModel(default=script, journal=JOURNAL)
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping, Sequence
from typing import Any, Generic, TypeVar, overload

from raysaga.agents import ModelRequest
from raysaga.testing import RecordingModel

T = TypeVar("T")

__all__ = ["Recorded", "RecordedByConversation", "RecordingModel"]


class Recorded(Sequence[T], Generic[T]):
    """The requests of journal ``journal`` so far, each passed through ``shape``; read live."""

    def __init__(self, journal: str, shape: Callable[[ModelRequest], T]) -> None:
        self._model = RecordingModel(journal=journal)
        self._shape = shape

    def _items(self) -> list[T]:
        return [self._shape(r) for r in self._model.requests]

    @overload
    def __getitem__(self, index: int) -> T: ...

    @overload
    def __getitem__(self, index: slice) -> list[T]: ...

    def __getitem__(self, index: int | slice) -> T | list[T]:
        return self._items()[index]

    def __len__(self) -> int:
        return len(self._model.requests)

    def __iter__(self) -> Iterator[T]:
        return iter(self._items())

    def clear(self) -> None:
        self._model.clear()


class RecordedByConversation(Mapping[str, list[list[dict[str, Any]]]]):
    """The messages of each request of journal ``journal``, grouped by the first message's
    content (the conversation), each group oldest first; read live."""

    def __init__(self, journal: str) -> None:
        self._model = RecordingModel(journal=journal)

    def _groups(self) -> dict[str, list[list[dict[str, Any]]]]:
        grouped: dict[str, list[list[dict[str, Any]]]] = {}
        for request in self._model.requests:
            grouped.setdefault(str(request.messages[0]["content"]), []).append(request.messages)
        return grouped

    def __getitem__(self, conversation: str) -> list[list[dict[str, Any]]]:
        return self._groups()[conversation]

    def __len__(self) -> int:
        return len(self._groups())

    def __iter__(self) -> Iterator[str]:
        return iter(self._groups())

    def clear(self) -> None:
        self._model.clear()
