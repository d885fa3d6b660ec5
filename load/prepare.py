#!/usr/bin/env python3
"""Prepares a load-test run: a synthetic array larger than the chunk cache (so that slices of
random regions miss), the server configuration, and the URL lists the wrk script mixes.
Standard library only.

    python3 load/prepare.py OUT PORT CACHE_BYTES

Writes OUT/config.toml, OUT/big/ (a v2 float32 array of 16384 x 16384 in 256 x 256 zlib chunks:
1 GiB decoded, a few MiB on disk, chunk files hard-linked to 8 distinct bodies), and
OUT/{raw,ranged,slices,zom}.txt (one request path per line) and OUT/uncached.txt (the big
array's shape and chunks, for the script to pick random regions).
"""
import json
import os
import struct
import sys
import zlib

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(HERE)
META = {"zarr.json", ".zarray", ".zgroup", ".zattrs", ".zmetadata", "meta", "attrs"}

SHAPE, CHUNK = 16384, 256


def big_array(root):
    os.makedirs(root, exist_ok=True)
    meta = {
        "zarr_format": 2,
        "shape": [SHAPE, SHAPE],
        "chunks": [CHUNK, CHUNK],
        "dtype": "<f4",
        "compressor": {"id": "zlib", "level": 1},
        "fill_value": 0.0,
        "order": "C",
        "filters": None,
    }
    with open(os.path.join(root, ".zarray"), "w") as f:
        json.dump(meta, f)
    with open(os.path.join(root, ".zattrs"), "w") as f:
        json.dump({"_ARRAY_DIMENSIONS": ["y", "x"], "note": "zarrgate load test"}, f)
    bodies = []
    for v in range(8):
        values = [((i * (v + 3)) % 1000) / 7.0 for i in range(CHUNK * CHUNK)]
        path = os.path.join(root, ".body%d" % v)
        with open(path, "wb") as f:
            f.write(zlib.compress(struct.pack("<%df" % len(values), *values), 1))
        bodies.append(path)
    n = SHAPE // CHUNK
    for i in range(n):
        for j in range(n):
            key = os.path.join(root, "%d.%d" % (i, j))
            if not os.path.exists(key):
                os.link(bodies[(i * 7 + j) % 8], key)


def files(base):
    for root, dirs, names in os.walk(base):
        dirs.sort()
        for name in sorted(names):
            yield os.path.relpath(os.path.join(root, name), base)


def main():
    out, port, cache_bytes = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
    big_array(os.path.join(out, "big", "array"))
    demo = os.path.join(REPO, "data", "demo")
    fixtures = os.path.join(REPO, "tests", "fixtures", "data")
    with open(os.path.join(out, "config.toml"), "w") as f:
        f.write(
            f"""[server]
bind = "127.0.0.1:{port}"

[limits]
max_concurrent_requests = 1024

[cache]
chunk_bytes = {cache_bytes}

[mounts.demo]
url = "{demo}"

[mounts.fixtures]
url = "{fixtures}"

[mounts.big]
url = "{os.path.join(out, 'big')}"
"""
        )

    raw, ranged = [], []
    for mount, base in (("demo", demo), ("fixtures", fixtures)):
        for rel in files(base):
            if os.path.basename(rel).startswith(".body"):
                continue
            path = f"/zarr/{mount}/{rel}"
            raw.append(path)
            if os.path.basename(rel) not in META:
                ranged.append(path)
    # Keys clients probe that do not exist (404) and synthesized consolidated metadata.
    raw += [
        "/zarr/demo/v2.zarr/.zmetadata",
        "/zarr/demo/v3.zarr/zarr.json",
        "/zarr/demo/v2.zarr/image/zarr.json",
        "/zarr/demo/v3.zarr/volume/.zarray",
        "/zarr/big/array/.zarray",
        "/zarr/big/array/17.23",
    ]

    slices = [
        "/api/v1/slice/demo/v3.zarr/volume?select=[3,0:4,0:6]",
        "/api/v1/slice/demo/v3.zarr/volume?select=[:, 60:70, 60:70]&format=bin",
        "/api/v1/slice/demo/v2.zarr/image?select=::4,::4&format=npy",
        "/api/v1/slice/demo/v2.zarr/image?format=png&cmap=viridis",
        "/api/v1/slice/demo/v2.zarr/image?select=0:32,0:32",
        "/api/v1/slice/demo/v3.zarr/temperature?select=0:3,0:5&format=csv",
        "/api/v1/slice/demo/v3.zarr/temperature",
        "/api/v1/slice/demo/v3.zarr/names",
        "/api/v1/slice/demo/v2.zarr/labels",
        "/api/v1/slice/demo/v2.zarr/counts?select=10:90:3",
        "/api/v1/slice/big/array?select=0:64,0:64",
    ]
    with open(os.path.join(REPO, "tests", "fixtures", "cases.json")) as f:
        cases = json.load(f)
    for i, case in enumerate(cases):
        numeric = isinstance(case["dtype"], str) and case["dtype"].lstrip("<>|=")[:1] in ("i", "u", "f", "c", "b", "M", "m")
        fmt = "npy" if numeric and i % 3 == 0 else "json"
        slices.append(f"/api/v1/slice/fixtures/{case['path']}?format={fmt}")

    zom = [
        "/api/v1/zom/demo/v2.zarr",
        "/api/v1/zom/demo/v3.zarr?depth=0",
        "/api/v1/zom/demo/v3.zarr",
        "/api/v1/zom/demo/v2.zarr/image",
        "/api/v1/zom/fixtures/v3/group_nested",
        "/api/v1/zom/fixtures/v2/group_consolidated",
        "/api/v1/zom/big/array",
        "/api/v1/mounts",
        "/api/v1/list/demo",
        "/api/v1/list/fixtures/v2",
    ]

    for name, lines in (("raw", raw), ("ranged", ranged), ("slices", slices), ("zom", zom)):
        with open(os.path.join(out, name + ".txt"), "w") as f:
            f.write("\n".join(p.replace(" ", "%20") for p in lines) + "\n")
    with open(os.path.join(out, "uncached.txt"), "w") as f:
        f.write(f"{SHAPE} {CHUNK}\n")


if __name__ == "__main__":
    main()
