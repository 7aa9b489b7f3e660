"""Option objects a workflow author passes to steps and runs."""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass, field
from typing import Any

from raysaga.errors import InvalidOptionError

__all__ = ["DEFAULT_RETRY", "MIN_LEASE_TTL", "NO_RETRY", "InvalidOptionError", "RetryPolicy", "RunOptions"]


#: The shortest lease a driver may take: the heartbeat renews every ttl/3, so a tiny ttl spins
#: it, and a lease shorter than one store round trip expires while it is being renewed.
MIN_LEASE_TTL = 0.5


def _number(owner: str, name: str, value: Any, *, minimum: float, allowed: str, strict: bool = False,
            integer: bool = False, optional: bool = False) -> None:
    """Refuse a value outside ``[minimum, inf)`` (``(minimum, inf)`` if ``strict``), NaN, inf, a bool."""
    if value is None and optional:
        return
    ok = isinstance(value, int | float) and not isinstance(value, bool)
    if ok and integer:
        ok = isinstance(value, int)
    if ok:
        ok = math.isfinite(value) and (value > minimum if strict else value >= minimum)
    if not ok:
        raise InvalidOptionError(f"{owner}.{name} must be {allowed}, got {value!r}")


@dataclass(frozen=True)
class RetryPolicy:
    """How a step's failed attempts are retried.

    Only failures classified transient are retried (see ``raysaga.orchestrator.retry``);
    the delay before attempt ``n+1`` is drawn with full jitter:
    ``uniform(0, min(cap, base * 2 ** (n - 1)))``.
    """

    max_attempts: int = 3
    """Attempts in all, the first included. 1 means never retry."""
    base: float = 0.5
    """Seconds: the ceiling of the first backoff draw."""
    cap: float = 30.0
    """Seconds: no backoff draw exceeds this."""
    transient: tuple[type[BaseException], ...] = ()
    """Extra exception types to treat as transient (retry)."""
    permanent: tuple[type[BaseException], ...] = ()
    """Extra exception types to treat as permanent (never retry); wins over ``transient``."""

    def __post_init__(self) -> None:
        _number("RetryPolicy", "max_attempts", self.max_attempts, minimum=1, integer=True,
                allowed="a whole number >= 1 (1: never retry)")
        _number("RetryPolicy", "base", self.base, minimum=0, allowed="a finite number of seconds >= 0")
        _number("RetryPolicy", "cap", self.cap, minimum=0, allowed="a finite number of seconds >= 0")


DEFAULT_RETRY = RetryPolicy()
NO_RETRY = RetryPolicy(max_attempts=1)

#: Attempts a compensation gets by default: effectively unlimited. An undo must complete; it
#: stops only when it succeeds, is refused permanently, or a budget the workflow declares with
#: ``@wf.compensation(step, retry=RetryPolicy(...))`` runs out.
COMPENSATION_ATTEMPTS = 1_000_000
#: The default compensation retry: full jitter, base 0.5 s, capped at 60 s between attempts.
COMPENSATION_RETRY = RetryPolicy(max_attempts=COMPENSATION_ATTEMPTS, base=0.5, cap=60.0)


def compensation_retry(declared: RetryPolicy | None, forward: RetryPolicy | None) -> RetryPolicy:
    """The retry policy of a compensation: the one its workflow declares, else the forward step's
    (its classification, base and cap: the same service answers) with effectively unlimited
    attempts, else ``COMPENSATION_RETRY``."""
    if declared is not None:
        return declared
    if forward is None:
        return COMPENSATION_RETRY
    return dataclasses.replace(forward, max_attempts=max(forward.max_attempts, COMPENSATION_ATTEMPTS))


@dataclass(frozen=True)
class RunOptions:
    """Per-run knobs; every field has a safe default."""

    deadline: float | None = None
    """Seconds from the run's creation after which it stops with reason ``deadline``."""
    retry_budget: int | None = None
    """Retries the whole run may spend across all nodes (None: only per-step limits)."""
    lease_ttl: float = 15.0
    """Seconds a driver's lease lasts without a heartbeat; a dead driver's run is free after this."""
    blob_threshold: int = 64 * 1024
    """Outputs larger than this many bytes of JSON go to the blob store by digest."""
    max_output_bytes: int = 16 * 1024 * 1024
    """Outputs larger than this fail their node permanently with a clear error."""
    token_budget: int | None = None
    """Model tokens (input + output) the whole run may spend; at the budget agents stop calling
    the model (the run pauses, or the node fails, as each agent declares). Raise it on resume."""
    cost_budget: float | None = None
    """Model cost in USD the whole run may spend (prices: ``raysaga.agents.price_of``)."""
    labels: dict[str, str] = field(default_factory=dict)

    def __post_init__(self) -> None:
        _number("RunOptions", "lease_ttl", self.lease_ttl, minimum=MIN_LEASE_TTL,
                allowed=f"a finite number of seconds >= {MIN_LEASE_TTL} (the heartbeat renews every ttl/3; "
                        "5 to 60 is sensible)")
        _number("RunOptions", "deadline", self.deadline, minimum=0, strict=True, optional=True,
                allowed="None or a finite number of seconds > 0")
        _number("RunOptions", "retry_budget", self.retry_budget, minimum=0, integer=True, optional=True,
                allowed="None or a whole number >= 0")
        _number("RunOptions", "blob_threshold", self.blob_threshold, minimum=0, integer=True,
                allowed="a whole number of bytes >= 0")
        _number("RunOptions", "max_output_bytes", self.max_output_bytes, minimum=1, integer=True,
                allowed="a whole number of bytes >= 1")
        _number("RunOptions", "token_budget", self.token_budget, minimum=0, integer=True, optional=True,
                allowed="None or a whole number of tokens >= 0")
        _number("RunOptions", "cost_budget", self.cost_budget, minimum=0, optional=True,
                allowed="None or a finite amount of USD >= 0")
