"""zarr-python 3 reads every fixture it can read locally over HTTP from zarrgate's raw keys,
and gets the same values."""
import pytest
import zarr

from conftest import FIXTURES, ZARRITA, manifest
from expected import load, same

ZP3 = "zarr-python 3.1.6"

CASES = [c for c in manifest(FIXTURES / "cases.json") if c["reader"] == ZP3 and c["expected"]]
ZARRITA_CASES = [
    c for c in manifest(FIXTURES / "zarrita_expected" / "cases.json") if c["reader"] == ZP3 and c["expected"]
]


@pytest.mark.parametrize("case", CASES, ids=[c["path"] for c in CASES])
def test_fixture_over_http(base_url, case):
    arr = zarr.open_array(f"{base_url}/zarr/fx/{case['path']}", mode="r")
    assert same(arr[...], load(FIXTURES / case["expected"]))


@pytest.mark.skipif(not ZARRITA.is_dir(), reason="../shared/fixtures/zarrita is absent")
@pytest.mark.parametrize("case", ZARRITA_CASES, ids=[c["path"] for c in ZARRITA_CASES])
def test_zarrita_over_http(base_url, case):
    arr = zarr.open_array(f"{base_url}/zarr/zarrita/{case['path']}", mode="r")
    assert same(arr[...], load(FIXTURES / "zarrita_expected" / case["expected"]))


@pytest.mark.parametrize("path", ["v2.zarr/image", "v2.zarr/counts", "v3.zarr/volume", "v3.zarr/names", "v3.zarr/temperature"])
def test_demo_over_http_matches_local(base_url, path):
    remote = zarr.open_array(f"{base_url}/zarr/demo/{path}", mode="r")
    local = zarr.open_array(str(FIXTURES.parents[1] / "data" / "demo" / path), mode="r")
    assert remote.shape == local.shape and remote.dtype == local.dtype
    assert same(remote[...], local[...])
    # A sub-region crosses chunk (and for the volume, shard) boundaries.
    region = tuple(slice(1, max(2, n - 1)) for n in local.shape)
    assert same(remote[region], local[region])
