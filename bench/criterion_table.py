#!/usr/bin/env python3
"""Turns the criterion samples of `cargo bench --bench decode` into a Markdown table:
min / median / max of the per-iteration time over criterion's samples (10 here), the
throughput at the median, and the ratio of each median to the memcpy median of the same run.

    python3 bench/criterion_table.py [${CARGO_TARGET_DIR:-target}/criterion]
"""

import json
import os
import statistics
import sys

REGION = 64 << 20


def samples(path):
    d = json.load(open(os.path.join(path, "new", "sample.json")))
    return [t / i / 1e6 for t, i in zip(d["times"], d["iters"])]  # ms per iteration


def main():
    root = sys.argv[1] if len(sys.argv) > 1 else os.path.join(os.environ.get("CARGO_TARGET_DIR", "target"), "criterion")
    rows = []
    for group in ["region_64MiB", "floor_1thread_64MiB"]:
        gdir = os.path.join(root, group)
        if not os.path.isdir(gdir):
            continue
        for name in sorted(os.listdir(gdir)):
            p = os.path.join(gdir, name)
            if os.path.exists(os.path.join(p, "new", "sample.json")):
                bench = json.load(open(os.path.join(p, "new", "benchmark.json")))
                rows.append((group, bench.get("function_id", name), samples(p)))
    ref = next((statistics.median(s) for g, n, s in rows if n == "memcpy"), None)
    order = ["memcpy", "memcpy_fresh_alloc", "uncompressed", "zstd", "zstd_sharded", "blosc", "blosc_sharded", "gzip", "gzip_sharded"]
    rows.sort(key=lambda r: (r[0] != "region_64MiB", order.index(r[1]) if r[1] in order else 99))
    print("| bench | ms per 64 MiB: min / median / max | MiB/s at median | median / memcpy median |")
    print("|---|---|---|---|")
    for g, n, s in rows:
        med = statistics.median(s)
        ratio = f"{med / ref:.1f}x" if ref else "n/a"
        print(f"| {g}/{n} | {min(s):.1f} / {med:.1f} / {max(s):.1f} | {REGION / 2**20 / (med / 1000):.0f} | {ratio} |")
    print(f"\n{len(rows[0][2]) if rows else 0} samples per bench (each the mean of that sample's iterations).")


if __name__ == "__main__":
    main()
