"""zarr-python 3 over obstore's HTTPStore (`zarr.storage.ObjectStore(HTTPStore.from_url(...))`,
Rust object_store underneath: ranged GETs, HEAD): every fixture it can read locally, whole and in
regions, equals the local read."""
import pytest
import zarr
from obstore.store import HTTPStore

from conftest import ALL_CASES, DEMO, URL, params, regions
from expected import same
from zarr3_check import check_remote


def open_remote(url):
    store = HTTPStore.from_url(url, client_options={"allow_http": True})
    return zarr.open_array(store=zarr.storage.ObjectStore(store, read_only=True), mode="r")


@pytest.mark.parametrize("case", params(ALL_CASES))
def test_fixture_over_obstore(case):
    if case.zarr_format == 1:
        pytest.skip("zarr-python 3 does not read Zarr v1")
    check_remote(open_remote, case)


@pytest.mark.parametrize("path", ["v2.zarr/image", "v3.zarr/volume", "v3.zarr/names"])
def test_demo_over_obstore(path):
    remote = open_remote(f"{URL}/zarr/demo/{path}")
    local = zarr.open_array(str(DEMO / path), mode="r")
    assert same(remote[...], local[...])
    for name, region in regions(local.shape, local.chunks).items():
        assert same(remote[region], local[region]), name
