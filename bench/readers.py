#!/usr/bin/env python3
"""In-process reference readers for the slice benchmarks: tensorstore and zarr-python reading a
region of a local Zarr array, timed per run. Prints one line per run: the seconds it took.

    python bench/readers.py --reader ts|zarr --array PATH --select 2048:6144,2048:6144 \
        --mode cold|warm [--runs 5] [--drop-caches] [--serve]

cold: every run opens the array anew (metadata read included, like zarrgate after a restart),
      with tensorstore's default context (no chunk cache) and, with --drop-caches, the page
      cache dropped first (needs root).
warm: the array is opened once and read once untimed; then each run reads the same region.
      tensorstore gets a 1 GiB cache_pool (decoded chunks, like zarrgate's chunk cache) with
      recheck_cached_data "open"; zarr-python has no decoded-chunk cache, so its warm runs
      read from the page cache and decode again.

--serve (cold only): the process stays up and does one cold run per line read from stdin,
      printing its seconds (flushed), so that bench/run.sh can interleave these runs with
      zarrgate's run by run. One untimed cold read first warms up the process (thread pools,
      drivers), as zarrgate's start-up is not timed either.

The result is checked once against the expected shape and dtype (and that it is not all fill).
"""

import argparse
import json
import os
import subprocess
import sys
import time

import numpy as np


def parse_select(text):
    out = []
    for part in text.split(","):
        a, b = part.split(":")
        out.append(slice(int(a), int(b)))
    return tuple(out)


def drop_caches():
    subprocess.run(["sync"], check=True)
    with open("/proc/sys/vm/drop_caches", "w") as f:
        f.write("3\n")


def zarr_format(path):
    return 3 if os.path.exists(os.path.join(path, "zarr.json")) else 2


def ts_open(path, warm):
    import tensorstore as ts

    driver = "zarr3" if zarr_format(path) == 3 else "zarr"
    spec = {"driver": driver, "kvstore": {"driver": "file", "path": path}}
    if warm:
        spec["recheck_cached_data"] = "open"
        ctx = ts.Context({"cache_pool": {"total_bytes_limit": 1 << 30}})
    else:
        ctx = ts.Context()
    return ts.open(spec, context=ctx, read=True).result()


def ts_read(arr, sel):
    return arr[sel].read().result()


def zarr_open(path, warm):
    import zarr

    return zarr.open_array(path, mode="r")


def zarr_read(arr, sel):
    return arr[sel]


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--reader", choices=["ts", "zarr"], required=True)
    p.add_argument("--array", required=True)
    p.add_argument("--select", required=True)
    p.add_argument("--mode", choices=["cold", "warm"], required=True)
    p.add_argument("--runs", type=int, default=5)
    p.add_argument("--drop-caches", action="store_true")
    p.add_argument("--serve", action="store_true")
    args = p.parse_args()
    sel = parse_select(args.select)
    expect = tuple(s.stop - s.start for s in sel)
    opener, reader = (ts_open, ts_read) if args.reader == "ts" else (zarr_open, zarr_read)
    warm = args.mode == "warm"

    def check(out):
        out = np.asarray(out)
        assert out.shape == expect and out.dtype == np.float32, (out.shape, out.dtype)
        assert float(np.abs(out).max()) > 0

    def cold_run():
        if args.drop_caches:
            drop_caches()
        t = time.perf_counter()
        arr = opener(args.array, False)
        out = reader(arr, sel)
        return time.perf_counter() - t, out

    if args.serve:
        if warm:
            p.error("--serve runs cold reads only")
        check(cold_run()[1])
        for _ in sys.stdin:
            seconds, out = cold_run()
            del out
            print(f"{seconds:.6f}", flush=True)
        return

    times = []
    if warm:
        arr = opener(args.array, True)
        check(reader(arr, sel))
        for _ in range(args.runs):
            t = time.perf_counter()
            out = reader(arr, sel)
            times.append(time.perf_counter() - t)
            del out
    else:
        for i in range(args.runs):
            seconds, out = cold_run()
            times.append(seconds)
            if i == 0:
                check(out)
            del out
    for t in times:
        print(f"{t:.6f}")


if __name__ == "__main__":
    main()
