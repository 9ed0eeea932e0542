"""Sums `ncu --csv --metrics gpu__time_duration.sum` rows by kernel and grid.

  python3 tools/gpu/ncu_agg.py NCU.csv [ROWS]

Prints the total, then one line a (kernel, grid): total us, launches, us a
launch, most time first. Kernels are profiled one at a time with ncu's
cache control (cold L2), so the sum is more than a graph replay takes; the
ranking is what it is for.
"""
import collections
import csv
import re
import sys

SCALE = {"nsecond": 1e-3, "ns": 1e-3, "usecond": 1.0, "us": 1.0, "msecond": 1e3, "ms": 1e3, "second": 1e6}


def main():
    rows = list(csv.reader(open(sys.argv[1], newline="")))
    top = int(sys.argv[2]) if len(sys.argv) > 2 else 40
    hdr = None
    agg = collections.OrderedDict()
    for r in rows:
        if "Kernel Name" in r and "Metric Value" in r:
            hdr = r
            continue
        if hdr is None or len(r) != len(hdr):
            continue
        d = dict(zip(hdr, r))
        if d.get("Metric Name") != "gpu__time_duration.sum":
            continue
        unit = d.get("Metric Unit", "")
        if unit not in SCALE:
            sys.exit(f"ncu_agg: unknown unit {unit!r}")
        us = float(d["Metric Value"].replace(",", "")) * SCALE[unit]
        key = (re.sub(r"\(.*", "", d["Kernel Name"])[:70], d.get("Grid Size", ""))
        n, total = agg.get(key, (0, 0.0))
        agg[key] = (n + 1, total + us)
    total = sum(t for _, t in agg.values())
    print(f"total {total:.1f} us over {sum(n for n, _ in agg.values())} kernels")
    for (name, grid), (n, t) in sorted(agg.items(), key=lambda kv: -kv[1][1])[:top]:
        print(f"{t:10.1f} us {n:6d} x {t / n:8.2f} us  {name} {grid}")


if __name__ == "__main__":
    main()
