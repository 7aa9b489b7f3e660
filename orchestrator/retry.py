"""Failure classification and backoff maths (pure; durable timers live in the driver).

Transient: timeouts, connection errors, HTTP 408/425/429/5xx (incl. Anthropic's 529
overloaded), a lost Ray worker, ``Transient``. Permanent: everything else, ``Permanent``, or
what the step's ``RetryPolicy`` declares.
"""

from __future__ import annotations

import random
import re
from typing import Any

from raysaga.errors import NotJSONableError, StepFailure, UserError
from raysaga.orchestrator.options import RetryPolicy

TRANSIENT_HTTP = frozenset({408, 425, 429})

#: Exception class names (from libraries we do not import here) that mean "try again".
_TRANSIENT_NAMES = frozenset({
    "APIConnectionError", "APITimeoutError", "ConnectTimeout", "ReadTimeout", "ConnectError",
    "RemoteProtocolError", "WorkerCrashedError", "NodeDiedError", "RaySystemError", "LocalRayletDiedError",
    "TaskCancelledError", "GetTimeoutError", "ObjectLostError", "OwnerDiedError", "ActorDiedError",
})


def http_status(exc: BaseException) -> int | None:
    """The HTTP status an exception carries, if any (httpx, anthropic, requests, urllib)."""
    for holder in (exc, getattr(exc, "response", None)):
        for attr in ("status_code", "status", "code"):
            value = getattr(holder, attr, None)
            if isinstance(value, int) and 100 <= value <= 599:
                return value
    return None


#: The longest ``retry-after`` honoured (an hour): a larger or malformed value is ignored.
MAX_RETRY_AFTER = 3600.0

#: A header's number of seconds (or milliseconds): ASCII digits, an optional fraction. ``float``
#: took more: "1_000" (1000 s), "nan", "-5", "1e3", Arabic-Indic digits.
_HEADER_NUMBER = re.compile(r"[0-9]+(?:\.[0-9]+)?")


def _header_seconds(headers: Any, name: str, scale: float) -> float | None:
    """The header ``name`` in seconds (its value divided by ``scale``) if it is a plain number
    in (0, ``MAX_RETRY_AFTER``], else None."""
    try:
        raw = headers.get(name)
    except Exception:  # a headers object that is not a mapping
        return None
    if not isinstance(raw, str | bytes):
        return None
    text = (raw.decode("ascii", "replace") if isinstance(raw, bytes) else raw).strip()
    if not _HEADER_NUMBER.fullmatch(text):
        return None  # an HTTP date, or garbage: the other header, or the backoff, decides
    seconds = float(text) / scale
    return seconds if 0 < seconds <= MAX_RETRY_AFTER else None


def retry_after(exc: BaseException) -> float | None:
    """Seconds a provider asked us to wait before trying again (``retry-after-ms`` or
    ``retry-after`` in seconds on the error's HTTP response, or a ``retry_after`` attribute).

    A header counts only if it is a plain number of (milli)seconds in range: a malformed or
    out-of-range ``retry-after-ms`` leaves the decision to ``retry-after``, not to nothing."""
    value = getattr(exc, "retry_after", None)
    if isinstance(value, int | float) and not isinstance(value, bool):
        seconds = float(value)
        return seconds if 0 < seconds <= MAX_RETRY_AFTER else None
    headers = getattr(getattr(exc, "response", None), "headers", None)
    if headers is None:
        return None
    ms = _header_seconds(headers, "retry-after-ms", 1000.0)
    return ms if ms is not None else _header_seconds(headers, "retry-after", 1.0)


def is_transient(exc: BaseException, policy: RetryPolicy | None = None) -> bool:
    """Classify one failure. User declarations win, then raysaga's own markers, then the rules."""
    if policy is not None:
        if policy.permanent and isinstance(exc, policy.permanent):
            return False
        if policy.transient and isinstance(exc, policy.transient):
            return True
    if isinstance(exc, StepFailure):
        return exc.transient
    if isinstance(exc, NotJSONableError | UserError):
        return False
    status = http_status(exc)
    if status is not None:
        return status in TRANSIENT_HTTP or status >= 500
    if isinstance(exc, TimeoutError | ConnectionError):
        return True
    return any(cls.__name__ in _TRANSIENT_NAMES for cls in type(exc).__mro__)


def backoff_delay(attempt: int, policy: RetryPolicy, rng: random.Random) -> float:
    """Full-jitter delay after failed attempt ``attempt`` (1-based)."""
    # the exponent is bounded: an undo retried without limit reaches attempt 1025, and 2.0 ** 1024 overflows
    ceiling = min(policy.cap, policy.base * (2 ** min(max(0, attempt - 1), 62)))
    return rng.uniform(0.0, ceiling)


#: A terminal colour code: Ray colours its task errors' ``ray::name()`` prefix, and the store,
#: ``status`` and the dashboard showed them as ``\x1b[36m``.
_COLOUR = re.compile(r"\x1b\[[0-9;]*m")


def without_colours(text: str, exc: BaseException) -> str:
    """``text`` without the colour codes Ray added, when ``exc`` is Ray's: a user's own message
    is kept as raised (every display shows its escapes escaped, never acted on)."""
    if "\x1b" not in text or not any(c.__module__.startswith("ray.") for c in type(exc).__mro__):
        return text
    return _COLOUR.sub("", text)


def message_of(exc: BaseException) -> str:
    """``str(exc)``, or a note saying it could not be read: an exception is user code, and one
    whose ``__str__`` raises must still fail its step, not the driver recording the failure."""
    try:
        return without_colours(str(exc), exc)
    except Exception as problem:  # any failure of user code reading its own message
        return f"<the message of this {type(exc).__name__} could not be read: str() raised {type(problem).__name__}>"
