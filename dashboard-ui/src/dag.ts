// The run's DAG: laid out by dagre (layered, top to bottom), drawn as SVG. A node shows its state
// by colour AND symbol; a fan-out is one stacked node with its items counted per state; agents show
// their turns; a compensated step its undo's state. Layout happens once per shape: a live change
// only rewrites the nodes it touches. Steps are looked up by name in Maps, and dagre (whose graph is
// plain objects) is given "n:" + name: a step named `constructor` or `__proto__` (valid names) read
// Object.prototype's member, and no DAG was drawn.
import dagre from "@dagrejs/dagre";
import { h, s, secs } from "./dom";
import { cls, fanState, symbol } from "./status";
import type { Graph, GraphNode, StepState } from "./types";

const W = 196;
const H = 62;

export interface DagView { svg: SVGSVGElement; update: (id: string) => void; ids: string[] }

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
export function liveState(graph: Graph, steps: Steps, id: string, running: boolean): string {
  const node = graph.nodes.find((n) => n.id === id);
  const state = stepState(node, steps.get(id));
  if (state !== "pending" || !running || !node) return state;
  const ready = node.deps.every((d) => stepState(graph.nodes.find((n) => n.id === d), steps.get(d)) === "completed");
  return ready ? "running" : state;
}

export function drawDag(graph: Graph, steps: Steps, hide: (id: string) => boolean,
  onPick: (id: string) => void, selected: string | null, running: () => boolean, ended: () => boolean): DagView {
  const g = new dagre.graphlib.Graph();
  g.setGraph({ rankdir: "TB", nodesep: 28, ranksep: 44, marginx: 12, marginy: 12 });
  g.setDefaultEdgeLabel(() => ({}));
  const byId = new Map(graph.nodes.map((n) => [n.id, n]));
  const ids = graph.nodes.map((n) => n.id).filter((id) => !hide(id));
  for (const id of ids) g.setNode(key(id), { width: W, height: H });
  const kept = new Set(ids);
  for (const [a, b] of graph.edges) if (kept.has(a) && kept.has(b)) g.setEdge(key(a), key(b));
  // a graph known only from rows has no edges: chain its steps (in the order they started) for the
  // layout only, so they read top to bottom; no line is drawn for these
  const chained = graph.source === "rows" && !graph.edges.length;
  if (chained) ids.forEach((id, i) => { if (i) g.setEdge(key(ids[i - 1]!), key(id), { hidden: true }); });
  dagre.layout(g);
  const info = g.graph();
  const width = Math.max(info.width ?? 0, W + 24);
  const height = Math.max(info.height ?? 0, H + 24);
  const svg = s("svg", { class: "dag", viewBox: `0 0 ${width} ${height}`, width, height, role: "img",
    "aria-label": "the run's DAG" }) as SVGSVGElement;
  svg.append(s("defs", {}, s("marker", { id: "arrow", viewBox: "0 0 10 10", refX: 9, refY: 5, markerWidth: 7,
    markerHeight: 7, orient: "auto-start-reverse" }, s("path", { d: "M 0 0 L 10 5 L 0 10 z", class: "arrowhead" }))));
  for (const e of g.edges()) {
    if (chained) continue;
    const pts: { x: number; y: number }[] = g.edge(e).points ?? [];
    const d = pts.map((p: { x: number; y: number }, i: number) => `${i ? "L" : "M"} ${p.x.toFixed(1)} ${p.y.toFixed(1)}`).join(" ");
    svg.append(s("path", { d, class: "edge", "marker-end": "url(#arrow)" }));
  }
  const groups = new Map<string, SVGElement>();
  const paint = (id: string): void => {
    const grp = groups.get(id);
    const node = byId.get(id);
    if (!grp || !node) return;
    const st = steps.get(id);
    const state = liveState(graph, steps, id, running());
    grp.setAttribute("class", `node ${cls(state)}${node.map_over ? " fan" : ""}${id === selected ? " selected" : ""}`);
    grp.setAttribute("data-state", state);
    const label = grp.querySelector(".state");
    if (label) label.textContent = `${symbol(state)} ${state}`;
    const sub = grp.querySelector(".sub");
    // a node left waiting or running when its run ended (cancelled, rolled back) will not go on
    const left = ended() && (state === "waiting" || state === "running");
    if (sub) sub.textContent = left ? "left so: the run ended" : subline(node, st);
  };
  for (const id of ids) {
    const n = g.node(key(id));
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
  return { svg, update: paint, ids };
}

export function legend(): HTMLElement {
  const states = ["pending", "running", "retrying", "waiting", "completed", "failed", "skipped", "cancelled"];
  return h("div", { class: "legend" }, ...states.map((st) => h("span", { class: `badge ${cls(st)}` },
    `${symbol(st)} ${st}`)));
}
