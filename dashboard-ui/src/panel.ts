// The node panel: the row, its output (large ones fetched on demand), its error, its attempts from
// the event log, its ledger rows, its compensation, an agent's turns, and an approval's form.
import { actor, clear, getJSON, h, postJSON, pretty, secs, utc } from "./dom";
import { badge } from "./list";
import type { ApprovalDoc, NodeDoc, Shown } from "./types";

// `part` picks what is shown of the value fetched whole (an approval's payload of its output)
function value(shown: Shown | null, fetchUrl: string | null, part: (v: unknown) => unknown = (v) => v): HTMLElement {
  if (!shown) return h("p", { class: "muted" }, "none");
  if ("value" in shown) return h("pre", { class: "value" }, pretty(shown.value));
  const box = h("div", { class: "value" });
  const label = shown.digest ? `kept as blob ${shown.digest.slice(0, 19)}…` : `${shown.size ?? "?"} bytes (a preview)`;
  box.append(h("p", { class: "muted" }, label));
  if (shown.preview) box.append(h("pre", {}, shown.preview + " …"));
  if (fetchUrl) {
    const button = h("button", { class: "load" }, "Load the whole value");
    button.addEventListener("click", () => {
      button.setAttribute("disabled", "");
      void getJSON<{ value: unknown }>(fetchUrl).then((v) => {
        clear(box);
        box.append(h("pre", {}, pretty(part(v.value))));
      }).catch((e: Error) => box.append(h("p", { class: "error" }, e.message)));
    });
    box.append(button);
  }
  return box;
}

function errorBlock(error: Record<string, unknown> | null): HTMLElement | null {
  if (!error) return null;
  const trace = typeof error.traceback === "string" ? error.traceback : null;
  const kind = [error.type, error.message].filter(Boolean).join(": ");
  return h("div", { class: "error-block" },
    h("p", {}, h("strong", {}, "error "), kind, error.reason ? ` (${String(error.reason)})` : "",
      error.transient !== undefined ? h("span", { class: "muted" }, error.transient ? " · transient" :
        " · permanent") : null),
    trace ? h("details", {}, h("summary", {}, "traceback"), h("pre", {}, trace)) : null);
}

function section(title: string, ...body: (HTMLElement | null)[]): HTMLElement {
  return h("section", {}, h("h3", {}, title), ...body);
}

type Field = { name: string; type: string; title: string; required: boolean; input: HTMLInputElement };

// An answer form from the approval's JSON Schema when it is an object of plain fields (string,
// integer, number, boolean), pre-filled from the payload (an approve with edits); else a JSON box.
function schemaFields(schema: unknown, payload: unknown): Field[] | null {
  const sc = schema as { type?: string; properties?: Record<string, { type?: string; title?: string }>;
    required?: string[] } | null;
  if (!sc || sc.type !== "object" || !sc.properties) return null;
  const plain = ["string", "integer", "number", "boolean"];
  const entries = Object.entries(sc.properties);
  if (!entries.length || entries.some(([, p]) => !plain.includes(p.type ?? ""))) return null;
  const given = payload && typeof payload === "object" ? payload as Record<string, unknown> : {};
  return entries.map(([name, p]) => {
    const type = p.type ?? "string";
    const input = h("input", { name, "aria-label": p.title ?? name, class: "field",
      type: type === "boolean" ? "checkbox" : type === "string" ? "text" : "number",
      step: type === "integer" ? "1" : type === "number" ? "any" : undefined }) as HTMLInputElement;
    // own keys only: a field named `constructor` was pre-filled with Object's source
    const value = Object.prototype.hasOwnProperty.call(given, name) ? given[name] : undefined;
    if (type === "boolean") input.checked = value === true;
    else if (value !== undefined && value !== null && typeof value !== "object") input.value = String(value);
    return { name, type, title: p.title ?? name, required: (sc.required ?? []).includes(name), input };
  });
}

// An integer past 2^53 is rounded by the browser's JSON (9007199254740993 reads 9007199254740992):
// approved from the page, a decision carried another number than the one asked for (an account).
const UNSAFE = "holds an integer beyond what a browser keeps exactly (±2^53): decide with " +
  "`raysaga approve RUN NODE --answer JSON` instead";

function unsafe(value: unknown): boolean {
  if (typeof value === "number") return Number.isInteger(value) && !Number.isSafeInteger(value);
  if (value && typeof value === "object") return Object.values(value as Record<string, unknown>).some(unsafe);
  return false;
}

function readFields(fields: Field[]): Record<string, unknown> | string {
  // no prototype: a field named `__proto__` is the answer's key, not its prototype
  const out = Object.create(null) as Record<string, unknown>;
  for (const f of fields) {
    if (f.type === "boolean") { out[f.name] = f.input.checked; continue; }
    const raw = f.input.value.trim();
    if (!raw) { if (f.required) return `${f.title} is required`; continue; }
    if (f.type === "string") out[f.name] = raw;
    else {
      const n = Number(raw);
      if (!Number.isFinite(n) || (f.type === "integer" && !Number.isInteger(n))) return `${f.title} is not ${f.type === "integer" ? "an integer" : "a number"}`;
      if (Number.isInteger(n) && !Number.isSafeInteger(n)) return `${f.title}: ${UNSAFE}`;
      out[f.name] = n;
    }
  }
  return out;
}

// Built from the node's `approval` (the request whole, in its own key): an output above the
// preview size came as a preview, and a large payload left no Approve/Reject at all.
function approvalForm(runId: string, doc: NodeDoc, request: ApprovalDoc, outputUrl: string,
  done: () => void): HTMLElement {
  const fields = request.answer_schema ? schemaFields(request.answer_schema, request.prefill) : null;
  const answer = h("textarea", { rows: 4, class: "answer", "aria-label": "answer (JSON)" }) as HTMLTextAreaElement;
  const comment = h("input", { class: "comment", placeholder: "comment", "aria-label": "comment" }) as HTMLInputElement;
  const note = h("p", { class: "muted" });
  const act = (verb: "approve" | "reject"): void => {
    let parsed: unknown = undefined;
    if (verb === "approve" && fields) {
      const read = readFields(fields);
      if (typeof read === "string") { note.textContent = read; return; }
      parsed = read;
    } else if (verb === "approve" && request.takes_answer && answer.value.trim()) {
      try { parsed = JSON.parse(answer.value); } catch { note.textContent = "the answer is not JSON"; return; }
      if (unsafe(parsed)) { note.textContent = `the answer: ${UNSAFE}`; return; }
    }
    if (!window.confirm(`${verb} ${doc.node} of run ${runId} as ${actor()}?`)) return;
    void postJSON(`/api/runs/${encodeURIComponent(runId)}/actions/${verb}`, {
      confirm: true, by: actor(), node: doc.node, answer: parsed, comment: comment.value || undefined,
    }).then(() => { note.textContent = verb === "approve" ? "approved" : "rejected"; done(); })
      .catch((e: Error) => { note.textContent = e.message; });
  };
  const answerBox = fields ? h("fieldset", { class: "answer-form" }, h("legend", {}, "answer (edit before approving)"),
    ...fields.map((f) => h("label", {}, `${f.title}${f.required ? " *" : ""}`, f.input)))
    : request.takes_answer ? h("label", {}, "answer (JSON)", answer) : null;
  const held = (v: unknown): unknown => {
    const approval = v && typeof v === "object" ? (v as Record<string, unknown>).approval : undefined;
    return approval && typeof approval === "object" ? (approval as Record<string, unknown>).payload : v;
  };
  const more = (request.approvers_count ?? 0) - (request.approvers?.length ?? 0);
  return section("Waiting for a decision",
    h("p", { class: "prompt" }, request.prompt, request.prompt_size ? ` … (${request.prompt_size} characters)` : ""),
    "value" in request.payload && request.payload.value === null ? null : value(request.payload,
      "value" in request.payload ? null : outputUrl, held),
    request.answer_schema ? h("details", { open: !fields }, h("summary", {}, "the answer's JSON Schema"),
      h("pre", {}, pretty(request.answer_schema))) : request.takes_answer ? h("p", { class: "muted" },
      `the answer's JSON Schema (${request.answer_schema_size} bytes) is too large to show: the store checks the answer against it`) : null,
    request.approvers ? h("p", { class: "muted" }, `may decide: ${request.approvers.join(", ")}`,
      more > 0 ? ` and ${more} more` : "") : null,
    typeof request.timeout_at === "number" ? h("p", { class: "muted" }, `times out ${utc(request.timeout_at)}`) : null,
    answerBox, comment,
    h("div", { class: "buttons" }, h("button", { class: "approve", onclick: () => act("approve") }, "Approve"),
      h("button", { class: "reject", onclick: () => act("reject") }, "Reject")), note);
}

export async function renderPanel(box: HTMLElement, runId: string, label: string, onPick: (l: string) => void,
  reload: () => void, inputs: string[] = []): Promise<void> {
  clear(box);
  box.append(h("p", { class: "muted" }, `loading ${label}…`));
  const base = `/api/runs/${encodeURIComponent(runId)}/nodes/${encodeURIComponent(label)}`;
  let doc: NodeDoc;
  try {
    doc = await getJSON<NodeDoc>(base);
  } catch (e) {
    clear(box);
    box.append(h("p", { class: "error" }, (e as Error).message));
    return;
  }
  clear(box);
  const row = doc.row;
  box.setAttribute("data-node", label);
  box.append(h("div", { class: "panel-head" }, h("h2", {}, label), row ? badge(row.status) : badge("pending"),
    h("button", { class: "close", "aria-label": "close", onclick: () => { box.hidden = true; } }, "×")));
  if (!row) box.append(h("p", { class: "muted" }, "no row yet: this node has not started"));
  else {
    box.append(h("dl", { class: "facts" },
      h("dt", {}, "attempts"), h("dd", {}, String(row.attempt)),
      row.started_at ? h("dt", {}, "started") : null, row.started_at ? h("dd", {}, utc(row.started_at)) : null,
      row.duration !== null ? h("dt", {}, "took") : null, row.duration !== null ? h("dd", {}, secs(row.duration)) : null,
      row.not_before ? h("dt", {}, "next try") : null, row.not_before ? h("dd", {}, utc(row.not_before)) : null,
      row.inherited_from ? h("dt", {}, "inherited from") : null,
      row.inherited_from ? h("dd", {}, h("a", { href: `#/runs/${encodeURIComponent(row.inherited_from)}` },
        row.inherited_from), " (forked: not run again here)") : null));
    if (row.status === "waiting" && doc.approval) box.append(approvalForm(runId, doc, doc.approval, base + "/output",
      reload));
    else if (row.status === "waiting" && doc.approval_error) box.append(h("p", { class: "error" }, doc.approval_error));
  }
  if (inputs.length) {
    // a node's input is its upstream steps' outputs (and the run's input): each a click away
    box.append(section("Inputs", h("p", {}, "from ", ...inputs.flatMap((dep, i) => [i ? ", " : "",
      h("a", { href: "#", class: "input-link", onclick: (ev: Event) => { ev.preventDefault(); onPick(dep); } }, dep)]))));
  }
  if (row?.status !== "waiting")
    box.append(section("Output", value(doc.output, doc.output && !("value" in doc.output) ? base + "/output" : null)));
  const err = errorBlock(doc.error);
  if (err) box.append(section("Error", err));
  if (doc.attempts.length) {
    box.append(section("Attempts and events", h("ol", { class: "attempts" }, ...doc.attempts.map((e) => {
      const data = (e.data ?? {}) as Record<string, unknown>;
      const error = data.error as Record<string, unknown> | undefined;
      return h("li", {}, h("span", { class: "muted" }, utc(e.at)), ` ${e.kind}`,
        data.attempt !== undefined ? ` · attempt ${String(data.attempt)}` : "",
        typeof data.delay === "number" ? ` · retry in ${secs(data.delay)}` : "",
        error ? h("div", { class: "error" }, [error.type, error.message].filter(Boolean).join(": ")) : null);
    }))));
  }
  if (doc.effects.length) {
    box.append(section("Ledger (effects)", ...doc.effects.map((e) => h("div", { class: "ledger-row", "data-key": e.key },
      h("div", {}, badge(e.status), " ", h("strong", {}, e.effect), h("span", { class: "muted" }, ` ${e.node}`)),
      h("div", { class: "mono key" }, e.key), value(e.result, null)))));
  }
  if (doc.compensation.length) {
    box.append(section("Compensation", ...doc.compensation.map((c) => h("p", {}, badge(c.status),
      ` ${c.node} · attempt ${c.attempt} · ${utc(c.finished_at ?? c.started_at)}`))));
  }
  if (doc.turns.length) {
    box.append(section("Agent turns", h("table", { class: "turns" },
      h("thead", {}, h("tr", {}, ...["node", "state", "stop", "in / out", "tools / text"].map((c) =>
        h("th", {}, c)))),
      h("tbody", {}, ...doc.turns.map((t) => {
        const tr = h("tr", { class: "turn" }, h("td", {}, h("a", { href: "#", onclick: (ev: Event) => {
          ev.preventDefault(); onPick(t.node);
        } }, t.node)), h("td", {}, badge(t.status)), h("td", {}, t.stop_reason ?? ""),
        h("td", {}, t.input_tokens != null ? `${t.input_tokens ?? "?"} / ${t.output_tokens ?? "?"}` +
          (typeof t.cost === "number" ? ` · $${t.cost.toFixed(4)}` : "") : ""),
        h("td", {}, (t.tool_uses ?? []).map((u) => u.name).join(", ") || (t.text ?? "").slice(0, 120)));
        return tr;
      })))));
  }
}
