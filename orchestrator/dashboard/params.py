"""Reading what a request to the dashboard asks for: its query parameters and path segments.

Each check refuses, with a ``UserError`` (400) naming the parameter and what it takes, a value the
store cannot hold or compare (a NUL is not text to PostgreSQL, a 64-bit overflow fails in the
driver: each a 500 had it reached the store) or one that would list nothing, silently (a state
that does not exist, ``since=nan``); a run id no run can have is simply not found (404).
"""

from __future__ import annotations

import math
from typing import TypeGuard

from raysaga.errors import RunNotFoundError, UserError
from raysaga.state import RunStatus

#: The event log's sequence numbers are 64-bit; a fan-out's indexes 32-bit (the store's columns).
MAX_SEQ = 2**63 - 1
MAX_INDEX = 2**31 - 1


def bounded(value: int, name: str, low: int, high: int) -> int:
    """``value`` if ``low <= value <= high``, else ``UserError`` (400) naming the parameter: a number
    the store cannot hold would be a database error (500), never a result."""
    if not low <= value <= high:
        raise UserError(f"{name}={value} is out of range: {low} to {high}")
    return value


def fits(value: object, limit: int) -> TypeGuard[str]:
    """Whether ``value`` is 1 to ``limit`` printable characters: the one test of text the dashboard
    takes from a request (a run id, a node label, a cursor, a name to act as, a filter). NUL is
    not text to PostgreSQL (a 500 had it reached the store), nor is any other control character
    something to compare or record."""
    return isinstance(value, str) and 0 < len(value) <= limit and value.isprintable()


def text_param(value: str | None, name: str, limit: int) -> str | None:
    """A text query parameter: at most ``limit`` characters, no NUL (PostgreSQL text cannot hold
    one: a 500) nor other control character; else ``UserError`` naming it. Empty means unset."""
    if not value or fits(value, limit):
        return value or None
    if len(value) > limit:
        raise UserError(f"{name}= is {len(value)} characters long: at most {limit}")
    raise UserError(f"{name}={value[:40]!r} holds a control character")


#: Longest run id (as `raysaga run --run-id` accepts).
MAX_RUN_ID = 200


def run_id_param(value: str) -> str:
    """A run id from a path: one no run can have (empty, too long, a control character, which
    PostgreSQL could not even compare) is not found, without asking the store."""
    if not fits(value, MAX_RUN_ID):
        raise RunNotFoundError(value)
    return value


def label_param(value: str, name: str) -> str:
    """A step or node label from a path (steps are short identifiers; agent turns add a little)."""
    if not fits(value, 300):
        raise UserError(f"{name} {value[:40]!r} is not a node label: write STEP, STEP[ITEM] or AGENT@TURN[ITEM]")
    return value


def parse_status(value: str | None) -> str | None:
    """A run state, or ``UserError`` naming the states (an unknown one would list no runs, silently)."""
    if not value:
        return None
    states = [s.value for s in RunStatus]
    if value not in states:
        raise UserError(f"status={value!r} is not a run state: one of {', '.join(states)}")
    return value


def parse_time(value: str | None, name: str) -> float | None:
    """An ISO date/time (UTC unless it says) or epoch seconds (finite: ``nan`` would list no runs)."""
    if not value:
        return None
    try:
        number = float(value)
    except ValueError:
        pass
    else:
        if not math.isfinite(number):
            raise UserError(f"{name}={value!r} is not a time: use 2026-01-31, 2026-01-31T12:00 or epoch seconds")
        return number
    from datetime import UTC, datetime

    try:
        at = datetime.fromisoformat(value)
    except ValueError:
        raise UserError(f"{name}={value!r} is not a time: use 2026-01-31, 2026-01-31T12:00 or epoch seconds") from None
    return (at if at.tzinfo else at.replace(tzinfo=UTC)).timestamp()


def parse_cursor(value: str | None) -> tuple[float, str] | None:
    if not value:
        return None
    at, sep, run_id = value.partition("|")
    try:
        number = float(at)
    except ValueError:
        number = math.nan
    if not sep or not math.isfinite(number) or not fits(run_id, MAX_RUN_ID):
        raise UserError(f"before={value[:80]!r} is not a cursor from a previous page")
    return number, run_id



__all__ = ["MAX_INDEX", "MAX_RUN_ID", "MAX_SEQ", "bounded", "fits", "label_param", "parse_cursor",
           "parse_status", "parse_time", "run_id_param", "text_param"]
