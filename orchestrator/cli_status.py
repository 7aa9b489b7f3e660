"""``raysaga status``: where a run stands, for people and as streamed JSON.

Nodes are listed step by step in the order the run started them (a step starts only after every
step it depends on completed, so this is a topological order of what ran), fan-out items by index.
``status`` never imports the run's recorded workflow code; with ``--workflow MODULE:WF`` (code the
operator names) steps that never started are listed too, as pending, in the workflow's order.

``--json`` writes the document incrementally, one node at a time, so a 50,000-node run costs a few
seconds and a bounded amount of memory. Its keys (``schema_version`` 1): run_id, workflow, version,
status, reason, trace_id, labels, created_at, updated_at, wake_at (when a resting run is due),
deadline_at, lease_owner, lease_expires_at, retries_used, retry_budget, tokens_used, cost_used, input,
output, error, node_counts, no_driver (``undriven.NoDriver.as_json``: why nobody drives a run still
running or compensating, since when, the command that continues it; null otherwise), nodes, effects,
next_nodes_after (and steps/failures with ``--summary``, which leaves nodes out); a fan-out's items
with no row yet (``queries.StepInfo.no_row``: held back by an effect step's window, or in flight and
not recorded yet) are counted ``pending``, not listed;
a pending run ``raysaga launch`` launched also has launch (its latest job: job, address, at, and
not_started, what ``status`` says when no driver has taken it, or null);
a submitted run waiting for the worker fleet has fleet (``fleet_view.fleet``: live_workers,
serving, queue, note, command).
"""

from __future__ import annotations

import json
import shlex
import time
from collections.abc import Callable, Iterable, Iterator
from typing import IO, TYPE_CHECKING, Any

from rich.console import Console
from rich.text import Text

from raysaga.errors import UserError
from raysaga.node_key import NodeKey
from raysaga.orchestrator import fleet_view, launch_marks, undriven
from raysaga.orchestrator.ownership import describe_lease
from raysaga.orchestrator.status_agents import fold_agent_calls
from raysaga.orchestrator.status_text import clock as clock  # re-exported: the other commands' views use them
from raysaga.orchestrator.status_text import error_line as error_line
from raysaga.orchestrator.status_text import (
    fan_state,
    run_times,
    run_wake,
    undone_by_forks,
    undone_note,
)
from raysaga.orchestrator.status_text import flat as flat
from raysaga.orchestrator.status_text import one_line as one_line
from raysaga.orchestrator.status_text import output_line as output_line
from raysaga.orchestrator.status_text import seconds as seconds
from raysaga.orchestrator.status_text import utc as utc
from raysaga.state import EffectStatus, RunRecord, SqlStore, node_label, queries  # reads: SQLAlchemy
from raysaga.state.models import PARKED, TERMINAL, RunStatus
from raysaga.state.redact import scrub, scrub_data

if TYPE_CHECKING:
    from raysaga.orchestrator.workflow import Workflow

SCHEMA_VERSION = 1
#: Fan-out items listed by name in the human view (the rest are counted).
ITEMS_SHOWN = 20
STATUS_COLOURS = {"completed": "green", "failed": "red", "cancelled": "yellow", "compensated": "yellow",
                  "compensation_failed": "red", "running": "cyan", "retrying": "yellow", "skipped": "dim",
                  "pending": "dim", "interrupted": "dark_orange"}


#: Largest fan-out index a node row can hold (a 32-bit column).
MAX_FAN_INDEX = 2**31 - 1


def parse_label(label: str, option: str = "node") -> tuple[str, int]:
    """``step`` or ``step[3]`` to (node_id, fan_index); an index beyond any row's is refused."""
    if label.endswith("]") and "[" in label:
        head, _, index = label[:-1].rpartition("[")
        if index.isascii() and index.isdigit():
            if len(index) > 10 or int(index) > MAX_FAN_INDEX:
                raise UserError(f"{option} {label!r}: a fan-out index is 0 to {MAX_FAN_INDEX}")
            return head, int(index)
    return label, -1


def step_order(store: SqlStore, run_id: str, wf: Workflow | None) -> tuple[list[queries.StepInfo], list[str]]:
    """The run's steps with rows, and the order to list them in (see the module docstring)."""
    infos = queries.steps(store, run_id)
    order = [s.node_id for s in infos]
    if wf is not None:
        rank = {name: i for i, name in enumerate(wf.order)}
        known = {s.node_id for s in infos}
        order = sorted(known | set(wf.order), key=lambda n: (rank.get(n.split("@")[0].split(":")[0], len(rank)),
                                                            n not in rank, order.index(n) if n in known else 0, n))
    return infos, order


def _node_json(row: dict[str, Any]) -> dict[str, Any]:
    index = row["fan_index"]
    return {
        "node": node_label(row["node_id"], index),
        "step": row["node_id"],
        "index": index if index >= 0 else None,
        "status": row["status"],
        "attempts": row["attempt"],
        "started_at": row["started_at"],
        "finished_at": row["finished_at"],
        "duration": row["duration"],
        "not_before": row["not_before"],
        "error": scrub(row["error"]),
        "output_digest": row["output_digest"],
        "inherited_from": row.get("origin_run_id"),
    }


def lineage(store: SqlStore, run: RunRecord) -> dict[str, Any]:
    """A run's parent and the node it was forked from, and the runs forked from it (docs/fork.md);
    empty for a run with neither."""
    children = [{k: c[k] for k in ("run_id", "forked_from", "status")} for c in store.children(run.run_id)]
    children = children[:CHILDREN_SHOWN]
    if run.parent_run_id is None and not children:
        return {}
    return {"parent_run_id": run.parent_run_id, "forked_from": run.forked_from, "children": children,
            "undone_by_forks": undone_by_forks(store, run.run_id)}


#: Forks of a run that ``status`` lists.
CHILDREN_SHOWN = 50


def _pending_json(step: str, status: str = "pending") -> dict[str, Any]:
    return {"node": step, "step": step, "index": None, "status": status, "attempts": 0, "started_at": None,
            "finished_at": None, "duration": None, "not_before": None, "error": None, "output_digest": None,
            "inherited_from": None}


def dumps(value: Any) -> str:
    return json.dumps(value, default=str)


def stream_json(store: SqlStore, run: RunRecord, stream: IO[str], *, wf: Workflow | None = None,
                summary: bool = False, nodes_limit: int | None = None, nodes_after: str | None = None) -> None:
    """Write ``status --json`` to ``stream`` piece by piece (never the whole document in memory).
    Every option is checked before the first byte is written; a node row that cannot be read
    (``CorruptRecordError``) midway ends the stream early (the CLI exits 2 after a partial document)."""
    infos, order = step_order(store, run.run_id, wf)
    after_key = _after_key(nodes_after, order)
    none = undriven.of_run(store, run)
    counts = shown_counts([c for info in infos for c in info.counts.items()], none, run.status.value)
    head = {
        "schema_version": SCHEMA_VERSION,
        "run_id": run.run_id, "workflow": run.workflow_name, "version": run.workflow_version,
        "status": run.status.value, "reason": scrub(run.status_reason), "trace_id": run.trace_id,
        "labels": run.labels,
        "created_at": run.created_at, "updated_at": run.updated_at, "wake_at": run_wake(run),
        "deadline_at": run.deadline_at, "lease_owner": run.lease_owner,
        "lease_expires_at": run.lease_expires_at, "retries_used": run.retries_used,
        "retry_budget": run.retry_budget, "tokens_used": run.tokens_used, "cost_used": run.cost_used,
        # secrets in a step's output are kept in the store (changing it would be a wrong result),
        # never shown: as on the dashboard (docs/dashboard.md, "Secrets")
        "input": scrub_data(run.input), "output": scrub_data(run.output),
        "error": None if run.error is None else scrub(run.error.as_dict()),
        "node_counts": counts,
        # an active run nobody drives (interrupted, its driver dead): why, since when, what continues it
        "no_driver": None if none is None else none.as_json(),
        **_launch_json(store, run),
        **({} if (fleet := fleet_view.fleet(store, run, time.time())) is None else {"fleet": fleet}),
        **lineage(store, run),
    }
    stream.write(dumps(head)[:-1])
    next_after: str | None = None
    if summary:
        steps = summary_steps(infos, none, run.status.value)
        stream.write(', "steps": ' + dumps(steps))
        failures = [{"node": node_label(f["node_id"], f["fan_index"]), "attempts": f["attempt"],
                     "error": error_line(f["error"], None)}
                    for f in queries.failed_nodes(store, run.run_id, SUMMARY_FAILURES)]
        stream.write(', "failures": ' + dumps(failures))
        # the list is bounded; a reader is told it was (3,000 failed nodes listed 1,000, silently)
        stream.write(', "failures_left_out": ' + dumps(max(counts.get("failed", 0) - len(failures), 0)))
    else:
        stream.write(', "nodes": [')
        first = True
        last: str | None = None
        shown = 0
        # in flight with no row yet: listed running, unless nobody drives the run (then as stored: pending)
        flying = set() if none is not None else _flying(store, run, wf) | _expanded(infos, run)
        with_rows = {s.node_id for s in infos if s.rows}
        for item in _nodes(store, run.run_id, order, with_rows, after_key, nodes_limit, flying):
            item["status"] = undriven.shown_state(item["status"], none, run.status.value)  # as the table lists
            stream.write(("\n" if first else ",\n") + dumps(item))
            first, last, shown = False, item["node"], shown + 1
        stream.write("]")
        if nodes_limit is not None and shown == nodes_limit and last is not None:
            more = list(_nodes(store, run.run_id, order, with_rows, parse_label(last), 1))
            next_after = last if more else None
    stream.write(', "effects": [')
    inherited = store.inherited_effects(run.run_id) if run.parent_run_id else []
    for i, e in enumerate([*store.effects(run.run_id), *inherited]):
        item = {"key": e.idempotency_key, "node": node_label(e.node_id, e.fan_index), "effect": e.effect_name,
                "status": e.status.value}
        if e.run_id != run.run_id:  # a fork's inherited effect: the ledger row of the run that executed it
            item["inherited_from"] = e.run_id
        stream.write(("\n" if i == 0 else ",\n") + dumps(item))
    stream.write('], "next_nodes_after": ' + dumps(next_after) + "}\n")
    stream.flush()


def shown_counts(counts: Iterable[tuple[str, int]], none: undriven.NoDriver | None,
                 status: str | None = None) -> dict[str, int]:
    """(state, count) pairs summed by state as the views show it (``undriven.shown_state``)."""
    out: dict[str, int] = {}
    for state, n in counts:
        shown = undriven.shown_state(state, none, status)
        out[shown] = out.get(shown, 0) + n
    return out


def summary_steps(infos: list[queries.StepInfo], none: undriven.NoDriver | None = None,
                  status: str | None = None) -> list[dict[str, Any]]:
    """``--summary``'s steps: the workflow's steps only, by first start. An agent's turns
    (``plan@2``) and tool calls (``plan@2.0``) are node rows of their own, and were listed as steps;
    they are counted under their agent step's ``agent`` (turns, tool_calls, and the calls not
    completed by status), which starts with its first turn (its own row has no start). A step's
    ``nodes`` are its rows and its items with no row yet (``pending`` in its counts); counts by
    state as shown (``shown_counts``: in a run no driver drives, ``running`` is ``none.in_flight``)."""
    kept, calls = fold_agent_calls(infos, [s.node_id for s in infos], by_start=True)
    by_id = {s.node_id: s for s in infos}
    steps: list[dict[str, Any]] = [
        {"step": name, "nodes": by_id[name].rows + by_id[name].no_row,
         "counts": shown_counts(by_id[name].counts.items(), none, status),
         "first_started_at": by_id[name].first_started} for name in kept]
    steps += [{"step": name, "nodes": 0, "counts": {}, "first_started_at": None}  # turns with no agent row yet
              for name in calls if name not in by_id]
    for step in steps:
        found = calls.get(step["step"])
        if found is not None:
            step["first_started_at"] = step["first_started_at"] or found.first_started
            step["agent"] = {"turns": found.turns, "tool_calls": found.tool_calls,
                             "unfinished": shown_counts(found.unfinished.items(), none, status)}
    steps.sort(key=lambda st: (st["first_started_at"] is None, st["first_started_at"] or 0.0))  # stable
    return steps


def _launch_json(store: SqlStore, run: RunRecord) -> dict[str, Any]:
    """``{"launch": ...}``, a pending run's latest launch (``launch_marks``): its job, the Job API,
    when, and the note when no driver has started it yet; {} (no key) for a run not launched, or
    no longer pending."""
    launch = launch_marks.latest(store, run)
    if launch is None:
        return {}
    return {"launch": {"job": launch.job, "address": launch.address, "at": launch.at,
                       "not_started": launch_marks.not_started(run, launch, time.time())}}


def _after_key(after: str | None, order: list[str]) -> tuple[str, int] | None:
    """``--nodes-after LABEL`` as (step, fan_index), refused unless the step is one of the run's."""
    if after is None:
        return None
    key = parse_label(after, "--nodes-after")
    if key[0] not in order:
        raise UserError(f"--nodes-after {after!r} is not a node of this run (use a label from the listing, "
                        "e.g. plan or square[41])")
    return key


def _expanded(infos: list[queries.StepInfo], run: RunRecord) -> set[str]:
    """The fan-outs of a running run expanded with no row yet, parent or item: in flight."""
    if run.status.value != "running":
        return set()
    return {s.node_id for s in infos if not s.rows and s.no_row}


def _flying(store: SqlStore, run: RunRecord, wf: Workflow | None) -> set[str]:
    """The steps of ``wf`` a running run has in flight with no row yet (``run_views.in_flight``,
    as ``--dag`` and the dashboard infer them)."""
    if wf is None or run.status.value != "running":
        return set()
    from raysaga.orchestrator import run_views

    return run_views.running_without_rows(store, run, wf)


def _nodes(store: SqlStore, run_id: str, order: list[str], with_rows: set[str], after_key: tuple[str, int] | None,
           limit: int | None, flying: set[str] | frozenset[str] = frozenset()) -> Iterator[dict[str, Any]]:
    """Node JSON in listing order: rows from the store, entries for steps without any (``running``
    for those in ``flying``, else ``pending``); ``after_key`` as checked by ``_after_key``."""
    start = 0
    if after_key is not None:
        start = order.index(after_key[0])
    left = limit
    for position in range(start, len(order)):
        step = order[position]
        if left is not None and left <= 0:
            return
        if step not in with_rows:
            if after_key is not None and position == start:
                continue
            left = None if left is None else left - 1
            yield _pending_json(step, "running" if step in flying else "pending")
            continue
        resume_from = after_key if after_key is not None and position == start else None
        for row in queries.iter_nodes(store, run_id, [step], after=resume_from, limit=left):
            left = None if left is None else left - 1
            yield _node_json(row)


def columns(rows: list[list[str]]) -> list[str]:
    """Plain aligned columns: never truncated, never wrapped, never read as markup."""
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    return ["  ".join(cell.ljust(w) for cell, w in zip(r, widths, strict=True)).rstrip() for r in rows]


def styled(status: str) -> Text:
    return Text(status, style=STATUS_COLOURS.get(status, ""))


def print_status(console: Console, store: SqlStore, run: RunRecord, *, store_text: str,
                 wf: Workflow | None = None, now: Callable[[], float] = time.time) -> None:
    """The human view: header, store, driver, one row per step, fan-outs counted, output, error.
    The header's length is the run's whole life once it rests (ended or parked), else its age."""
    none = undriven.of_run(store, run, now())
    colour = STATUS_COLOURS.get(run.status.value, "cyan") if none is None else STATUS_COLOURS[undriven.INTERRUPTED]
    line = Text.assemble("run ", (run.run_id, "bold"), f" ({run.workflow_name} v{run.workflow_version}): ",
                         (run.status.value if none is None else none.headline(), colour))
    if run.status_reason:
        line.append(" — " + one_line(run.status_reason))  # one line: a newline in it would fake a line
    if none is not None:  # nobody drives it: since when, why, and what continues it (not "running" alone)
        line.append(f" — {none.cause()}; {none.advice()}")
    console.print(line)
    at = now()
    life = (f"{seconds(max(0.0, run.updated_at - run.created_at))} in all" if run.status in TERMINAL | PARKED
            else f"{seconds(max(0.0, at - run.created_at))} so far")  # waiting, running: not over
    console.print(Text(f"created {utc(run.created_at)}, updated {utc(run.updated_at)} ({life})"))
    console.print(Text(f"driver: {describe_lease(run, at)}"))
    stuck = launch_marks.not_started(run, launch_marks.latest(store, run), at)
    if stuck is not None:  # its Ray job failed before driving it, or has yet to start: no worker takes it
        console.print(Text(f"launch: {stuck}"))
    if (fleet := fleet_view.fleet(store, run, at)) is not None:  # submitted, and no driver: do workers serve it?
        console.print(Text(f"fleet: {fleet['note']}"))
    for text in run_times(run, at):  # when a resting run wakes, and its deadline
        console.print(Text(text))
    console.print(Text(f"store: {store_text}"))
    if run.labels:
        console.print(Text("labels: " + ", ".join(flat(f"{k}={v}") for k, v in sorted(run.labels.items()))))
    family = lineage(store, run)
    if family:
        forks = ", ".join(f"{c['run_id']} (from {c['forked_from']}, {c['status']})" for c in family["children"])
        parent = f"forked from {run.parent_run_id} at {run.forked_from}" if run.parent_run_id else ""
        console.print(Text("lineage: " + "; ".join(p for p in (parent, f"forks: {forks}" if forks else "") if p)))
        if family["undone_by_forks"]:
            console.print(Text("undone by forks: " + ", ".join(
                flat(f"{u['node']} ({undone_note(u)})") for u in family["undone_by_forks"][:20])))
        inherited = store.inherited_effects(run.run_id) if run.parent_run_id else []
        if inherited:
            console.print(Text("effects inherited (not executed again): " + ", ".join(
                f"{node_label(e.node_id, e.fan_index)} ({e.status.value}, {e.run_id})" for e in inherited[:20])))
    infos, order = step_order(store, run.run_id, wf)
    order, agent_calls = fold_agent_calls(infos, order, by_start=wf is None)
    by_step = {s.node_id: s for s in infos}
    flying = _flying(store, run, wf)
    expanded = _expanded(infos, run)
    table = [["node", "status", "attempts", "started", "took", "note"]]
    fan_notes: list[str] = []

    undone = {u["node"]: undone_note(u) for u in reversed(family.get("undone_by_forks", []))}

    def add(label: str, row: dict[str, Any]) -> None:
        note = f"inherited from {row['origin_run_id']}" if row.get("origin_run_id") else error_line(row["error"], 120)
        note = " · ".join(n for n in (note, undone.get(label, "")) if n)
        if row["fan_index"] < 0 and row["node_id"] in agent_calls and not note:
            note = agent_calls[row["node_id"]].note(lambda s: undriven.shown_state(s, none, run.status.value))
        state = undriven.shown_state(row["status"], none, run.status.value)
        if state != row["status"] and not note:
            again = "a resume runs it again" if none else "it runs again when the run goes on"
            note = f"recorded running; nobody runs it: {again}"
        table.append([flat(label), state, str(row["attempt"]), clock(row["started_at"]),
                      seconds(row["duration"]), flat(note)])

    in_flight = "running" if none is None else none.in_flight
    for step in order:
        info = by_step.get(step)
        if info is None:
            table.append([flat(step), in_flight, "0", "", "", "inputs complete, no row yet"] if step in flying
                         else [flat(step), "pending", "0", "", "", "not started"])
            continue
        if not info.rows:  # a fan-out expanded, none of its items recorded yet
            table.append([flat(step), in_flight if step in expanded else "pending", "0", "", "",
                          "fan-out expanded, no row yet"])
        plain = [r for r in queries.iter_nodes(store, run.run_id, [step], limit=1) if r["fan_index"] < 0]
        for row in plain:
            add(step, row)
        items = dict(info.counts)
        for row in plain:
            items[row["status"]] -= 1
        total = sum(items.values())
        if info.rows and not plain and total > 0:  # a fan-out under way: its own row is written when it ends
            table.append([flat(step), undriven.shown_state(fan_state(items), none, run.status.value), "", "", "",
                          f"fan-out: {total} items, counted below"])
        if total > 0:
            shown = shown_counts(items.items(), none, run.status.value)
            parts = ", ".join(f"{n} {state}" for state, n in sorted(shown.items()) if n)
            closed = any(row["status"] in _CLOSED for row in plain)  # the fan-out ended: what has no row never ran
            fan_notes.append(f"{step}: {total} items — {parts}" + _no_row_note(info.no_row, run, none, closed))
            unfinished = total - items.get("completed", 0) - info.no_row  # rows: the ones to list
            if unfinished:
                for row in _problem_items(store, run.run_id, step):
                    add(node_label(step, row["fan_index"]), row)
                if unfinished > ITEMS_SHOWN:
                    fan_notes[-1] += (f" (the first {ITEMS_SHOWN} not completed are listed; "
                                      f"`raysaga status {shlex.quote(run.run_id)} --json --summary` counts them all)")
    for text in columns(table):
        console.print(Text(text))
    for note in fan_notes:
        console.print(Text("fan-out " + flat(note)))
    if run.output is not None:
        console.print(Text("output: " + output_line(run.output, 600)))
    if run.error:
        console.print(Text("error: " + error_line(scrub(run.error.as_dict()), 600)))
    # as the table counts them: an agent's failed turn (``ask@0``) is its agent's row, not one more
    failed = sum(s.counts.get("failed", 0) for s in infos if not NodeKey.parse(s.node_id).is_agent_call)
    if failed:
        console.print(Text(f"{failed} failed node(s): `raysaga status {shlex.quote(run.run_id)} --errors` shows "
                           "each attempt and its traceback"))
    print_unknown_effects(console, store, run)


#: Abandoned effects listed by ``print_status`` (the rest are counted; ``--json`` lists them all).
UNKNOWN_SHOWN = 10


def print_unknown_effects(console: Console, store: SqlStore, run: RunRecord) -> None:
    """The effects whose outcome nobody knows, their ledger rows ``abandoned``: in flight (or
    waiting out a retry) when the run stopped, or out of retries on transient errors. Each may or
    may not have taken effect; an operator checks the service under its idempotency key (or
    ``raysaga retry`` re-sends it under that key, reconciling, for the service to dedupe). The one
    thing a finished run cannot say for itself."""
    unknown = [e for e in store.effects(run.run_id) if e.status == EffectStatus.ABANDONED]
    if not unknown:
        return
    console.print(Text(f"{len(unknown)} effect(s) with an unknown outcome (abandoned: in flight when the run "
                       "stopped, or out of retries on transient errors; each may or may not have taken effect: "
                       "check the service under its key):", style="yellow"))
    for e in unknown[:UNKNOWN_SHOWN]:
        console.print(Text(f"  {flat(node_label(e.node_id, e.fan_index))}: effect {flat(e.effect_name)}, "
                           f"key {e.idempotency_key}"))
    if len(unknown) > UNKNOWN_SHOWN:
        console.print(Text(f"  ... and {len(unknown) - UNKNOWN_SHOWN} more: "
                           f"`raysaga status {shlex.quote(run.run_id)} --json` lists every ledger row"))


def print_dag(console: Console, store: SqlStore, run: RunRecord, workflow: str | None = None) -> None:
    """The DAG layered by topological generation, each step's state, attempts, duration, fan-out
    counts, effect and undo, agent turns and tokens. Imports the run's recorded workflow (as
    ``resume`` does) unless ``workflow`` (MODULE:WF) is given; without either, the steps with rows."""
    from raysaga.orchestrator import run_views

    graph = run_views.run_graph(store, run, workflow)
    if graph.get("note"):
        console.print(Text(f"dag: {graph['note']}", style="dim"))
    console.print(Text("dag (by generation):"))
    views = run_views.step_views(store, run.run_id, graph, running=run.status.value == "running",
                                 no_driver=undriven.of_run(store, run), status=run.status.value)
    for head, style, detail in run_views.layered_lines(graph, views):
        console.print(Text.assemble((flat(head), style), "  ", flat(detail)))


#: A fan-out step's own row in one of these: it ended (``failed``: a policy stopped it), so its items
#: with no row will not be issued by this run (a retry of the step is ``retrying`` first).
_CLOSED = frozenset({"completed", "failed", "skipped", "cancelled"})


def _no_row_note(count: int, run: RunRecord, none: undriven.NoDriver | None = None, closed: bool = False) -> str:
    """What a fan-out's items with no row yet are (``StepInfo.no_row``): in a running run, not
    issued yet (an effect step issues a window of items at a time) or in flight and not recorded
    yet; in one no driver drives (``none``), not issued or cut short when it stopped; in a resting
    one, not issued yet (a resume issues them); in an ended or rolling back one, or of a fan-out
    that ended (``closed``: a failure policy stopped it), never issued."""
    if not count:
        return ""
    if closed or run.status in TERMINAL or run.status in (RunStatus.COMPENSATING, RunStatus.COMPENSATION_FAILED):
        return f" ({count} never issued)"
    if none is not None and none.why != "silent":  # (a silent driver, on another machine, may be at work)
        return f" ({count} with no row: not issued, or in flight when its driver stopped; a resume issues them)"
    if run.status == RunStatus.RUNNING:
        return f" ({count} with no row yet: not issued yet, or in flight and not recorded yet)"
    return f" ({count} with no row yet: not issued yet)"


def _problem_items(store: SqlStore, run_id: str, step: str) -> Iterable[dict[str, Any]]:
    return queries.unfinished_items(store, run_id, step, ITEMS_SHOWN)


#: Failed nodes ``--json --summary`` lists (``failures_left_out`` counts the rest).
SUMMARY_FAILURES = 1000

