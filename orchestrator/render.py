"""Text views of a DAG and of a run: mermaid, dot, and the JSON that ``status --json`` prints."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from raysaga.state import NodeRecord, RunRecord, Store
from raysaga.state.redact import scrub, scrub_data

if TYPE_CHECKING:
    from raysaga.orchestrator.workflow import Workflow


def _node_text(wf: Workflow, step: str) -> str:
    spec = wf.steps[step]
    tags = []
    if spec.map_over:
        tags.append(f"map over {spec.map_over}")
    if spec.effect:
        tags.append("effect")
    if not spec.critical:
        tags.append("non-critical")
    if wf.compensation_for(step):
        tags.append("compensated")
    return step + (f" ({', '.join(tags)})" if tags else "")


#: Characters a Mermaid label cannot hold as they are, as its entity codes.
_MERMAID_ESCAPES = str.maketrans({"#": "#35;", '"': "#quot;", "<": "#lt;", ">": "#gt;", "`": "#96;",
                                  "\n": " ", "\r": " "})


def mermaid_label(text: str) -> str:
    return '"' + text.translate(_MERMAID_ESCAPES) + '"'


def dot_string(text: str) -> str:
    """A DOT quoted string: backslash and double quote escaped, line breaks as ``\\n``."""
    escaped = text.replace("\\", "\\\\").replace('"', '\\"').replace("\r\n", "\\n").replace("\n", "\\n")
    return '"' + escaped.replace("\r", "\\n") + '"'


_MERMAID_KEYWORDS = frozenset({"end", "graph", "subgraph", "flowchart", "class", "classdef", "click", "style",
                               "linkstyle", "direction", "call", "href", "default", "interpolate"})


#: Names of JavaScript's Object.prototype: Mermaid keeps nodes in plain objects, so a node id
#: spelled like one of these is dropped (Mermaid 10): they get generated ids too.
_JS_PROTOTYPE = frozenset({"constructor", "toString", "toLocaleString", "valueOf", "hasOwnProperty",
                           "isPrototypeOf", "propertyIsEnumerable", "__proto__", "__defineGetter__",
                           "__defineSetter__", "__lookupGetter__", "__lookupSetter__"})


def mermaid_ids(steps: list[str]) -> dict[str, str]:
    """A step's own name as its id when Mermaid takes it as is; else a generated ``n<i>``."""
    plain = {s for s in steps if s.isidentifier() and s.isascii() and s.lower() not in _MERMAID_KEYWORDS
             and s not in _JS_PROTOTYPE}
    ids: dict[str, str] = {}
    for i, step in enumerate(steps):
        if step in plain:
            ids[step] = step
            continue
        candidate = f"n{i}"
        while candidate in plain or candidate in ids.values():
            candidate = "_" + candidate
        ids[step] = candidate
    return ids


def mermaid(wf: Workflow, statuses: dict[str, str] | None = None) -> str:
    """A Mermaid flowchart. A name that is not a plain identifier, or is a Mermaid keyword
    (``end``, ``class``...), gets a generated id (``n0``...); labels are quoted and escaped."""
    ids = mermaid_ids(wf.order)
    lines = ["flowchart TD"]
    for step in wf.order:
        shape = ("[[", "]]") if wf.steps[step].map_over else ("[", "]")
        lines.append(f"    {ids[step]}{shape[0]}{mermaid_label(_node_text(wf, step))}{shape[1]}")
    for src, dst in sorted(wf.graph.edges):
        lines.append(f"    {ids[src]} --> {ids[dst]}")
    for step, status in sorted((statuses or {}).items()):
        css = "".join(c for c in str(status) if c.isalnum() or c in "_-")
        if step in ids and css:
            lines.append(f"    class {ids[step]} {css}")
    return "\n".join(lines) + "\n"


def dot(wf: Workflow) -> str:
    """A Graphviz digraph; every id and label is a quoted, escaped DOT string."""
    lines = [f"digraph {dot_string(wf.name)} {{", "    rankdir=TB;"]
    for step in wf.order:
        spec = wf.steps[step]
        shape = "box3d" if spec.map_over else ("doubleoctagon" if spec.effect else "box")
        lines.append(f"    {dot_string(step)} [label={dot_string(_node_text(wf, step))}, shape={shape}];")
    for src, dst in sorted(wf.graph.edges):
        lines.append(f"    {dot_string(src)} -> {dot_string(dst)};")
    lines.append("}")
    return "\n".join(lines) + "\n"


def node_json(node: NodeRecord) -> dict[str, Any]:
    return {
        "node": node.label,
        "step": node.node_id,
        "index": node.fan_index if node.fan_index >= 0 else None,
        "status": node.status.value,
        "attempts": node.attempt,
        "started_at": node.started_at,
        "finished_at": node.finished_at,
        "duration": node.duration,
        "not_before": node.not_before,
        "error": None if node.error is None else scrub(node.error.as_dict()),
        "output_digest": node.output_digest,
    }


def status_json(store: Store, run: RunRecord) -> dict[str, Any]:
    nodes = store.nodes(run.run_id)
    effects = store.effects(run.run_id)
    counts: dict[str, int] = {}
    for node in nodes:
        counts[node.status.value] = counts.get(node.status.value, 0) + 1
    return {
        "schema_version": 1,  # as `raysaga status --json` (orchestrator/cli_status.py) writes it
        "run_id": run.run_id,
        "workflow": run.workflow_name,
        "version": run.workflow_version,
        "status": run.status.value,
        "reason": scrub(run.status_reason),
        "trace_id": run.trace_id,
        "created_at": run.created_at,
        "updated_at": run.updated_at,
        "lease_owner": run.lease_owner,
        "lease_expires_at": run.lease_expires_at,
        "retries_used": run.retries_used,
        "retry_budget": run.retry_budget,
        "tokens_used": run.tokens_used,
        "cost_used": run.cost_used,
        "input": scrub_data(run.input),  # shown as on the dashboard: secrets a step returned stay in the store
        "output": scrub_data(run.output),
        "error": None if run.error is None else scrub(run.error.as_dict()),
        "node_counts": counts,
        "nodes": [node_json(n) for n in nodes],
        "effects": [{"key": e.idempotency_key, "node": e.node_id if e.fan_index < 0 else f"{e.node_id}[{e.fan_index}]",
                     "effect": e.effect_name, "status": e.status.value} for e in effects],
    }
