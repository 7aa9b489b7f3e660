"""What a progress display reads while a driver runs (the CLI's bar, ``on_progress=``).

A listener is display code: one that raises must not derail the run it displays. Its exception
is logged once, at WARNING with its traceback (logger ``raysaga.driver``), the listener is not
called again for this run, and the run goes on. ``KeyboardInterrupt`` and ``SystemExit`` are not
display failures: they stop the driver as anywhere else (the lease is released; ``resume`` goes on).
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

log = logging.getLogger("raysaga.driver")


@dataclass
class Progress:
    """Counters a progress display reads."""

    total: int = 0
    done: int = 0
    failed: int = 0
    listeners: list[Callable[[Progress], None]] = field(default_factory=list)

    def notify(self) -> None:
        for listener in list(self.listeners):
            try:
                listener(self)
            except Exception:
                self.listeners.remove(listener)
                log.warning("the progress callback %s raised: it is not called again for this run, which goes on "
                            "(a display's failure does not stop the run)", _name(listener), exc_info=True)

    def report(self, counts: Any) -> None:
        """Take the machine's ``done``/``failed`` counts; tell the listeners when they moved."""
        if self.listeners and (self.done, self.failed) != (counts.done, counts.failed):
            self.done, self.failed = counts.done, counts.failed
            self.notify()


def _name(listener: Callable[..., Any]) -> str:
    return getattr(listener, "__qualname__", None) or repr(listener)[:120]
