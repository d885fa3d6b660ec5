#!/usr/bin/env python3
"""Generates the benchmark datasets (deterministic) with pinned zarr-python 3.1.6.

Usage (from the repo root):

    venv="$(scripts/python-env.sh bench bench/requirements.txt)"
    "$venv/bin/python" bench/make_datasets.py [OUTDIR] [--only GROUP[,GROUP...]]

OUTDIR defaults to ${ZARRGATE_CACHE:-~/.cache/zarrgate}/bench-data. Each group is written to a
temporary directory and renamed into place when complete, with a stamp file recording the
generator version, so a rerun skips what is already there and an interrupted run leaves nothing
half-written. Groups:

- issue9/   the issue-9 arrays, 16384x16384 float32 (1 GiB decoded):
              sharded.zarr    v3, shards 4096x4096 (64 MiB), inner chunks 512x512, zstd level 3
              unsharded.zarr  v3, chunks 512x512 (1 MiB), zstd level 3
              blosc_v2.zarr   v2, chunks 512x512, blosc lz4 clevel 5 byte-shuffle
- small/    the criterion-bench arrays, 4096x4096 float32 (64 MiB decoded), chunks 512x512 and,
            for *_sharded, shards 2048x2048: zstd, zstd_sharded, blosc, blosc_sharded (v3 blosc
            lz4 clevel 5 shuffle), gzip, gzip_sharded (level 5)
- raw/      uncompressed v3 arrays whose chunk files are exactly 64 KiB (c64k.zarr, 128x128
            chunks) and 1 MiB (c1m.zarr, 512x512 chunks), for raw-key serving
- hier/     tree.zarr: a v3 hierarchy of exactly 10,000 nodes: the root group, 9 groups,
            10 subgroups in each (90), and 110 tiny int32 arrays (shape 4, chunk 4, no chunk
            written) in each subgroup (9,900), every node with a few attributes

Values: a smooth field plus seeded Gaussian noise, quantized to 1/16, so the data compress like
real measurements (roughly 2-4x) rather than like zeros or like white noise.
"""

import argparse
import json
import os
import shutil
import sys
import time

import numpy as np
import numcodecs
import zarr
from zarr.codecs import BloscCodec, GzipCodec, ZstdCodec

VERSION = "zarrgate-bench-data-1"
BIG = 16384
SMALL = 4096


def field(r0, r1, ncols, seed):
    """Rows r0..r1 of the deterministic test field (float32)."""
    y = np.arange(r0, r1, dtype=np.float32)[:, None]
    x = np.arange(ncols, dtype=np.float32)[None, :]
    base = 50.0 * np.sin(y / np.float32(97.0)) * np.cos(x / np.float32(131.0)) + y * np.float32(0.001)
    rng = np.random.default_rng([seed, r0])
    noise = rng.standard_normal((r1 - r0, ncols), dtype=np.float32)
    v = base + noise
    return (np.round(v * 16.0) / 16.0).astype(np.float32)


def fill_array(arr, rows_per_block, seed):
    n, ncols = arr.shape
    for r0 in range(0, n, rows_per_block):
        r1 = min(n, r0 + rows_per_block)
        arr[r0:r1, :] = field(r0, r1, ncols, seed)


def v3(path, shape, chunks, compressor, shards=None):
    return zarr.create_array(
        store=path,
        shape=shape,
        dtype="float32",
        chunks=chunks,
        shards=shards,
        compressors=compressor,
        fill_value=0.0,
        zarr_format=3,
        dimension_names=["y", "x"],
        overwrite=True,
    )


def make_issue9(root):
    os.makedirs(root)
    z = ZstdCodec(level=3)
    a = v3(f"{root}/sharded.zarr", (BIG, BIG), (512, 512), z, shards=(4096, 4096))
    fill_array(a, 4096, 9)
    a = v3(f"{root}/unsharded.zarr", (BIG, BIG), (512, 512), z)
    fill_array(a, 2048, 9)
    a = zarr.create_array(
        store=f"{root}/blosc_v2.zarr",
        shape=(BIG, BIG),
        dtype="float32",
        chunks=(512, 512),
        compressors=numcodecs.Blosc(cname="lz4", clevel=5, shuffle=numcodecs.Blosc.SHUFFLE),
        fill_value=0.0,
        zarr_format=2,
        attributes={"_ARRAY_DIMENSIONS": ["y", "x"]},
        overwrite=True,
    )
    fill_array(a, 2048, 9)


def make_small(root):
    os.makedirs(root)
    codecs = {
        "zstd": ZstdCodec(level=3),
        "blosc": BloscCodec(cname="lz4", clevel=5, shuffle="shuffle"),
        "gzip": GzipCodec(level=5),
    }
    for name, codec in codecs.items():
        a = v3(f"{root}/{name}.zarr", (SMALL, SMALL), (512, 512), codec)
        fill_array(a, 2048, 64)
        a = v3(f"{root}/{name}_sharded.zarr", (SMALL, SMALL), (512, 512), codec, shards=(2048, 2048))
        fill_array(a, 2048, 64)


def make_raw(root):
    os.makedirs(root)
    a = v3(f"{root}/c64k.zarr", (SMALL, SMALL), (128, 128), None)
    fill_array(a, 2048, 1)
    a = v3(f"{root}/c1m.zarr", (SMALL, SMALL), (512, 512), None)
    fill_array(a, 2048, 1)


def make_hier(root):
    """10,000 nodes. Metadata documents are made by zarr-python once (a template group and
    array) and written directly for the rest, which is thousands of times faster and gives the
    same bytes."""
    os.makedirs(root)
    tmpl = zarr.storage.MemoryStore()
    zarr.create_group(store=tmpl, path="g", zarr_format=3)
    zarr.create_array(store=tmpl, name="a", shape=(4,), chunks=(4,), dtype="int32", fill_value=0, zarr_format=3)
    import asyncio

    from zarr.core.buffer import default_buffer_prototype

    async def doc(key):
        buf = await tmpl.get(key, prototype=default_buffer_prototype())
        return json.loads(buf.to_bytes())

    group_doc = asyncio.run(doc("g/zarr.json"))
    array_doc = asyncio.run(doc("a/zarr.json"))
    count = 0

    def write(path, base, attrs):
        nonlocal count
        os.makedirs(path, exist_ok=True)
        d = dict(base)
        d["attributes"] = attrs
        with open(os.path.join(path, "zarr.json"), "w") as f:
            json.dump(d, f, indent=2)
        count += 1

    top = f"{root}/tree.zarr"
    write(top, group_doc, {"title": "10,000-node bench hierarchy", "nodes": 10000})
    for g in range(9):
        gp = f"{top}/g{g}"
        write(gp, group_doc, {"index": g})
        for s in range(10):
            sp = f"{gp}/s{s}"
            write(sp, group_doc, {"index": s, "parent": g})
            for a in range(110):
                write(f"{sp}/a{a:03d}", array_doc, {"index": a, "units": "m", "long_name": f"array {g}.{s}.{a}"})
    assert count == 10000, count


GROUPS = {"issue9": make_issue9, "small": make_small, "raw": make_raw, "hier": make_hier}


def main():
    default = os.path.join(os.environ.get("ZARRGATE_CACHE", os.path.expanduser("~/.cache/zarrgate")), "bench-data")
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("outdir", nargs="?", default=default)
    p.add_argument("--only", default=",".join(GROUPS), help="comma-separated groups: " + ", ".join(GROUPS))
    args = p.parse_args()
    if zarr.__version__ != "3.1.6":
        sys.exit(f"make_datasets.py needs zarr 3.1.6 (pinned), found {zarr.__version__}")
    os.makedirs(args.outdir, exist_ok=True)
    for name in args.only.split(","):
        final = os.path.join(args.outdir, name)
        stamp = os.path.join(final, ".stamp")
        if os.path.exists(stamp) and open(stamp).read().strip() == VERSION:
            print(f"{name}: present", file=sys.stderr)
            continue
        tmp = final + ".tmp"
        shutil.rmtree(tmp, ignore_errors=True)
        t = time.monotonic()
        GROUPS[name](tmp)
        with open(os.path.join(tmp, ".stamp"), "w") as f:
            f.write(VERSION + "\n")
        shutil.rmtree(final, ignore_errors=True)
        os.rename(tmp, final)
        print(f"{name}: written in {time.monotonic() - t:.1f} s", file=sys.stderr)


if __name__ == "__main__":
    main()
