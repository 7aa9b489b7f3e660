"""Option objects a workflow author passes to steps and runs (they live in ``raysaga.types``)."""

from __future__ import annotations

from raysaga.errors import InvalidOptionError
from raysaga.types import (
    COMPENSATION_ATTEMPTS,
    COMPENSATION_RETRY,
    DEFAULT_RETRY,
    MIN_LEASE_TTL,
    NO_RETRY,
    RetryPolicy,
    RunOptions,
    compensation_retry,
)

__all__ = [
    "COMPENSATION_ATTEMPTS",
    "COMPENSATION_RETRY",
    "DEFAULT_RETRY",
    "MIN_LEASE_TTL",
    "NO_RETRY",
    "InvalidOptionError",
    "RetryPolicy",
    "RunOptions",
    "compensation_retry",
]
