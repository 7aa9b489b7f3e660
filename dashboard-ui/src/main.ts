// The dashboard's entry: a hash router between the run list and a run's page.
import { clear, getJSON, h, postJSON, setSignedIn } from "./dom";
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

// Without users, the *acting as* box: a name the page sends (a label, kept in localStorage).
function actingAs(): void {
  const actor = document.getElementById("actor") as HTMLInputElement | null;
  if (!actor) return;
  actor.value = localStorage.getItem("raysaga-actor") ?? "";
  actor.addEventListener("change", () => localStorage.setItem("raysaga-actor", actor.value));
}

// With users, who is signed in, read-only, in place of the *acting as* box, and a way out.
function signedIn(name: string): void {
  const box = h("span", { class: "actor", id: "signed-in" }, "signed in as ", h("b", { id: "signed-in-name" }, name),
    h("button", { type: "button", id: "sign-out", onclick: () => void signOut() }, "Sign out"));
  document.querySelector(".top .actor")?.replaceWith(box);
}

// With a shared token (--token) signed in by a link (the cookie), a way out beside the *acting
// as* box: a shared browser otherwise stayed signed in until the cookie was deleted by hand.
function tokenSession(): void {
  document.querySelector(".top .actor")?.after(h("span", { class: "actor", id: "token-session" },
    h("button", { type: "button", id: "sign-out", onclick: () => void signOut() }, "Sign out")));
}

// The cookie cleared by the server (POST /api/logout); the page then stops reading (a run's
// stream too) and says how to sign in again.
async function signOut(): Promise<void> {
  try {
    await postJSON("/api/logout", {});
  } catch (e) {
    window.alert(`Could not sign out: ${(e as Error).message}`);
    return;
  }
  leave?.();
  leave = null;
  window.removeEventListener("hashchange", route);
  document.getElementById("signed-in")?.remove();
  document.getElementById("token-session")?.remove();
  const root = document.getElementById("app");
  if (!root) return;
  clear(root);
  root.append(h("p", { id: "signed-out" }, "Signed out. To sign in, open /?token=<your token> in this browser " +
    "(paste the link into the address bar)."));
}

async function start(): Promise<void> {
  let me: string | null = null;
  let session = false;
  try {
    ({ user: me, session } = await getJSON<{ user: string | null; session: boolean }>("/api/me"));
  } catch { /* not read: as without users (an action's refusal then says who is signed in) */ }
  setSignedIn(me);
  if (me !== null) signedIn(me);
  else {
    actingAs();
    if (session) tokenSession();
  }
  window.addEventListener("hashchange", route);
  route();
}

window.addEventListener("error", (ev) => {
  document.getElementById("app")?.prepend(h("p", { class: "error" }, `error: ${ev.message}`));
});
void start();
