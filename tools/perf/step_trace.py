#!/usr/bin/env python3
"""Sums a dpl-server step trace (DPL_TRACE_STEPS=FILE; columns in
runtime/server/scheduler.h, SchedulerOptions::trace): where a load's wall
time went, engine calls by kind (decode only, prompts only, both) and the
scheduler's gaps between them, and the decode-only calls' time by rows.

  python3 tools/perf/step_trace.py TRACE [--from-ms T]

--from-ms skips the calls that start before T (a warm-up request)."""
import statistics
import sys


def main(argv):
    if len(argv) < 2:
        print(__doc__, file=sys.stderr)
        return 1
    start = 0.0
    if "--from-ms" in argv:
        start = float(argv[argv.index("--from-ms") + 1])
    rows = []
    with open(argv[1]) as f:
        header = f.readline().split()
        for line in f:
            v = dict(zip(header, (float(x) for x in line.split())))
            if v["t_ms"] >= start:
                rows.append(v)
    if not rows:
        print("no engine calls")
        return 1
    wall = rows[-1]["t_ms"] + rows[-1]["engine_ms"] - rows[0]["t_ms"]
    gaps = sum(r["gap_ms"] for r in rows[1:])
    kinds = {}
    for r in rows:
        k = ("decode+prompt" if r["decode_rows"] and r["prompt_tokens"]
             else "prompt" if r["prompt_tokens"] else "decode")
        n, ms, toks, dec = kinds.get(k, (0, 0.0, 0, 0))
        kinds[k] = (n + 1, ms + r["engine_ms"], toks + r["prompt_tokens"], dec + r["decode_rows"])
    print(f"{len(rows)} engine calls over {wall:.1f} ms: engine {sum(r['engine_ms'] for r in rows):.1f} ms, "
          f"gaps between calls {gaps:.1f} ms (median {statistics.median(r['gap_ms'] for r in rows[1:] or rows):.3f})")
    for k, (n, ms, toks, dec) in sorted(kinds.items()):
        print(f"  {k:14s} {n:5d} calls {ms:9.1f} ms  prompt tokens {int(toks):7d}  decode rows {int(dec):7d}")
    by_rows = {}
    for r in rows:
        if r["decode_rows"] and not r["prompt_tokens"]:
            by_rows.setdefault(int(r["decode_rows"]), []).append(r["engine_ms"])
    print("  decode-only calls by rows: rows calls median_ms (gap median_ms)")
    gap_by_rows = {}
    for r in rows[1:]:
        if r["decode_rows"] and not r["prompt_tokens"]:
            gap_by_rows.setdefault(int(r["decode_rows"]), []).append(r["gap_ms"])
    for n in sorted(by_rows):
        g = gap_by_rows.get(n)
        print(f"    {n:4d} {len(by_rows[n]):5d} {statistics.median(by_rows[n]):8.3f}"
              f"  ({statistics.median(g):.3f})" if g else f"    {n:4d} {len(by_rows[n]):5d} {statistics.median(by_rows[n]):8.3f}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
