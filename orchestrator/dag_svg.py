"""Drawing a DAG with states, with no store, no workflow import and no I/O: each step's view
(``StepView``), its generations, the terminal's layered lines and a standalone SVG. Used by
``status --dag`` and ``--format svg`` (through ``run_views``), and by a workflow's or a run's
``_repr_html_`` in a notebook. Every state has a colour and a symbol, as on the dashboard.
"""

from __future__ import annotations

import html
from dataclasses import dataclass, field
from typing import Any

import networkx as nx

from raysaga.orchestrator.fan_states import fan_state

SYMBOL = {"completed": "✓", "running": "●", "retrying": "↻", "failed": "✗", "pending": "○", "skipped": "⊘",
          "cancelled": "⊗", "waiting": "◷", "interrupted": "◌"}  # interrupted: in flight, no driver (undriven)
#: (fill, stroke) per node state: light fills, strong strokes (GitHub's palette, as the dashboard).
COLOURS = {"completed": ("#f0fff4", "#1a7f37"), "running": ("#ddf4ff", "#0969da"), "retrying": ("#fff8c5", "#9a6700"),
           "failed": ("#ffebe9", "#cf222e"), "pending": ("#ffffff", "#6e7781"), "skipped": ("#f6f8fa", "#6e7781"),
           "cancelled": ("#fff8c5", "#7d4e00"), "waiting": ("#fbefff", "#8250df"),
           "interrupted": ("#fff1e5", "#bc4c00")}
#: rich styles for the terminal.
STYLES = {"completed": "green", "running": "cyan", "retrying": "yellow", "failed": "red", "pending": "dim",
          "skipped": "dim", "cancelled": "yellow", "waiting": "magenta", "interrupted": "dark_orange"}


@dataclass
class StepView:
    """One workflow step as a run has it."""

    step: str
    kind: str = "step"
    state: str = "pending"
    attempts: int = 0
    duration: float | None = None
    counts: dict[str, int] = field(default_factory=dict)
    turns: int = 0
    tokens: int = 0
    effect: bool = False
    compensation: str | None = None
    deps: list[str] = field(default_factory=list)

    def detail(self) -> str:
        parts = []
        if self.counts:
            total = sum(self.counts.values())
            shown = " ".join(f"{SYMBOL.get(k, '?')}{n}" for k, n in sorted(self.counts.items()))
            parts.append(f"{total} items {shown}")
        elif self.attempts:
            parts.append(f"{self.attempts} attempt{'s' if self.attempts != 1 else ''}")
        if self.duration is not None:
            parts.append(_secs(self.duration))
        if self.turns:  # a retried round asks its items' turns again, over their rows: the last round's
            parts.append(f"{self.turns} turns, {self.tokens} tokens" + (" (last round's)" if self.counts
                                                                         and self.attempts > 1 else ""))
        if self.effect:
            parts.append("effect")
        if self.compensation:
            parts.append(f"undo {self.compensation}")
        if self.kind not in ("step", "map"):
            parts.append(self.kind)
        return ", ".join(parts)


def _secs(value: float) -> str:
    return f"{value * 1000:.0f}ms" if value < 1 else f"{value:.1f}s" if value < 120 else f"{value / 60:.1f}m"


def generations(graph: dict[str, Any]) -> list[list[str]]:
    """The graph's steps by topological generation (a step after every step it depends on)."""
    g = nx.DiGraph()
    g.add_nodes_from(n["id"] for n in graph["nodes"])
    g.add_edges_from((a, b) for a, b in graph["edges"])
    return [sorted(gen) for gen in nx.topological_generations(g)]


def layered_lines(graph: dict[str, Any], views: list[StepView]) -> list[tuple[str, str, str]]:
    """(indent + symbol + name, style, detail) per step, generation by generation."""
    by_id = {v.step: v for v in views}
    lines = []
    for level, gen in enumerate(generations(graph)):
        for i, step in enumerate(gen):
            v = by_id[step]
            head = f"{level:>2} " if i == 0 else "   "
            after = f"  ← {', '.join(v.deps)}" if v.deps else ""
            lines.append((f"{head}{SYMBOL.get(v.state, '?')} {step}", STYLES.get(v.state, ""),
                          f"{v.state}{', ' + v.detail() if v.detail() else ''}{after}"))
    return lines


def svg(graph: dict[str, Any], views: list[StepView], title: str = "", *, states: bool = True) -> str:
    """A standalone SVG: steps laid out by generation (one row each), edges as lines, each step a
    box in its state's colours with its symbol (no Graphviz needed)."""
    by_id = {v.step: v for v in views}
    gens = generations(graph)
    w, h, gap_x, gap_y, pad = 230, 52, 24, 40, 16
    width = max(max((len(g) for g in gens), default=1) * (w + gap_x) - gap_x + 2 * pad, len(title) * 7.5 + 2 * pad)
    top = pad + (22 if title else 0)
    height = top + len(gens) * (h + gap_y) - gap_y + pad
    where: dict[str, tuple[float, float]] = {}
    for row, gen in enumerate(gens):
        offset = (width - (len(gen) * (w + gap_x) - gap_x)) / 2
        for col, step in enumerate(gen):
            where[step] = (offset + col * (w + gap_x), top + row * (h + gap_y))
    out = [f'<svg xmlns="http://www.w3.org/2000/svg" width="{width:.0f}" height="{height:.0f}" '
           f'viewBox="0 0 {width:.0f} {height:.0f}" font-family="DejaVu Sans, Arial, sans-serif" font-size="12">',
           '<defs><marker id="a" viewBox="0 0 10 10" refX="9" refY="5" markerWidth="7" markerHeight="7" '
           'orient="auto"><path d="M0 0L10 5L0 10z" fill="#8c959f"/></marker></defs>']
    if title:
        out.append(f'<text x="{pad}" y="{pad + 8}" font-weight="bold">{html.escape(title)}</text>')
    for a, b in graph["edges"]:
        (ax, ay), (bx, by) = where[a], where[b]
        out.append(f'<line x1="{ax + w / 2:.1f}" y1="{ay + h:.1f}" x2="{bx + w / 2:.1f}" y2="{by:.1f}" '
                   'stroke="#8c959f" stroke-width="1.4" marker-end="url(#a)"/>')
    for step, (x, y) in where.items():
        v = by_id[step]
        fill, stroke = COLOURS.get(v.state, COLOURS["pending"])
        dash = ' stroke-dasharray="4 3"' if v.state == "pending" else ""
        if v.kind == "map":
            out.append(f'<rect x="{x + 4:.1f}" y="{y + 4:.1f}" width="{w}" height="{h}" rx="6" fill="{fill}" '
                       f'stroke="{stroke}"/>')
        out.append(f'<g data-node="{html.escape(step)}" data-state="{html.escape(v.state)}">'
                   f'<rect x="{x:.1f}" y="{y:.1f}" width="{w}" height="{h}" rx="6" fill="{fill}" stroke="{stroke}" '
                   f'stroke-width="2"{dash}/>'
                   f'<text x="{x + 8:.1f}" y="{y + 17:.1f}" font-weight="bold">{html.escape(step[:26])}</text>'
                   + (f'<text x="{x + 8:.1f}" y="{y + 32:.1f}" fill="{stroke}">{SYMBOL.get(v.state, "?")} '
                      f'{html.escape(v.state)}</text>' if states else "") +
                   f'<text x="{x + 8:.1f}" y="{y + 46:.1f}" fill="#656d76" font-size="10">'
                   f'{html.escape(v.detail()[:40])}</text><title>{html.escape(step)}</title></g>')
    out.append("</svg>")
    return "\n".join(out) + "\n"


def workflow_graph(wf: Any) -> dict[str, Any]:
    """A ``Workflow``'s nodes and edges (typed ``Any``: the DSL imports this module, not the reverse)."""
    return {"nodes": [{"id": s, "kind": wf.steps[s].kind, "map_over": wf.steps[s].map_over,
                       "effect": wf.steps[s].effect, "deps": list(wf.steps[s].deps)} for s in wf.order],
            "edges": [list(e) for e in sorted(wf.graph.edges)]}


def workflow_html(wf: Any) -> str:
    """A workflow's DAG for a notebook: its steps by generation, kinds and effects, no states."""
    graph = workflow_graph(wf)
    views = [StepView(step=n["id"], kind="map" if n["map_over"] else n["kind"], effect=n["effect"],
                      deps=n["deps"]) for n in graph["nodes"]]
    return svg(graph, views, f"{wf.name} v{wf.version}", states=False)


__all__ = ["COLOURS", "STYLES", "SYMBOL", "StepView", "fan_state", "generations", "layered_lines", "svg",
           "workflow_graph", "workflow_html"]
