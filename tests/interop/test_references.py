"""Reference mounts over HTTP: kerchunk reference sets of a NetCDF4 file, an HDF5 file and a
raw binary file (tests/fixtures/references, written by kerchunk 0.2.10) served by zarrgate as
plain Zarr v2, read by zarr-python 3 and xarray.open_zarr, equal to what xarray, h5py and numpy
read from the original files (expected.json, written by the fixtures' script)."""
import json

import numpy as np
import pytest
import xarray as xr
import zarr

from conftest import FIXTURES, URL

REFERENCES = FIXTURES / "references"
EXPECTED = json.loads((REFERENCES / "expected.json").read_text())["arrays"]
# The mounts run.sh serves each reference set as.
MOUNTS = {"refs_templates.json": "refs_templates", "refs_h5_v0.json": "refs_h5_v0"}
CASES = [
    (MOUNTS[refs], array)
    for array in EXPECTED
    for refs in array["refs"]
    if refs in MOUNTS
]


def want(array):
    return np.asarray(array["values"], dtype=np.dtype(array["dtype"])).reshape(array["shape"])


@pytest.mark.parametrize("mount,array", CASES, ids=[f"{m}/{a['path']}" for m, a in CASES])
def test_zarr_python_reads_each_array(mount, array):
    z = zarr.open_array(f"{URL}/zarr/{mount}/{array['path']}", mode="r", zarr_format=2)
    got = z[...]
    assert got.shape == tuple(array["shape"])
    assert got.dtype == np.dtype(array["dtype"])
    np.testing.assert_array_equal(got, want(array))


def test_xarray_opens_the_netcdf_references_as_the_netcdf_file():
    ds = xr.open_zarr(f"{URL}/zarr/refs_templates", consolidated=True, mask_and_scale=False, decode_times=False)
    netcdf = [a for a in EXPECTED if a["source"] == "data.nc"]
    assert {a["path"] for a in netcdf} <= set(ds.variables)
    for array in netcdf:
        np.testing.assert_array_equal(ds[array["path"]].values, want(array))
    assert ds["temperature"].dims == ("time", "y", "x")
