// Builds the dashboard's front-end into one folder: index.html, app.js, app.css.
// `node build.mjs OUTDIR` (npm run build writes ../orchestrator/dashboard/static, which is
// committed); with no argument it builds into a temporary folder and fails if that differs
// from the committed build (what .ci/run checks). The build is deterministic: fixed file
// names, no source maps, no timestamps, a pinned esbuild.
import { build } from "esbuild";
import { cpSync, mkdtempSync, readdirSync, readFileSync, rmSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { fileURLToPath } from "node:url";

const here = fileURLToPath(new URL(".", import.meta.url));
const committed = join(here, "..", "orchestrator", "dashboard", "static");
const check = process.argv.length < 3;
const out = check ? mkdtempSync(join(tmpdir(), "raysaga-ui-")) : process.argv[2];

await build({
  entryPoints: [join(here, "src", "main.ts")],
  bundle: true,
  minify: true,
  format: "iife",
  target: ["es2020"],
  outfile: join(out, "app.js"),
  legalComments: "eof",
  sourcemap: false,
  charset: "utf8",
  logLevel: "warning",
});
cpSync(join(here, "src", "index.html"), join(out, "index.html"));
cpSync(join(here, "src", "app.css"), join(out, "app.css"));

if (check) {
  const names = (dir) => readdirSync(dir).filter((n) => !n.startsWith(".")).sort();
  const stale = [];
  const built = names(out);
  let have = [];
  try { have = names(committed); } catch { /* no committed build */ }
  for (const name of new Set([...built, ...have])) {
    const a = built.includes(name) ? readFileSync(join(out, name)) : null;
    const b = have.includes(name) ? readFileSync(join(committed, name)) : null;
    if (a === null || b === null || !a.equals(b)) stale.push(name);
  }
  rmSync(out, { recursive: true, force: true });
  if (stale.length) {
    console.error(`the committed dashboard build is stale (${stale.join(", ")}): run \`npm run build\` in dashboard-ui/ and commit orchestrator/dashboard/static`);
    process.exit(1);
  }
  console.log("the committed dashboard build matches its sources");
}
