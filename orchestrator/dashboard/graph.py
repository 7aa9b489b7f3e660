"""The DAG a run page draws: the steps and edges of the run's workflow, with what kind each is.

The workflow comes from the ``workflow_ref`` the run records, imported the way ``resume`` does
(``loader.load_recorded_workflow``: a module name from the operator's own environment, never a
file path), once per (ref, definition hash) per process. When it cannot be imported here (the
dashboard runs where the workflow's code is not installed), the graph is built from the run's
node rows: every step that has a row, without edges, and the page says why.
"""

from __future__ import annotations

import threading
from typing import Any

from raysaga.errors import RaySagaError
from raysaga.node_key import NodeKey
from raysaga.state import RunRecord
from raysaga.state.redact import scrub_text

_cache: dict[tuple[str, str], dict[str, Any]] = {}
_lock = threading.Lock()


def base_step(node_id: str) -> str:
    """The workflow step a stored node id belongs to (``research@2.1`` -> ``research``)."""
    return NodeKey.parse(node_id).step


def workflow_graph(ref: str, run_id: str) -> dict[str, Any]:
    """Nodes and edges of a recorded workflow (``WorkflowLoadError`` when it cannot be imported)."""
    from raysaga.orchestrator.loader import load_recorded_workflow

    wf = load_recorded_workflow(ref, run_id)
    out_nodes = []
    for step in wf.order:
        spec = wf.steps[step]
        out_nodes.append({
            "id": step, "kind": spec.kind, "map_over": spec.map_over, "effect": spec.effect,
            "critical": spec.critical, "compensated": wf.compensation_for(step) is not None,
            "deps": list(spec.deps),
        })
    edges = [[src, dst] for src, dst in sorted(wf.graph.edges)]
    return {"source": "workflow", "definition_hash": wf.definition_hash, "nodes": out_nodes, "edges": edges}


def graph_for(run: RunRecord, step_ids: list[str]) -> dict[str, Any]:
    """The run's DAG: its workflow's when it can be imported here, else the steps it has rows for."""
    ref = run.workflow_ref
    note: str | None = None
    if ref:
        key = (ref, run.definition_hash)
        with _lock:
            cached = _cache.get(key)
        if cached is None:
            try:
                cached = workflow_graph(ref, run.run_id)
            except (RaySagaError, ImportError, SyntaxError, AttributeError) as exc:
                note = scrub_text(f"the workflow {ref!r} cannot be imported here ({exc}); steps are drawn from the "
                                  "run's rows, without edges")
            else:
                with _lock:
                    _cache[key] = cached
        if cached is not None:
            graph = dict(cached)
            if graph["definition_hash"] != run.definition_hash:
                graph["note"] = ("the workflow's definition changed since this run started: the graph is "
                                 "today's code")
            return graph
    else:
        note = ("the run does not record its workflow's module (`raysaga run MODULE:WF` records it; "
                "raysaga.run(..., workflow_ref=...) too): steps are drawn from its rows, in the order they "
                "started, without edges")
    steps = list(dict.fromkeys(base_step(s) for s in step_ids))
    return {"source": "rows", "definition_hash": None, "note": note, "edges": [],
            "nodes": [{"id": s, "kind": "step", "map_over": None, "effect": False, "critical": True,
                       "compensated": False, "deps": []} for s in steps]}


__all__ = ["base_step", "graph_for", "workflow_graph"]
