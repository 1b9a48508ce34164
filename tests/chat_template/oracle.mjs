// Renders chat-template cases with @huggingface/jinja (what transformers.js uses).
// Usage: node oracle.mjs CASES.json  (NODE_PATH-independent: the package is resolved
// from tests/npm/node_modules next to this folder).
// Input: JSON array of {"template": str, "context": {...}}.
// Output: JSON array of {"ok": true, "out": str} or {"ok": false, "error": str}.
import { readFileSync } from "node:fs";
import { dirname, join } from "node:path";
import { fileURLToPath, pathToFileURL } from "node:url";

const here = dirname(fileURLToPath(import.meta.url));
const pkg = join(here, "..", "npm", "node_modules", "@huggingface", "jinja", "dist", "index.js");
const { Template } = await import(pathToFileURL(pkg).href);

const cases = JSON.parse(readFileSync(process.argv[2], "utf8"));
const results = cases.map((c) => {
  try {
    return { ok: true, out: new Template(c.template).render(c.context) };
  } catch (e) {
    return { ok: false, error: String(e && e.message ? e.message : e) };
  }
});
process.stdout.write(JSON.stringify(results));
