#!/usr/bin/env python3
"""Writes the seed inputs of every fuzz target into OUT/<target>/ from tests/fixtures and
data/demo (chunk files and metadata documents) and from codecs.json. Standard library only.

    python3 fuzz/make_seeds.py OUT
"""
import gzip
import hashlib
import json
import os
import struct
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(HERE)
FIXTURES = os.path.join(REPO, "tests", "fixtures")
DATA_DIRS = [os.path.join(FIXTURES, "data"), os.path.join(REPO, "data", "demo")]
META_NAMES = {"zarr.json", ".zarray", ".zgroup", ".zattrs", ".zmetadata", "meta", "attrs"}


def write(out, target, data):
    d = os.path.join(out, target)
    os.makedirs(d, exist_ok=True)
    with open(os.path.join(d, "seed-" + hashlib.sha1(data).hexdigest()), "wb") as f:
        f.write(data)


def first_chunk(array_dir):
    """The smallest stored object below an array directory (not a metadata document)."""
    best = None
    for root, dirs, files in os.walk(array_dir):
        dirs.sort()
        for name in sorted(files):
            if name in META_NAMES:
                continue
            path = os.path.join(root, name)
            size = os.path.getsize(path)
            if best is None or size < best[0]:
                best = (size, path)
    if best is None:
        return b""
    with open(best[1], "rb") as f:
        return f.read()


def metadata(out):
    for base in DATA_DIRS:
        for root, dirs, files in os.walk(base):
            dirs.sort()
            for name, target in ((".zarray", "metadata_v2"), ("meta", "metadata_v2"), ("zarr.json", "metadata_v3")):
                if name not in files:
                    continue
                with open(os.path.join(root, name), "rb") as f:
                    doc = f.read()
                try:
                    parsed = json.loads(doc)
                except ValueError:
                    continue
                if target == "metadata_v3" and parsed.get("node_type") != "array":
                    # Groups only as documents: they never parse as arrays.
                    write(out, target, doc)
                    continue
                write(out, target, doc + b"\0" + first_chunk(root))


def codecs(out):
    with open(os.path.join(HERE, "codecs.json")) as f:
        table = json.load(f)
    for i, entry in enumerate(table):
        seeds = entry["seeds"] or [None]
        for seed in seeds:
            if seed is None:
                body = struct.pack("<8f", *range(8))
            else:
                with open(os.path.join(FIXTURES, seed), "rb") as f:
                    body = f.read()
            write(out, "codecs", bytes([i]) + body)


def shard(out):
    base = os.path.join(FIXTURES, "data", "v3")
    with open(os.path.join(base, "sharding_index_crc32c_gzip_inner_u2", "c", "0", "0"), "rb") as f:
        end = f.read()
    n = 4  # a [6, 10] shard of [3, 5] inner chunks
    index_len = 16 * n
    data, index = end[: -index_len - 4], end[-index_len - 4 : -4]
    entries = list(struct.unpack("<%dQ" % (2 * n), index))
    write(out, "shard", bytes([0]) + end)
    write(out, "shard", bytes([2]) + data + index)  # the same index without its checksum
    moved = [
        e if (e == 2**64 - 1 or k % 2) else e + index_len + 4 for k, e in enumerate(entries)
    ]
    # index at the start; mode bit 2 makes the harness write the checksum
    write(out, "shard", bytes([1 | 4]) + struct.pack("<%dQ" % (2 * n), *moved) + b"\0\0\0\0" + data)
    # one inner chunk empty
    empty = entries[:]
    empty[2:4] = [2**64 - 1, 2**64 - 1]
    write(out, "shard", bytes([2]) + data + struct.pack("<%dQ" % (2 * n), *empty))
    with open(os.path.join(base, "sharding_nested_i4", "c", "0", "0"), "rb") as f:
        write(out, "shard", bytes([3]) + f.read())


def varlen(out):
    items = [b"a", b"", "h\u00e9llo".encode(), b"red"]

    def head(mode, n):
        return bytes([mode]) + struct.pack("<H", n)

    offsets = [0]
    for i in items:
        offsets.append(offsets[-1] + len(i))
    zep = struct.pack("<%di" % len(offsets), *offsets)
    zep += b"\0" * (-len(zep) % 64) + b"".join(items)
    vlen = struct.pack("<I", len(items)) + b"".join(struct.pack("<I", len(i)) + i for i in items)
    json2 = json.dumps(["text", 1, 2.5, "x", "|O", [4]]).replace('"x"', "NaN").encode()
    json2_2d = json.dumps([["a", [1, 2]], [None, "d"], "|O", [2, 2]]).encode()
    for mode, n, chunk in [
        (0, 4, zep),
        (1, 4, zep),
        (2, 4, vlen),
        (3, 4, vlen),
        (4, 4, json2),
        (4, 4, json2_2d),
        (5, 4, bytes([1, 2, 3, 0])),
        (6, 4, bytes([1, 2, 3, 0])),
        # vlen-array: <f8 items [1.5, 2.0], [] and >i2 items [1, -1], [7]
        (7, 2, struct.pack("<II2dI", 2, 16, 1.5, 2.0, 0)),
        # msgpack2: numcodecs' MsgPack of ["text", 1, 2.5, None, [1, "two", [3]], {"k": "v", "n": 1}, b"\0\xff", nan]
        (9, 8, bytes.fromhex("9aa47465787401cb4004000000000000c09301a374776f910382a16ba176a16e01c40200ff"
                             "cb7ff8000000000000a27c4f9108")),
        (8, 2, struct.pack("<II", 2, 4) + struct.pack(">2h", 1, -1) + struct.pack("<I", 2) + struct.pack(">h", 7)),
    ]:
        write(out, "varlen", head(mode, n) + chunk)
    for name, n in (("zep0007_string_no_codecs", 3), ("zep0007_string_long_chunk", 20), ("zep0007_binary_gzip", 2)):
        d = os.path.join(FIXTURES, "data", "v3", name)
        chunk = first_chunk(d)
        if name.endswith("gzip"):
            chunk = gzip.decompress(chunk)
        write(out, "varlen", head(1 if "binary" in name else 0, n) + chunk)


def selection(out):
    def shape(dims):
        b = bytes([len(dims)])
        for size, chunk in dims:
            b += bytes([size]) if size < 0xF0 else bytes([0xF0]) + struct.pack("<Q", size)
            b += bytes([chunk - 1])
        return b

    three = shape([(10, 3), (20, 7), (30, 30)])
    for text in ["", "[1:3, 5, ::7]", "-3:", "-1", "5:100", "8:2", "-100:2", "0:10:3", "2, 3:5", "::4,::4", "[:, -5:-1:2]"]:
        write(out, "selection", three + text.encode())
    write(out, "selection", shape([]) + b"")
    write(out, "selection", shape([(2**40, 64), (2**40, 64)]) + b":, 3")
    write(out, "selection", shape([(2**63, 1)]) + b"-9223372036854775807:")


def path(out):
    for p in [
        "v3.zarr/volume/zarr.json",
        "v2.zarr/image/.zarray",
        "a/b%20c/.zarray",
        "group/",
        "%252e%252e",
        "%2e%2e/x",
        "a%2f..%2fb",
        "a%5cb",
        "a%00b",
        "c/0/0/0",
        "",
    ]:
        write(out, "path", p.encode())


def main():
    out = sys.argv[1]
    metadata(out)
    codecs(out)
    shard(out)
    varlen(out)
    selection(out)
    path(out)


if __name__ == "__main__":
    main()
