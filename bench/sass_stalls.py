#!/usr/bin/env python3
"""Summarizes an Nsight Compute SASS source export (ncu -i REP --page source --csv --print-source
sass, as bench/w4a8_profile.sh writes it): the warp-stall samples per 4 KB region of code, and the
instructions of one address range (offsets from the kernel's first instruction) with the most
samples and their top stall reasons.

    python3 bench/sass_stalls.py ncu_X_sass.csv                  # regions
    python3 bench/sass_stalls.py ncu_X_sass.csv 0x68000 0x6c000  # + that range's top instructions
"""
import collections
import csv
import sys


def load(path):
    rows = list(csv.reader(open(path)))
    header = rows[1]
    col = {h: i for i, h in enumerate(header)}
    stalls = [h for h in header if h.startswith("stall_") and "Not Issued" not in h]
    out = []
    for r in rows[2:]:
        if len(r) < len(header):
            continue
        out.append({
            "addr": int(r[col["Address"]], 16),
            "src": r[col["Source"]].strip(),
            "samples": int(r[col["# Samples"]] or 0),
            "executed": int(r[col["Instructions Executed"]] or 0),
            "stalls": {k[6:]: int(r[col[k]] or 0) for k in stalls},
        })
    base = out[0]["addr"]
    for i in out:
        i["off"] = i["addr"] - base
    return out


def regions(ins):
    total = sum(i["samples"] for i in ins)
    by = collections.defaultdict(lambda: [0, 0, collections.Counter()])
    for i in ins:
        b = by[i["off"] // 0x1000]
        b[0] += i["samples"]
        b[1] += i["executed"]
        b[2].update(i["stalls"])
    print(f"total samples {total}")
    for k in sorted(by):
        s, ex, st = by[k]
        if s < total * 0.005:
            continue
        top = " ".join(f"{n}={v}" for n, v in st.most_common(4))
        print(f"0x{k * 0x1000:06x} samples {s:8d} ({100 * s / total:4.1f}%) executed {ex:11d}  {top}")


def top(ins, lo, hi, n=30):
    sel = [i for i in ins if lo <= i["off"] < hi]
    total = sum(i["samples"] for i in sel)
    reasons = collections.Counter()
    for i in sel:
        reasons.update(i["stalls"])
    print(f"\n0x{lo:x}..0x{hi:x}: samples {total}, warp instructions executed "
          f"{sum(i['executed'] for i in sel)}")
    print(" ".join(f"{k}={100 * v / max(total, 1):.1f}%" for k, v in reasons.most_common(8)))
    for i in sorted(sel, key=lambda i: -i["samples"])[:n]:
        st = " ".join(f"{k}={v}" for k, v in sorted(i["stalls"].items(), key=lambda x: -x[1])[:3])
        print(f"0x{i['off']:06x} {i['samples']:7d} {i['executed']:10d} {i['src'][:62]:62s} {st}")


if __name__ == "__main__":
    ins = load(sys.argv[1])
    regions(ins)
    if len(sys.argv) >= 4:
        top(ins, int(sys.argv[2], 16), int(sys.argv[3], 16))
