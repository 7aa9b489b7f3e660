// The dashboard's entry: a hash router between the run list and a run's page.
import { h } from "./dom";
import { renderList } from "./list";
import { renderRun } from "./run";

let leave: (() => void) | null = null;

function route(): void {
  const root = document.getElementById("app");
  if (!root) return;
  leave?.();
  const [path, query] = location.hash.replace(/^#/, "").split("?", 2);
  const params = new URLSearchParams(query ?? "");
  const run = /^\/runs\/(.+)$/.exec(path ?? "");
  if (run) leave = renderRun(root, decodeURIComponent(run[1]!), params);
  else leave = renderList(root, params);
}

const actor = document.getElementById("actor") as HTMLInputElement | null;
if (actor) {
  actor.value = localStorage.getItem("raysaga-actor") ?? "";
  actor.addEventListener("change", () => localStorage.setItem("raysaga-actor", actor.value));
}
window.addEventListener("hashchange", route);
window.addEventListener("error", (ev) => {
  document.getElementById("app")?.prepend(h("p", { class: "error" }, `error: ${ev.message}`));
});
route();
