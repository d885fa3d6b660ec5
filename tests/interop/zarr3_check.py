"""What the zarr-python 3 suites (fsspec and obstore transports) check for one array."""
import numpy as np
import pytest
import zarr

from conftest import regions
from expected import load, same

ZP3 = f"zarr-python {zarr.__version__}"


def open_local(path):
    """The array read from disk, or a skip when zarr-python 3 cannot read it (not a failure)."""
    try:
        arr = zarr.open_array(str(path), mode="r")
        whole = arr[...]
    except Exception as e:  # e.g. Zarr v1, json2 / categorize on objects, nested structured dtypes
        pytest.skip(f"{ZP3} cannot read it locally: {type(e).__name__}: {str(e)[:160]}")
    return arr, whole


def check_remote(open_remote, case):
    """`open_remote(url)` (the array over HTTP) equals the local read, whole and in every region, and the
    manifest's expected values when they were read by this same zarr-python."""
    local, local_whole = open_local(case.local)
    remote = open_remote(case.url())
    assert remote.shape == local.shape
    assert remote.dtype == local.dtype
    assert remote.chunks == local.chunks and remote.shards == local.shards
    whole = remote[...]
    assert same(whole, local_whole), f"whole: {whole!r} != {local_whole!r}"
    if case.reader == ZP3:
        expected = load(case.expected_file)
        assert same(whole, expected), f"whole vs expected: {whole!r} != {expected!r}"
    for name, region in regions(local.shape, local.chunks).items():
        got, want = remote[region], local[region]
        assert same(got, want), f"{name} {region}: {got!r} != {want!r}"
        assert same(got, np.asarray(local_whole)[region]), name
