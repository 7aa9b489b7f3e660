"""A run's DAG as text: layered by topological generation for the terminal (``status --dag``,
``--watch``), and as Mermaid, Graphviz DOT or SVG coloured by state (``status --format``), and as
HTML for a notebook (``_repr_html_``).

The graph is the workflow's (``dashboard.graph``: nodes, edges, kinds); the states come from the
run's rows through the dashboard's reads (per-step rows, fan-out counts, agent turns). Every
state has a colour and a symbol, as on the dashboard.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

from raysaga.node_key import NodeKey, NodeKind
from raysaga.orchestrator import dag_svg
from raysaga.orchestrator.dag_svg import StepView, fan_state, generations, layered_lines, svg, workflow_graph
from raysaga.orchestrator.dashboard.views import ITEMS_SHOWN, fan_counts, steps_of
from raysaga.orchestrator.render import dot_string, mermaid_ids, mermaid_label
from raysaga.orchestrator.undriven import INTERRUPTED, NoDriver, of_run, shown_state
from raysaga.state import RunRecord, Store
from raysaga.state.dashboard_reads import DashboardReads

#: A fan-out's states from its items that say more than its completed row: items still at work.
IN_FLIGHT = frozenset({"running", "waiting"})
#: dag_svg's symbols, colours and terminal styles (``interrupted`` among them: a step in flight in a
#: run no driver drives, ``undriven``).
SYMBOL, COLOURS, STYLES = dag_svg.SYMBOL, dag_svg.COLOURS, dag_svg.STYLES


def step_views(store: Store, run_id: str, graph: dict[str, Any], *, running: bool = False,
               no_driver: NoDriver | None = None, status: str | None = None) -> list[StepView]:
    """The graph's steps in topological order, each with its state from the run's rows. In a
    ``running`` run a step with no row whose inputs are all complete is in flight (the engine
    writes most rows when a step ends), so it shows as running; in one that no driver drives
    (``no_driver``) what would show running shows as ``NoDriver.in_flight`` (``interrupted``), as
    in one at rest (``status``: ``undriven.shown_state``)."""
    rows = store.step_rows(run_id, ITEMS_SHOWN)
    fanned = {r["node_id"] for r in rows if r["fan_index"] >= 0 and "@" not in r["node_id"]}
    steps = steps_of(rows, fan_counts(store, run_id, fanned | set(store.fanout_sizes(run_id))))
    out = []
    for node in graph["nodes"]:
        st = steps.get(node["id"], {})
        row = st.get("row")
        counts = st.get("counts") or {}
        view = StepView(step=node["id"], kind="map" if node.get("map_over") else node.get("kind", "step"),
                        counts=counts, turns=st.get("turns", 0), effect=bool(node.get("effect")),
                        compensation=st.get("compensation"), deps=list(node.get("deps", [])))
        if row is not None:
            view.state, view.attempts, view.duration = row["status"], row["attempt"], row["duration"]
            # its own row wins; only items still in flight (a retried item, say) say more: a
            # best-effort fan-out that completed with failed items is completed, they are counted
            if counts and row["status"] == "completed" and fan_state(counts) in IN_FLIGHT:
                view.state = fan_state(counts)
        elif counts or node.get("map_over"):
            view.state = fan_state(counts)
        if view.turns:
            view.tokens = _agent_tokens(store, run_id, node["id"])
        out.append(view)
    if running:
        flying = in_flight({v.step: v.deps for v in out}, {v.step: v.state for v in out})
        for v in out:
            if v.step in flying:
                v.state = "running"
    for v in out:
        v.state = shown_state(v.state, no_driver, status)
    return out


def in_flight(deps: Mapping[str, Iterable[str]], state: Mapping[str, str]) -> set[str]:
    """The steps of a running run in flight without a row yet: ``pending`` (no row), every input
    ``completed``. The engine writes a step's row when it ends, a running row only when the driver
    has a quiet moment (the inline executor none while a step runs): every view of a running run
    (``status``, ``--json``, ``--dag``, the notebook view) says these are running."""
    return {s for s, d in deps.items() if state.get(s, "pending") == "pending"
            and all(state.get(x) == "completed" for x in d)}


def running_without_rows(store: Store, run: RunRecord, wf: Any) -> set[str]:
    """``in_flight`` for the views that list rows (``status``, ``status --json``): the steps of
    ``wf`` that a running run has in flight with no row yet; empty unless the run is running."""
    if run.status.value != "running" or wf is None:
        return set()
    return {v.step for v in step_views(store, run.run_id, workflow_graph(wf), running=True)
            if v.state == "running" and v.attempts == 0 and not v.counts}


def _agent_tokens(store: Store, run_id: str, step: str) -> int:
    """The tokens the model turns of agent ``step`` used: every turn, of every item of a mapped
    agent (one aggregate query, ``DashboardReads.agent_tokens``). Through ``sub_rows`` this read
    400 rows at most, of item -1 only: a long agent showed too few tokens, a mapped one none."""
    if isinstance(store, DashboardReads):  # the store's one implementation (SqlStore)
        return store.agent_tokens(run_id, step)
    total = 0  # another Store: what its rows of the agent node show
    for row in store.sub_rows(run_id, step, -1):
        usage = row["output"].get("usage") if isinstance(row.get("output"), dict) else None
        if isinstance(usage, dict) and NodeKey.parse(row["node_id"]).kind is NodeKind.TURN:  # not a tool's
            total += sum(int(v) for k, v in usage.items() if k in ("input_tokens", "output_tokens") and
                         isinstance(v, int))
    return total


def mermaid(graph: dict[str, Any], views: list[StepView]) -> str:
    """A Mermaid flowchart with each step's state (symbol in the label, a class per state)."""
    order = [n["id"] for n in graph["nodes"]]
    ids = mermaid_ids(order)
    by_id = {v.step: v for v in views}
    lines = ["flowchart TD"]
    for step in order:
        v = by_id[step]
        shape = ("[[", "]]") if v.kind == "map" else ("[", "]")
        label = f"{step} {SYMBOL.get(v.state, '?')} {v.state}" + (f" · {v.detail()}" if v.detail() else "")
        lines.append(f"    {ids[step]}{shape[0]}{mermaid_label(label)}{shape[1]}")
    for a, b in graph["edges"]:
        lines.append(f"    {ids[a]} --> {ids[b]}")
    for state, (fill, stroke) in COLOURS.items():
        lines.append(f"    classDef {state} fill:{fill},stroke:{stroke},color:#1f2328")
    for step in order:
        lines.append(f"    class {ids[step]} {by_id[step].state}")
    return "\n".join(lines) + "\n"


def dot(graph: dict[str, Any], views: list[StepView], name: str = "run") -> str:
    """A Graphviz digraph, each step filled by its state."""
    by_id = {v.step: v for v in views}
    lines = [f"digraph {dot_string(name)} {{", "    rankdir=TB;", '    node [shape=box, style="rounded,filled"];']
    for node in graph["nodes"]:
        v = by_id[node["id"]]
        fill, stroke = COLOURS.get(v.state, COLOURS["pending"])
        label = f"{v.step}\n{SYMBOL.get(v.state, '?')} {v.state}" + (f"\n{v.detail()}" if v.detail() else "")
        shape = ", peripheries=2" if v.kind == "map" else ""
        lines.append(f'    {dot_string(v.step)} [label={dot_string(label)}, fillcolor="{fill}", '
                     f'color="{stroke}"{shape}];')
    for a, b in graph["edges"]:
        lines.append(f"    {dot_string(a)} -> {dot_string(b)};")
    lines.append("}")
    return "\n".join(lines) + "\n"


def run_graph(store: Store, run: RunRecord, ref: str | None = None) -> dict[str, Any]:
    """The run's graph: of ``ref`` (an operator's MODULE:WF) when given, else of the workflow its
    row records (imported as ``resume`` does), else its steps from its rows without edges."""
    from raysaga.orchestrator.dashboard.graph import graph_for
    from raysaga.orchestrator.dashboard.views import started_order

    if ref is not None:
        from raysaga.orchestrator.loader import load_workflow

        return {"source": "workflow", **workflow_graph(load_workflow(ref))}
    return graph_for(run, started_order(store.step_rows(run.run_id, 1)))


class RunView:
    """A run in a notebook: ``RunView(run_id, db=URL)`` displays its DAG with each step's state as
    it stands when shown (``_repr_html_``, an SVG); ``watch()`` redraws it in place until the run
    rests. Reads only; the graph is the run's recorded workflow's (imported as ``resume`` does)."""

    def __init__(self, run_id: str, db: str | Store | None = None, *, workflow: str | None = None) -> None:
        from raysaga.state import open_store

        self.run_id = run_id
        self.workflow = workflow
        self._store = db if isinstance(db, Store) else open_store(db, create=False)

    def run(self) -> RunRecord:
        return self._store.get_run(self.run_id, lenient=True)

    def _repr_html_(self) -> str:
        run = self.run()
        graph = run_graph(self._store, run, self.workflow)
        none = of_run(self._store, run)
        title = f"{run.run_id} ({run.workflow_name} v{run.workflow_version}): " + \
            (none.headline() if none else run.status.value)
        return svg(graph, step_views(self._store, run.run_id, graph, running=run.status.value == "running",
                                     no_driver=none, status=run.status.value), title)

    def _repr_svg_(self) -> str:
        return self._repr_html_()

    def watch(self, interval: float = 1.0, timeout: float | None = None) -> RunRecord:
        """Redraw in the notebook's output every ``interval`` seconds until the run rests (or
        ``timeout``); returns the run as it stands then."""
        import time

        from IPython.display import HTML, display  # type: ignore[import-not-found,unused-ignore]

        handle = display(HTML(self._repr_html_()), display_id=True)
        deadline = None if timeout is None else time.monotonic() + timeout
        while True:
            run = self.run()
            handle.update(HTML(self._repr_html_()))
            if run.status.value in _RESTING or (deadline is not None and time.monotonic() > deadline):
                return run
            time.sleep(interval)  # a redraw period


_RESTING = frozenset({"completed", "failed", "compensated", "compensation_failed", "cancelled", "paused",
                      "waiting_human", "waiting_timer"})


__all__ = ["COLOURS", "INTERRUPTED", "STYLES", "SYMBOL", "RunView", "StepView", "dot", "fan_state", "generations",
           "in_flight", "layered_lines", "mermaid", "run_graph", "running_without_rows", "step_views", "svg"]
