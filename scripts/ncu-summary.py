#!/usr/bin/env python3
"""Summarizes an Nsight Compute CSV of fathom's kernels: per kernel name, launches, total and mean duration,
share of the profiled time, and mean DRAM throughput as a share of the peak ncu reports; optionally the launches
in order from the first whose name matches (one layer of a step, say).

Record on the GPU machine (kernels serialized, caches flushed between them: a kernel's figure is its own, without
the overlap of programmatic dependent launch or fathom's L2 prefetch):

  ncu --clock-control none --metrics gpu__time_duration.sum,dram__throughput.avg.pct_of_peak_sustained_elapsed \\
      --csv --page raw [--launch-skip N] --launch-count M  fathom bench MODEL --device cuda -p 512 -n 4 -r 1 > k.csv

Usage: scripts/ncu-summary.py k.csv [--from NAME_PREFIX] [--show N] [--top N]
"""
import argparse
import csv
import sys
from collections import defaultdict

DURATION = "gpu__time_duration.sum"
DRAM = "dram__throughput.avg.pct_of_peak_sustained_elapsed"


def number(text):
    """ncu writes thousands separators in its CSV ("20,000")."""
    return float(text.replace(",", ""))


def launches(path):
    """(kernel name, µs, DRAM % or None, grid) per profiled launch, in order."""
    with open(path, newline="") as f:
        lines = f.read().splitlines()
    header = next((i for i, line in enumerate(lines) if line.startswith('"ID"')), None)
    if header is None:
        sys.exit(f"{path}: no ncu CSV header (a line starting with \"ID\"); record with --csv --page raw")
    rows = [r for r in csv.DictReader(lines[header:]) if r.get("ID", "").isdigit()]
    if rows and DURATION not in rows[0]:
        sys.exit(f"{path}: no {DURATION} column; record with --metrics {DURATION},{DRAM}")
    out = []
    for r in rows:
        unit_ns = r.get(DURATION, "")
        dram = r.get(DRAM)
        out.append((r["Kernel Name"], number(unit_ns) / 1000.0, number(dram) if dram else None, r.get("Grid Size", "")))
    return out


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("csv")
    ap.add_argument("--from", dest="start", help="list launches from the first kernel whose name starts so")
    ap.add_argument("--show", type=int, default=0, help="how many launches to list (with --from)")
    ap.add_argument("--top", type=int, default=20, help="kernel names in the summary")
    a = ap.parse_args()
    seq = launches(a.csv)
    if not seq:
        sys.exit(f"{a.csv}: no kernel launches recorded")
    if a.start:
        first = next((i for i, s in enumerate(seq) if s[0].startswith(a.start)), None)
        if first is None:
            sys.exit(f"{a.csv}: no kernel name starts with {a.start!r}")
        for name, us, dram, grid in seq[first:first + a.show]:
            d = f"{dram:6.1f}%" if dram is not None else "      "
            print(f"  {name[:48]:<48} {us:9.2f} us  DRAM {d}  grid {grid}")
    total = sum(s[1] for s in seq)
    agg = defaultdict(lambda: [0, 0.0, 0.0, 0])
    for name, us, dram, _ in seq:
        k = agg[name[:48]]
        k[0] += 1
        k[1] += us
        if dram is not None:
            k[2] += dram
            k[3] += 1
    print(f"{len(seq)} launches, {total:.1f} us in all")
    print(f"{'kernel':<48} {'n':>5} {'total us':>10} {'share':>6} {'mean us':>8} {'DRAM %':>7}")
    for name, (n, us, dram, nd) in sorted(agg.items(), key=lambda kv: -kv[1][1])[: a.top]:
        d = f"{dram / nd:7.1f}" if nd else "      -"
        print(f"{name:<48} {n:>5} {us:>10.1f} {100 * us / total:>5.1f}% {us / n:>8.2f} {d}")


if __name__ == "__main__":
    main()
