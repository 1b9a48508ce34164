// Writes a deterministic tokenizer test corpus, one JSON string per line.
// Usage: node gen_corpus.mjs OUT.jsonl [SEED] [GSM8K_JSONL]
// Mixes English, code, numbers of many lengths, whitespace runs, tabs, CRLF,
// emoji/ZWJ, CJK, Arabic, combining marks and special-token text in prose;
// appends the first 300 GSM8K questions when the file is given and exists.
import fs from "node:fs";

const [out, seedArg, gsm8k] = process.argv.slice(2);
if (!out) {
  console.error("usage: node gen_corpus.mjs OUT.jsonl [SEED] [GSM8K_JSONL]");
  process.exit(2);
}
let state = Number(seedArg ?? 1234) >>> 0;
const rand = () => {  // mulberry32
  state = (state + 0x6d2b79f5) >>> 0;
  let t = state;
  t = Math.imul(t ^ (t >>> 15), t | 1);
  t ^= t + Math.imul(t ^ (t >>> 7), t | 61);
  return ((t ^ (t >>> 14)) >>> 0) / 4294967296;
};
const int = (n) => Math.floor(rand() * n);
const pick = (a) => a[int(a.length)];

const words = ("the quick brown fox jumps over lazy dog I'm you're we've they'll she'd it's don't " +
  "HELLO World Tokenizer tokenization unbelievable antidisestablishmentarianism résumé naïve " +
  "café coöperate Straße İstanbul ﬁnance ｆｕｌｌｗｉｄｔｈ ½ ² x² ℌ Ω Å Ǆ ǅ").split(" ");
const code = [
  "def f(x):\n    return x * 2\n",
  "for (int i = 0; i < n; ++i) {\n\tsum += a[i];\n}",
  "const y = await fetch(`/api/${id}`);",
  "#include <vector>\nint main() { return 0; }\r\n",
  "if x != None and y >= 3:\n        print('ok')  # comment",
  "SELECT * FROM users WHERE id = 42;",
  "<div class=\"a\">&nbsp;</div>",
  "λx.λy.x y  // lambda",
  "fn main() { println!(\"{}\", 1_000_000u64); }",
];
const scripts = [
  "你好，世界！今天天气很好。", "日本語のテキストです。カタカナ", "한국어 문장입니다",
  "مرحبا بالعالم، كيف حالك؟", "שלום עולם", "Привет, мир! Ёжик", "Γειά σου Κόσμε",
  "नमस्ते दुनिया", "สวัสดีชาวโลก", "Tiếng Việt có dấu",
];
const emoji = [
  "👍", "😀😃😄", "👨‍👩‍👧‍👦", "🏳️‍🌈", "👩🏽‍💻", "🇺🇸🇯🇵", "❤️", "🤖 robot", "1️⃣", "🧑‍🤝‍🧑",
];
const combining = ["e\u0301", "a\u0308\u0323", "n\u0303", "\u0041\u030A", "Z\u0336\u0337",
                   "\u1100\u1161\u11A8", "\u0915\u094D\u0937"];
const specials = ["<|im_start|>", "<|im_end|>", "<|endoftext|>", "<s>", "</s>", "<unk>",
                  "<|begin_of_text|>", "<|eot_id|>", "<|start_header_id|>", "<think>",
                  "</think>", "<tool_call>", "<|im_start", "im_end|>", "< s>", "<0x41>"];
const spaces = [" ", "  ", "   ", "\t", "\t\t", "\n", "\n\n", "\r\n", "\r\n\r\n", " \n ",
                "\u00A0", "\u3000", "\u2009", "\u200B", "\u180E", "\u0085", "\uFEFF", "    \n"];

const number = () => {
  const len = 1 + int(pick([3, 6, 12, 25]));
  let s = String(1 + int(9));
  for (let i = 1; i < len; ++i) s += String(int(10));
  const r = rand();
  if (r < 0.15) return s.replace(/\B(?=(\d{3})+(?!\d))/g, ",");
  if (r < 0.3) return s + "." + String(int(1000));
  if (r < 0.4) return "-" + s;
  if (r < 0.45) return "٣٤٥" + s;  // Arabic-Indic digits
  return s;
};

const piece = () => {
  const r = rand();
  if (r < 0.35) return pick(words);
  if (r < 0.45) return number();
  if (r < 0.55) return pick(scripts);
  if (r < 0.62) return pick(emoji);
  if (r < 0.68) return pick(combining);
  if (r < 0.76) return pick(specials);
  if (r < 0.82) return pick(code);
  if (r < 0.9) return pick(spaces);
  return pick([".", ",", "!", "?", "...", "'", "\"", "(", ")", "--", "—", "$", "%", "'s", "'LL"]);
};

const lines = [];
// Fixed edge cases first.
lines.push("", " ", "  ", "\n", "\t", "a", "Hello world", " Hello", "Hello ", "hello   world",
           "1", "12", "123", "1234", "12345", "123456789", "3.14159", "1,000,000",
           "line1\r\nline2\r\n", "tab\tseparated\tvalues", "<|im_start|>user\nHi<|im_end|>",
           "<s>Hello</s>", "a<|endoftext|>b", "<|endoftext|><|endoftext|>", "  <s>  ",
           "👨‍👩‍👧‍👦", "e\u0301", "é", "ǅ", "ﬁ", "I'm don't THEY'LL", "x\u180Ey", "a\u0085b",
           "\uFEFFbom");
for (const s of specials) lines.push(s, ` ${s} `, `text${s}text`);
for (const d of ["1", "12", "123", "1234", "12345", "123456", "1234567"]) lines.push(d, ` ${d}`, `a${d}b`);
while (lines.length < 1800) {
  const n = 1 + int(rand() < 0.8 ? 12 : 60);
  let s = "";
  for (let i = 0; i < n; ++i) {
    s += piece();
    if (rand() < 0.7) s += " ";
  }
  lines.push(s);
}
// Paragraph-sized prose.
while (lines.length < 2000) {
  let s = "";
  for (let i = 0; i < 200; ++i) s += pick(words) + (rand() < 0.1 ? ". " : " ");
  lines.push(s);
}
if (gsm8k && fs.existsSync(gsm8k)) {
  const qs = fs.readFileSync(gsm8k, "utf8").split("\n").filter((l) => l.trim()).slice(0, 300);
  for (const q of qs) lines.push(JSON.parse(q).question);
}
fs.writeFileSync(out, lines.map((l) => JSON.stringify(l)).join("\n") + "\n");
