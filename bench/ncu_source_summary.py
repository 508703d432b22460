#!/usr/bin/env python3
"""Summarise an `ncu --page source --csv --print-source sass` dump of one kernel.

    python3 bench/ncu_source_summary.py src_ws_tma_sass.csv > summary.txt

Prints the instructions with the most warp-stall samples, and per opcode its share of the samples
and how many warp instructions execute per wgmma (QGMMA / HGMMA / IGMMA): the instruction budget of
a K step, which the full dumps (megabytes) are too large to keep in the repository.
"""
import collections
import csv
import re
import sys


def main(path: str, top: int = 25) -> None:
    rows = list(csv.reader(open(path)))
    kernel = rows[0][1] if rows and len(rows[0]) > 1 else "?"
    header = rows[1]
    data = [r for r in rows[2:] if len(r) == len(header)]
    col = {name: header.index(name) for name in header}
    addr, src = col["Address"], col["Source"]
    samples, executed = col["Warp Stall Sampling (All Samples)"], col["Instructions Executed"]

    def num(r, c):
        return float(r[c] or 0)

    total = sum(num(r, samples) for r in data)
    mma = sum(num(r, executed) for r in data if re.search(r"\b[QHI]GMMA\b", r[src]))
    print(f"kernel: {kernel}")
    print(f"stall samples: {total:.0f}; warp instructions: {sum(num(r, executed) for r in data):.0f}; "
          f"wgmma: {mma:.0f}")
    print(f"\ntop {top} instructions by stall samples (address low bits, % of samples, executed):")
    for r in sorted(data, key=lambda r: -num(r, samples))[:top]:
        print(f"  {r[addr][-5:]} {num(r, samples) / total * 100:5.1f}% {num(r, executed):>11.0f}  "
              f"{r[src].strip()[:90]}")
    share, count = collections.Counter(), collections.Counter()
    for r in data:
        m = re.match(r"\s*(@!?U?P\w+\s+)?([A-Z0-9_]+)", r[src])
        op = m.group(2) if m else "?"
        share[op] += num(r, samples)
        count[op] += num(r, executed)
    print("\nper opcode: % of stall samples, warp instructions executed per wgmma")
    for op, v in share.most_common(30):
        per = count[op] / mma if mma else 0.0
        print(f"  {op:12s} {v / total * 100:5.1f}%  {per:7.2f}")
    print(f"  {'all':12s} {'':5s}   {sum(count.values()) / mma if mma else 0.0:7.2f}")


if __name__ == "__main__":
    main(sys.argv[1])
