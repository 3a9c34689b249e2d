#!/usr/bin/env python3
"""Renders the tables of a `fathom bench memory --json` results file as
Markdown on stdout: one row per cell (plan, peak, margin, ratio, llama.cpp's
peak), then the summary; for a `--device cuda` file, the device and host
budgets of each cell. Usage: memory_grid_table.py RESULTS.json"""
import json
import statistics
import sys


def mib(b):
    return f"{b / 2**20:.2f} MiB"


def cuda_tables(doc):
    """A CUDA grid: device plan vs NVML peak, host plan vs peak RSS, and
    llama.cpp CUDA's device peak on the same file and context."""
    cells = doc["cells"]
    print("| cell | prompt tokens | device plan | device peak (NVML) | plan / peak | host plan | peak RSS "
          "| plan / peak | allocated while generating | llama.cpp device peak |")
    print("| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |")
    for c in cells:
        llama = (c.get("llama_cpp") or {}).get("device_peak_bytes")
        grown = [r.get("allocated_while_generating_bytes") for r in c.get("child_reports", [])]
        grown = max((g for g in grown if g is not None), default=None)
        flag = "" if c["covered"] and c["tight"] else " **check**"
        peak = c["peak_bytes"] or 0
        print(f"| `{c['id']}` | {c['prompt_tokens']} | {c['plan_bytes']:,} | {peak:,} | "
              f"{c['ratio'] or 0:.4f}{flag} | {c['host_plan_bytes']:,} | {c['host_peak_bytes']:,} | "
              f"{c['host_ratio']:.3f}{'' if c['host_covered'] else ' **not covered**'} | "
              f"{'–' if grown is None else f'{grown:,} B'} | {mib(llama) if llama else '–'} |")
    ratios = [c["ratio"] for c in cells if c["ratio"]]
    bad = [c["id"] for c in cells if not (c["covered"] and c["tight"] and c["host_covered"])]
    print()
    print(f"{len(cells)} cells; device plan / peak min {min(ratios):.4f}, median "
          f"{statistics.median(ratios):.4f}, max {max(ratios):.4f}; device margin "
          f"{mib(min(c['margin_bytes'] for c in cells if c['margin_bytes'] is not None))} to "
          f"{mib(max(c['margin_bytes'] for c in cells if c['margin_bytes'] is not None))}; "
          f"cells failing a check: {', '.join(bad) or 'none'}.")


def main(path):
    doc = json.load(open(path))
    if doc.get("device") == "cuda":
        cuda_tables(doc)
        return
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
