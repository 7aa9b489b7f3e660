// The run's DAG: laid out by dagre (layered, top to bottom), drawn as SVG. A node shows its state
// by colour AND symbol; a fan-out is one stacked node with its items counted per state; agents show
// their turns; a compensated step its undo's state. Layout happens once per shape: a live change
// only rewrites the nodes it touches. Steps are looked up by name in Maps, and dagre (whose graph is
// plain objects) is given "n:" + name: a step named `constructor` or `__proto__` (valid names) read
// Object.prototype's member, and no DAG was drawn. A live change repaints the steps it touched and
// their dependents only, each found in a Map (a repaint of every node per message, each looking its
// node up with `find`, was O(n²) a message: a 10,000-step run's page fell 15 s behind). Above
// `DAGRE_MAX` steps dagre's layout alone takes seconds (about 1 s for 1,000 steps, 9 s for 10,000),
// so such a DAG is drawn as a grid by depth, without edges, and says so.
import dagre from "@dagrejs/dagre";
import { h, s, secs } from "./dom";
import { cls, fanState, symbol } from "./status";
import type { Graph, GraphNode, StepState } from "./types";

const W = 196;
const H = 62;

export interface DagView {
  svg: SVGSVGElement; update: (id: string) => void; ids: string[];
  /** Why the DAG is drawn as a grid, not as a graph (too many steps for dagre), or null. */
  note: string | null;
}

/** Most steps laid out by dagre: its layout took ~1 s for 1,000 steps, ~9 s for 10,000. */
export const DAGRE_MAX = 1000;
/** Steps per line of the grid a larger DAG is drawn as. */
const GRID_COLS = 12;

/** The graph's nodes by id: a lookup per node, never a `find` over all of them. */
export type Nodes = Map<string, GraphNode>;

export function nodesOf(graph: Graph): Nodes {
  return new Map(graph.nodes.map((n) => [n.id, n]));
}

/** Each step's dependents (the steps whose live state reads its state). */
export function dependentsOf(graph: Graph): Map<string, string[]> {
  const out = new Map<string, string[]>();
  for (const n of graph.nodes) for (const d of n.deps) {
    const list = out.get(d);
    if (list) list.push(n.id); else out.set(d, [n.id]);
  }
  return out;
}

/** A step's state by its name: a Map, never an object indexed by a name a user chose. */
export type Steps = Map<string, StepState>;

// dagre's key for a step: no step name holds ':' (so never one of dagre's own, `_root`, `_d1`...)
const key = (id: string): string => "n:" + id;

const IN_FLIGHT = new Set(["running", "waiting"]);

export function stepState(node: GraphNode | undefined, st: StepState | undefined): string {
  if (!st) return "pending";
  const counts = st.counts ?? {};
  // its own row wins; only items still in flight say more (a best-effort fan-out that completed
  // with failed items is completed: the items' counts show the failures)
  if (st.row && !(Object.keys(counts).length && st.row.status === "completed" && IN_FLIGHT.has(fanState(counts))))
    return st.row.status;
  if (Object.keys(counts).length || node?.map_over) return fanState(counts);
  return "pending";
}

function subline(node: GraphNode, st: StepState | undefined): string {
  const parts: string[] = [];
  const counts = st?.counts ?? {};
  const total = Object.values(counts).reduce((a, b) => a + b, 0);
  if (node.map_over || total) {
    // every state the counts hold, pending too (items a retry reset, or not started yet), as
    // `raysaga status --dag` and RunView count them: "30 items ✓27 ○3" adds up
    const order = ["completed", "running", "retrying", "waiting", "failed", "pending", "skipped", "cancelled"];
    const keys = [...order, ...Object.keys(counts).filter((k) => !order.includes(k)).sort()];
    const shown = keys.filter((k) => counts[k]).map((k) => `${symbol(k)}${counts[k]}`);
    parts.push(total ? `${total} items ${shown.join(" ")}` : "fan-out");
  } else if (st?.row) {
    if (st.row.attempt > 1) parts.push(`attempt ${st.row.attempt}`);
    if (st.row.duration !== null) parts.push(secs(st.row.duration));
  }
  if (st?.turns) parts.push(`${st.turns} turns`);
  if (st?.compensation) parts.push(`↺ undo ${st.compensation}`);
  else if (node.effect) parts.push("effect");
  return parts.join(" · ");
}

// A step with no row yet whose inputs are all complete, in a running run, is in flight: the engine
// writes most steps' rows when they end, so this is read from the graph, not from a row.
export function liveState(nodes: Nodes, steps: Steps, id: string, running: boolean): string {
  const node = nodes.get(id);
  const state = stepState(node, steps.get(id));
  if (state !== "pending" || !running || !node) return state;
  const ready = node.deps.every((d) => stepState(nodes.get(d), steps.get(d)) === "completed");
  return ready ? "running" : state;
}

/** Each step's depth (the longest chain of dependencies above it), for the grid of a large DAG. */
function depths(ids: string[], byId: Nodes): Map<string, number> {
  const depth = new Map<string, number>();
  for (const start of ids) {  // iterative: a 10,000-step chain must not overflow the stack
    const stack = [start];
    while (stack.length) {
      const id = stack[stack.length - 1]!;
      if (depth.has(id)) { stack.pop(); continue; }
      const deps = (byId.get(id)?.deps ?? []).filter((d) => byId.has(d));
      const todo = deps.filter((d) => !depth.has(d) && !stack.includes(d));
      if (todo.length && stack.length <= byId.size) { stack.push(...todo); continue; }
      depth.set(id, deps.reduce((m, d) => Math.max(m, (depth.get(d) ?? -1) + 1), 0));
      stack.pop();
    }
  }
  return depth;
}

/** Where each shown step goes: dagre's layout, or above ``DAGRE_MAX`` steps a grid by depth. */
function place(graph: Graph, ids: string[], byId: Nodes): { at: Map<string, { x: number; y: number }>;
  width: number; height: number; edges: { x: number; y: number }[][]; grid: boolean } {
  const at = new Map<string, { x: number; y: number }>();
  if (ids.length > DAGRE_MAX) {
    const depth = depths(ids, byId);
    const order = ids.map((id, i) => [id, depth.get(id) ?? 0, i] as const)
      .sort((a, b) => a[1] - b[1] || a[2] - b[2]);
    order.forEach(([id], i) => at.set(id, { x: 12 + (i % GRID_COLS) * (W + 16) + W / 2,
      y: 12 + Math.floor(i / GRID_COLS) * (H + 16) + H / 2 }));
    return { at, width: 24 + GRID_COLS * (W + 16), height: 24 + Math.ceil(ids.length / GRID_COLS) * (H + 16),
      edges: [], grid: true };
  }
  const g = new dagre.graphlib.Graph();
  g.setGraph({ rankdir: "TB", nodesep: 28, ranksep: 44, marginx: 12, marginy: 12 });
  g.setDefaultEdgeLabel(() => ({}));
  for (const id of ids) g.setNode(key(id), { width: W, height: H });
  const kept = new Set(ids);
  for (const [a, b] of graph.edges) if (kept.has(a) && kept.has(b)) g.setEdge(key(a), key(b));
  // a graph known only from rows has no edges: chain its steps (in the order they started) for the
  // layout only, so they read top to bottom; no line is drawn for these
  const chained = graph.source === "rows" && !graph.edges.length;
  if (chained) ids.forEach((id, i) => { if (i) g.setEdge(key(ids[i - 1]!), key(id), { hidden: true }); });
  dagre.layout(g);
  for (const id of ids) { const n = g.node(key(id)); at.set(id, { x: n.x, y: n.y }); }
  const info = g.graph();
  const edges = chained ? [] : g.edges().map((e) => (g.edge(e).points ?? []) as { x: number; y: number }[]);
  return { at, width: info.width ?? 0, height: info.height ?? 0, edges, grid: false };
}

// Writes only what changed: a repaint that sets the same class and text still costs the browser
// a style recalculation (and a MutationObserver a record) per node.
const put = (el: Element | null, text: string): void => { if (el && el.textContent !== text) el.textContent = text; };
const attr = (el: Element, name: string, value: string): void => {
  if (el.getAttribute(name) !== value) el.setAttribute(name, value);
};

// ``undriven``: when nobody drives the run (the store still records it running), the state what
// would show running shows (`interrupted` where its driver stopped); else null
export function drawDag(graph: Graph, byId: Nodes, steps: Steps, hide: (id: string) => boolean,
  onPick: (id: string) => void, selected: () => string | null, running: () => boolean, ended: () => boolean,
  undriven: () => string | null = () => null): DagView {
  const ids = graph.nodes.map((n) => n.id).filter((id) => !hide(id));
  const laid = place(graph, ids, byId);
  const width = Math.max(laid.width, W + 24);
  const height = Math.max(laid.height, H + 24);
  const svg = s("svg", { class: "dag", viewBox: `0 0 ${width} ${height}`, width, height, role: "img",
    "aria-label": "the run's DAG" }) as SVGSVGElement;
  svg.append(s("defs", {}, s("marker", { id: "arrow", viewBox: "0 0 10 10", refX: 9, refY: 5, markerWidth: 7,
    markerHeight: 7, orient: "auto-start-reverse" }, s("path", { d: "M 0 0 L 10 5 L 0 10 z", class: "arrowhead" }))));
  for (const pts of laid.edges) {
    const d = pts.map((p: { x: number; y: number }, i: number) => `${i ? "L" : "M"} ${p.x.toFixed(1)} ${p.y.toFixed(1)}`).join(" ");
    svg.append(s("path", { d, class: "edge", "marker-end": "url(#arrow)" }));
  }
  const groups = new Map<string, SVGElement>();
  const paint = (id: string): void => {
    const grp = groups.get(id);
    const node = byId.get(id);
    if (!grp || !node) return;
    const st = steps.get(id);
    const live = liveState(byId, steps, id, running());
    const state = live === "running" ? undriven() ?? live : live;
    attr(grp, "class", `node ${cls(state)}${node.map_over ? " fan" : ""}${id === selected() ? " selected" : ""}`);
    attr(grp, "data-state", state);
    put(grp.querySelector(".state"), `${symbol(state)} ${state}`);
    // a node left waiting or running when its run ended (cancelled, rolled back) will not go on
    const left = ended() && (state === "waiting" || state === "running");
    put(grp.querySelector(".sub"), left ? "left so: the run ended" : subline(node, st));
  };
  for (const id of ids) {
    const n = laid.at.get(id)!;
    const node = byId.get(id)!;
    const x = n.x - W / 2;
    const y = n.y - H / 2;
    const kind = node.kind !== "step" ? node.kind : node.map_over ? "map" : "";
    const grp = s("g", { "data-node": id, tabindex: 0, role: "button", "aria-label": `node ${id}` },
      node.map_over ? s("rect", { x: x + 5, y: y + 5, width: W, height: H, rx: 6, class: "stack" }) : null,
      s("rect", { x, y, width: W, height: H, rx: 6, class: "box" }),
      s("text", { x: x + 10, y: y + 19, class: "name" }, id.length > 24 ? id.slice(0, 23) + "…" : id),
      kind ? s("text", { x: x + W - 8, y: y + 19, class: "kind", "text-anchor": "end" }, kind) : null,
      s("text", { x: x + 10, y: y + 37, class: "state" }, ""),
      s("text", { x: x + 10, y: y + 53, class: "sub" }, ""),
      s("title", {}, id));
    grp.addEventListener("click", () => onPick(id));
    grp.addEventListener("keydown", (ev) => { if ((ev as KeyboardEvent).key === "Enter") onPick(id); });
    groups.set(id, grp);
    svg.append(grp);
    paint(id);
  }
  const note = laid.grid ? `${ids.length} steps: more than ${DAGRE_MAX} are too many to lay out as a graph ` +
    "in the browser (seconds of work), so they are drawn as a grid by depth, without edges: a step's " +
    "dependencies are in its panel (click it), and `raysaga status RUN --dag` draws the whole graph." : null;
  return { svg, update: paint, ids, note };
}

export function legend(): HTMLElement {
  const states = ["pending", "running", "retrying", "waiting", "completed", "failed", "skipped", "cancelled",
    "interrupted"];
  return h("div", { class: "legend" }, ...states.map((st) => h("span", { class: `badge ${cls(st)}` },
    `${symbol(st)} ${st}`)));
}
