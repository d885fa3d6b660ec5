"""tensorstore (C++ Zarr implementation): the `zarr` driver on v2 fixtures and the `zarr3` driver
on v3 fixtures, kvstore `{"driver": "http", "base_url": ...}` pointed at zarrgate's raw keys, read
whole and in regions; compared with tensorstore reading the same files through the `file` kvstore.
Cases tensorstore cannot open locally (object / vlen dtypes, Zarr v1, ...) are skipped, not failed.
Structured v2 dtypes are opened one field at a time (tensorstore requires a `field`)."""
import importlib.metadata
import re

import numpy as np
import pytest
import tensorstore as ts

from conftest import ALL_CASES, DEMO, URL, params, read_chunk_shape, regions
from expected import same

TS = f"tensorstore {importlib.metadata.version('tensorstore')}"
DRIVER = {2: "zarr", 3: "zarr3"}


def spec(case, kvstore, field=None):
    s = {"driver": DRIVER[case.zarr_format], "kvstore": kvstore, "open": True}
    if field is not None:
        s["field"] = field
    return s


def http_kv(mount, path):
    return {"driver": "http", "base_url": f"{URL}/zarr/{mount}/{path}"}


def file_kv(local):
    return {"driver": "file", "path": str(local)}


def fields_of(case):
    """None for a plain dtype; the top-level field names for a structured one."""
    if isinstance(case.dtype, list):
        return [f[0] for f in case.dtype]
    return [None]


def open_local(case, field):
    try:
        t = ts.open(spec(case, file_kv(case.local), field), read=True).result()
        whole = t.read().result()
    except Exception as e:
        why = re.sub(r'Error reading local file "[^"]*": |\s*\[tensorstore_spec=.*', "", str(e), flags=re.S)
        pytest.skip(f"{TS} cannot read it locally{'' if field is None else f' (field {field})'}: {why[:240]}")
    return t, whole


@pytest.mark.parametrize("case", params(ALL_CASES))
def test_tensorstore_over_http(case):
    if case.zarr_format not in DRIVER:
        pytest.skip("tensorstore has no Zarr v1 driver")
    chunks = read_chunk_shape(case.local)
    for field in fields_of(case):
        local, local_whole = open_local(case, field)
        remote = ts.open(spec(case, http_kv(case.mount, case.path), field), read=True).result()
        assert remote.shape == local.shape and remote.dtype == local.dtype
        whole = remote.read().result()
        assert same(whole, local_whole), f"field {field} whole: {whole!r} != {local_whole!r}"
        for name, region in regions(local.shape, chunks).items():
            got = remote[region].read().result()
            assert same(got, local[region].read().result()), f"field {field} {name} {region}: {got!r}"
            assert same(got, np.asarray(local_whole)[region]), f"field {field} {name}"


@pytest.mark.parametrize("path", ["v2.zarr/image", "v2.zarr/counts", "v3.zarr/volume", "v3.zarr/temperature"])
def test_tensorstore_demo(path):
    driver = "zarr3" if path.startswith("v3") else "zarr"
    local = ts.open({"driver": driver, "kvstore": file_kv(DEMO / path)}, read=True).result()
    remote = ts.open({"driver": driver, "kvstore": http_kv("demo", path)}, read=True).result()
    assert same(remote.read().result(), local.read().result())
    for name, region in regions(local.shape, read_chunk_shape(DEMO / path)).items():
        assert same(remote[region].read().result(), local[region].read().result()), name
