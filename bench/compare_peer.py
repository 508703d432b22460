#!/usr/bin/env python3
"""Side-by-side table of `moekit bench --json` and the Triton peer's JSON from the same device call:
peer us / moekit us per (model, M) — above 1 means moekit is faster. moekit's time excludes its
shared-expert stages when the peer does not run them (deepseek-v3).

    python3 bench/compare_peer.py bench.json peer.json [--dtype bf16] > ratio.md
"""
import json
import statistics
import sys


def print_summary(label: str, ratios: list) -> None:
    """The closing line of a ratio table: min, median and max over the cases (none: nothing)."""
    if ratios:
        print(f"\n{label} over {len(ratios)} cases: min {min(ratios):.2f}, "
              f"median {statistics.median(ratios):.2f}, max {max(ratios):.2f}")


def main() -> int:
    argv = sys.argv[1:]
    dtype = "bf16"
    if "--dtype" in argv:
        i = argv.index("--dtype")
        dtype = argv[i + 1]
        del argv[i:i + 2]
    args = [a for a in argv if not a.startswith("--")]
    if len(args) != 2:
        print(__doc__)
        return 2
    bench = json.load(open(args[0]))
    peer = json.load(open(args[1]))
    rows = {(r["model"], r["M"]): r for r in peer["rows"]
            if r.get("status") == "ok" and r.get("dtype") == dtype}
    print(f"| model | M | moekit us | moekit routed us | TB/s | TFLOP/s | peer us | peer/moekit |")
    print("|---|---|---|---|---|---|---|---|")
    ratios = []
    for c in bench["cases"]:
        p = rows.get((c["model"], c["M"]))
        shared = sum(c.get("stages_us", {}).get(s, 0.0) for s in ("shared_experts", "shared_add"))
        routed = c["us"] - shared
        if p is None:
            print(f"| {c['model']} | {c['M']} | {c['us']:.1f} | {routed:.1f} | {c['tbps']:.2f} | "
                  f"{c['tflops']:.1f} | - | - |")
            continue
        ratio = p["us"] / routed
        ratios.append(ratio)
        print(f"| {c['model']} | {c['M']} | {c['us']:.1f} | {routed:.1f} | {c['tbps']:.2f} | "
              f"{c['tflops']:.1f} | {p['us']:.1f} | {ratio:.2f} |")
    print_summary("peer/moekit", ratios)
    return 0


if __name__ == "__main__":
    sys.exit(main())
