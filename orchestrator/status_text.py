"""Store values as people read them in ``raysaga status`` and its kin (``inbox``): times,
durations, errors, and what a waiting node waits for (an approval's payload, a sleep's end)."""

from __future__ import annotations

import json
import re
import time
from typing import Any

from raysaga.orchestrator.fan_states import fan_state
from raysaga.state import NodeStatus, SqlStore, node_label
from raysaga.state.decisions import ApprovalRequest, request_of
from raysaga.state.item_pages import rows_at
from raysaga.state.models import PARKED, TERMINAL, RunRecord, RunStatus
from raysaga.state.redact import scrub_data, scrub_text

__all__ = ["FAR", "clock", "error_line", "fan_state", "flat", "inherited_from", "one_line", "output_line",
           "payload_line", "relative", "run_times", "run_wake", "seconds", "span", "undone_by_forks", "undone_note",
           "utc", "waiting_lines", "when"]

#: The states a run rests in until its ``wake_at`` (a timer, a retry's backoff, an approval's
#: timeout or the deadline; a decision or an unpause makes it now): a worker then takes it up.
_WAKING = (RunStatus.WAITING_TIMER, RunStatus.WAITING_HUMAN, RunStatus.PAUSED)


#: Seconds beyond which a time is read as "more than 100 years" away: a timeout of 1e300 s is a
#: 300-digit number of hours, or no date at all (``time.gmtime`` refuses it).
FAR = 100 * 365.25 * 86400


def utc(at: float | None) -> str:
    """A store timestamp as people read it (UTC, to the second); one too far for a date (a timeout
    of 1e300 s) is "more than 100 years from now"."""
    if at is None:
        return ""
    try:
        return time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime(at))
    except (OverflowError, ValueError, OSError):
        return "more than 100 years from now" if at > time.time() + FAR else "(bad time)"


def span(value: float) -> str:
    """A length of time as people read it, rounded: 12s, 5m, 3.2h, 4.5d; "more than 100 years"."""
    value = abs(value)
    if not value < FAR:  # NaN too
        return "more than 100 years"
    if value < 120:
        return f"{value:.0f}s"
    if value < 7200:
        return f"{value / 60:.0f}m"
    return f"{value / 3600:.1f}h" if value < 172800 else f"{value / 86400:.1f}d"


def relative(at: float, now: float) -> str:
    """``at`` from ``now``: "in 12s", "3m ago", "in more than 100 years"."""
    return f"in {span(at - now)}" if at >= now else f"{span(now - at)} ago"


def when(at: float, now: float) -> str:
    """A time to come (or past) as a date and its distance: "at 2026-11-30 21:40:13 UTC (in 12s)";
    a far one only as its distance ("in more than 100 years")."""
    if not abs(at - now) < FAR:
        return relative(at, now)
    return f"at {utc(at)} ({relative(at, now)})"


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


def run_wake(run: RunRecord) -> float | None:
    """When a resting run is due (``wake_at``); None for a run that does not rest until then."""
    return run.wake_at if run.status in _WAKING else None


def run_times(run: RunRecord, now: float) -> list[str]:
    """``status``'s lines for when a resting run wakes and its deadline: the store has both, and
    nothing else said when a sleep or a retry's backoff ends, or when the run must be done."""
    lines = []
    wake = run_wake(run)
    if wake is not None:
        due = "" if wake > now else ": due, a `raysaga worker` (or `raysaga resume`) takes it up"
        lines.append(f"wakes {when(wake, now)}{due}")
    ended = run.status in TERMINAL or run.status in PARKED  # its deadline matters only if it ended the run
    if run.deadline_at is not None and (not ended or run.status_reason == "deadline"):
        lines.append(f"deadline {when(run.deadline_at, now)}" + ("" if run.deadline_at > now else ": passed"))
    return lines


def flat(text: str) -> str:
    """One line of printable text (newlines and control characters shown escaped)."""
    return "".join(c if c.isprintable() else c.encode("unicode_escape", "backslashreplace").decode("ascii")
                   for c in text)


#: The end of a text cut inside an escape: an odd run of backslashes, then part of ``\uXXXX`` or ``\xXX``.
_HALF_ESCAPE = re.compile(r"(?<!\\)(?:\\\\)*(\\(?:u[0-9a-fA-F]{0,3}|x[0-9a-fA-F]?)?)$")


def output_line(output: Any, limit: int) -> str:
    """A run's output as one line of JSON: text as written (``日本``, not ``\\u65e5\\u672c``), with what
    a terminal would act on shown escaped (JSON escapes C0 controls, ``flat`` the rest), and cut
    at ``limit`` characters, never inside an escape."""
    text = flat(json.dumps(scrub_data(output), default=str, ensure_ascii=False))
    if len(text) <= limit:
        return text
    cut = text[:limit]
    half = _HALF_ESCAPE.search(cut)
    return (cut[:half.start(1)] if half else cut) + " …"


# ---------------------------------------------------------------- what a waiting node waits for

#: Characters of an approval's payload, prompt or a run's reason shown on one line (the JSON views have it whole).
PAYLOAD_WIDTH = 300
#: Characters scrubbed beyond the cut: a secret begun before it is masked whole (a 20 MB prompt is not scanned).
_SCRUB_MARGIN = 4096


def one_line(text: str, limit: int = PAYLOAD_WIDTH, more: str = "") -> str:
    """User text (an approval's prompt, a run's reason) for one line of the terminal: scrubbed, its
    newlines and control characters shown escaped (a step error's newline would draw a line of its
    own: a fake ``driver: ...``), cut at ``limit`` characters, never inside an escape; ``more``
    follows the cut's `` …`` (where the rest is)."""
    shown = flat(scrub_text(text[:limit + _SCRUB_MARGIN])[:limit + 1])
    if len(shown) <= limit:
        return shown
    cut = shown[:limit]
    half = _HALF_ESCAPE.search(cut)
    return (cut[:half.start(1)] if half else cut) + " …" + more


def payload_line(request: ApprovalRequest) -> str | None:
    """An approval's payload on one line, scrubbed, escaped and cut (``output_line``): an agent
    tool call's as ``call: TOOL {arguments}``; None when it has none."""
    payload = request.payload
    if request.tool is not None and isinstance(payload, dict) and "args" in payload:
        return f"call: {flat(request.tool)} {output_line(payload['args'], PAYLOAD_WIDTH)}"
    if payload is None:
        return None
    return f"payload: {output_line(payload, PAYLOAD_WIDTH)}"


def waiting_lines(store: SqlStore, run: RunRecord, node_id: str, fan_index: int, now: float) -> list[str]:
    """For one node of ``status --node``: an approval's payload, when a sleep wakes, when a retry
    (or a step held back) tries next; nothing for a node that waits for none of these, or in a
    run at rest (its rows wait for nothing any more)."""
    if run.status in TERMINAL or run.status in PARKED:
        return []
    with store.reader.connect() as conn:
        found = rows_at(conn, run.run_id, [(node_id, fan_index)], ("status", "not_before", "output"))
    if not found:
        return []
    row: dict[str, Any] = found[0]
    status, not_before = row["status"], row["not_before"]
    lines = []
    request = request_of(row["output"]) if status == "waiting" else None
    if request is not None:
        lines.append(f"asks: {one_line(request.prompt)}")
        payload = payload_line(request)
        if payload is not None:
            lines.append(payload)
    if isinstance(not_before, int | float) and status in ("waiting", "retrying", "pending"):
        what = "wakes" if status == "waiting" else "next try"
        lines.append(f"{what} {when(float(not_before), now)}")
    return lines


def undone_by_forks(store: SqlStore, run_id: str) -> list[dict[str, Any]]:
    """The nodes of ``run_id`` that a run forked from it (or from its forks) undid in its rollback:
    ``{"node", "run_id", "status"}`` (the compensation's status: ``completed`` undid it, another
    tried and did not finish). The parent's own rows do not say so: a fork undoes an inherited node
    under the parent's key, and records it in its own rows (docs/fork.md). One read of the forks'
    compensation rows (loading every row of 50 forks of a 20,000-item run took 25 s)."""
    if not store.children(run_id):
        return []
    from raysaga.state.fork_rows import undone_in

    forks = {r: i for i, r in enumerate(store.lineage({run_id})) if r != run_id}
    with store.reader.connect() as conn:
        found = undone_in(conn, run_id, list(forks))
    return [{"node": node_label(node_id, fan_index), "run_id": other, "status": status}
            for other, node_id, fan_index, status in sorted(found, key=lambda f: (forks[f[0]], f[1], f[2]))]


def undone_note(entry: dict[str, Any]) -> str:
    """How ``status`` tells one of ``undone_by_forks``: ``undone by F2's rollback``."""
    if entry["status"] == NodeStatus.COMPLETED.value:
        return f"undone by {entry['run_id']}'s rollback"
    return f"undo {entry['status']} in {entry['run_id']}'s rollback (may still stand)"


def inherited_from(store: SqlStore, run_id: str, node_id: str, fan_index: int) -> str | None:
    """The run that executed a fork's inherited node (its approval decided there), else None."""
    with store.reader.connect() as conn:
        found = rows_at(conn, run_id, [(node_id, fan_index)], ("origin_run_id",))
    origin = found[0].get("origin_run_id") if found else None
    return str(origin) if origin else None
