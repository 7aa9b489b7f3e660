"""Failure classification and backoff maths (pure; durable timers live in the driver).

Transient: timeouts, connection errors, DNS failures, HTTP clients' transport errors (httpx,
requests, urllib3, aiohttp: read by name and package, never imported), HTTP 408/425/429/5xx
(incl. Anthropic's 529 overloaded), a lost Ray worker, ``Transient``; an error wrapping one of
these (``__cause__``, ``__context__``, ``reason``) too. Permanent: everything else,
``Permanent``, or what the step's ``RetryPolicy`` declares.
"""

from __future__ import annotations

import random
import re
import socket
from typing import Any

from raysaga.errors import NotJSONableError, SecretUnavailableError, StepFailure, UserError
from raysaga.orchestrator.options import RetryPolicy

TRANSIENT_HTTP = frozenset({408, 425, 429})

#: Exception class names (from libraries we do not import here) that mean "try again", wherever
#: the class is defined: names no library uses for anything else (the SDKs' connection errors, Ray's).
_TRANSIENT_NAMES = frozenset({
    "APIConnectionError", "APITimeoutError", "ConnectTimeout", "ReadTimeout", "ConnectError",
    "RemoteProtocolError", "WorkerCrashedError", "NodeDiedError", "RaySystemError", "LocalRayletDiedError",
    "TaskCancelledError", "GetTimeoutError", "ObjectLostError", "OwnerDiedError", "ActorDiedError",
})

#: HTTP clients' transport errors (never imported: they may not be installed), by the package that
#: defines them and the class's name. Names as plain as ``Timeout`` or ``ConnectionError`` count
#: only from these packages: a user's own ``Timeout`` (a business rule's) is not retried by accident.
#: (requests' ``ConnectionError`` and ``Timeout`` derive from ``OSError``, not from the builtins.)
_TRANSIENT_BY_PACKAGE: dict[str, frozenset[str]] = {
    **dict.fromkeys(("httpx", "httpx2", "httpcore"), frozenset({
        "NetworkError", "ReadError", "WriteError", "ConnectError", "CloseError", "TimeoutException",
        "ReadTimeout", "WriteTimeout", "PoolTimeout", "ConnectTimeout", "RemoteProtocolError"})),
    "requests": frozenset({"ConnectionError", "Timeout", "ChunkedEncodingError"}),
    "urllib3": frozenset({"ProtocolError", "TimeoutError", "NewConnectionError", "NameResolutionError",
                          "IncompleteRead"}),
    "aiohttp": frozenset({"ClientConnectionError", "ServerTimeoutError", "ClientPayloadError"}),
}

#: Connection errors that are no transport failure: TLS refused (a certificate, a protocol).
_NOT_TRANSPORT = frozenset({"SSLError", "SSLCertVerificationError", "CertificateError", "InvalidCertificate"})

#: How many links of an exception's chain (``__cause__``, ``__context__``, a ``reason``) are read.
_CHAIN_LIMIT = 16


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
    return any(_transport_failure(link) for link in _chain(exc))


def secret_missing(exc: BaseException) -> SecretUnavailableError | None:
    """The ``SecretUnavailableError`` (raised or wrapped) a step failed with, if any: a secret of the
    run's input missing where it ran is not the step's fault, so the run is parked, not rolled back
    (``records.parks``)."""
    return next((link for link in _chain(exc) if isinstance(link, SecretUnavailableError)), None)


def _chain(exc: BaseException) -> list[BaseException]:
    """``exc`` and what it wraps: its ``__cause__`` (``raise ... from``), else its ``__context__``
    (raised while handling it: requests wraps urllib3's error so, a tool its library's), and a
    ``reason`` an error carries (``urllib.error.URLError``, urllib3's ``MaxRetryError``).

    A connection reset inside ``requests`` reaches a tool as ``requests.ConnectionError``, an
    ``OSError``; a tool wrapping it (``raise RuntimeError("fetch failed") from exc``) hid it
    further. Read to its root, the chain says what happened. (A permanent error raised while
    handling a connection error is then retried too, within its bounded attempts: the lesser harm
    than a call failed for good on one dropped connection.)"""
    links: list[BaseException] = []
    todo: list[BaseException] = [exc]
    while todo and len(links) < _CHAIN_LIMIT:
        link = todo.pop()
        if any(link is seen for seen in links):
            continue
        links.append(link)
        try:
            reason = getattr(link, "reason", None)
        except Exception:  # a property of user code that raises: nothing more to read there
            reason = None
        if isinstance(reason, BaseException):
            todo.append(reason)
        wrapped = link.__cause__ if link.__cause__ is not None else (
            None if link.__suppress_context__ else link.__context__)
        if wrapped is not None:
            todo.append(wrapped)
    return links


def _transport_failure(exc: BaseException) -> bool:
    """Whether ``exc`` itself (not what it wraps) says the call could not get through: a timeout,
    a refused or reset connection, a name that did not resolve, an HTTP client's transport error."""
    mro = type(exc).__mro__
    if any(cls.__name__ in _NOT_TRANSPORT for cls in mro):
        return False  # requests' SSLError is a ConnectionError: a certificate refused stays refused
    if isinstance(exc, TimeoutError | ConnectionError):
        return True
    # a DNS failure: EAI_AGAIN is transient by definition, and a name not (yet) known is, more
    # often than not, a resolver or a service discovery catching up (a typo fails after the retries)
    if isinstance(exc, socket.gaierror):
        return True
    for cls in mro:
        if cls.__name__ in _TRANSIENT_NAMES:
            return True
        module = getattr(cls, "__module__", None)
        package = module.partition(".")[0] if isinstance(module, str) else ""
        if cls.__name__ in _TRANSIENT_BY_PACKAGE.get(package, ()):
            return True
    return False


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
