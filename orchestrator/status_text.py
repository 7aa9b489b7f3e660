"""Store values as people read them in ``raysaga status`` and its kin: times, durations, errors."""

from __future__ import annotations

import time
from typing import Any

from raysaga.state.redact import scrub_text

__all__ = ["clock", "error_line", "seconds", "utc"]


def utc(at: float | None) -> str:
    """A store timestamp as people read it (UTC, to the second)."""
    if at is None:
        return ""
    try:
        return time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime(at))
    except (OverflowError, ValueError, OSError):
        return "(bad time)"


def clock(at: float | None) -> str:
    """Time of day (UTC) for a node's start."""
    if at is None:
        return ""
    try:
        return time.strftime("%H:%M:%S", time.gmtime(at))
    except (OverflowError, ValueError, OSError):
        return "?"


def seconds(value: float | None) -> str:
    if value is None:
        return ""
    if value < 1:
        return f"{value * 1000:.0f}ms"
    if value < 120:
        return f"{value:.1f}s"
    if value < 7200:
        return f"{value / 60:.1f}m"
    return f"{value / 3600:.1f}h"


def error_line(error: Any, limit: int | None = 200) -> str:
    """A stored error as one readable line: ``Type: message (reason)``, never a dict."""
    if error is None:
        return ""
    if isinstance(error, dict) and "failed_compensations" in error:  # a rollback's report (sagas/rollback.py)
        text = _compensation_report(error)
    elif isinstance(error, dict):
        kind, message, reason = error.get("type"), error.get("message"), error.get("reason")
        text = f"{kind}: {message}" if kind and message else str(message or kind or "")
        if reason and str(reason) not in text:
            text = f"{text} ({reason})" if text else str(reason)
        if not text:
            text = ", ".join(f"{k}={v}" for k, v in error.items() if k != "traceback")
    else:
        text = str(error)
    text = " ".join(scrub_text(text).split())  # scrubbed on read too: a store written before a shape was known
    if limit is not None and len(text) > limit:
        text = text[:limit] + " …"
    return text


def _compensation_report(error: dict[str, Any]) -> str:
    """``compensation failed: charge (RuntimeError: refund down); cause: RuntimeError: …`` from the
    error a ``compensation_failed`` run holds (failed and blocked compensations, forward cause)."""
    failed = [f"{c.get('node', '?')} ({error_line({k: v for k, v in c.items() if k != 'node'}, None)})"
              if isinstance(c, dict) else str(c) for c in error.get("failed_compensations") or []]
    text = f"compensation failed: {', '.join(failed) or 'none'}"
    blocked = error.get("blocked_compensations") or []
    if blocked:
        text += f"; not compensated (waiting on those): {', '.join(str(b) for b in blocked)}"
    cause = error.get("cause")
    return f"{text}; cause: {error_line(cause, None)}" if cause else text
