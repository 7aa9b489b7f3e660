"""The JSON documents the dashboard's pages read: a page of runs, a run, a node, a value.

Every value shown passes through ``redact.scrub`` (secrets never reach the page, whatever a step
returned), and a value above ``PREVIEW_BYTES`` of JSON is sent as a preview with its size: the
page fetches the whole of it (``/api/runs/RUN/nodes/NODE/output``) only when asked. A node's
output kept as a blob is fetched the same way, by the digest its row names.
"""

from __future__ import annotations

import json
import time
from collections.abc import Iterable
from typing import Any

from raysaga.errors import BlobIntegrityError, RunNotFoundError
from raysaga.node_key import AGENT_SEP, NodeKey
from raysaga.orchestrator import fleet_view, undriven
from raysaga.orchestrator.dashboard.graph import Given, base_step, graph_for
from raysaga.orchestrator.dashboard.params import MAX_INDEX, MAX_SEQ, bounded, node_param
from raysaga.state import Store, node_label
from raysaga.state.dashboard_reads import DashboardReads, RunFilter
from raysaga.state.decisions import request_of
from raysaga.state.item_events import item_indexes
from raysaga.state.redact import scrub, scrub_data, scrub_text

#: A value above this many bytes of JSON is sent as a preview; the page fetches the rest on demand.
PREVIEW_BYTES = 16_384
#: Items of a fan-out sent with the run (the rest by /items, on demand).
ITEMS_SHOWN = 24
#: Largest page of runs or items.
MAX_PAGE = 500
#: A waiting approval's prompt and answer schema are sent whole up to this many bytes of JSON each
#: (the form needs them; the payload is a value like any other, a preview when large).
REQUEST_BYTES = 65_536
#: Names of who may decide an approval sent with it, at most.
MAX_APPROVERS = 200


def _json(value: Any) -> str:
    return json.dumps(value, default=str, ensure_ascii=False)


def shown(value: Any, limit: int = PREVIEW_BYTES) -> dict[str, Any]:
    """A value as the page shows it: ``{"value": ...}``, or ``{"preview": text, "size": n}``."""
    clean = scrub_data(value)
    text = _json(clean)
    if len(text) <= limit:
        return {"value": clean}
    return {"preview": text[:limit], "size": len(text.encode())}


def _row(row: dict[str, Any]) -> dict[str, Any]:
    """A light node row (no output) as JSON."""
    return {"node": node_label(row["node_id"], row["fan_index"]), "node_id": row["node_id"],
            "index": row["fan_index"] if row["fan_index"] >= 0 else None, "status": str(row["status"]),
            "attempt": row["attempt"], "not_before": row["not_before"], "started_at": row["started_at"],
            "finished_at": row["finished_at"], "duration": row["duration"],
            "output_digest": row.get("output_digest"), "inherited_from": row.get("origin_run_id")}


def _run_json(row: dict[str, Any]) -> dict[str, Any]:
    out = {k: row[k] for k in row}
    out["status_reason"] = scrub(row.get("status_reason"))
    if "labels" in out:  # stored before labels holding a secret were refused (6867918): masked here
        out["labels"] = {scrub_text(k, short_values=False): v for k, v in scrub_data(out["labels"]).items()}
    return out


def summaries(store: Store, rows: list[dict[str, Any]], now: float) -> list[dict[str, Any]]:
    """Run summary rows as the page gets them, each with ``no_driver``: why nobody drives a run
    still running or compensating (``undriven.NoDriver.as_json``), else null. The driver stops of
    the runs whose lease is free are read in one pass."""
    stops = undriven.stops(store, [r["run_id"] for r in rows if undriven.needs_stop(r.get("status"),
                                                                                      r.get("lease_owner"))])
    out = []
    for row in rows:
        none = undriven.derive(row, stops.get(row["run_id"]), now)
        out.append({**_run_json(row), "no_driver": None if none is None else none.as_json()})
    return out


def summary(store: Store, run_id: str, now: float | None = None) -> dict[str, Any]:
    """One run's summary as ``summaries`` gives it ({} for a run not in the store)."""
    row = store.run_row(run_id)
    return summaries(store, [row], time.time() if now is None else now)[0] if row else {}


def run_list(store: Store, f: RunFilter) -> dict[str, Any]:
    """One page of runs, the counts by state under the same filter (and ``no_driver``, how many of
    the active ones nobody drives), the next page's cursor."""
    rows = store.run_page(f)
    last = rows[-1] if len(rows) == f.limit else None
    now = time.time()
    return {
        "runs": summaries(store, rows, now),
        "counts": store.run_counts(f),
        "no_driver": store.undriven_count(f, now) if isinstance(store, DashboardReads) else 0,
        "next": None if last is None else f"{last['created_at']!r}|{last['run_id']}",
        "now": now,
    }


def inbox(store: Store, approver: str | None = None) -> list[dict[str, Any]]:
    """Approvals waiting for a decision (prompt, approvers, timeout), oldest first; with
    ``approver``, those they may decide."""
    return [{"run_id": w.run_id, "workflow": w.workflow, "node": node_label(w.node, w.fan_index),
             "since": w.request.asked_at, "prompt": scrub(w.request.prompt), "approvers": w.request.approvers,
             "timeout_at": w.request.timeout_at, "approvals": w.approvals} for w in store.waiting_approvals(approver)]


def steps_of(rows: list[dict[str, Any]], counts: dict[str, dict[str, int]]) -> dict[str, dict[str, Any]]:
    """Per workflow step: its own row, a fan-out's counts and first items, agent turns counted,
    its compensation's status."""
    steps: dict[str, dict[str, Any]] = {}
    for row in rows:
        key = NodeKey.parse(row["node_id"], row["fan_index"])
        entry = steps.setdefault(key.step, {"row": None, "items": [], "counts": {}, "turns": 0, "calls": 0,
                                            "compensation": None})
        if key.compensates:
            entry["compensation"] = str(row["status"])
        elif key.call is not None:
            entry["calls"] += 1
        elif key.turn is not None:
            entry["turns"] += 1
        elif key.fan_index >= 0:
            entry["items"].append(_row(row))
        else:
            entry["row"] = _row(row)
    for step, c in counts.items():
        steps.setdefault(step, {"row": None, "items": [], "counts": {}, "turns": 0, "calls": 0,
                                "compensation": None})["counts"] = c
    return steps


def _sent_once(steps: dict[str, dict[str, Any]]) -> dict[str, dict[str, Any]]:
    """The steps as the run page gets them: each step's own row as its status only and its first
    items as their labels, since the page's ``rows`` holds every row whole. Sent in both, the rows
    were a third of a 10,000-step run's 6.9 MB page."""
    for entry in steps.values():
        row = entry["row"]
        entry["row"] = None if row is None else {"status": row["status"]}
        entry["items"] = [item["node"] for item in entry["items"]]
    return steps


def _agent_counts(store: Store, run_id: str, steps: Iterable[str] | None) -> dict[str, dict[str, int]]:
    """Turns and tool calls of each agent step, every item counted (``DashboardReads.agent_counts``);
    another ``Store``: none (the counts of the rows read stand)."""
    return store.agent_counts(run_id, steps) if isinstance(store, DashboardReads) else {}


def _with_agent_counts(steps: dict[str, dict[str, Any]],
                       agents: dict[str, dict[str, int]]) -> dict[str, dict[str, Any]]:
    for step, c in agents.items():
        if step in steps:
            steps[step].update(c)
    return steps


def started_order(rows: list[dict[str, Any]]) -> list[str]:
    """Node ids by when their step first started (never-started last): the order a graph drawn
    from rows alone lists its steps in."""
    first: dict[str, float] = {}
    for r in rows:
        at = r["started_at"] if r["started_at"] is not None else float("inf")
        step = base_step(r["node_id"])
        first[step] = min(first.get(step, at), at)
    return sorted(first, key=lambda step: (first[step], step))


def fan_counts(store: Store, run_id: str, steps: Iterable[str]) -> dict[str, dict[str, int]]:
    """Items by state of each named fan-out; items expanded but without a row yet (in flight or
    queued) count as ``pending``."""
    wanted = set(steps)
    sizes = {k: v for k, v in store.fanout_sizes(run_id).items() if k in wanted} if wanted else {}
    counts = store.step_counts(run_id, wanted | set(sizes))
    for step, size in sizes.items():
        have = sum(counts.get(step, {}).values())
        if size > have:
            counts.setdefault(step, {})["pending"] = size - have
    return counts


def _every_step(store: Store, run_id: str) -> tuple[list[dict[str, Any]], dict[str, dict[str, int]]]:
    """The run's step rows (of each fan-out its first ``ITEMS_SHOWN`` items) and every fan-out's counts."""
    rows = store.step_rows(run_id, ITEMS_SHOWN)
    fanned = {r["node_id"] for r in rows if r["fan_index"] >= 0 and "@" not in r["node_id"]}
    return rows, fan_counts(store, run_id, fanned | set(store.fanout_sizes(run_id)))


def run_page(store: Store, run_id: str, given: Given = None) -> dict[str, Any]:
    """Everything a run page first draws. ``cursor`` is the event seq read *before* the rows, so
    the live stream from it replays whatever changed while they were read (updates are idempotent).
    ``given``: the workflows the dashboard was started with (``--workflow``) to draw DAGs from."""
    run = store.get_run(run_id, lenient=True)
    cursor = run.event_seq
    rows, counts = _every_step(store, run_id)
    return {
        "run": {**summary(store, run_id), "trace_id": run.trace_id, "workflow_ref": run.workflow_ref,
                "input": shown(run.input), "output": shown(run.output),
                "error": None if run.error is None else scrub(run.error.as_dict()),
                "forked_from": run.forked_from, "wake_at": run.wake_at, "event_seq": run.event_seq,
                "children": [{"run_id": c["run_id"], "status": str(c["status"]), "forked_from": c["forked_from"]}
                             for c in store.children(run_id)],
                # a submitted run waiting for workers: do live ones serve it (``status``'s fleet line)
                "fleet": fleet_view.fleet(store, run, time.time())},
        "graph": graph_for(run, started_order(rows), given),
        "steps": _sent_once(_with_agent_counts(steps_of(rows, counts), _agent_counts(store, run_id, None))),
        "rows": [_row(r) for r in rows],
        "cursor": cursor,
        "now": time.time(),
    }


def fan_items(store: Store, run_id: str, step: str, after: int, limit: int, status: str | None) -> dict[str, Any]:
    # the page asked for is the page read: `next` compares with it (a limit above MAX_PAGE once
    # made a full page look like the last one, and the rest of the items were never listed)
    page = min(max(1, limit), MAX_PAGE)
    rows = store.fan_items(run_id, step, bounded(after, "after", -1, MAX_INDEX), page, status or None)
    if not rows and store.run_row(run_id) is None:  # an unknown run is a 404, as on every route
        raise RunNotFoundError(run_id)
    return {"items": [_row(r) for r in rows], "next": rows[-1]["fan_index"] if len(rows) == page else None}


def parse_node(label: str) -> tuple[str, int]:
    """``step``, ``step[3]``, ``research@2.1`` to (node_id, fan_index); a label no node can have
    is a ``UserError`` (400) naming it, never a ``ValueError`` from ``NodeKey.parse`` (a 500)."""
    return node_param(label)


def _event_json(e: Any) -> dict[str, Any]:
    return {"seq": e.seq, "at": e.at, "kind": e.kind, "node": None if e.node_id is None else
            node_label(e.node_id, -1 if e.fan_index is None else e.fan_index), "data": scrub(e.data)}


def _turn(row: dict[str, Any]) -> dict[str, Any]:
    """An agent turn or tool call row: the model's usage, stop reason and tool uses when it holds them."""
    out = _row(row)
    value = row.get("output")
    if isinstance(value, dict):
        usage = value.get("usage")
        out.update(stop_reason=value.get("stop_reason"), model=value.get("model"), cost=value.get("cost"))
        if isinstance(usage, dict):
            out.update(input_tokens=usage.get("input_tokens"), output_tokens=usage.get("output_tokens"))
        content = value.get("content")
        if isinstance(content, str):  # a tool call's result
            out["text"] = scrub_text(content)[:2000]  # scrubbed before it is cut (a cut secret is not found)
        if isinstance(content, list):
            out["tool_uses"] = [{"name": c.get("name"), "input": shown(c.get("input"), 2000)} for c in content
                                if isinstance(c, dict) and c.get("type") == "tool_use"]
            out["text"] = scrub_text(" ".join(str(c.get("text")) for c in content
                                              if isinstance(c, dict) and c.get("type") == "text"))[:2000]
    out["output"] = shown(value, 4000)
    out["error"] = scrub(row.get("error"))
    return out


def _prefill(schema: Any, payload: Any) -> dict[str, Any]:
    """The payload's values of the answer schema's plain top-level fields (a string, number or
    boolean each): what the form is pre-filled with, so an approve with edits is a change of a field."""
    props = schema.get("properties") if isinstance(schema, dict) else None
    if not isinstance(props, dict) or not isinstance(payload, dict):
        return {}
    return {k: v for k, v in payload.items() if k in props and isinstance(v, (str, int, float, bool))
            and len(_json(v)) <= REQUEST_BYTES}


def approval_form(output: Any) -> dict[str, Any] | None:
    """What the Approve/Reject form of a waiting approval needs, from its row's output (or None:
    not a waiting approval): its prompt, who may decide, the answer's schema (each whole up to
    ``REQUEST_BYTES``: a larger one is cut, and its size said), the payload as a shown value and
    the form's pre-filled fields. Sent in its own key: the output itself, above ``PREVIEW_BYTES``,
    is a preview, from which the page could build no form."""
    request = request_of(output)
    if request is None:
        return None
    prompt = scrub_text(request.prompt)
    schema = scrub(request.answer_schema)
    schema_size = len(_json(schema).encode()) if schema is not None else 0
    deciders = request.deciders()
    return {
        "prompt": prompt[:REQUEST_BYTES], "prompt_size": len(prompt) if len(prompt) > REQUEST_BYTES else None,
        "approvers": None if deciders is None else deciders[:MAX_APPROVERS],
        "approvers_count": None if deciders is None else len(deciders),
        "quorum": request.quorum, "timeout_at": request.timeout_at, "on_timeout": request.on_timeout,
        "tool": request.tool, "takes_answer": request.answer_schema is not None,
        "answer_schema": schema if schema_size <= REQUEST_BYTES else None,
        "answer_schema_size": schema_size,
        "payload": shown(request.payload),
        "prefill": _prefill(schema, scrub(request.payload)) if schema_size <= REQUEST_BYTES else {},
    }


class NodeNotFoundError(LookupError):
    """A well-formed node label that names no node of the run (the app answers 404)."""


def _known(store: Store, run_id: str, node_id: str, index: int, given: Given) -> bool:
    """Whether a node with no row, event or ledger row is still one of the run's: a step of its
    graph (its workflow's, or the steps its rows name: a step not started yet has no row), or an
    item of a fan-out it expanded. A turn, tool call or compensation with none of those is not."""
    step = base_step(node_id)
    if step != node_id:
        return False
    sizes = store.fanout_sizes(run_id)
    if index >= 0:
        return index < sizes.get(step, 0)
    run = store.get_run(run_id, lenient=True)
    graph = graph_for(run, started_order(store.step_rows(run_id, 1)), given)
    return step in sizes or any(n["id"] == step for n in graph["nodes"])


def node_page(store: Store, run_id: str, label: str, given: Given = None) -> dict[str, Any]:
    """A node's panel: its row, output (or digest), error, attempts from the event log, ledger rows,
    its compensation and, for an agent, its turns and tool calls. A label that names no node of
    the run (``_known``) is a ``NodeNotFoundError``: it answered 200 with every part empty, as a
    step not started yet does."""
    node_id, index = parse_node(label)
    row = store.node_row(run_id, node_id, index)
    if row is None and store.run_row(run_id) is None:
        raise RunNotFoundError(run_id)
    events = store.node_events(run_id, node_id, index)
    subs = store.sub_rows(run_id, node_id, index) if NodeKey.parse(node_id).turn is None else []
    ledger = store.node_effects(run_id, node_id, index)
    if row is None and not events and not subs and not ledger and not _known(store, run_id, node_id, index, given):
        raise NodeNotFoundError(f"run {run_id!r} has no node {label!r}: no row, event or ledger row names it, and "
                                "it is neither a step of the run's DAG as drawn here nor an item of a fan-out it "
                                "expanded")
    comp = [r for r in subs if r["node_id"].endswith(":compensate") and "@" not in r["node_id"]]
    turns = [r for r in subs if "@" in r["node_id"]]
    output: dict[str, Any] | None = None
    approval = approval_error = None
    if row is not None:
        blob = bool(row["output_digest"]) and row["output"] is None
        output = {"digest": row["output_digest"]} if blob else shown(row["output"])
        if str(row["status"]) == "waiting":  # an approval's request, read from its blob if kept as one
            try:
                held = store.load_blobs({row["output_digest"]: f"output of {label}"})[row["output_digest"]] \
                    if blob else row["output"]
                approval = approval_form(held)
            except BlobIntegrityError as exc:  # the rest of the panel still shows; the form cannot
                approval_error = f"no form: the approval's request cannot be read ({exc})"
    return {
        "node": label, "step": base_step(node_id),
        "row": None if row is None else _row(row),
        "output": output,
        "approval": approval,
        "approval_error": approval_error,
        "error": None if row is None else scrub(row["error"]),
        "attempts": [_event_json(e) for e in events],
        "effects": [{"key": e.idempotency_key, "node": node_label(e.node_id, e.fan_index), "effect": e.effect_name,
                     "status": e.status.value, "result": shown(e.result, 4000), "external_id": e.external_id,
                     "created_at": e.created_at, "updated_at": e.updated_at} for e in ledger],
        "compensation": [{**_row(r), "error": scrub(r["error"])} for r in comp],
        "turns": [_turn(r) for r in turns],
    }


def node_output(store: Store, run_id: str, label: str) -> Any:
    """A node's whole output (from its blob when it is kept as one), scrubbed."""
    node_id, index = parse_node(label)
    row = store.node_row(run_id, node_id, index)
    if row is None and store.run_row(run_id) is None:
        raise RunNotFoundError(run_id)
    if row is None:  # (a node not started yet has no output either: its label is known or not, no matter)
        raise NodeNotFoundError(f"run {run_id!r} has no output of node {label!r}: no row of it (not started, "
                                "or no such node)")
    if row["output_digest"] and row["output"] is None:
        return scrub_data(store.load_blobs({row["output_digest"]: f"output of {label}"})[row["output_digest"]])
    return scrub_data(row["output"])


def events_page(store: Store, run_id: str, after: int, limit: int) -> list[dict[str, Any]]:
    after = bounded(after, "after", 0, MAX_SEQ)
    return [_event_json(e) for e in store.events(run_id, after_seq=after, limit=min(max(1, limit), MAX_PAGE))]


def live_change(store: Store, run_id: str, after: int, limit: int = 500) -> tuple[int, dict[str, Any] | None]:
    """What changed after event ``after``: the events, the rows of the nodes they name (of a
    fan-out's items, ``ITEMS_SHOWN`` at most: its new counts say the rest), the new counts of the
    fan-outs they touch, the run's summary. Never the whole DAG.

    An event that names no node (a transition of the run, a retry, a cancel, a rollback) may come
    with node rows changed in the same commit that no event names: a retry resets the failed and
    skipped nodes to pending, a cancel marks the waiting and running ones cancelled. With one, the
    change holds the run's step rows and every fan-out's counts, as the run page first reads them
    (``full``): the page kept showing the old states until it was reloaded."""
    page = store.events(run_id, after_seq=after, limit=limit)
    if not page:
        return after, None
    if any(e.node_id is None for e in page):
        rows, counts = _every_step(store, run_id)
        return page[-1].seq, {
            "events": [_event_json(e) for e in page],
            "nodes": [_row(r) for r in rows],
            "counts": counts,
            "agents": _agent_counts(store, run_id, None),
            "run": summary(store, run_id),
            "full": True,
        }
    keys = sorted({(e.node_id, -1 if e.fan_index is None else e.fan_index) for e in page if e.node_id}
                  | {(e.node_id, i) for e in page if e.kind == "items_completed" and e.node_id
                     for i in item_indexes(e.data)[:ITEMS_SHOWN]})
    per_step: dict[str, int] = {}
    wanted = []
    for node_id, index in keys:  # a fan-out's items: its counts say it all; a few rows for its list
        if index >= 0:
            per_step[node_id] = per_step.get(node_id, 0) + 1
            if per_step[node_id] > ITEMS_SHOWN:
                continue
        wanted.append((node_id, index))
    rows = store.node_rows(run_id, wanted)
    fanned = {e.node_id for e in page
              if e.node_id and ((e.fan_index is not None and e.fan_index >= 0)
                                or e.kind in ("fanout_expanded", "items_completed"))}
    return page[-1].seq, {
        "events": [_event_json(e) for e in page],
        "nodes": [_row(r) for r in rows],
        "counts": fan_counts(store, run_id, fanned),
        "agents": _agent_counts(store, run_id, {e.node_id.partition(AGENT_SEP)[0] for e in page
                                                if e.node_id and AGENT_SEP in e.node_id}),
        "run": summary(store, run_id),
    }


def gone(run_id: str, row: dict[str, Any] | None, born: float) -> dict[str, str] | None:
    """Why a live stream's run is no longer the run its page drew (``row``: its summary now, ``born``:
    its ``created_at`` when the stream started), or None. Deleted (pruned): the page showed it live
    forever. Another run under the same id: its event seqs restart at 1, so the old cursor waited
    past events it never sent, and the page kept the old run's states."""
    if not row:
        return {"run_id": run_id, "reason": "deleted", "message": f"run {run_id!r} was deleted"}
    if row.get("created_at") != born:
        return {"run_id": run_id, "reason": "replaced",
                "message": f"run {run_id!r} is another run now (created under the same id)"}
    return None


__all__ = ["ITEMS_SHOWN", "PREVIEW_BYTES", "REQUEST_BYTES", "NodeNotFoundError", "approval_form", "events_page",
           "fan_items", "gone", "inbox", "live_change", "node_output", "node_page", "parse_node", "run_list",
           "run_page", "shown", "steps_of", "summaries", "summary"]
