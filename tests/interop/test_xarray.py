"""xarray `open_zarr` (zarr-python 3 underneath) on the demo groups over HTTP: v2.zarr (dimension
names from `_ARRAY_DIMENSIONS`) and v3.zarr (`dimension_names`); every variable, its dims,
attributes and values (whole and in regions) equal a local open of the same group.

consolidated=False: plain HTTP cannot list a group, so the store used here answers listing from
the local directory and fetches every key (metadata and chunks) from zarrgate: what xarray does
against a listable bucket. consolidated=True: a plain URL; zarrgate's synthesized consolidated
metadata (v2 `.zmetadata`, v3 `consolidated_metadata` in the group's `zarr.json`) is all xarray
gets to find the variables."""
import pathlib

import pytest
import xarray as xr
import zarr
from zarr.storage import FsspecStore, WrapperStore

from conftest import DEMO, URL, read_chunk_shape, regions

GROUPS = ["v2.zarr", "v3.zarr"]
DIMS = {
    "v2.zarr": {"image": ("y", "x"), "counts": ("i",), "labels": ("k",)},
    "v3.zarr": {"volume": ("z", "y", "x"), "names": ("i",), "temperature": ("lat", "lon")},
}


class LocallyListedStore(WrapperStore):
    """Reads go to the wrapped (HTTP) store; listing comes from the same hierarchy on disk."""

    def __init__(self, store, local: pathlib.Path):
        super().__init__(store)
        self._local = local

    def _with_store(self, store):
        return type(self)(store, self._local)

    @property
    def supports_listing(self) -> bool:
        return True

    async def list(self):
        for p in sorted(self._local.rglob("*")):
            if p.is_file():
                yield p.relative_to(self._local).as_posix()

    async def list_prefix(self, prefix: str):
        async for key in self.list():
            if key.startswith(prefix):
                yield key

    async def list_dir(self, prefix: str):
        d = self._local / prefix.strip("/") if prefix.strip("/") else self._local
        if d.is_dir():
            for p in sorted(d.iterdir()):
                yield p.name


def local_ds(group):
    return xr.open_zarr(str(DEMO / group), consolidated=False)


def assert_same_dataset(remote, local, group):
    assert set(remote.data_vars) == set(local.data_vars) == set(DIMS[group])
    for name, dims in DIMS[group].items():
        assert remote[name].dims == dims
    assert remote.attrs == local.attrs
    xr.testing.assert_identical(remote.load(), local.load())
    for name in DIMS[group]:
        chunks = read_chunk_shape(DEMO / group / name)
        for rname, region in regions(remote[name].shape, chunks).items():
            sel = dict(zip(remote[name].dims, region))
            xr.testing.assert_identical(remote[name].isel(sel).load(), local[name].isel(sel).load())


@pytest.mark.parametrize("group", GROUPS)
def test_xarray_open_zarr_unconsolidated(group):
    http = FsspecStore.from_url(f"{URL}/zarr/demo/{group}", read_only=True)
    remote = xr.open_zarr(LocallyListedStore(http, DEMO / group), consolidated=False)
    assert_same_dataset(remote, local_ds(group), group)


@pytest.mark.parametrize("group", GROUPS)
def test_xarray_open_zarr_consolidated(group):
    remote = xr.open_zarr(f"{URL}/zarr/demo/{group}", consolidated=True)
    assert_same_dataset(remote, local_ds(group), group)
