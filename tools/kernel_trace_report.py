#!/usr/bin/env python3
"""Summarize a kernel trace (tools/kernel-trace.sh) of CUDA-graph decode steps.

    python3 tools/kernel_trace_report.py TRACE.csv [--steps N] [--show K] [--layers]

Takes the last N graph replays (a replay = the kernels of one graph launch, told apart by
graph_id and by gaps), and for each kernel name reports, averaged over its calls in those
replays: its cost (its end minus the previous kernel's end: what it adds to the step), its
start lead (the previous kernel's end minus its own start: > 0 when PDL let it start early) and
its duration. --show K prints the first K kernels of the last replay one by one. --layers finds
the repeating per-layer sequence of kernels and reports the same figures by position in the layer
(so that, e.g., the q/k/v, o, gate_up and down GEMVs, one kernel name, are told apart).
"""
import argparse
import collections
import itertools
import re
import subprocess
import sys


def short_name(mangled, cache={}):
    if mangled not in cache:
        try:
            d = subprocess.run(["c++filt"], input=mangled, capture_output=True, text=True).stdout
            d = d.strip() or mangled
        except OSError:
            d = mangled
        d = re.sub(r"serval::kernels::cuda::", "", d)
        d = re.sub(r"\(anonymous namespace\)::", "", d)
        d = re.sub(r"\(.*\)$", "", d)  # parameter list
        cache[mangled] = d[:70]
    return cache[mangled]


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("trace")
    ap.add_argument("--steps", type=int, default=8)
    ap.add_argument("--show", type=int, default=0)
    ap.add_argument("--layers", action="store_true")
    a = ap.parse_args()
    rows = []
    with open(a.trace) as f:
        next(f)  # header
        for line in f:
            # The name is last and may hold commas (demangled template arguments).
            start, end, graph, _node, grid, block, name = line.rstrip("\n").split(",", 6)
            rows.append((int(start), int(end), int(graph), grid, block, name))
    rows.sort()
    graph_rows = [r for r in rows if r[2] != 0]
    if not graph_rows:
        sys.exit("no graph-launched kernels in the trace")
    # Split into replays: a new replay starts when the graph id changes or after a 20 µs gap.
    replays, cur, cur_end = [], [], 0
    for r in graph_rows:
        if cur and (r[2] != cur[-1][2] or r[0] - cur_end > 20000):
            replays.append(cur)
            cur, cur_end = [], 0
        cur.append(r)
        cur_end = max(cur_end, r[1])
    replays.append(cur)
    # The most common graph (the decode bucket being measured), last N replays of it.
    common = collections.Counter(rp[0][2] for rp in replays).most_common(1)[0][0]
    sel = [rp for rp in replays if rp[0][2] == common][-a.steps:]
    stats = collections.OrderedDict()
    for rp in sel:
        prev_end = None
        for s, e, g, grid, block, name in rp:
            key = short_name(name)
            st = stats.setdefault(key, [0, 0.0, 0.0, 0.0, grid, block])
            st[0] += 1
            if prev_end is not None:
                st[1] += (e - prev_end) / 1000.0
                st[2] += (prev_end - s) / 1000.0
            st[3] += (e - s) / 1000.0
            prev_end = max(prev_end or 0, e)
    step_us = [(max(x[1] for x in rp) - rp[0][0]) / 1000.0 for rp in sel]
    print(f"{len(sel)} replays of graph {common}, {len(sel[-1])} kernels each; step "
          f"{sum(step_us) / len(step_us):.1f} µs (first start to last end)")
    print(f"{'kernel':70s} {'calls':>6s} {'cost µs':>8s} {'lead µs':>8s} {'dur µs':>8s} "
          f"{'total µs':>9s}  grid / block")
    n = len(sel)
    for key, (calls, cost, lead, dur, grid, block) in sorted(stats.items(),
                                                            key=lambda kv: -kv[1][1]):
        c = max(calls, 1)
        print(f"{key:70s} {calls / n:6.1f} {cost / c:8.2f} {lead / c:8.2f} {dur / c:8.2f} "
              f"{cost / n:9.1f}  {grid} / {block}")
    if a.layers:
        report_layers(sel)
    if a.show:
        print(f"\nfirst {a.show} kernels of the last replay (µs from its start):")
        rp = sel[-1]
        t0, prev_end = rp[0][0], None
        for s, e, g, grid, block, name in rp[:a.show]:
            cost = "" if prev_end is None else f"cost {(e - prev_end) / 1000:7.2f}"
            print(f"  {(s - t0) / 1000:9.2f} .. {(e - t0) / 1000:9.2f}  {cost:13s} "
                  f"{short_name(name)}")
            prev_end = max(prev_end or 0, e)


def find_period(names):
    """(period, offset, layers) of the longest run of a repeating kernel-name sequence."""
    best = (0, 0, 0)
    for period in range(2, 40):
        for offset in range(0, 3 * period):
            n = 0
            while offset + (n + 2) * period <= len(names) and \
                    names[offset + n * period:offset + (n + 1) * period] == \
                    names[offset + (n + 1) * period:offset + (n + 2) * period]:
                n += 1
            layers = n + 1 if n > 0 else 0
            if layers * period > best[2] * best[0] or (layers * period == best[2] * best[0]
                                                      and period < best[0]):
                best = (period, offset, layers)
    return best


def report_layers(replays):
    names = [r[5] for r in replays[-1]]
    period, offset, layers = find_period(names)
    if layers < 2:
        print("\nno repeating layer sequence found")
        return
    print(f"\nper layer: {period} kernels repeating {layers} times from kernel {offset} "
          f"(averaged over {len(replays)} replays × {layers} layers)")
    print(f"{'#':>3s} {'kernel':70s} {'cost µs':>8s} {'lead µs':>8s} {'dur µs':>8s}  grid / block")
    # done[i]: the latest end among a replay's kernels 0..i.
    done_by = [list(itertools.accumulate((r[1] for r in rp), max)) for rp in replays]
    total = 0.0
    for pos in range(period):
        cost = lead = dur = 0.0
        count = 0
        for rp, done in zip(replays, done_by):
            for layer in range(layers):
                i = offset + layer * period + pos
                if i == 0 or i >= len(rp):
                    continue
                prev_end = done[i - 1]
                s, e = rp[i][0], rp[i][1]
                cost += (e - prev_end) / 1000.0
                lead += (prev_end - s) / 1000.0
                dur += (e - s) / 1000.0
                count += 1
        r = replays[-1][offset + pos]
        c = max(count, 1)
        total += cost / c
        print(f"{pos:3d} {short_name(r[5]):70s} {cost / c:8.2f} {lead / c:8.2f} {dur / c:8.2f}  "
              f"{r[3]} / {r[4]}")
    print(f"    {'layer total':70s} {total:8.2f}")


if __name__ == "__main__":
    main()
