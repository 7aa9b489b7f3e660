"""Reading what a request to the dashboard asks for: its query parameters and path segments.

Each check refuses, with a ``UserError`` (400) naming the parameter and what it takes, a value the
store cannot hold or compare (a NUL is not text to PostgreSQL, a 64-bit overflow fails in the
driver: each a 500 had it reached the store) or one that would list nothing, silently (a state
that does not exist, ``since=nan``); a run id no run can have is simply not found (404).
"""

from __future__ import annotations

import math
import re
from collections.abc import Sequence
from typing import Any, TypeGuard
from urllib.parse import unquote, unquote_to_bytes

from raysaga.errors import RunNotFoundError, UserError
from raysaga.state import NodeStatus, RunStatus
from raysaga.types import MAX_LABELS, check_labels

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


#: A node label as ``node_label`` writes one: a step (no ``@ : [ ]``), an agent's turn and tool call
#: (``@2``, ``@2.1``), a compensation (``:compensate``), a fan-out item (``[3]``); ASCII digits only.
_NODE = re.compile(r"(?P<node>[^@:\[\]]+(?:@[0-9]{1,10}(?:\.[0-9]{1,10})?)?(?::compensate)?)"
                   r"(?:\[(?P<index>[0-9]{1,10})\])?")


def node_param(value: object, name: str = "node") -> tuple[str, int]:
    """A node label (from a path or an action's body) as the store's ``(node_id, fan_index)``, or
    ``UserError`` (400) naming it: ``x@`` reached ``NodeKey.parse`` (``int('')``) and ``each[³]``
    ``int('³')`` (``str.isdigit`` takes it), each a 500 with a traceback."""
    found = _NODE.fullmatch(value) if fits(value, 300) else None
    index = -1 if found is None or found["index"] is None else int(found["index"])
    if found is None or index > MAX_INDEX:
        shown = value[:40] if isinstance(value, str) else value
        raise UserError(f"{name} {shown!r} is not a node label: write STEP, STEP[ITEM], AGENT@TURN[ITEM] or "
                        f"STEP:compensate (ITEM a whole number from 0 to {MAX_INDEX} in ASCII digits)")
    return found["node"], index


def label_filter(given: list[str] | None) -> tuple[tuple[str, str], ...]:
    """``label=KEY=VALUE`` query parameters (repeatable; a run must carry every one, as with
    ``raysaga list --label``) as (key, value) pairs. A pair without '=', a key given twice, more
    labels than a run can carry, or a label no run could carry (``raysaga.types.check_labels``: a
    key of 1-100 printable characters, a value of 0-500) is a ``UserError`` (400) naming it:
    such a filter would list no runs, as if there were none."""
    if not given:
        return ()
    if len(given) > MAX_LABELS:
        raise UserError(f"label= is given {len(given)} times: a run carries at most {MAX_LABELS} labels, "
                        "so none could match; filter by fewer")
    found: dict[str, str] = {}
    for pair in given:
        key, sep, value = pair.partition("=")
        if not sep:
            raise UserError(f"label={pair!r:.80} is not KEY=VALUE: e.g. label=team=billing "
                            "(in a URL: ?label=team%3Dbilling)")
        if key in found:
            raise UserError(f"label={key!r:.80} is given twice ({found[key]!r:.40} and {value!r:.40}): "
                            "a run has one value per key; give each key once")
        found[key] = value
    check_labels(found, "label=")
    return tuple(found.items())


def parse_status(value: str | None) -> str | None:
    """A run state, or ``UserError`` naming the states (an unknown one would list no runs, silently)."""
    if not value:
        return None
    states = [s.value for s in RunStatus]
    if value not in states:
        raise UserError(f"status={value!r} is not a run state: one of {', '.join(states)}")
    return value


def parse_node_status(value: str | None) -> str | None:
    """A node state (a fan-out's items filter), or ``UserError`` naming the states: an unknown one
    listed no items, silently, as if the fan-out had none in it."""
    if not value:
        return None
    states = [s.value for s in NodeStatus]
    if value not in states:
        raise UserError(f"status={value[:40]!r} is not a node state: one of {', '.join(states)}")
    return value


def path_segment(segment: str) -> str:
    """A path parameter under ``/api/runs/`` (routed on the raw path) percent-decoded, or
    ``UserError``: bytes that are not UTF-8 (``%FF``) were read as U+FFFD and looked up as
    another label (a 200 for "\ufffd"), as query strings once were."""
    try:
        return unquote(segment, errors="strict")
    except UnicodeDecodeError:
        raise UserError(f"the path segment {segment[:40]!r}, percent-decoded, is not UTF-8 text "
                        "(%FF, or %ED%A0%80: a lone surrogate): percent-encode text as UTF-8 "
                        "(encodeURIComponent)") from None


def last_event_id(value: str | None) -> int | None:
    """The ``Last-Event-ID`` a reconnecting browser sends, as a cursor; None when absent or not a
    number (the stream then starts from ``after``). Longer than 19 digits (beyond 64 bits) is a
    ``UserError``: ``int()`` of 4,301 digits or more raised ValueError (Python's limit), a 500."""
    if not value or not (value.isascii() and value.isdigit()):
        return None
    if len(value) > 19:
        raise UserError(f"Last-Event-ID={value[:20]}… is {len(value):,} digits long: an event seq is at most "
                        f"{MAX_SEQ} (19 digits)")
    return bounded(int(value), "Last-Event-ID", 0, MAX_SEQ)


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



def query_problem(raw: bytes) -> str | None:
    """Why a request's query string is not text, naming the parameter, or None. Starlette reads
    bytes that are not UTF-8 once percent-decoded (``%FF``, ``%ED%A0%80``: a lone surrogate) as
    U+FFFD, and raw bytes above ASCII (curl sends ``é`` as is) as Latin-1: either way a filter
    asked for other text than was sent, and listed nothing, silently."""
    for part in raw.split(b"&"):
        name = part.partition(b"=")[0].decode("ascii", "replace")[:40]
        if not part.isascii():
            return (f"{name}=: the query string holds bytes that are not percent-encoded: percent-encode "
                    "its text as UTF-8 (as a browser does: label=%C3%A9quipe%3Dsearch)")
        try:
            unquote_to_bytes(part.replace(b"+", b" ")).decode("utf-8")
        except UnicodeDecodeError:
            return (f"{name}=: percent-decoded, it is not UTF-8 text (%FF, or %ED%A0%80: a lone surrogate, "
                    "is not a character): percent-encode text as UTF-8")
    return None



def validation_message(errors: Sequence[Any]) -> str:
    """FastAPI's refusal of a parameter of the wrong type (``limit=abc``, a body that is no JSON
    object) as one line naming it, as every other refusal here names its parameter."""
    if not errors:
        return "the request does not fit this route"
    first = errors[0]
    if first.get("type") == "json_invalid":
        return 'the body is not JSON: send a JSON object, e.g. {"confirm": true}'
    where = [str(part) for part in first.get("loc", ()) if part not in ("query", "path", "header")]
    name = ".".join(where) or "the request"
    return f"{name}={first.get('input')!r:.60}: {first.get('msg', 'not accepted')}".replace("Input should", "it should")


__all__ = ["MAX_INDEX", "MAX_RUN_ID", "MAX_SEQ", "bounded", "fits", "label_filter", "label_param", "last_event_id",
           "node_param", "parse_cursor", "parse_node_status", "parse_status", "parse_time", "path_segment",
           "query_problem", "run_id_param", "text_param", "validation_message"]
