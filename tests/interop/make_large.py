"""Writes the arrays of test_large_slices.py with zarr-python into the directory given: results
above the 8 MiB that makes zarrgate stream a slice response, read back through every format.

- f8_zstd: 1200 x 1100 float64, 250 x 300 chunks, zstd, fill NaN; the chunks of rows 500-749
  and columns 300-599 are all fill and so never written (zarr-python skips empty chunks).
- i2_sharded: 2100 x 2100 int16 in 1024 x 1024 shards of 256 x 256 blosc (lz4, shuffle) inner
  chunks, fill 0, with the same kind of hole.
"""
import sys

import numpy as np
import zarr
from zarr.codecs import BloscCodec, ZstdCodec


def main(root):
    rng = np.random.default_rng(7)
    a = rng.normal(size=(1200, 1100)) * 1e3
    a[500:750, 300:600] = np.nan
    a[3, 5] = np.inf
    z = zarr.create_array(f"{root}/f8_zstd", shape=a.shape, chunks=(250, 300), dtype="f8",
                          compressors=[ZstdCodec(level=3)], fill_value=np.nan)
    z[...] = a
    b = (np.arange(2100 * 2100, dtype=np.int64).reshape(2100, 2100) % 65521 - 32000).astype("i2")
    b[256:512, 0:1024] = 0
    s = zarr.create_array(f"{root}/i2_sharded", shape=b.shape, chunks=(256, 256), shards=(1024, 1024),
                          dtype="i2", compressors=[BloscCodec(cname="lz4", shuffle="shuffle")], fill_value=0)
    s[...] = b


if __name__ == "__main__":
    main(sys.argv[1])
