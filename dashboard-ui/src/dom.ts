// DOM and HTTP helpers. Text always goes in as text (never as HTML): run ids, outputs and errors
// are user data.

export type Child = Node | string | number | null | undefined | false;
export type Attrs = Record<string, string | number | boolean | EventListener | undefined>;

export function h(tag: string, attrs: Attrs = {}, ...children: Child[]): HTMLElement {
  const el = document.createElement(tag);
  setAttrs(el, attrs);
  append(el, children);
  return el;
}

const SVG_NS = "http://www.w3.org/2000/svg";

export function s(tag: string, attrs: Attrs = {}, ...children: Child[]): SVGElement {
  const el = document.createElementNS(SVG_NS, tag);
  setAttrs(el, attrs);
  append(el, children);
  return el;
}

function setAttrs(el: Element, attrs: Attrs): void {
  for (const [k, v] of Object.entries(attrs)) {
    if (v === undefined || v === false) continue;
    if (typeof v === "function") el.addEventListener(k.replace(/^on/, ""), v);
    else el.setAttribute(k, v === true ? "" : String(v));
  }
}

function append(el: Element, children: Child[]): void {
  for (const c of children) {
    if (c === null || c === undefined || c === false) continue;
    el.append(typeof c === "string" || typeof c === "number" ? document.createTextNode(String(c)) : c);
  }
}

export function clear(el: Element): void {
  while (el.firstChild) el.removeChild(el.firstChild);
}

const csrfMeta = (): HTMLMetaElement | null => document.querySelector<HTMLMetaElement>('meta[name="raysaga-csrf"]');
const csrf = (): string => csrfMeta()?.content ?? "";

// fetch() rejects only when no answer came (the server stopped, restarted, or the network
// dropped the request), with the browser's own terse text ("Failed to fetch", "Load failed")
async function reach(url: string, init: RequestInit): Promise<Response> {
  try {
    return await fetch(url, init);
  } catch (e) {
    throw new Error(`Cannot reach the dashboard server (${(e as Error).message}): is \`raysaga dashboard\` still running?`);
  }
}

export async function getJSON<T>(url: string): Promise<T> {
  const r = await reach(url, { credentials: "same-origin", headers: { Accept: "application/json" } });
  if (!r.ok) throw new Error(await errorText(r));
  return (await r.json()) as T;
}

// The CSRF value is the serving process's: a page left open while `raysaga dashboard` restarted
// holds the old one, and its every action was a 403. On that refusal (and only on it: the server
// names it), the page reads the current value (a GET guarded as the page is) and sends once more.
export async function postJSON<T>(url: string, body: unknown): Promise<T> {
  const send = (): Promise<Response> => reach(url, {
    method: "POST",
    credentials: "same-origin",
    headers: { "Content-Type": "application/json", "X-Raysaga-CSRF": csrf() },
    body: JSON.stringify(body),
  });
  let r = await send();
  if (r.status === 403 && r.headers.get("X-Raysaga-Refused") === "csrf") {
    const fresh = await getJSON<{ csrf: string }>("/api/csrf");
    csrfMeta()?.setAttribute("content", fresh.csrf);
    r = await send();
  }
  if (!r.ok) throw new Error(await errorText(r));
  return (await r.json()) as T;
}

async function errorText(r: Response): Promise<string> {
  const text = await r.text();
  try {
    const parsed = JSON.parse(text) as { error?: string; detail?: string };
    return `${r.status}: ${parsed.error ?? parsed.detail ?? text}`;
  } catch {
    return `${r.status}: ${text}`;
  }
}

export function utc(at: number | null | undefined): string {
  if (at === null || at === undefined) return "";
  return new Date(at * 1000).toISOString().replace("T", " ").replace(/\.\d+Z$/, " UTC");
}

export function clock(at: number | null | undefined): string {
  if (at === null || at === undefined) return "";
  return new Date(at * 1000).toISOString().slice(11, 19);
}

export function secs(v: number | null | undefined): string {
  if (v === null || v === undefined) return "";
  if (v < 1) return `${Math.round(v * 1000)}ms`;
  if (v < 120) return `${v.toFixed(1)}s`;
  if (v < 7200) return `${(v / 60).toFixed(1)}m`;
  if (v < 172800) return `${(v / 3600).toFixed(1)}h`;
  return `${(v / 86400).toFixed(1)}d`;
}

export function pretty(value: unknown): string {
  return JSON.stringify(value, null, 2) ?? "null";
}

// With users (`raysaga dashboard --user NAME=TOKEN`), who is signed in: read once from /api/me
// (main.ts). An action is then done as them whatever the page sends, so the page sends and shows
// that name, never the *acting as* box (a page another site signed in as someone else asked to
// "approve ... as dashboard" while the action was recorded as that someone).
let signedIn: string | null = null;

export function setSignedIn(name: string | null): void {
  signedIn = name;
}

/** Who acts: the person signed in; without users, the *acting as* box's name (a label). */
export function actor(): string {
  if (signedIn !== null) return signedIn;
  const input = document.getElementById("actor") as HTMLInputElement | null;
  return (input?.value || "").trim() || "dashboard";
}
