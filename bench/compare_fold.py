#!/usr/bin/env python3
"""The shared experts folded into the routed experts against the separate pass, from two
`moekit bench --json` runs of the same device call (the second with --separate-shared), and the
Triton peer's routed experts where its JSON has the model (the peer runs no shared experts, so
peer/folded compares the peer's routed experts with moekit's whole layer).

    python3 bench/compare_fold.py folded.json separate.json [peer.json] > fold.md
"""
import json
import sys

from compare_peer import print_summary


def main() -> int:
    if len(sys.argv) not in (3, 4):
        print(__doc__)
        return 2
    folded = {(c["model"], c["M"]): c for c in json.load(open(sys.argv[1]))["cases"]}
    separate = {(c["model"], c["M"]): c for c in json.load(open(sys.argv[2]))["cases"]}
    peer = {}
    if len(sys.argv) == 4:
        peer = {(r["model"], r["M"]): r for r in json.load(open(sys.argv[3]))["rows"]
                if r.get("status") == "ok" and r.get("dtype") == "bf16"}
    print("| model | M | separate us | of which shared pass + add | folded us | saved us | "
          "separate/folded | peer routed us | peer/folded |")
    print("|---|---|---|---|---|---|---|---|---|")
    gains = []
    for key, f in folded.items():
        s = separate.get(key)
        if s is None:
            continue
        stages = s.get("stages_us", {})
        shared = sum(stages.get(n, 0.0) for n in ("shared_experts", "shared_add"))
        gain = s["us"] / f["us"]
        gains.append(gain)
        p = peer.get(key)
        p_us = f"{p['us']:.1f}" if p else "-"
        p_ratio = f"{p['us'] / f['us']:.2f}" if p else "-"
        print(f"| {key[0]} | {key[1]} | {s['us']:.1f} | {shared:.1f} | {f['us']:.1f} | "
              f"{s['us'] - f['us']:.1f} | {gain:.2f} | {p_us} | {p_ratio} |")
    print_summary("separate/folded", gains)
    return 0


if __name__ == "__main__":
    sys.exit(main())
