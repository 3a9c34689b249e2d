#!/usr/bin/env python3
"""Renders the tables of a `fathom bench memory --json` results file as
Markdown on stdout: one row per cell (plan, peak, margin, ratio, llama.cpp's
peak), then the summary. Usage: memory_grid_table.py RESULTS.json"""
import json
import statistics
import sys


def mib(b):
    return f"{b / 2**20:.2f} MiB"


def main(path):
    doc = json.load(open(path))
    cells = doc["cells"]
    print("| cell | plan bytes | peak bytes | margin bytes | plan / peak | llama.cpp peak |")
    print("| --- | ---: | ---: | ---: | ---: | ---: |")
    for c in cells:
        llama = (c.get("llama_cpp") or {}).get("peak_bytes")
        llama_text = f"{mib(llama)}" if llama else "–"
        flag = "" if c["covered"] else " **not covered**"
        print(f"| `{c['id']}` | {c['plan_bytes']} ({mib(c['plan_bytes'])}) | {c['peak_bytes']} "
              f"({mib(c['peak_bytes'])}) | {c['margin_bytes']} ({mib(c['margin_bytes'])}) | "
              f"{c['ratio']:.4f}{flag} | {llama_text} |")
    ratios = [c["ratio"] for c in cells]
    uncovered = [c["id"] for c in cells if not c["covered"]]
    loose = [c["id"] for c in cells if not c["tight"]]
    print()
    print(f"{len(cells)} cells; plan / peak min {min(ratios):.4f}, median "
          f"{statistics.median(ratios):.4f}, max {max(ratios):.4f}; "
          f"not covered: {', '.join(uncovered) or 'none'}; "
          f"looser than {doc['tightness']}x: {', '.join(loose) or 'none'}.")
    # How much of the runtime term each cell used: the peak above every
    # other term.
    used = [(c["peak_bytes"] - (c["plan_bytes"] - c["terms"]["runtime"]), c["terms"]["runtime"], c["id"])
            for c in cells]
    lo, hi = min(used), max(used)
    print(f"Peak above weights + converted + KV + activations (what the runtime term must cover): "
          f"{mib(lo[0])} ({lo[2]}, term {mib(lo[1])}) to {mib(hi[0])} ({hi[2]}, term {mib(hi[1])}).")


if __name__ == "__main__":
    main(sys.argv[1])
