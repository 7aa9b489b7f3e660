"""The DAG a run page draws: the steps and edges of the run's workflow, with what kind each is.

The workflow comes from the ``workflow_ref`` the run records, imported the way ``resume`` does
(``loader.load_recorded_workflow``: a module name from the operator's own environment, never a
file path), once per (ref, definition hash) per process, and a failed import too (its note is
kept: importing again would run the module's top level, its side effects, on every read). When it
cannot be imported here (the dashboard runs where the workflow's code is not installed), the graph
is built from the run's node rows: every step that has a row, without edges, and the page says why.
A run whose definition is not the one imported here is drawn from that import plus the steps of
its rows the import lacks, and the note says so (that the import is older only when it is known).

The workflows the dashboard was started with (``raysaga dashboard --workflow MODULE:WF``, repeatable;
a file path such as ``flows/order.py:wf`` too) come first: a run of one of them (by name) at its
definition hash is drawn from it, whatever its recorded module; one of another definition is drawn
from it when its recorded module cannot be imported here. A run started from another folder
records a module only that folder imports: the note said "pass --workflow", which the dashboard
did not take.
"""

from __future__ import annotations

import os
import sys
import threading
import time
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any, TypeAlias

from raysaga.errors import RaySagaError
from raysaga.node_key import NodeKey
from raysaga.state import RunRecord
from raysaga.state.redact import scrub_text

if TYPE_CHECKING:
    from raysaga.orchestrator.workflow import Workflow

#: The workflows a dashboard was given to draw runs' DAGs from (``--workflow``), or None.
Given: TypeAlias = "Sequence[Workflow] | None"

_cache: dict[tuple[str, str], dict[str, Any]] = {}
#: The note of a (ref, definition hash) whose import failed: not imported again by this process.
_failed: dict[tuple[str, str], str] = {}
#: When this process first drew a graph from each module (``import_module`` keeps that import).
_imported: dict[str, float] = {}
_lock = threading.Lock()


def base_step(node_id: str) -> str:
    """The workflow step a stored node id belongs to (``research@2.1`` -> ``research``)."""
    return NodeKey.parse(node_id).step


def workflow_graph(ref: str, run_id: str) -> dict[str, Any]:
    """Nodes and edges of a recorded workflow (``WorkflowLoadError`` when it cannot be imported)."""
    from raysaga.orchestrator.loader import load_recorded_workflow

    return graph_of(load_recorded_workflow(ref, run_id))


def graph_of(wf: Workflow) -> dict[str, Any]:
    """A workflow's nodes and edges, as the run page draws them."""
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


def graph_for(run: RunRecord, step_ids: list[str], given: Given = None) -> dict[str, Any]:
    """The run's DAG: of a ``given`` workflow of its name and definition, else of its workflow when
    it can be imported here, else of a ``given`` workflow of its name (another definition), else
    the steps it has rows for."""
    named = [wf for wf in given or () if wf.name == run.workflow_name]
    for wf in named:
        if wf.definition_hash == run.definition_hash:
            return graph_of(wf)
    ref = run.workflow_ref
    note: str | None = None
    if ref:
        key = (ref, run.definition_hash)
        with _lock:
            cached, note = _cache.get(key), _failed.get(key)
        if cached is None and note is None:
            try:
                cached = workflow_graph(ref, run.run_id)
            except (RaySagaError, ImportError, SyntaxError, AttributeError) as exc:
                module = ref.partition(":")[0]
                why = str(exc).split(": pass --workflow ")[0]  # (the loader's advice is the CLI's: said below)
                note = scrub_text(f"the workflow {ref!r} cannot be imported here ({why}); steps are drawn from the "
                                  f"run's rows, without edges: start the dashboard with --workflow {ref} (repeatable; "
                                  "a file path such as flows/order.py:wf too), or where module "
                                  f"{module} imports (the folder the run was started from, or with that folder "
                                  "on PYTHONPATH)")
            with _lock:  # a failure too: importing again ran the module's top level (its side effects) per read
                if cached is None:
                    _failed[key] = note or ""
                else:
                    _cache[key] = cached
                    _imported.setdefault(ref.partition(":")[0], time.time())
        if cached is not None:
            graph = dict(cached)
            if graph["definition_hash"] != run.definition_hash:
                return _other_definition(graph, run, step_ids)
            return graph
    else:
        note = ("the run does not record its workflow's module (`raysaga run MODULE:WF` records it; "
                "raysaga.run(..., workflow_ref=...) too): steps are drawn from its rows, in the order they "
                "started, without edges; `raysaga dashboard --workflow MODULE:WF` draws its DAG")
    if named:
        wf = named[0]
        graph, missing = _plus_rows(graph_of(wf), step_ids)
        extra = f" (steps {', '.join(missing)} are drawn from the run's rows, without edges)" if missing else ""
        graph["note"] = (f"drawn from the workflow {wf.name} v{wf.version} this dashboard was given (--workflow), "
                         f"whose definition differs from the one the run started with{extra}")
        return graph
    steps = list(dict.fromkeys(base_step(s) for s in step_ids))
    return {"source": "rows", "definition_hash": None, "note": note, "edges": [],
            "nodes": [_row_node(s) for s in steps]}


def _row_node(step: str) -> dict[str, Any]:
    """A step known only from the run's rows: no kind, no edges."""
    return {"id": step, "kind": "step", "map_over": None, "effect": False, "critical": True, "compensated": False,
            "deps": []}


def _other_definition(graph: dict[str, Any], run: RunRecord, step_ids: list[str]) -> dict[str, Any]:
    """The graph of a run whose definition is not the one imported here: the imported one with the
    run's row steps it lacks added (without edges), and a note. "An older import" (restart the
    dashboard) only when it is known to be: the module's file changed after this process imported
    it, and the run was created after that change. Otherwise the note says only that they differ:
    a worker not yet upgraded starts runs of older code than the dashboard's (a rolling deploy),
    and a run older than a change is no sign of this import's age."""
    ref = str(run.workflow_ref)
    module = ref.partition(":")[0]
    with _lock:
        loaded_at = _imported.get(module, 0.0)
    graph, missing = _plus_rows(graph, step_ids)
    changed = _written_at(module)
    if changed is not None and loaded_at < changed < run.created_at:
        extra = f" (steps {', '.join(missing)} are drawn from the run's rows, without edges)" if missing else ""
        graph["note"] = (f"this dashboard holds an older import of {module} than the definition this run started "
                         f"with{extra}: restart it to draw the new steps' edges")
    else:
        graph["note"] = (f"the run's definition differs from the code this dashboard imported ({module}): steps it "
                         "does not know are drawn without edges")
    return graph


def _plus_rows(graph: dict[str, Any], step_ids: list[str]) -> tuple[dict[str, Any], list[str]]:
    """``graph`` with the steps of the run's rows it lacks (without edges), and those steps."""
    known = {n["id"] for n in graph["nodes"]}
    missing = [s for s in dict.fromkeys(base_step(s) for s in step_ids) if s not in known]
    return {**graph, "nodes": [*graph["nodes"], *(_row_node(s) for s in missing)]}, missing


def _written_at(module: str) -> float | None:
    """When ``module``'s source file was last written (None: not imported, no file)."""
    found = sys.modules.get(module)
    path = getattr(found, "__file__", None)
    try:
        return os.stat(str(path)).st_mtime if path else None
    except OSError:
        return None


__all__ = ["Given", "base_step", "graph_for", "graph_of", "workflow_graph"]
