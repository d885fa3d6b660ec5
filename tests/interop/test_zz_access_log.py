"""Runs last (run.sh runs it after every other suite, the browser's included): a few requests of
its own, then the server's access log of the whole run shows no 5xx, every CORS preflight
(OPTIONS) answered 2xx, and raw keys never sent with a Content-Encoding."""
import os
import re
import time

import pytest
import requests

from conftest import URL

ENCODINGS = "gzip, br, zstd"
RAW_KEYS = [
    "demo/v2.zarr/.zgroup",
    "demo/v2.zarr/image/.zarray",
    "demo/v2.zarr/image/0.0",  # blosc chunk
    "demo/v2.zarr/counts/0",  # zlib chunk
    "demo/v3.zarr/zarr.json",
    "demo/v3.zarr/volume/c/0/0/0",  # shard
    "demo/v3.zarr/temperature/c/0/0",  # gzip chunk
    "fx/v2/compressor_none_i4/0.0",  # uncompressed, compressible bytes
]


def access_lines():
    path = os.environ.get("ZARRGATE_ACCESS_LOG")
    if not path:
        pytest.skip("no access log: run through tests/interop/run.sh (ZARRGATE_ACCESS_LOG)")
    return [l for l in open(path, encoding="utf-8", errors="replace").read().splitlines() if "zarrgate::access" in l]


@pytest.mark.parametrize("key", RAW_KEYS)
@pytest.mark.parametrize("byte_range", [None, "bytes=0-9", "bytes=-4"], ids=["whole", "range", "suffix"])
def test_raw_keys_have_no_content_encoding(key, byte_range):
    headers = {"Accept-Encoding": ENCODINGS}
    if byte_range:
        headers["Range"] = byte_range
    r = requests.get(f"{URL}/zarr/{key}", headers=headers, timeout=30, stream=True)
    body = r.raw.read(decode_content=False)
    assert r.status_code == (206 if byte_range else 200), r.status_code
    assert "content-encoding" not in {k.lower() for k in r.headers}, dict(r.headers)
    assert int(r.headers["content-length"]) == len(body)
    h = requests.head(f"{URL}/zarr/{key}", headers={"Accept-Encoding": ENCODINGS}, timeout=30)
    assert h.status_code == 200 and "content-encoding" not in {k.lower() for k in h.headers}, dict(h.headers)


@pytest.mark.parametrize(
    "path", ["demo/v3.zarr/volume/c/0/0/0", "demo/v2.zarr/.zmetadata", "demo/missing/zarr.json"]
)
def test_cors_preflight(path):
    r = requests.options(
        f"{URL}/zarr/{path}",
        headers={
            "Origin": "http://example.test",
            "Access-Control-Request-Method": "GET",
            "Access-Control-Request-Headers": "range",
        },
        timeout=30,
    )
    assert 200 <= r.status_code < 300, (r.status_code, r.text[:200])
    assert r.headers.get("access-control-allow-origin") in ("*", "http://example.test")
    methods = r.headers.get("access-control-allow-methods", "").upper()
    assert "GET" in methods and "HEAD" in methods, methods
    allowed = r.headers.get("access-control-allow-headers", "").lower()
    assert "range" in allowed or allowed == "*", allowed


def test_access_log_has_no_server_errors():
    lines = access_lines()
    assert lines, "the access log has lines"
    bad = [l for l in lines if re.search(r"status=5\d\d", l)]
    assert not bad, bad[:10]


def test_access_log_preflights_answered_2xx():
    deadline = time.time() + 5
    while True:  # this file's own preflights must have reached the log
        options = [l for l in access_lines() if "method=OPTIONS" in l]
        if len(options) >= 3 or time.time() > deadline:
            break
        time.sleep(0.2)
    assert options, "no OPTIONS request in the access log"
    bad = [l for l in options if not re.search(r"status=2\d\d", l)]
    assert not bad, bad[:10]
