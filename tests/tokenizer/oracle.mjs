// Oracle for the C++ tokenizer: runs @huggingface/tokenizers (JS) on a corpus.
// Usage: node oracle.mjs NODE_MODULES TOKENIZER_DIR CORPUS.jsonl OUT.jsonl
// For each corpus string writes {ids, ids_special, decoded, decoded_skip, decoded_clean}:
//   ids          encode(s, add_special_tokens=false)
//   ids_special  encode(s, add_special_tokens=true)
//   decoded      decode(ids_special, skip_special_tokens=false)
//   decoded_skip decode(ids_special, skip_special_tokens=true)
//   decoded_clean decode(ids, skip_special_tokens=false, clean_up_tokenization_spaces=true)
import fs from "node:fs";
import path from "node:path";
import { pathToFileURL } from "node:url";

const [modules, dir, corpus, out] = process.argv.slice(2);
const { Tokenizer } = await import(
  pathToFileURL(path.join(modules, "@huggingface/tokenizers/dist/tokenizers.mjs")).href);
const tj = JSON.parse(fs.readFileSync(path.join(dir, "tokenizer.json"), "utf8"));
const cfgPath = path.join(dir, "tokenizer_config.json");
const cfg = fs.existsSync(cfgPath) ? JSON.parse(fs.readFileSync(cfgPath, "utf8")) : {};
const tok = new Tokenizer(tj, cfg);

const dec = (ids, skip, clean) =>
  ids.length ? tok.decode(ids, { skip_special_tokens: skip, clean_up_tokenization_spaces: clean }) : "";
const lines = fs.readFileSync(corpus, "utf8").split("\n").filter((l) => l.length);
const rows = lines.map((l) => {
  const s = JSON.parse(l);
  const ids = tok.encode(s, { add_special_tokens: false }).ids;
  const ids_special = tok.encode(s, { add_special_tokens: true }).ids;
  return JSON.stringify({
    ids, ids_special,
    decoded: dec(ids_special, false, false),
    decoded_skip: dec(ids_special, true, false),
    decoded_clean: dec(ids, false, true),
  });
});
fs.writeFileSync(out, rows.join("\n") + "\n");
