"""zarrgate's own slice API (`/api/v1/slice/{mount}/{path}?select=...&format=...`) on every fixture:
fixed-size dtypes as `format=npy` (read with numpy.load(allow_pickle=False)), variable-length
strings / bytes / objects as `format=json`; the whole array and regions (inside one chunk, across
chunks, strided `1::2` per dimension), compared with the manifest's expected values."""
import base64
import io

import numpy as np
import pytest
import requests

from conftest import ALL_CASES, URL, params, read_chunk_shape, regions, select_param
from expected import kind, load, nested_to_object, object_array, same, same_dtype

SESSION = requests.Session()


def get(case, fmt, region=None):
    q = {"format": fmt}
    if region is not None:
        q["select"] = select_param(region)
    r = SESSION.get(f"{URL}/api/v1/slice/{case.mount}/{case.path}", params=q, timeout=60)
    assert r.status_code == 200, f"GET {r.url} -> {r.status_code} {r.text[:300]}"
    return r


def npy(case, region=None):
    r = get(case, "npy", region)
    assert r.headers["content-type"].startswith("application/x-npy"), r.headers["content-type"]
    return np.load(io.BytesIO(r.content), allow_pickle=False)


def json_values(case, region=None, bytes_kind=False):
    doc = get(case, "json", region).json()
    out = nested_to_object(doc["data"], doc["shape"])
    if bytes_kind:
        out = nested_to_object([None if v is None else base64.b64decode(v) for v in out.ravel().tolist()], doc["shape"])
    return doc, out


def whole_and_regions(case):
    yield "whole", None
    yield from regions(case.shape, read_chunk_shape(case.local)).items()


def as_zarr3_reads(case, expected, k):
    """zarr 2 reads the elements of a missing chunk of a variable-length string or bytes array
    with fill_value null as None; zarr-python 3, and zarrgate with it, reads "" (b"")."""
    if not case.reader.startswith("zarr 2") or k not in ("string", "bytes"):
        return expected
    empty = "" if k == "string" else b""
    return object_array([empty if v is None else v for v in expected.ravel().tolist()], expected.shape)


@pytest.mark.parametrize("case", params(ALL_CASES))
def test_slice_api(case):
    k = kind(case.expected_file)
    expected = as_zarr3_reads(case, load(case.expected_file), k)
    for name, region in whole_and_regions(case):
        want = expected if region is None else expected[region]
        if k == "npy":
            got = npy(case, region)
            assert same_dtype(got.dtype, expected.dtype), f"{name}: dtype {got.dtype} != {expected.dtype}"
            assert same(got, want), f"{name} select={region and select_param(region)}: {got!r} != {want!r}"
        else:
            doc, got = json_values(case, region, bytes_kind=(k == "bytes"))
            assert doc["shape"] == list(want.shape), name
            assert same(got, want), f"{name} select={region and select_param(region)}: {got!r} != {want!r}"


def fixed_bytes_cases():
    out = []
    for case in ALL_CASES:
        if kind(case.expected_file) != "npy":
            continue
        dtype = load(case.expected_file).dtype
        if dtype.kind in "SV" and dtype.names is None:
            out.append(case)
    return out


@pytest.mark.parametrize("case", params(fixed_bytes_cases()))
def test_fixed_bytes_as_json(case):
    """`S` and `V` values in JSON are base64 of the bytes NumPy gives for them: an `S` value ends at
    its trailing NULs (b"ab\\0\\0" is b"ab"), a `V` value keeps all its bytes."""
    expected = load(case.expected_file)
    doc, got = json_values(case, bytes_kind=True)
    assert doc["dtype"] == expected.dtype.str, doc["dtype"]
    want = [bytes(v) for v in expected.ravel().tolist()]
    assert [bytes(v) for v in got.ravel().tolist()] == want
