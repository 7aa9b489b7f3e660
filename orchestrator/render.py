"""Text views of a DAG and of a run: mermaid, dot, and the JSON that ``status --json`` prints."""

from __future__ import annotations

from typing import Any

from raysaga.orchestrator.workflow import Workflow
from raysaga.state import NodeRecord, RunRecord, Store


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


def mermaid(wf: Workflow, statuses: dict[str, str] | None = None) -> str:
    lines = ["flowchart TD"]
    for step in wf.order:
        shape = ("[[", "]]") if wf.steps[step].map_over else ("[", "]")
        lines.append(f'    {step}{shape[0]}"{_node_text(wf, step)}"{shape[1]}')
    for src, dst in sorted(wf.graph.edges):
        lines.append(f"    {src} --> {dst}")
    for step, status in sorted((statuses or {}).items()):
        lines.append(f"    class {step} {status}")
    return "\n".join(lines) + "\n"


def dot(wf: Workflow) -> str:
    lines = [f'digraph "{wf.name}" {{', "    rankdir=TB;"]
    for step in wf.order:
        spec = wf.steps[step]
        shape = "box3d" if spec.map_over else ("doubleoctagon" if spec.effect else "box")
        lines.append(f'    "{step}" [label="{_node_text(wf, step)}", shape={shape}];')
    for src, dst in sorted(wf.graph.edges):
        lines.append(f'    "{src}" -> "{dst}";')
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
        "error": node.error,
        "output_digest": node.output_digest,
    }


def status_json(store: Store, run: RunRecord) -> dict[str, Any]:
    nodes = store.nodes(run.run_id)
    effects = store.effects(run.run_id)
    counts: dict[str, int] = {}
    for node in nodes:
        counts[node.status.value] = counts.get(node.status.value, 0) + 1
    return {
        "run_id": run.run_id,
        "workflow": run.workflow_name,
        "version": run.workflow_version,
        "status": run.status.value,
        "reason": run.status_reason,
        "trace_id": run.trace_id,
        "created_at": run.created_at,
        "updated_at": run.updated_at,
        "lease_owner": run.lease_owner,
        "lease_expires_at": run.lease_expires_at,
        "retries_used": run.retries_used,
        "retry_budget": run.retry_budget,
        "tokens_used": run.tokens_used,
        "cost_used": run.cost_used,
        "input": run.input,
        "output": run.output,
        "error": run.error,
        "node_counts": counts,
        "nodes": [node_json(n) for n in nodes],
        "effects": [{"key": e.idempotency_key, "node": e.node_id if e.fan_index < 0 else f"{e.node_id}[{e.fan_index}]",
                     "effect": e.effect_name, "status": e.status.value} for e in effects],
    }
