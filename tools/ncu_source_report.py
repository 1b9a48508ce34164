#!/usr/bin/env python3
"""Summarize the per-instruction source page of an ncu report (tools/ncu-kernel.sh's NAME-source.csv).

    python3 tools/ncu_source_report.py NAME-source.csv [--top K] [--loops L]

Prints three things, each weighted by what the SASS actually did:
  - the stall reasons over all warp-state samples (% of the samples);
  - the K instructions with the most samples, each with its execution count and its two largest
    stall reasons;
  - the instruction mix of the L innermost loops with the most samples: a loop is a backward branch
    that runs more often than the kernel's first instruction (once per launched warp) and its
    target; per loop, the instructions per pass by opcode (executions / the closing branch's, so
    a conditional block inside counts at its frequency) and the share of the samples.
That is how one reads, e.g., that a decode attention tile loop costs ~458 instructions per warp and
tile, of which 65 are fp8 conversions (bench/RESULTS.md, 2026-12-04).
"""
import argparse
import collections
import csv
import sys


def load(path):
    with open(path, newline="") as f:
        rows = list(csv.reader(f))
    # The first row names the kernel; the second is the header.
    header_at = next(i for i, r in enumerate(rows) if "Address" in r and "Source" in r)
    header = rows[header_at]
    name_row = rows[header_at - 1] if header_at else []
    named = [cell for cell in name_row if cell]  # "Kernel Name", then the name
    kernel = named[-1] if len(named) > 1 else ""
    # With several profiled launches the page repeats per launch: keep the first.
    data = rows[header_at + 1 :]
    end = next((i for i, r in enumerate(data) if r and r[0] == "Kernel Name"), len(data))
    return kernel, header, data[:end]


def number(text):
    try:
        return float(text)
    except ValueError:
        return 0.0


def opcode(source):
    tokens = source.split()
    if not tokens:
        return "?"
    op = tokens[1] if tokens[0].startswith("@") and len(tokens) > 1 else tokens[0]
    return op.split(".")[0]


def find_loops(addresses, sources, execs):
    """(first, last + 1) instruction indices of the innermost loops that iterate: a backward branch
    executed more often than the kernel's first instruction (once per warp), with its target."""
    where = {a: i for i, a in enumerate(addresses)}
    found = []
    for i, text in enumerate(sources):
        tokens = text.replace(",", " ").split()
        if "BRA" not in [t.split(".")[0] for t in tokens[:2]] or execs[i] <= execs[0]:
            continue
        try:
            target = int(tokens[-1], 16)
        except ValueError:
            continue
        if target in where and where[target] <= i:
            found.append((where[target], i + 1))
    loops = []
    for a, b in sorted(found, key=lambda ab: ab[1] - ab[0]):  # innermost first
        if all(b <= c or a >= d for c, d in loops):
            loops.append((a, b))
    return loops


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("csv")
    ap.add_argument("--top", type=int, default=15)
    ap.add_argument("--loops", type=int, default=2)
    args = ap.parse_args()
    kernel, header, data = load(args.csv)
    col = {name: i for i, name in enumerate(header)}
    for need in ("Address", "Source", "Warp Stall Sampling (All Samples)", "Instructions Executed"):
        if need not in col:
            sys.exit(f"ncu_source_report: {args.csv} has no column '{need}' (ncu --page source --csv)")
    src, smp, exe = col["Source"], col["Warp Stall Sampling (All Samples)"], col["Instructions Executed"]
    stall_cols = [i for i, h in enumerate(header) if h.startswith("stall_") and "Not Issued" not in h]
    samples = [number(r[smp]) for r in data]
    execs = [number(r[exe]) for r in data]
    addresses = [int(r[col["Address"]], 16) if r[col["Address"]] else -1 for r in data]
    total = sum(samples) or 1.0
    if kernel:
        print(kernel[:160])
    print(f"{int(total)} samples, {int(sum(execs))} warp instructions executed")
  
    reasons = collections.Counter()
    for r in data:
        for i in stall_cols:
            reasons[header[i]] += number(r[i])
    print("\nstall reasons (% of samples): " + ", ".join(
        f"{name[6:]} {100 * v / total:.1f}" for name, v in reasons.most_common(8) if v > 0))

    print(f"\ntop {args.top} instructions by samples:")
    for i in sorted(range(len(data)), key=lambda i: -samples[i])[: args.top]:
        top2 = sorted(((number(data[i][c]), header[c][6:]) for c in stall_cols), reverse=True)[:2]
        why = ", ".join(f"{name} {int(v)}" for v, name in top2 if v > 0)
        print(f"  {100 * samples[i] / total:5.1f} %  exec {int(execs[i]):>8}  "
              f"{data[i][src].strip()[:60]:60}  {why}")

    # A loop's passes: its closing branch's executions; per warp: over the entry's (the first
    # instruction runs once per warp).
    entry = execs[0] or 1.0
    loops = find_loops(addresses, [r[src] for r in data], execs)
    loops = sorted(loops, key=lambda ab: -sum(samples[ab[0]:ab[1]]))
    for a, b in loops[: args.loops]:
        passes = execs[b - 1] or 1.0
        mix = collections.Counter()
        for i in range(a, b):
            mix[opcode(data[i][src])] += execs[i] / passes
        share = 100 * sum(samples[a:b]) / total
        print(f"\nloop of {b - a} static instructions ({share:.1f} % of the samples, "
              f"{passes / entry:.1f} passes per launched warp): {sum(mix.values()):.0f} instructions per pass")
        print("  " + ", ".join(f"{op} {n:.1f}" for op, n in mix.most_common(16)))


if __name__ == "__main__":
    main()
