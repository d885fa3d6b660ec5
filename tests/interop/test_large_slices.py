"""Slices larger than the 8 MiB that makes zarrgate stream its response (bands of chunk rows
encoded as they are sent), in every format, against zarr-python's read of the same files
(written by make_large.py into $ZARRGATE_LARGE, mounted as `large`)."""
import csv
import io
import json
import os
import pathlib

import numpy as np
import pytest
import requests

from conftest import URL
from expected import same

LARGE = os.environ.get("ZARRGATE_LARGE")
pytestmark = pytest.mark.skipif(not LARGE, reason="ZARRGATE_LARGE is not set (run through run.sh)")

# (array, select, the same selection in NumPy, elements): all above 8 MiB decoded but the last,
# which checks that a small result of the same array agrees as well.
CASES = [
    ("f8_zstd", ":,:", np.s_[:, :], 1200 * 1100),
    ("f8_zstd", "1:1200:1,::1", np.s_[1:1200, :], 1199 * 1100),
    ("f8_zstd", "7,::", np.s_[7, :], 1100),
    ("i2_sharded", ":,:", np.s_[:, :], 2100 * 2100),
    ("i2_sharded", "5:2100,3:2099", np.s_[5:2100, 3:2099], 2095 * 2096),
]


def expected(array, region):
    import zarr

    return zarr.open_array(pathlib.Path(LARGE) / array, mode="r")[region]


def fetch(array, select, fmt, headers=None):
    r = requests.get(
        f"{URL}/api/v1/slice/large/{array}", params={"select": select, "format": fmt}, headers=headers, timeout=120
    )
    assert r.status_code == 200, f"{r.url}: {r.status_code} {r.text[:300]}"
    return r


def text(array, select, fmt, streamed):
    """A text answer as requests asks for it (gzip, deflate, zstd: urllib3 decodes zstd with
    backports.zstd installed), checked against the same answer asked for uncompressed: text of 1 KiB
    or more comes compressed (zstd, which zarrgate prefers), and decodes to the same bytes. A
    streamed text answer is sent chunked (its length is not known in advance), and so is a
    compressed one."""
    r = fetch(array, select, fmt)
    plain = fetch(array, select, fmt, {"Accept-Encoding": "identity"})
    assert r.content == plain.content
    assert "zstd" in r.request.headers["accept-encoding"]
    assert r.headers.get("content-encoding") == ("zstd" if len(r.content) >= 1024 else None), dict(r.headers)
    assert "content-encoding" not in plain.headers
    assert ("content-length" not in r.headers) == (streamed or "content-encoding" in r.headers), dict(r.headers)
    assert ("content-length" not in plain.headers) == streamed, dict(plain.headers)
    return r


def from_json_number(v):
    return {"NaN": np.nan, "Infinity": np.inf, "-Infinity": -np.inf}.get(v, v) if isinstance(v, str) else v


@pytest.mark.parametrize("array,select,region,n", CASES, ids=[f"{c[0]}[{c[1]}]" for c in CASES])
def test_every_format_agrees_with_zarr_python(array, select, region, n):
    want = expected(array, region)
    assert want.size == n
    streamed = want.nbytes > 8 << 20

    r = fetch(array, select, "npy")
    got = np.load(io.BytesIO(r.content), allow_pickle=False)
    assert got.dtype == want.dtype and same(got, want)

    r = fetch(array, select, "bin")
    assert r.headers["x-zarr-shape"] == ",".join(map(str, want.shape))
    assert same(np.frombuffer(r.content, dtype=want.dtype.newbyteorder("<")).reshape(want.shape), want)

    r = text(array, select, "json", streamed)
    doc = json.loads(r.content)
    assert doc["shape"] == list(want.shape) and doc["dtype"] == want.dtype.newbyteorder("<").str
    got = np.vectorize(from_json_number, otypes=[np.float64])(np.array(doc["data"], dtype=object))
    assert same(got.astype(want.dtype), want)

    r = text(array, select, "csv", streamed)
    rows = list(csv.reader(io.StringIO(r.text)))
    got = np.array(rows, dtype=np.float64).astype(want.dtype)
    assert same(got.reshape(want.shape), want)
