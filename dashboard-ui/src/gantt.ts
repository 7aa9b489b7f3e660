// A Gantt of attempts: one bar per node row from its start to its end (or now); waiting is drawn
// apart, hatched: a backoff until not_before, an approval or timer until now.
import { clock, h, s, secs } from "./dom";
import { cls } from "./status";
import type { Row } from "./types";

const ROW = 18;
const LEFT = 170;
const MAX_ROWS = 80;

// ``claims``: when each driver took the run (lease_claimed events): a resume starts a new segment,
// drawn as a dashed line; ``segment`` (1-based) keeps the attempts that started in that one only.
// ``stopped``: nobody drives the run (``now`` is then when its driver stopped): an attempt left
// running is drawn in this state (`interrupted`), up to then, not growing with the clock.
export function drawGantt(rows: Row[], now: number, onPick: (label: string) => void, claims: number[] = [],
  segment = 0, stopped: string | null = null): HTMLElement {
  const bounds = segment > 0 ? [claims[segment - 1] ?? 0, claims[segment] ?? Infinity] : [-Infinity, Infinity];
  const timed = rows.filter((r) => r.started_at !== null || r.not_before !== null)
    .filter((r) => { const t = r.started_at ?? r.not_before ?? 0; return t >= bounds[0]! && t < bounds[1]!; })
    .sort((a, b) => (a.started_at ?? a.not_before ?? 0) - (b.started_at ?? b.not_before ?? 0)).slice(0, MAX_ROWS);
  if (!timed.length) return h("p", { class: "muted" }, "no attempt has started yet");
  const start = Math.min(...timed.map((r) => r.started_at ?? r.not_before ?? now));
  const end = Math.max(now, ...timed.map((r) => Math.max(r.finished_at ?? 0, r.not_before ?? 0)));
  const span = Math.max(end - start, 0.001);
  const width = 760;
  const scale = (t: number): number => LEFT + ((t - start) / span) * (width - LEFT - 10);
  const svg = s("svg", { class: "gantt", width, height: timed.length * ROW + 26, viewBox:
    `0 0 ${width} ${timed.length * ROW + 26}`, role: "img", "aria-label": "attempts over time" });
  svg.append(s("defs", {}, s("pattern", { id: "hatch", width: 6, height: 6, patternUnits: "userSpaceOnUse",
    patternTransform: "rotate(45)" }, s("rect", { width: 6, height: 6, class: "hatch-bg" }),
  s("line", { x1: 0, y1: 0, x2: 0, y2: 6, class: "hatch-line" }))));
  timed.forEach((r, i) => {
    const y = i * ROW + 4;
    const shown = stopped !== null && r.status === "running" ? stopped : r.status;
    const g = s("g", { class: `bar ${cls(shown)}`, "data-node": r.node, "data-state": shown });
    g.append(s("text", { x: LEFT - 6, y: y + 12, "text-anchor": "end", class: "label" },
      r.node.length > 26 ? r.node.slice(0, 25) + "…" : r.node));
    if (r.started_at !== null) {
      const stop = r.finished_at ?? (["running", "waiting"].includes(r.status) ? now : r.started_at);
      const x = scale(r.started_at);
      g.append(s("rect", { x, y, width: Math.max(2, scale(stop) - x), height: ROW - 6, rx: 2, class: "run" },
        s("title", {}, `${r.node}: ${shown !== r.status ? `${shown} (recorded running; nobody runs it)` :
          r.status}, attempt ${r.attempt}, ${secs(r.duration ?? stop - r.started_at)}`)));
    }
    const waitFrom = r.status === "waiting" ? r.started_at : r.finished_at ?? r.started_at;
    const waitTo = r.status === "waiting" ? now : r.not_before;
    if (waitFrom !== null && waitTo !== null && waitTo > waitFrom && ["retrying", "waiting"].includes(r.status)) {
      const x = scale(waitFrom);
      g.append(s("rect", { x, y, width: Math.max(2, scale(waitTo) - x), height: ROW - 6, class: "wait" },
        s("title", {}, `${r.node}: waiting${r.status === "retrying" ? " (backoff)" : ""} until ${clock(waitTo)}`)));
    }
    g.addEventListener("click", () => onPick(r.node));
    svg.append(g);
  });
  claims.forEach((at, i) => {
    if (at > end) return;
    const x = scale(Math.max(at, start));
    svg.append(s("line", { x1: x, y1: 0, x2: x, y2: timed.length * ROW + 6, class: "claim" }),
      s("text", { x: x + 3, y: 10, class: "claim-label" }, `driver ${i + 1}`));
  });
  const axisY = timed.length * ROW + 18;
  svg.append(s("text", { x: LEFT, y: axisY, class: "axis" }, clock(start)),
    s("text", { x: width - 10, y: axisY, class: "axis", "text-anchor": "end" }, `${clock(end)} (+${secs(span)})`));
  return h("div", { class: "gantt-wrap" }, svg,
    h("p", { class: "muted" }, "solid: an attempt running · hatched: waiting (backoff, approval, timer)"));
}
