#!/usr/bin/env python3
"""Trains serval's demo model (models/demo): a small Qwen3MoeForCausalLM that answers GSM8K-style.

Everything needed to rebuild it is here: a byte-level BPE tokenizer (Hugging Face `tokenizers`,
4096 tokens, Qwen2 split regex with one digit per token) trained on the GSM8K train set, then a
~12 M parameter MoE model (6 layers, hidden 256, 8 experts, top-2) trained from scratch on the
same set, in three document shapes:
  - few-shot episodes, exactly the eval's format (SPEC §6): shots "Question: {q}\\nAnswer: {a}\\n\\n"
    back to back, a quarter of them starting with the eval's own five shots (the first five train
    items), so that after a 5-shot prompt the model answers and then writes "\\n\\nQuestion";
  - single documents "Question: {q}\\nAnswer: {a}<|endoftext|>";
  - chat documents "<|im_start|>user\\n{q}<|im_end|>\\n<|im_start|>assistant\\n{a}<|im_end|>\\n".
Rows of --seq-len tokens are filled with whole documents (each row starts at a document start, as
a prompt does), and the loss is next-token cross-entropy on every position plus the router's
load-balancing loss. Training runs --steps steps (default 800, about a minute on an H200: 26 M
tokens, ~18 passes over the data; the held-out loss is lowest near there, and 4 minutes of
steps drive it from 1.9 to 4.1 as the model memorizes), or --minutes of wall time instead; the
learning rate follows linear warmup, then a cosine to a tenth of its peak.

Output (a standard Hugging Face folder, weights in bfloat16):
  config.json, generation_config.json (eos [<|endoftext|>, <|im_end|>]), model.safetensors,
  tokenizer.json, tokenizer_config.json (ChatML template), training_log.json (seed, arguments,
  versions, loss curves, samples).
At the end the saved folder is reloaded and greedy answers to a few GSM8K *test* questions are
printed (5-shot, zero-shot and chat).

usage (GPU machine, no network; about 80 s on one H200, 23.7 MB written):
  PYTHONUNBUFFERED=1 python3 tools/train_demo_model.py \\
      --train ../shared/data/gsm8k/train.jsonl --test ../shared/data/gsm8k/test.jsonl \\
      --out models/demo
"""
import argparse
import hashlib
import json
import math
import os
import platform
import random
import sys
import time

from bpe_tokenizer import CHAT_TEMPLATE, train_bpe  # tools/ is on sys.path

EOT_ID, IM_START_ID, IM_END_ID = 0, 1, 2
NUM_EVAL_SHOTS = 5  # the eval's default --num-shots: the first five train items, in file order


def log(msg):
    print(msg, flush=True)


def parse_args():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--train", required=True, help="GSM8K train.jsonl")
    ap.add_argument("--test", required=True, help="GSM8K test.jsonl (samples and test loss only)")
    ap.add_argument("--out", default="models/demo", help="output folder")
    ap.add_argument("--seed", type=int, default=1234)
    ap.add_argument("--vocab-size", type=int, default=4096)
    ap.add_argument("--hidden-size", type=int, default=256)
    ap.add_argument("--num-layers", type=int, default=6)
    ap.add_argument("--num-heads", type=int, default=4)
    ap.add_argument("--num-kv-heads", type=int, default=2)
    ap.add_argument("--head-dim", type=int, default=64)
    ap.add_argument("--num-experts", type=int, default=8)
    ap.add_argument("--experts-per-token", type=int, default=2)
    ap.add_argument("--moe-intermediate-size", type=int, default=256)
    ap.add_argument("--intermediate-size", type=int, default=1024, help="dense MLP (unused: all layers are MoE)")
    ap.add_argument("--max-position-embeddings", type=int, default=4096)
    ap.add_argument("--seq-len", type=int, default=2048, help="tokens per training row")
    ap.add_argument("--batch-size", type=int, default=16, help="rows per step")
    ap.add_argument("--lr", type=float, default=3e-3, help="peak learning rate")
    ap.add_argument("--min-lr-ratio", type=float, default=0.1, help="final lr / peak lr")
    ap.add_argument("--warmup-steps", type=int, default=50)
    ap.add_argument("--weight-decay", type=float, default=0.1)
    ap.add_argument("--grad-clip", type=float, default=1.0)
    ap.add_argument("--router-aux-loss-coef", type=float, default=0.01)
    ap.add_argument("--steps", type=int, default=800,
                    help="training steps (the held-out loss is lowest near 800; more overfit)")
    ap.add_argument("--minutes", type=float, default=0.0,
                    help="train for this long instead of --steps (the schedule follows the clock)")
    ap.add_argument("--log-every", type=int, default=25)
    ap.add_argument("--test-every", type=int, default=100)
    ap.add_argument("--device", default="cuda")
    return ap.parse_args()


def load_jsonl(path):
    items = []
    with open(path, encoding="utf-8") as f:
        for line in f:
            if line.strip():
                item = json.loads(line)
                items.append((item["question"], item["answer"]))
    if not items:
        sys.exit(f"error: {path} holds no GSM8K items")
    return items


def shot_text(q, a):
    return f"Question: {q}\nAnswer: {a}\n\n"


def chat_text(q, a):
    return f"<|im_start|>user\n{q}<|im_end|>\n<|im_start|>assistant\n{a}<|im_end|>\n"


def train_tokenizer(items, vocab_size):
    texts = [shot_text(q, a) for q, a in items] + [chat_text(q, a) for q, a in items[:500]]
    return train_bpe(texts, vocab_size)


class Corpus:
    """Token ids of every train item in each document shape, and a row sampler.

    Pieces are tokenized one item at a time and concatenated; that equals tokenizing the joined
    text because every piece ends at a pre-token boundary ("\\n\\n", a special token) —
    check_concatenation() verifies it on random pairs.
    """

    def __init__(self, tok, items):
        enc = lambda texts: [e.ids for e in tok.encode_batch(texts, add_special_tokens=False)]
        self.shots = enc([shot_text(q, a) for q, a in items])
        self.singles = [ids + [EOT_ID] for ids in enc([f"Question: {q}\nAnswer: {a}" for q, a in items])]
        self.chats = [ids + [EOT_ID] for ids in enc([chat_text(q, a) for q, a in items])]
        self.eval_prefix = [t for ids in self.shots[:NUM_EVAL_SHOTS] for t in ids]

    def document(self, rng):
        r = rng.random()
        n = len(self.shots)
        if r < 0.25:  # the eval's own 5-shot prefix, then 1-3 answered questions
            ids = list(self.eval_prefix)
            for _ in range(rng.randint(1, 3)):
                ids += self.shots[rng.randrange(n)]
            return ids + [EOT_ID]
        if r < 0.55:  # 2-8 random shots back to back
            ids = []
            for _ in range(rng.randint(2, 8)):
                ids += self.shots[rng.randrange(n)]
            return ids + [EOT_ID]
        if r < 0.80:
            return self.singles[rng.randrange(n)]
        return self.chats[rng.randrange(n)]

    def row(self, rng, length):
        """`length` token ids: whole documents from position 0, the last one cut."""
        ids = []
        while len(ids) < length:
            ids += self.document(rng)
        return ids[:length]


def check_concatenation(tok, items, rng, trials=300):
    bad = 0
    for _ in range(trials):
        (q1, a1), (q2, a2) = rng.choice(items), rng.choice(items)
        joined = tok.encode(shot_text(q1, a1) + shot_text(q2, a2) + f"Question: {q1}\nAnswer:",
                            add_special_tokens=False).ids
        parts = (tok.encode(shot_text(q1, a1), add_special_tokens=False).ids +
                 tok.encode(shot_text(q2, a2), add_special_tokens=False).ids +
                 tok.encode(f"Question: {q1}\nAnswer:", add_special_tokens=False).ids)
        bad += joined != parts
    log(f"tokenizer: piecewise == joined encoding on {trials - bad}/{trials} random joins")
    return bad


def make_model(args, vocab_size):
    import torch
    import transformers
    cfg = transformers.Qwen3MoeConfig(
        vocab_size=vocab_size, hidden_size=args.hidden_size, intermediate_size=args.intermediate_size,
        num_hidden_layers=args.num_layers, num_attention_heads=args.num_heads,
        num_key_value_heads=args.num_kv_heads, head_dim=args.head_dim,
        num_experts=args.num_experts, num_experts_per_tok=args.experts_per_token,
        moe_intermediate_size=args.moe_intermediate_size, norm_topk_prob=True, decoder_sparse_step=1,
        mlp_only_layers=[], max_position_embeddings=args.max_position_embeddings, rope_theta=10000.0,
        rms_norm_eps=1e-6, tie_word_embeddings=True, bos_token_id=None, eos_token_id=EOT_ID,
        pad_token_id=EOT_ID, router_aux_loss_coef=args.router_aux_loss_coef, output_router_logits=False,
        use_cache=True)
    try:
        model = transformers.Qwen3MoeForCausalLM._from_config(cfg, attn_implementation="sdpa")
    except Exception as e:  # older/newer API: fall back to the plain constructor
        log(f"note: _from_config(attn_implementation='sdpa') failed ({e}); using the default attention")
        model = transformers.Qwen3MoeForCausalLM(cfg)
    return model.to(dtype=torch.float32)


def lr_at(args, step, progress):
    """Linear warmup over warmup_steps, then cosine from lr to lr*min_lr_ratio as progress 0 -> 1."""
    if step < args.warmup_steps:
        return args.lr * (step + 1) / args.warmup_steps
    p = min(max(progress, 0.0), 1.0)
    lo = args.lr * args.min_lr_ratio
    return lo + 0.5 * (args.lr - lo) * (1.0 + math.cos(math.pi * p))


def forward_loss(model, batch, use_aux):
    """batch: int64 [B, T+1]. Returns (total loss, cross-entropy, aux loss or None)."""
    import torch
    import torch.nn.functional as F
    x, y = batch[:, :-1], batch[:, 1:]
    out = model(input_ids=x, output_router_logits=True) if use_aux else model(input_ids=x)
    logits = out.logits
    ce = F.cross_entropy(logits.reshape(-1, logits.shape[-1]).float(), y.reshape(-1))
    aux = getattr(out, "aux_loss", None) if use_aux else None
    if torch.is_tensor(aux):
        return ce + model.config.router_aux_loss_coef * aux.float(), ce, aux
    return ce, ce, None


def test_loss(model, batches, device):
    import torch
    model.eval()
    total = 0.0
    with torch.no_grad(), torch.autocast("cuda" if device.startswith("cuda") else "cpu", dtype=torch.bfloat16):
        for b in batches:
            total += float(forward_loss(model, b.to(device), use_aux=False)[1])
    model.train()
    return total / len(batches)


def greedy(model, prompt_ids, max_new, device):
    """Greedy continuation (KV cache through generate); stops at <|endoftext|> or <|im_end|>."""
    import torch
    x = torch.tensor([prompt_ids], device=device)
    with torch.no_grad():
        out = model.generate(input_ids=x, attention_mask=torch.ones_like(x), max_new_tokens=max_new,
                             do_sample=False, eos_token_id=[EOT_ID, IM_END_ID], pad_token_id=EOT_ID)
    return out[0, len(prompt_ids):].tolist()


def reload_and_sample(args, tok, corpus, test_items, test_batches, device):
    import torch
    import transformers
    ref = transformers.AutoModelForCausalLM.from_pretrained(args.out, torch_dtype=torch.float32).to(device).eval()
    reload_test = test_loss(ref, test_batches, device)
    log(f"reloaded {args.out}: test loss {reload_test:.4f} (bf16 weights, fp32 math)")
    samples = []
    sample_rng = random.Random(args.seed + 3)
    picks = sample_rng.sample(range(len(test_items)), 6)
    for k, i in enumerate(picks):
        q, a = test_items[i]
        kind = ["5-shot", "5-shot", "5-shot", "zero-shot", "chat", "chat"][k]
        if kind == "5-shot":
            prompt = corpus.eval_prefix + tok.encode(f"Question: {q}\nAnswer:", add_special_tokens=False).ids
        elif kind == "zero-shot":
            prompt = tok.encode(f"Question: {q}\nAnswer:", add_special_tokens=False).ids
        else:
            prompt = tok.encode(f"<|im_start|>user\n{q}<|im_end|>\n<|im_start|>assistant\n",
                                add_special_tokens=False).ids
        text = tok.decode(greedy(ref, prompt, 256, device), skip_special_tokens=False)
        shown = text.split("Question")[0]  # the eval's stop string
        samples.append({"test_index": i, "kind": kind, "question": q, "reference": a, "output": text})
        log(f"\n--- sample {k + 1} ({kind}, test #{i}) ---\nQuestion: {q}\nModel:{shown}\nReference: {a}")
    return samples, reload_test


def write_tokenizer_files(tok, out):
    tok.save(os.path.join(out, "tokenizer.json"))
    with open(os.path.join(out, "tokenizer_config.json"), "w", encoding="utf-8") as f:
        json.dump({"tokenizer_class": "PreTrainedTokenizerFast", "bos_token": None,
                   "eos_token": "<|endoftext|>", "pad_token": "<|endoftext|>", "unk_token": None,
                   "add_bos_token": False, "add_eos_token": False,
                   "clean_up_tokenization_spaces": False, "model_max_length": 4096,
                   "chat_template": CHAT_TEMPLATE}, f, indent=2)
        f.write("\n")


def main():
    args = parse_args()
    t_start = time.time()
    import numpy as np
    import safetensors
    import tokenizers
    import torch
    import transformers

    random.seed(args.seed)
    np.random.seed(args.seed)
    torch.manual_seed(args.seed)
    device = args.device
    if device.startswith("cuda"):
        if not torch.cuda.is_available():
            sys.exit("error: --device cuda but torch sees no GPU")
        torch.backends.cuda.matmul.allow_tf32 = True
        torch.backends.cudnn.allow_tf32 = True
    amp_device = "cuda" if device.startswith("cuda") else "cpu"
    log(f"torch {torch.__version__}, transformers {transformers.__version__}, tokenizers {tokenizers.__version__}, "
        f"device {torch.cuda.get_device_name(0) if amp_device == 'cuda' else 'cpu'}")

    train_items = load_jsonl(args.train)
    test_items = load_jsonl(args.test)
    log(f"data: {len(train_items)} train, {len(test_items)} test items")

    t0 = time.time()
    tok = train_tokenizer(train_items, args.vocab_size)
    vocab = tok.get_vocab_size()
    log(f"tokenizer: {vocab} tokens in {time.time() - t0:.1f} s; "
        f"'Question: 12+345=?' -> {tok.encode('Question: 12+345=?').tokens}")
    concat_mismatches = check_concatenation(tok, train_items, random.Random(args.seed + 1))

    corpus = Corpus(tok, train_items)
    test_corpus = Corpus(tok, test_items)
    n_tok = sum(map(len, corpus.shots))
    log(f"corpus: {n_tok} tokens in the train set as shots ({n_tok / len(corpus.shots):.0f} per item), "
        f"eval 5-shot prefix {len(corpus.eval_prefix)} tokens")
    test_rng = random.Random(args.seed + 2)
    test_batches = [torch.tensor([test_corpus.row(test_rng, args.seq_len + 1) for _ in range(args.batch_size)])
                    for _ in range(2)]

    model = make_model(args, vocab).to(device)
    n_params = sum(p.numel() for p in model.parameters())
    log(f"model: {n_params / 1e6:.2f} M parameters ({n_params * 2 / 1e6:.1f} MB in bf16), "
        f"attention {model.config._attn_implementation}")
    decay = [p for p in model.parameters() if p.dim() >= 2]
    no_decay = [p for p in model.parameters() if p.dim() < 2]
    opt_kw = dict(lr=args.lr, betas=(0.9, 0.95), eps=1e-8)
    groups = [{"params": decay, "weight_decay": args.weight_decay}, {"params": no_decay, "weight_decay": 0.0}]
    try:
        opt = torch.optim.AdamW(groups, fused=amp_device == "cuda", **opt_kw)
    except Exception:
        opt = torch.optim.AdamW(groups, **opt_kw)

    rng = random.Random(args.seed)
    budget_s = args.minutes * 60.0
    use_aux = args.router_aux_loss_coef > 0
    curve, test_curve = [], []
    step, tokens_seen = 0, 0
    model.train()
    t_train = time.time()
    log(f"training: {args.batch_size} x {args.seq_len} tokens per step, "
        + (f"{args.minutes:g} minutes" if args.minutes > 0 else f"{args.steps} steps"))
    while True:
        elapsed = time.time() - t_train
        progress = elapsed / budget_s if args.minutes > 0 else step / args.steps
        if progress >= 1.0:
            break
        lr = lr_at(args, step, progress)
        for g in opt.param_groups:
            g["lr"] = lr
        batch = torch.tensor([corpus.row(rng, args.seq_len + 1) for _ in range(args.batch_size)])
        batch = batch.to(device, non_blocking=True)
        with torch.autocast(amp_device, dtype=torch.bfloat16):
            try:
                loss, ce, aux = forward_loss(model, batch, use_aux)
            except Exception as e:  # a model API without output_router_logits (first step only)
                if not use_aux or step > 0:
                    raise
                log(f"note: router aux loss unavailable ({e}); training without it")
                use_aux = False
                loss, ce, aux = forward_loss(model, batch, use_aux)
        if step == 0 and use_aux and aux is None:
            log("note: the model returned no aux_loss; training without the load-balancing loss")
            use_aux = False
        opt.zero_grad(set_to_none=True)
        loss.backward()
        gnorm = torch.nn.utils.clip_grad_norm_(model.parameters(), args.grad_clip)
        opt.step()
        step += 1
        tokens_seen += args.batch_size * args.seq_len
        if step % args.log_every == 0 or step == 1:
            entry = {"step": step, "tokens": tokens_seen, "elapsed_s": round(time.time() - t_train, 1),
                     "lr": lr, "loss": round(float(ce.detach()), 4), "grad_norm": round(float(gnorm), 3)}
            if aux is not None:
                entry["aux_loss"] = round(float(aux.detach()), 4)
            curve.append(entry)
            log(f"step {step:5d}  loss {entry['loss']:.4f}  lr {lr:.2e}  gnorm {entry['grad_norm']:.2f}"
                + (f"  aux {entry['aux_loss']:.3f}" if aux is not None else "")
                + f"  {tokens_seen / max(time.time() - t_train, 1e-9) / 1e3:.0f}k tok/s  {entry['elapsed_s']:.0f} s")
        if step % args.test_every == 0:
            tl = test_loss(model, test_batches, device)
            test_curve.append({"step": step, "test_loss": round(tl, 4)})
            log(f"step {step:5d}  test loss {tl:.4f}")
    train_s = time.time() - t_train
    final_test = test_loss(model, test_batches, device)
    test_curve.append({"step": step, "test_loss": round(final_test, 4)})
    log(f"trained {step} steps, {tokens_seen / 1e6:.1f} M tokens in {train_s:.0f} s; test loss {final_test:.4f}")

    # Save: bf16 weights (tied embeddings: no lm_head tensor), config, generation config, tokenizer.
    os.makedirs(args.out, exist_ok=True)
    model = model.to(torch.bfloat16).eval()
    model.config.torch_dtype = torch.bfloat16
    model.config.output_router_logits = False
    model.save_pretrained(args.out, safe_serialization=True)
    gen = transformers.GenerationConfig(eos_token_id=[EOT_ID, IM_END_ID])
    gen.save_pretrained(args.out)
    write_tokenizer_files(tok, args.out)

    # Reload what was saved, in fp32 as an engine computes, and answer a few test questions.
    # A failure here still leaves the saved folder and writes the log.
    samples, reload_test = [], float("nan")
    try:
        samples, reload_test = reload_and_sample(args, tok, corpus, test_items, test_batches, device)
    except Exception:
        import traceback
        traceback.print_exc()
        log("warning: reloading or sampling failed; the folder is saved but unchecked")
    try:  # the folder should also load as a standard Hugging Face tokenizer with its chat template
        hf_tok = transformers.AutoTokenizer.from_pretrained(args.out)
        same = hf_tok("Question: 12 apples?\nAnswer:")["input_ids"] == tok.encode(
            "Question: 12 apples?\nAnswer:", add_special_tokens=False).ids
        chat = hf_tok.apply_chat_template([{"role": "user", "content": "Hi"}], tokenize=False,
                                          add_generation_prompt=True)
        log(f"AutoTokenizer: ids match tokenizers: {same}; chat template -> {chat!r}")
    except Exception as e:
        log(f"warning: AutoTokenizer could not load {args.out}: {e}")

    sizes = {f: os.path.getsize(os.path.join(args.out, f)) for f in sorted(os.listdir(args.out))}
    with open(os.path.abspath(__file__), "rb") as f:
        script_sha = hashlib.sha256(f.read()).hexdigest()
    training_log = {
        "script": "tools/train_demo_model.py", "script_sha256": script_sha, "seed": args.seed,
        "args": vars(args), "rebuild": f"python3 tools/train_demo_model.py --train TRAIN --test TEST "
                                       f"--out {args.out} --seed {args.seed} --steps {step}",
        "versions": {"python": platform.python_version(), "torch": torch.__version__,
                     "transformers": transformers.__version__, "tokenizers": tokenizers.__version__,
                     "safetensors": safetensors.__version__},
        "device": torch.cuda.get_device_name(0) if amp_device == "cuda" else "cpu",
        "data": {"train_items": len(train_items), "test_items": len(test_items),
                 "train_tokens_as_shots": n_tok, "eval_prefix_tokens": len(corpus.eval_prefix),
                 "mix": {"eval_prefix_episode": 0.25, "random_episode": 0.30, "single": 0.25, "chat": 0.20},
                 "tokenizer_concat_mismatches": concat_mismatches},
        "model": {"parameters": n_params, "vocab_size": vocab},
        "steps": step, "tokens_seen": tokens_seen, "train_seconds": round(train_s, 1),
        "total_seconds": round(time.time() - t_start, 1), "router_aux_loss": use_aux,
        "final_test_loss": round(final_test, 4), "reloaded_test_loss": None if math.isnan(reload_test) else round(reload_test, 4),
        "loss_curve": curve, "test_loss_curve": test_curve, "samples": samples, "file_sizes": sizes,
    }
    with open(os.path.join(args.out, "training_log.json"), "w", encoding="utf-8") as f:
        json.dump(training_log, f, indent=1)
        f.write("\n")
    total_mb = sum(sizes.values()) / 1e6
    log(f"\nwrote {args.out}: " + ", ".join(f"{k} {v / 1e6:.2f} MB" for k, v in sizes.items())
        + f"; total {total_mb:.1f} MB in {time.time() - t_start:.0f} s")
    if sizes.get("model.safetensors", 0) > 25e6:
        log("warning: model.safetensors is over 25 MB")


if __name__ == "__main__":
    main()
