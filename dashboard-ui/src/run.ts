// A run's page: its state and budgets, the DAG with live node states, a fan-out's items on demand,
// the Gantt of attempts, the event timeline, the node panel and the run's actions. Live by
// server-sent events from the event log: each message is a change (events, the rows they name, the
// counts of the fan-outs they touch); a reconnect resumes from the last event id. A `gone` message
// says the run was deleted (the page says so and reads again every 5 s) or another run now has its
// id (the page reads it afresh). Steps are kept by name in a Map (`steps`), never a plain object.
// A message repaints the steps it touched and their dependents (every step only when the run's
// status changed), and the timeline follows new events only when it is scrolled to its end, once
// a frame: reading its scrollHeight after each message laid out the whole page, DAG included.
import { actor, clear, clock, getJSON, h, postJSON, secs, utc } from "./dom";
import { dependentsOf, drawDag, legend, liveState, nodesOf, type DagView, type Nodes, type Steps } from "./dag";
import { drawGantt } from "./gantt";
import { labelChips, runBadge } from "./list";
import { renderPanel } from "./panel";
import { cls, symbol } from "./status";
import type { Change, EventJSON, Row, RunDoc, RunSummary, StepState } from "./types";

const MAX_EVENTS = 400;
/** How long a run page whose read failed waits before it reads again. */
const RETRY_MS = 5000;

function baseStep(nodeId: string): { step: string; turn: boolean; comp: boolean } {
  const comp = nodeId.endsWith(":compensate");
  const bare = comp ? nodeId.slice(0, -":compensate".length) : nodeId;
  const at = bare.indexOf("@");
  return { step: at >= 0 ? bare.slice(0, at) : bare, turn: at >= 0, comp };
}

function emptyStep(): StepState {
  return { row: null, items: [], counts: {}, turns: 0, calls: 0, compensation: null };
}

/** The actions a run in ``status`` accepts (orchestrator/client.py), each [verb, label, danger]:
 * a failed run refused *Pause* and took *Cancel* as a no-op; a rollback under way takes neither. */
export function runActions(status: string): [string, string, boolean][] {
  switch (status) {
    case "pending": case "running": case "waiting_human": case "waiting_timer":
      return [["cancel", "Cancel", true], ["compensate", "Cancel and compensate", true], ["pause", "Pause", false]];
    case "paused":
      return [["cancel", "Cancel", true], ["compensate", "Cancel and compensate", true], ["unpause", "Unpause", false]];
    case "failed":  // parked: revived with the same keys, or rolled back
      return [["retry", "Retry", false], ["compensate", "Compensate", true]];
    case "compensation_failed":  // its rollback is finished by a retry of its compensations
      return [["retry", "Retry", false]];
    default:  // completed, cancelled, compensated; compensating (a rollback is not cancelled half-way)
      return [];
  }
}

interface Gone { run_id: string; reason: "deleted" | "replaced"; message: string }

export function renderRun(root: HTMLElement, runId: string, params: URLSearchParams): () => void {
  clear(root);
  const enc = encodeURIComponent(runId);
  const head = h("section", { class: "run-head", id: "run-head" });
  const dagBox = h("div", { class: "dag-box", id: "dag" });
  const fanBox = h("section", { class: "fan-box", id: "fan", hidden: true });
  const ganttBox = h("section", { class: "gantt-box", id: "gantt" });
  const timeline = h("ol", { class: "timeline", id: "timeline" });
  const panel = h("aside", { class: "panel", id: "panel", hidden: true });
  const liveNote = h("span", { class: "live", id: "live" }, "connecting…");
  const hide = h("input", { type: "checkbox", id: "hide-completed" }) as HTMLInputElement;
  root.append(head, h("div", { class: "run-body" },
    h("div", { class: "run-main" },
      h("div", { class: "toolbar" }, h("h2", {}, "DAG"), legend(),
        h("label", {}, hide, " hide completed"), liveNote),
      dagBox, fanBox, h("h2", {}, "Attempts"), ganttBox, h("h2", {}, "Events"), timeline),
    panel));

  let doc: RunDoc | null = null;
  let steps: Steps = new Map();
  let nodes: Nodes = new Map();
  let dependents = new Map<string, string[]>();
  let gone: Gone | null = null;
  let view: DagView | null = null;
  let selected: string | null = params.get("node");
  const rows = new Map<string, Row>();
  let stream: EventSource | null = null;
  let closed = false;
  let retry = 0;

  const depsOf = (label: string): string[] => {
    const { step, turn, comp } = baseStep(label.replace(/\[\d+\]$/, ""));
    return turn || comp ? [step] : nodes.get(step)?.deps ?? [];
  };
  const pick = (label: string): void => {
    const was = selected;
    selected = label;
    panel.hidden = false;
    void renderPanel(panel, runId, label, pick, () => void load(), depsOf(label));
    if (view && doc) { if (was !== null) view.update(was); view.update(label); }  // the highlight moves
  };

  const drawHead = (run: RunSummary & Partial<RunDoc["run"]>, now: number): void => {
    clear(head);
    // (a budget of 0 is a budget: no retries at all)
    const budget = (used: number, cap: number | null, unit = ""): string => cap !== null && cap !== undefined ?
      `${used}${unit} of ${cap}${unit}` : `${used}${unit}`;
    const actions = h("div", { class: "actions" });
    const act = (verb: string, label: string, danger = false): HTMLElement => h("button", {
      class: danger ? "danger" : "", "data-verb": verb, onclick: () => {
        if (!window.confirm(`${label} run ${runId} as ${actor()}?`)) return;
        void postJSON(`/api/runs/${enc}/actions/${verb}`, { confirm: true, by: actor() })
          .then(() => { liveNote.textContent = `${label}: sent`; })
          .catch((e: Error) => window.alert(e.message));
      } }, label);
    for (const [verb, label, danger] of runActions(run.status)) actions.append(act(verb, label, danger));
    head.append(h("div", { class: "title" }, h("h1", {}, run.run_id), runBadge(run),
        h("span", { class: "muted" }, `${run.workflow_name} v${run.workflow_version}`)));
    if (run.status_reason) head.append(h("p", { class: "reason" }, run.status_reason));
    // nobody drives it: since when, why, and the command that continues it (the store says running)
    if (run.no_driver) head.append(h("p", { class: "no-driver", id: "no-driver", "data-why": run.no_driver.why },
      run.no_driver.note));
    head.append(h("dl", { class: "facts" },
        h("dt", {}, "age"), h("dd", {}, `${secs(now - run.created_at)} (since ${utc(run.created_at)})`),
        h("dt", {}, "updated"), h("dd", {}, utc(run.updated_at)),
        h("dt", {}, "deadline"), h("dd", {}, run.deadline_at ? `${utc(run.deadline_at)} (${run.deadline_at > now ?
          "in " + secs(run.deadline_at - now) : "passed"})` : "none"),
        h("dt", {}, "retries"), h("dd", {}, budget(run.retries_used, run.retry_budget)),
        h("dt", {}, "tokens"), h("dd", {}, budget(run.tokens_used, run.token_budget)),
        h("dt", {}, "cost"), h("dd", {}, run.cost_budget !== null && run.cost_budget !== undefined ?
          `$${run.cost_used.toFixed(4)} of $${run.cost_budget}` :
          `$${run.cost_used.toFixed(4)}`),
        h("dt", {}, "driver"), h("dd", { id: "driver" }, run.no_driver ? `none (${run.no_driver.why}` +
          `${run.no_driver.since ? " at " + utc(run.no_driver.since) : ""})` : run.lease_owner &&
          (run.lease_expires_at ?? 0) > now ? run.lease_owner.split(":").slice(0, 3).join(":") : "none"),
        ...(Object.keys(run.labels ?? {}).length ? [h("dt", {}, "labels"), h("dd", { class: "labels", id: "run-labels" },
          ...labelChips(run.labels, (pair) => "#/?" + new URLSearchParams([["label", pair]]).toString()))] : []),
        ...lineage(run)),
      actions);
  };

  // where the run comes from and what was forked from it (docs/fork.md)
  const lineage = (run: RunSummary & Partial<RunDoc["run"]>): HTMLElement[] => {
    const link = (id: string): HTMLElement => h("a", { href: `#/runs/${encodeURIComponent(id)}` }, id);
    const parts: HTMLElement[] = [];
    if (run.parent_run_id) {
      parts.push(h("dt", {}, "forked from"), h("dd", { class: "lineage" }, link(run.parent_run_id),
        run.forked_from ? ` at ${run.forked_from}` : ""));
    }
    if (run.children && run.children.length) {
      const forks = h("dd", { class: "lineage" });
      run.children.forEach((c, i) => forks.append(i ? ", " : "", link(c.run_id), ` (${c.status}, from ${c.forked_from ?? "?"})`));
      parts.push(h("dt", {}, "forks"), forks);
    }
    return parts;
  };

  const allRows = (): Row[] => [...rows.values()];
  // what a row the store records running shows in a run at rest (paused, waiting, ended): nobody
  // runs it, a pause cancelled its call (as `raysaga status` says: undriven.shown_state); else null
  const atRest = (): string | null =>
    doc && !["running", "compensating"].includes(doc.run.status) ? "interrupted" : null;
  const claims: number[] = [];
  let segment = 0;
  const drawGanttNow = (): void => {
    clear(ganttBox);
    const resting = doc && ["completed", "cancelled", "compensated", "failed", "compensation_failed", "paused"]
      .includes(doc.run.status);
    if (claims.length > 1) {
      const pickSegment = h("select", { id: "segment", "aria-label": "driver segment" },
        h("option", { value: "0" }, `every driver (${claims.length})`),
        ...claims.map((at, i) => h("option", { value: String(i + 1), selected: segment === i + 1 },
          `driver ${i + 1}, from ${clock(at)}`)));
      pickSegment.addEventListener("change", () => { segment = Number((pickSegment as HTMLSelectElement).value);
        drawGanttNow(); });
      ganttBox.append(h("label", { class: "muted" }, "resume segment ", pickSegment));
    }
    // a run nobody drives is drawn up to when its driver stopped: its bars do not grow with the clock
    // (a silent driver, on another machine, may still be at work: drawn as a driven run's)
    const stopped = doc?.run.no_driver?.why === "silent" ? null : doc?.run.no_driver ?? null;
    const until = resting && doc ? doc.run.updated_at : stopped ? stopped.since ?? doc?.run.updated_at ?? 0 :
      Date.now() / 1000;
    ganttBox.append(drawGantt(allRows(), until, pick, claims, segment, stopped?.in_flight ?? atRest()));
  };

  const layout = (): void => {
    if (!doc) return;
    const d = doc;
    clear(dagBox);
    if (d.graph.note) dagBox.append(h("p", { class: "muted note" }, d.graph.note));
    const hidden = (id: string): boolean => hide.checked &&
      liveState(nodes, steps, id, d.run.status === "running") === "completed";
    view = drawDag(d.graph, nodes, steps, hidden, (id) => {
      const node = nodes.get(id);
      const st = steps.get(id);
      if (node?.map_over || Object.keys(st?.counts ?? {}).length) void expand(id);
      pick(id);
    }, () => selected, () => doc?.run.status === "running",
    () => ["completed", "cancelled", "compensated", "failed", "compensation_failed"].includes(doc?.run.status ?? ""),
    () => doc?.run.no_driver?.in_flight ?? atRest());
    if (view.note) dagBox.append(h("p", { class: "muted note", id: "dag-grid-note" }, view.note));
    dagBox.append(view.svg);
  };

  // what a fan-out's items with no row are, as `raysaga status` says it (cli_status._no_row_note):
  // never issued once the run or the fan-out ended, else not issued yet (or cut short by a driver)
  const noRowWhy = (step: string): string => {
    const run = doc?.run;
    const own = steps.get(step)?.row?.status ?? "";
    if (["completed", "failed", "skipped", "cancelled"].includes(own) || !run ||
        ["completed", "cancelled", "compensated", "compensation_failed", "compensating"].includes(run.status))
      return "with no row: never issued";
    if (run.no_driver && run.no_driver.why !== "silent") return "with no row: not issued, or in flight when its driver stopped; a resume issues them";
    if (run.status === "running")
      return "with no row yet: not issued yet (an effect step issues a few at a time), or in flight and not recorded yet";
    return "with no row yet: not issued yet";
  };

  const expand = async (step: string, status = ""): Promise<void> => {
    fanBox.hidden = false;
    clear(fanBox);
    const counts = steps.get(step)?.counts ?? {};
    const filter = h("select", { "aria-label": "items in state" }, h("option", { value: "" }, "every state"),
      ...Object.keys(counts).map((k) => h("option", { value: k, selected: k === status }, `${k} (${counts[k]})`)));
    filter.addEventListener("change", () => void expand(step, (filter as HTMLSelectElement).value));
    const grid = h("div", { class: "items", "data-step": step });
    fanBox.append(h("div", { class: "toolbar" }, h("h2", {}, `${step}: items`), filter,
      h("button", { onclick: () => { fanBox.hidden = true; } }, "collapse")), grid);
    let after = -1;
    let listed = 0;
    const more = h("button", {}, "more items");
    const page = async (): Promise<void> => {
      let got: { items: Row[]; next: number | null };
      try {
        got = await getJSON<{ items: Row[]; next: number | null }>(
          `/api/runs/${enc}/items/${encodeURIComponent(step)}?after=${after}&limit=500${status ? "&status=" + status : ""}`);
      } catch (e) {
        more.remove();
        grid.append(h("p", { class: "error" }, (e as Error).message));
        return;
      }
      for (const r of got.items) grid.append(itemCell(r));
      listed += got.items.length;
      more.remove();
      if (got.next !== null) { after = got.next; fanBox.append(more); return; }
      // items counted pending with no row to list: held back by an effect step's window (no row,
      // no key until issued), or in flight and not recorded yet; an empty list said nothing of them
      const wanted = status ? (counts[status] ?? 0) : Object.values(counts).reduce((a, b) => a + b, 0);
      if ((!status || status === "pending") && wanted > listed)
        fanBox.append(h("p", { class: "muted note", "data-no-row": String(wanted - listed) },
          `${wanted - listed} more pending ${noRowWhy(step)}`));
    };
    more.addEventListener("click", () => void page());
    await page();
  };
  const itemCell = (r: Row): HTMLElement => h("button", { class: `item ${cls(r.status)}`, "data-node": r.node,
    title: `${r.node}: ${r.status}`, onclick: () => pick(r.node) }, `${symbol(r.status)}${r.index ?? ""}`);

  // follow the newest events while the timeline is scrolled to its end (a reader who scrolled up
  // keeps their place); its scroll event says where it is, read when the page is laid out anyway
  let follow = true;
  let scrolling = 0;
  timeline.addEventListener("scroll", () => {
    follow = timeline.scrollTop + timeline.clientHeight >= timeline.scrollHeight - 8;
  });
  const addEvents = (events: EventJSON[]): void => {
    for (const e of events) {
      if (e.kind === "lease_claimed" && !claims.includes(e.at)) claims.push(e.at);
      const data = e.data && typeof e.data === "object" ? JSON.stringify(e.data) : "";
      timeline.append(h("li", { "data-seq": e.seq }, h("span", { class: "muted" }, `#${e.seq} ${clock(e.at)} `),
        h("strong", {}, e.kind), e.node ? ` ${e.node}` : "",
        data && data !== "{}" ? h("span", { class: "data" }, ` ${data.length > 160 ? data.slice(0, 160) + "…" : data}`)
          : null));
    }
    while (timeline.childElementCount > MAX_EVENTS) timeline.firstElementChild?.remove();
    if (follow && !scrolling) scrolling = window.requestAnimationFrame(() => {
      scrolling = 0;
      timeline.scrollTop = timeline.scrollHeight;
    });
  };

  const stepOf = (name: string): StepState => {
    let st = steps.get(name);
    if (!st) steps.set(name, st = emptyStep());
    return st;
  };

  const apply = (change: Change): void => {
    if (!doc) return;
    let relayout = false;
    const was = doc.run.status;
    const wasDriven = !doc.run.no_driver;
    const touched = new Set<string>();
    for (const r of change.nodes) {
      const { step, turn, comp } = baseStep(r.node_id);
      const st = stepOf(step);
      if (!nodes.has(step)) {
        const node = { id: step, kind: "step", map_over: null, effect: false, critical: true, compensated: false,
          deps: [] };
        doc.graph.nodes.push(node);
        nodes.set(step, node);
        relayout = true;
      }
      if (comp) st.compensation = r.status;
      else if (turn) { /* counted by the server, every item's: `change.agents` below */ }
      else if (r.index === null) st.row = r;
      else {
        const cell = fanBox.querySelector(`[data-node="${CSS.escape(r.node)}"]`);
        if (cell) cell.replaceWith(itemCell(r));
      }
      if (r.index === null || rows.has(r.node) || rows.size < 200) rows.set(r.node, r);
      touched.add(step);
    }
    for (const [step, counts] of Object.entries(change.counts)) {
      stepOf(step).counts = counts;
      touched.add(step);
    }
    for (const [step, c] of Object.entries(change.agents ?? {})) {  // turns and tool calls, every item's
      const st = stepOf(step);
      st.turns = c.turns;
      st.calls = c.calls;
      touched.add(step);
    }
    drawHead({ ...doc.run, ...change.run }, Date.now() / 1000);
    doc.run = { ...doc.run, ...change.run };
    // a step's completion makes its dependents in flight: repaint the touched steps and their
    // dependents (text only, no layout); a change of the run's status, every step
    if (relayout || hide.checked) layout();
    else if (doc.run.status !== was || wasDriven !== !doc.run.no_driver) for (const id of view?.ids ?? []) view?.update(id);
    else {
      const again = new Set(touched);
      for (const step of touched) for (const d of dependents.get(step) ?? []) again.add(d);
      for (const id of again) view?.update(id);
    }
    addEvents(change.events);
    drawGanttNow();
    if (selected && panel.hidden === false && change.nodes.some((r) => r.node === selected ||
      baseStep(r.node_id).step === selected)) void renderPanel(panel, runId, selected, pick, () => void load(),
      depsOf(selected));
  };

  const connect = (cursor: number): void => {
    stream?.close();
    stream = new EventSource(`/api/runs/${enc}/stream?after=${cursor}`);
    stream.addEventListener("open", () => { liveNote.textContent = "● live"; liveNote.className = "live on"; });
    stream.addEventListener("error", () => { liveNote.textContent = "reconnecting…"; liveNote.className = "live"; });
    stream.addEventListener("change", (ev) => {
      const msg = ev as MessageEvent<string>;
      apply(JSON.parse(msg.data) as Change);
      document.body.setAttribute("data-seq", msg.lastEventId);
    });
    // the run was deleted, or another run has its id: this stream will not say more (closed before
    // the browser reconnects to it), and the page reads the run afresh
    stream.addEventListener("gone", (ev) => {
      const why = JSON.parse((ev as MessageEvent<string>).data) as Gone;
      stream?.close();
      stream = null;
      document.body.setAttribute("data-gone", why.reason);
      liveNote.textContent = why.reason === "deleted" ? "✗ run deleted" : "↻ another run: reloading";
      liveNote.className = "live gone";
      gone = why.reason === "deleted" ? why : null;
      if (gone) {
        doc = null;
        for (const box of [dagBox, fanBox, ganttBox, timeline]) clear(box);
        fanBox.hidden = true;
        panel.hidden = true;
      }
      void load();
    });
  };

  const load = async (): Promise<void> => {
    // both reads, or neither: a server gone between them (restarted, stopped) is said in the
    // head like a failed first read, never left as an unhandled rejection
    let events: { events: EventJSON[] };
    window.clearTimeout(retry);
    try {
      doc = await getJSON<RunDoc>(`/api/runs/${enc}`);
      events = await getJSON<{ events: EventJSON[] }>(`/api/runs/${enc}/events?after=${Math.max(0,
        doc.cursor - MAX_EVENTS)}&limit=${MAX_EVENTS}`);
    } catch (e) {
      if (closed) return;
      clear(head);
      if (gone) head.append(h("p", { class: "error gone", id: "run-gone" },
        `${gone.message} while this page was open.`));
      head.append(h("p", { class: "error" }, (e as Error).message),
        h("p", { class: "muted" }, `Trying again every ${RETRY_MS / 1000} s.`));
      // the page reads the run again on its own (as the run list refreshes): a restarted
      // server, or a run submitted after its link was shared, shows without a reload
      retry = window.setTimeout(() => void load(), RETRY_MS);
      return;
    }
    if (closed) return;
    gone = null;
    document.body.removeAttribute("data-gone");
    // own keys only, a `__proto__` step's included; each step's own row is read from `rows` (the
    // server sends a row once: `steps` holds its status only)
    steps = new Map(Object.entries(doc.steps).map(([name, st]) => [name, { ...st, row: null, items: [] }]));
    nodes = nodesOf(doc.graph);
    dependents = dependentsOf(doc.graph);
    rows.clear();
    claims.length = 0;
    for (const r of doc.rows) {
      rows.set(r.node, r);
      const { step, turn, comp } = baseStep(r.node_id);
      if (r.index === null && !turn && !comp) stepOf(step).row = r;
    }
    drawHead(doc.run, doc.now);
    layout();
    drawGanttNow();
    clear(timeline);
    addEvents(events.events.filter((e) => e.seq <= (doc?.cursor ?? 0)));
    drawGanttNow();
    if (selected) pick(selected);
    connect(doc.cursor);
  };
  hide.addEventListener("change", layout);
  void load();
  return () => { closed = true; window.clearTimeout(retry); stream?.close(); };
}
