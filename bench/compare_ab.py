#!/usr/bin/env python3
"""A/B table of `moekit bench --json` runs of the same cases (e.g. the commit before and this
one, in the same device call): layer and GEMM times per (model, M) and new / old — below 1 means
the new binary is faster.

    python3 bench/compare_ab.py old.json new.json > ab.md
    python3 bench/compare_ab.py old1.json,old2.json new1.json,new2.json > ab.md

Each side may name several runs of one binary (comma-separated; best run interleaved with the
other side's, old, new, old, new): a case's layer time and each stage's time are then the fastest
of its runs, which takes out most of a GPU's clock drift between runs (the H100s' boost clocks
moved single runs by up to ~10%).
"""
import json
import sys

from compare_peer import print_summary


def fastest(paths: str) -> tuple[dict, int]:
    """The cases of the comma-separated runs, each (model, M) at its fastest layer and stage
    times; and how many runs there were."""
    best: dict = {}
    files = paths.split(",")
    for path in files:
        for c in json.load(open(path))["cases"]:
            key = (c["model"], c["M"])
            if key not in best:
                best[key] = dict(c, stages_us=dict(c["stages_us"]))
                continue
            b = best[key]
            if c["us"] < b["us"]:
                b["us"], b["tflops"] = c["us"], c["tflops"]
            for s, us in c["stages_us"].items():
                b["stages_us"][s] = min(us, b["stages_us"].get(s, us))
    return best, len(files)


def main() -> int:
    if len(sys.argv) != 3:
        print(__doc__)
        return 2
    old, n_old = fastest(sys.argv[1])
    new, n_new = fastest(sys.argv[2])
    if n_old > 1 or n_new > 1:
        print(f"fastest of {n_old} old and {n_new} new runs per case\n")
    print("| model | M | old us | new us | new/old | gemm1 old / new | gemm2 old / new | new TFLOP/s |")
    print("|---|---|---|---|---|---|---|---|")
    ratios = []
    for key, c in new.items():
        o = old.get(key)
        if o is None:
            continue
        ratio = c["us"] / o["us"]
        ratios.append(ratio)
        g = [f"{o['stages_us'].get(s, 0):.1f} / {c['stages_us'].get(s, 0):.1f}"
             for s in ("gemm1", "gemm2")]
        print(f"| {c['model']} | {c['M']} | {o['us']:.1f} | {c['us']:.1f} | {ratio:.3f} | "
              f"{g[0]} | {g[1]} | {c['tflops']:.1f} |")
    print_summary("new/old", ratios)
    return 0


if __name__ == "__main__":
    sys.exit(main())
