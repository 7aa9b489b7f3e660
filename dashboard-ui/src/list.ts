// The run list: filters, counts by state, keyset paging, the inbox of runs waiting for a human.
import { actor, clear, getJSON, h, secs, utc } from "./dom";
import { cls, RUN_STATES, symbol } from "./status";
import type { RunList, RunSummary, Waiting } from "./types";

interface Stats {
  runs_without_driver?: number;
  waiting_human_seconds: { count: number; p50: number | null; p95: number | null };
  duplicates_prevented: number; retries: number; breaker_trips: number; resumed_runs: number;
  resume_success_rate: number | null;
}

interface Filters { status: string; workflow: string; since: string; until: string; q: string }

// A run's labels as chips, each a link to the list filtered by it too (user text: always text nodes).
export function labelChips(labels: Record<string, string> | undefined, href: (pair: string) => string | null
): HTMLElement[] {
  return Object.entries(labels ?? {}).map(([k, v]) => {
    const pair = `${k}=${v}`;
    const to = href(pair);
    return to === null ? h("span", { class: "chip label", title: pair, "data-label": pair }, pair)
      : h("a", { class: "chip label", title: `${pair}: list the runs labelled so`, "data-label": pair, href: to }, pair);
  });
}

export function badge(state: string): HTMLElement {
  return h("span", { class: `badge ${cls(state)}`, title: state }, `${symbol(state)} ${state}`);
}

// A run's state badge: "running, no driver" (its own colour and symbol, the note as its title) when
// nobody drives it, which the store still records running: a `running` badge said it was at work.
export function runBadge(run: RunSummary): HTMLElement {
  if (!run.no_driver) return badge(run.status);
  return h("span", { class: `badge ${cls("interrupted")}`, title: run.no_driver.note, "data-no-driver": run.no_driver.why },
    `${symbol("interrupted")} ${run.status}, no driver`);
}

export function renderList(root: HTMLElement, params: URLSearchParams): () => void {
  clear(root);
  const f: Filters = {
    status: params.get("status") ?? "", workflow: params.get("workflow") ?? "", since: params.get("since") ?? "",
    until: params.get("until") ?? "", q: params.get("q") ?? "",
  };
  // label=KEY=VALUE filters (all must hold, as `raysaga list --label`), in the order given
  const labels = [...new Set(params.getAll("label").filter((l) => l))];
  const inbox = h("section", { class: "inbox", id: "inbox" });
  const figures = h("dl", { class: "figures", id: "figures" });
  const chips = h("div", { class: "chips", id: "counts" });
  const table = h("tbody", { id: "runs" });
  const more = h("div", { class: "more" });
  const input = (name: keyof Filters, label: string, type = "text"): HTMLElement =>
    h("label", {}, label, h("input", { name, type, value: f[name], "aria-label": label }));
  const form = h("form", { class: "filters", id: "filters" },
    // the times a run page shows are UTC, and so are these (the server reads a time without a zone as UTC)
    input("q", "search"), input("workflow", "workflow"), input("since", "since (UTC)", "datetime-local"),
    input("until", "until (UTC)", "datetime-local"),
    h("label", {}, "state", h("select", { name: "status", "aria-label": "state" }, h("option", { value: "" }, "any"),
      ...RUN_STATES.map((st) => h("option", { value: st, selected: st === f.status }, st)))),
    h("label", {}, "label", h("input", { name: "label", id: "label-filter", placeholder: "key=value", "aria-label": "label" })),
    // the labels filtered by: kept on submit (hidden inputs), each removable
    ...labels.map((l) => h("input", { type: "hidden", name: "label", value: l })),
    h("span", { class: "label-filters", id: "label-filters" }, ...labels.map((l) => h("span", { class: "chip on", "data-label": l,
      title: l }, h("a", { class: "remove", href: "#/?" + filterParams(f.status, labels.filter((x) => x !== l)),
      title: `stop filtering by ${l}`, "aria-label": `stop filtering by ${l}` }, "×"), " ", l))),
    h("button", { type: "submit" }, "Filter"));
  form.addEventListener("submit", (ev) => {
    ev.preventDefault();
    const data = new FormData(form as HTMLFormElement);
    const next = new URLSearchParams();
    for (const [k, v] of data.entries()) {
      const text = String(v);  // as typed: a label is matched as written, spaces included
      if (!text.trim()) continue;
      if (k === "label") { if (!next.getAll("label").includes(text)) next.append(k, text); } else next.set(k, text);
    }
    location.hash = "#/?" + next.toString();
  });
  root.append(h("h1", {}, "Runs"), figures, inbox, form, chips,
    h("table", { class: "runs" }, h("thead", {}, h("tr", {}, ...["run", "workflow", "state", "created", "age",
      "labels", "reason"].map((c) => h("th", {}, c)))), table), more);

  const query = (before: string | null): string => {
    const p = new URLSearchParams();
    for (const [k, v] of Object.entries(f)) if (v) p.set(k, v);
    for (const l of labels) p.append("label", l);
    if (before) p.set("before", before);
    return "/api/runs?" + p.toString();
  };
  const draw = (page: RunList, append: boolean): void => {
    if (!append) {
      clear(table);
      clear(chips);
      const total = Object.values(page.counts).reduce((a, b) => a + b, 0);
      chips.append(h("a", { class: "chip" + (f.status ? "" : " on"), href: "#/?" + filterParams("", labels) }, `all ${total}`));
      for (const st of RUN_STATES) {
        const n = page.counts[st] ?? 0;
        if (n) chips.append(h("a", { class: `chip ${cls(st)}` + (f.status === st ? " on" : ""),
          href: "#/?" + filterParams(st, labels) }, `${symbol(st)} ${st} ${n}`));
      }
      if (page.no_driver) chips.append(h("span", { class: `chip ${cls("interrupted")}`, id: "no-driver-count",
        title: "runs still running (or compensating) that no driver drives: interrupted, their driver died, or on another machine it is silent past its lease; " +
          "`raysaga resume RUN` (or a worker) takes each up" }, `${symbol("interrupted")} no driver ${page.no_driver}`));
    }
    for (const r of page.runs) {
      table.append(h("tr", { "data-run": r.run_id },
        h("td", {}, h("a", { href: `#/runs/${encodeURIComponent(r.run_id)}` }, r.run_id)),
        h("td", {}, `${r.workflow_name} v${r.workflow_version}`), h("td", {}, runBadge(r)),
        h("td", {}, utc(r.created_at)), h("td", {}, secs(page.now - r.created_at)),
        h("td", { class: "labels" }, ...labelChips(r.labels, (pair) => labels.includes(pair) ? null
          : "#/?" + filterParams(f.status, [...labels, pair]))),
        h("td", { class: "reason", title: r.no_driver?.note ?? "" }, r.status_reason ?? r.no_driver?.note ?? "")));
    }
    if (!page.runs.length && !append) table.append(h("tr", {}, h("td", { colspan: 7 }, "no runs match")));
    clear(more);
    if (page.next) {
      const next = page.next;
      more.append(h("button", { onclick: () => { paged = true; void getJSON<RunList>(query(next)).then((p) => draw(p, true), (e: Error) => {
        table.append(h("tr", {}, h("td", { colspan: 7, class: "error" }, e.message)));  // below the runs already shown
      }); } },
        "Older runs"));
    }
  };
  function filterParams(status: string, withLabels: string[]): string {
    const p = new URLSearchParams();
    for (const [k, v] of Object.entries({ ...f, status })) if (v) p.set(k, v);
    for (const l of withLabels) p.append("label", l);
    return p.toString();
  }
  const drawInbox = (waiting: Waiting[], who: string): void => {
    clear(inbox);
    if (!waiting.length) return;
    inbox.append(h("h2", {}, who ? `Waiting for ${who} (${waiting.length})` : `Waiting for a human (${waiting.length})`),
      h("ul", {}, ...waiting.map((w) => h("li", {},
        h("a", { href: `#/runs/${encodeURIComponent(w.run_id)}?node=${encodeURIComponent(w.node)}` },
          `${w.run_id} · ${w.node}`), " ", typeof w.prompt === "string" ? w.prompt : "",
        w.since ? h("span", { class: "muted" }, ` waiting since ${utc(w.since)}`) : null))));
  };
  const drawFigures = (st: Stats): void => {
    clear(figures);
    const q = (v: number | null | undefined): string => (v === null || v === undefined ? "–" : secs(v));
    const pairs: [string, string][] = [
      ["waiting for a human p50 / p95", `${q(st.waiting_human_seconds.p50)} / ${q(st.waiting_human_seconds.p95)}`],
      ["duplicates prevented", String(st.duplicates_prevented)], ["retries", String(st.retries)],
      ["breakers open", String(st.breaker_trips)], ["running, no driver", String(st.runs_without_driver ?? 0)],
      ["resumed runs that completed", st.resume_success_rate === null ? "–" :
        `${Math.round(st.resume_success_rate * 100)}% of ${st.resumed_runs}`],
    ];
    for (const [k, v] of pairs) figures.append(h("div", {}, h("dt", {}, k), h("dd", {}, v)));
  };
  let live = true;
  let paged = false;
  // the first page's read that failed (the server stopped, restarted, or said no): said in the
  // table, never an unhandled rejection; the next refresh tries again
  const failed = (e: Error): void => {
    clear(table);
    table.append(h("tr", {}, h("td", { colspan: 7, class: "error" }, e.message)));
  };
  const refresh = (): void => {
    void getJSON<RunList>(query(null)).then((p) => { if (live) draw(p, false); }, failed);
    // acting as someone: the approvals they may decide; else every waiting approval; a failed read
    // of these two leaves them as they were (the runs table says why: its own read failed too)
    const who = actor() === "dashboard" ? "" : actor();
    void getJSON<{ waiting: Waiting[] }>("/api/inbox" + (who ? `?approver=${encodeURIComponent(who)}` : ""))
      .then((w) => { if (live) drawInbox(w.waiting, who); }, () => undefined);
    void getJSON<Stats>("/api/stats").then((st) => { if (live) drawFigures(st); }, () => undefined);
  };
  refresh();
  // the first page refreshes on a timer; older pages stay as they were read
  const timer = window.setInterval(() => { if (!paged) refresh(); }, 5000);
  return () => { live = false; window.clearInterval(timer); };
}
