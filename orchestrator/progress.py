"""What a progress display reads while a driver runs (the CLI's bar, ``on_progress=``)."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any


@dataclass
class Progress:
    """Counters a progress display reads."""

    total: int = 0
    done: int = 0
    failed: int = 0
    listeners: list[Callable[[Progress], None]] = field(default_factory=list)

    def notify(self) -> None:
        for listener in self.listeners:
            listener(self)

    def report(self, counts: Any) -> None:
        """Take the machine's ``done``/``failed`` counts; tell the listeners when they moved."""
        if self.listeners and (self.done, self.failed) != (counts.done, counts.failed):
            self.done, self.failed = counts.done, counts.failed
            self.notify()
