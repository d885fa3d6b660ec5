"""Compressed answers read by Python's own decoders: zarrgate's zstd and gzip streams of text
(ZOM, JSON and CSV slices, streamed or whole, the web page) decode with the
`backports.zstd` binding of libzstd (Python 3.14's `compression.zstd`) and with Python's gzip module to the bytes of the same answer
asked for uncompressed; requests (urllib3) decodes them by itself; raw keys are never
compressed."""
import gzip
import os
import pathlib

import pytest
import requests
from backports import zstd

from conftest import URL

REPO = pathlib.Path(__file__).resolve().parents[2]
LARGE = os.environ.get("ZARRGATE_LARGE")

TEXT = [
    "/api/v1/zom/demo/v3.zarr",
    "/api/v1/zom-schema",
    "/api/v1/slice/demo/v3.zarr/volume?select=0,:,:",
    "/api/v1/slice/demo/v3.zarr/volume?select=0,:,:&format=csv",
    "/",
]
if LARGE:
    # Streamed in bands (over 8 MiB decoded): compressed piece by piece as they are sent.
    TEXT += [
        "/api/v1/slice/large/f8_zstd?select=:,:",
        "/api/v1/slice/large/i2_sharded?select=:,:&format=csv",
    ]


def raw(path, coding):
    """The body as sent (not decoded by urllib3) and the response."""
    r = requests.get(URL + path, headers={"Accept-Encoding": coding}, stream=True, timeout=120)
    body = r.raw.read(decode_content=False)
    return body, r


@pytest.mark.parametrize("path", TEXT)
def test_text_decodes_to_the_plain_answer(path):
    plain, r = raw(path, "identity")
    assert r.status_code == 200, path
    assert "content-encoding" not in r.headers
    assert len(plain) >= 1024
    assert "accept-encoding" in r.headers["vary"].lower()

    body, r = raw(path, "zstd")
    assert r.headers["content-encoding"] == "zstd"
    assert "content-length" not in r.headers
    assert len(body) < len(plain)
    assert zstd.decompress(body) == plain

    body, r = raw(path, "gzip")
    assert r.headers["content-encoding"] == "gzip"
    assert len(body) < len(plain)
    assert gzip.decompress(body) == plain

    # requests decodes both by itself (zstd through urllib3 and backports.zstd).
    for coding in ["zstd", "gzip", "gzip, deflate, br, zstd"]:
        r = requests.get(URL + path, headers={"Accept-Encoding": coding}, timeout=120)
        assert r.content == plain, coding


def test_raw_keys_are_sent_as_stored():
    for key, file in [
        ("demo/v3.zarr/volume/zarr.json", REPO / "data/demo/v3.zarr/volume/zarr.json"),
        ("fx/v2/group_consolidated/.zmetadata", REPO / "tests/fixtures/data/v2/group_consolidated/.zmetadata"),
    ]:
        body, r = raw(f"/zarr/{key}", "gzip, zstd")
        assert r.status_code == 200, key
        assert "content-encoding" not in r.headers, key
        assert body == file.read_bytes(), key
