"""``raysaga status --errors`` and ``--node``: a node's failed attempts, tracebacks and an
approval's story (split from ``cli_status``, which draws the run)."""

from __future__ import annotations

import shlex
import sys
import time
from typing import TYPE_CHECKING, Any

from rich.console import Console
from rich.text import Text

from raysaga.errors import UserError
from raysaga.orchestrator.cli_status import dumps, parse_label, styled
from raysaga.orchestrator.status_text import error_line, flat, inherited_from, seconds, utc, waiting_lines, when
from raysaga.state import EventRecord, RunRecord, node_label, queries
from raysaga.state.decisions import node_history
from raysaga.state.redact import scrub, scrub_text

if TYPE_CHECKING:
    from raysaga.state import SqlStore


#: Failed nodes ``--errors`` shows (each with its attempts).
ERRORS_SHOWN = 50


def _say_errors_left_out(console: Console, store: SqlStore, run: RunRecord, as_json: bool) -> None:
    """How many failed nodes ``--errors`` leaves out, and how to see them (on stderr under
    ``--json``, whose stdout is one object per node): 3,000 failed nodes showed 50, silently."""
    total = sum(info.counts.get("failed", 0) for info in queries.steps(store, run.run_id))
    if total <= ERRORS_SHOWN:
        return
    rid = shlex.quote(run.run_id)
    note = (f"{total - ERRORS_SHOWN:,} more failed node(s) not shown (the first {ERRORS_SHOWN} are): "
            f"`raysaga status {rid} --errors --node LABEL` shows one; `raysaga status {rid} --json --summary` "
            "lists up to 1,000 with their errors")
    if as_json:
        sys.stderr.write(note + "\n")
    else:
        console.print(Text(note, style="dim"))


def print_errors(console: Console, store: SqlStore, run: RunRecord, node: str | None, *,
                 as_json: bool = False) -> None:
    """Every failed attempt from the event log, and the latest traceback of each failed node; for
    one node (``node``), also an approval's requests and decisions (who, when, the comment).
    ``as_json``: one JSON object per node, a line each."""
    if node is not None:
        node_id, index = parse_label(node, "--node")
        found = queries.node_error(store, run.run_id, node_id, index)
        if found is None:
            raise UserError(f"run {run.run_id!r} has no node {node!r} "
                            f"(`raysaga status {shlex.quote(run.run_id)}` lists them)")
        targets = [(node_id, index, found[0], found[1])]
    else:
        targets = [(f["node_id"], f["fan_index"], "failed", f["error"])
                   for f in queries.failed_nodes(store, run.run_id, ERRORS_SHOWN)]
        if not targets and not as_json:
            console.print(Text(f"run {run.run_id}: no failed nodes"))
    for node_id, index, state, error in targets:
        attempts = queries.attempt_failures(store, run.run_id, node_id, index)
        # a fork's inherited node: its approval was asked and decided in the run that executed it
        origin = inherited_from(store, run.run_id, node_id, index) if node is not None else None
        history = node_history(store.reader, origin or run.run_id, node_id, index) if node is not None else []
        if as_json:
            story = _node_story(run.run_id, node_label(node_id, index), state, error, attempts, history)
            sys.stdout.write(dumps({**story, "inherited_from": origin} if node is not None else story) + "\n")
            continue
        decided = ": as decided there" if history else ""  # (an approval's decisions, read from there)
        console.print(Text.assemble((node_label(node_id, index), "bold"), ": ", styled(state),
                                    f" (inherited from {origin}, not run again{decided})" if origin else ""))
        for event in history:
            console.print(Text("  " + _history_line(event)))
        if node is not None:  # what it waits for: an approval's payload, a sleep's or a retry's time
            for text in waiting_lines(store, run, node_id, index, time.time()):
                console.print(Text("  " + text))
        for event in attempts:
            data = event.data if isinstance(event.data, dict) else {}
            what = "retried" if event.kind == "retry_scheduled" else "failed for good"
            delay = f" after {seconds(data['delay'])}" if isinstance(data.get("delay"), int | float) else ""
            which = f"attempt {data['attempt']} " if isinstance(data.get("attempt"), int) else ""  # none: an approval's
            console.print(Text(f"  {which}at {utc(event.at)}: {error_line(data.get('error'), 300)} — {what}{delay}"))
            trace = data.get("error", {}).get("traceback") if isinstance(data.get("error"), dict) else None
            if trace:
                console.print(Text("    " + scrub_text(str(trace)).rstrip().replace("\n", "\n    ")))
        if error:
            if not attempts:
                console.print(Text(f"  {error_line(error, 300)}"))
            trace = error.get("traceback") if isinstance(error, dict) else None
            if trace:
                console.print(Text("  latest traceback:"))
                console.print(Text("    " + scrub_text(str(trace)).rstrip().replace("\n", "\n    ")))
    if node is None and len(targets) == ERRORS_SHOWN:  # bounded (each node's attempts are read): said
        _say_errors_left_out(console, store, run, as_json)


def _history_line(event: EventRecord) -> str:
    """An approval's request, escalation or decision, one line (scrubbed, printable)."""
    data = event.data if isinstance(event.data, dict) else {}
    if event.kind == "decision":
        comment = data.get("comment")
        return flat(scrub_text(f"{data.get('verdict')} by {data.get('by')} at {utc(event.at)} "
                               f"(decision {data.get('decision_id')})" + (f": {comment}" if comment else "")))
    who, until = data.get("approvers"), data.get("timeout_at")
    deciders = f", approvers {', '.join(map(str, who))}" if isinstance(who, list) else ", anyone decides"
    return flat(scrub_text(f"{'escalated' if event.kind == 'approval_escalated' else 'asked'} at {utc(event.at)}"
                           + deciders
                           + (f", quorum {data['quorum']}" if data.get("quorum", 1) != 1 else "")
                           + (f", times out {when(until, time.time())}" if isinstance(until, int | float) else "")))


def _node_story(run_id: str, label: str, state: str, error: Any, attempts: list[EventRecord],
                history: list[EventRecord]) -> dict[str, Any]:
    """``status --node NODE --json`` (and ``--errors --json``, a line per failed node)."""
    def data(e: EventRecord) -> dict[str, Any]:
        return e.data if isinstance(e.data, dict) else {}

    story: dict[str, Any] = scrub({
        "run_id": run_id, "node": label, "status": state,
        "error": None if error is None else error_line(error, None),
        "attempts": [{"attempt": data(e).get("attempt"), "at": e.at, "error": error_line(data(e).get("error"), None),
                      "retried": e.kind == "retry_scheduled", "delay": data(e).get("delay")} for e in attempts],
        "decisions": [{"verdict": data(e).get("verdict"), "by": data(e).get("by"), "at": e.at,
                       "comment": data(e).get("comment"), "decision_id": data(e).get("decision_id")}
                      for e in history if e.kind == "decision"],
        "requests": [{"kind": e.kind, "at": e.at, "approvers": data(e).get("approvers"),
                      "quorum": data(e).get("quorum"), "timeout_at": data(e).get("timeout_at")}
                     for e in history if e.kind != "decision"],
    })
    return story
