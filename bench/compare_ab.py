#!/usr/bin/env python3
"""A/B table of two `moekit bench --json` runs of the same cases (e.g. the commit before and this
one, in the same device call): layer and GEMM times per (model, M) and new / old — below 1 means
the new binary is faster.

    python3 bench/compare_ab.py old.json new.json > ab.md
"""
import json
import sys

from compare_peer import print_summary


def main() -> int:
    if len(sys.argv) != 3:
        print(__doc__)
        return 2
    old = {(c["model"], c["M"]): c for c in json.load(open(sys.argv[1]))["cases"]}
    new = json.load(open(sys.argv[2]))["cases"]
    print("| model | M | old us | new us | new/old | gemm1 old / new | gemm2 old / new | new TFLOP/s |")
    print("|---|---|---|---|---|---|---|---|")
    ratios = []
    for c in new:
        o = old.get((c["model"], c["M"]))
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
