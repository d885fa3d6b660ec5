"""zarr-python 3 over fsspec HTTP (`zarr.open_array("http://...")`): every fixture it can read
locally, read over zarrgate's raw keys, whole and in regions (inside one chunk / one inner chunk
of a shard, across chunk and shard boundaries, strided), equals the local read."""
import pytest
import zarr

from conftest import ALL_CASES, DEMO, params, regions
from expected import same
from zarr3_check import check_remote


@pytest.mark.parametrize("case", params(ALL_CASES))
def test_fixture_over_http(case):
    if case.zarr_format == 1:
        pytest.skip("zarr-python 3 does not read Zarr v1")
    check_remote(lambda url: zarr.open_array(url, mode="r"), case)


DEMO_ARRAYS = ["v2.zarr/image", "v2.zarr/counts", "v2.zarr/labels", "v3.zarr/volume", "v3.zarr/names", "v3.zarr/temperature"]


@pytest.mark.parametrize("path", DEMO_ARRAYS)
def test_demo_over_http_matches_local(base_url, path):
    remote = zarr.open_array(f"{base_url}/zarr/demo/{path}", mode="r")
    local = zarr.open_array(str(DEMO / path), mode="r")
    assert remote.shape == local.shape and remote.dtype == local.dtype
    assert remote.attrs.asdict() == local.attrs.asdict()
    assert same(remote[...], local[...])
    # For the sharded volume, sub_chunk is inside one inner chunk of one shard (byte ranges).
    for name, region in regions(local.shape, local.chunks).items():
        assert same(remote[region], local[region]), name
