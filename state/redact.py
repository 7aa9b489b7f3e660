"""Secrets never reach the store, the event log, the CLI or the logs (DESIGN invariant 7).

STUB: the interface is fixed here; the implementation is being written.
"""

from __future__ import annotations

from typing import Any


def scrub_text(text: str) -> str:
    """``text`` with every known secret replaced by a marker."""
    return text


def scrub(value: Any) -> Any:
    """A JSON value with every string scrubbed (keys kept); returns the same object when clean."""
    return value
