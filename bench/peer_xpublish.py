#!/usr/bin/env python3
"""A peer server for the raw-key comparison: xpublish + xpublish-zarr (uvicorn, one process)
serving the two uncompressed raw arrays of the bench data as Zarr v3 over HTTP.

    python bench/peer_xpublish.py DATA_DIR PORT

Chunks are at /datasets/{c64k|c1m}/zarr/data/c/{i}/{j}; they are encoded uncompressed, so a
chunk is 64 KiB / 1 MiB like the files zarrgate and nginx serve. xpublish-zarr re-encodes a chunk
from the dask array on first request and keeps the encoded response in its cachey cache, so a
warm run measures its cache-hit path.
"""

import sys

import dask.array as da
import xarray as xr
import xpublish
import zarr
from xpublish_zarr import ZarrPlugin


def dataset(path):
    arr = zarr.open_array(path, mode="r")
    data = da.from_zarr(arr)
    ds = xr.Dataset({"data": (("y", "x"), data)})
    ds["data"].encoding = {"chunks": arr.chunks, "compressors": None}
    return ds


def main():
    data_dir, port = sys.argv[1], int(sys.argv[2])
    rest = xpublish.Rest(
        {"c64k": dataset(f"{data_dir}/raw/c64k.zarr"), "c1m": dataset(f"{data_dir}/raw/c1m.zarr")},
        plugins={"zarr": ZarrPlugin()},
        cache_kws={"available_bytes": 1 << 30},
    )
    rest.serve(host="127.0.0.1", port=port, log_level="warning")


if __name__ == "__main__":
    main()
