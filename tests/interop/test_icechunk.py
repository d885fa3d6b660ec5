"""Icechunk mounts over HTTP: the repository of tests/fixtures/icechunk (run.sh mounts it as
`ice`, its virtual chunks' placeholder prefix `file:///zarrgate-fixtures/` relocated to
tests/fixtures/) served as plain Zarr v3 at every version (`ice@branch.NAME`, `ice@tag.NAME`,
`ice@snapshot.ID`, and bare `ice` = `branch.main`), read by zarr-python 3 and xarray.open_zarr,
equal to what icechunk-python + zarr-python read at that version (expected.json, written by the
fixtures' script); virtual/temperature equal to the NetCDF file its chunks live in. Also the
versions route, the keys and documents of each version, the slice and list APIs at a version,
and the caching headers of snapshot-addressed answers.

Skipped only when the server has no `ice` mount."""
import datetime
import io
import json
import re

import numpy as np
import pytest
import requests
import xarray as xr
import zarr

from conftest import FIXTURES, URL

MOUNT = "ice"
ICECHUNK = FIXTURES / "icechunk"
EXPECTED = json.loads((ICECHUNK / "expected.json").read_text())
SNAPSHOTS = EXPECTED["snapshots"]
# Every version expected.json names, and the bare mount: its default version, branch.main.
VERSIONS = sorted(EXPECTED["versions"].items()) + [("", EXPECTED["versions"]["branch.main"])]
IDS = [v or "default" for v, _ in VERSIONS]
IMMUTABLE = "public, max-age=31536000, immutable"
SESSION = requests.Session()


@pytest.fixture(scope="module", autouse=True)
def ice_mount():
    r = SESSION.get(f"{URL}/api/v1/mounts", timeout=30)
    assert r.status_code == 200, f"GET {r.url} -> {r.status_code} {r.text[:300]}"
    names = [m["name"] for m in r.json()["mounts"]]
    if MOUNT not in names:
        pytest.skip(f"the server has no '{MOUNT}' mount (tests/fixtures/icechunk/repo, as run.sh mounts it): {names}")


def segment(version):
    return f"{MOUNT}@{version}" if version else MOUNT


def zarr_url(version, path=""):
    return f"{URL}/zarr/{segment(version)}" + (f"/{path}" if path else "")


def get(url, **kw):
    return SESSION.get(url, timeout=60, **kw)


def want(array):
    """An array's expected values: flat C order, NaN (and infinities) written as strings."""
    values = [float(v) if isinstance(v, str) else v for v in array["values"]]
    return np.asarray(values, dtype=np.dtype(array["dtype"])).reshape(array["shape"])


def assert_values(got, array, what):
    expected = want(array)
    got = np.asarray(got)
    assert got.shape == expected.shape, what
    assert got.dtype.newbyteorder("=") == expected.dtype.newbyteorder("="), f"{what}: {got.dtype}"
    # exact, NaN equal to NaN in the same places
    np.testing.assert_array_equal(got, expected, err_msg=what)


def node_paths(snap):
    """Every node below the root: 'a', 'a/b', ... (expected.json keys them '/a', '/a/b')."""
    return {p.lstrip("/") for p in list(snap["arrays"]) + list(snap["groups"]) if p != "/"}


def nodes(group, prefix=""):
    out = {}
    for name, node in group.members():
        out[prefix + name] = node
        if isinstance(node, zarr.Group):
            out.update(nodes(node, prefix + name + "/"))
    return out


def rfc3339(text):
    """A datetime of an RFC 3339 time, fractions cut to microseconds (Python parses no more)."""
    text = text.replace("Z", "+00:00")
    text = re.sub(r"(\.\d{6})\d+", r"\1", text)
    return datetime.datetime.fromisoformat(text)


@pytest.mark.parametrize("version,snapshot", VERSIONS, ids=IDS)
def test_zarr_python_reads_every_version(version, snapshot):
    snap = SNAPSHOTS[snapshot]
    url = zarr_url(version)
    if "/" not in snap["groups"]:
        # The initial snapshot: no root group, no keys.
        with pytest.raises(FileNotFoundError):
            zarr.open_group(url, mode="r")
        return
    group = zarr.open_group(url, mode="r")
    assert group.attrs.asdict() == snap["groups"]["/"]["attributes"]
    found = nodes(group)
    assert set(found) == node_paths(snap), f"members of {url}"
    for path, meta in snap["groups"].items():
        if path != "/":
            node = found[path.lstrip("/")]
            assert isinstance(node, zarr.Group), path
            assert node.attrs.asdict() == meta["attributes"], path
    for path, array in snap["arrays"].items():
        node = found[path.lstrip("/")]
        what = f"{url}{path}"
        assert isinstance(node, zarr.Array), what
        assert node.shape == tuple(array["shape"]), what
        assert node.chunks == tuple(array["chunks"]), what
        assert node.dtype == np.dtype(array["dtype"]), what
        fill = array["fill_value"]
        fill = float(fill) if isinstance(fill, str) else fill
        np.testing.assert_array_equal(np.asarray(node.fill_value), np.asarray(fill, dtype=node.dtype), err_msg=what)
        assert node.attrs.asdict() == array["attributes"], what
        assert_values(node[...], array, what)
        # opened as an array on its own too (its own zarr.json, not the group's consolidated one)
        alone = zarr.open_array(f"{url}{path}", mode="r", zarr_format=3)
        assert_values(alone[...], array, what + " (open_array)")


@pytest.mark.parametrize("version,snapshot", VERSIONS, ids=IDS)
def test_keys_and_documents_of_every_version(version, snapshot):
    """Every key icechunk lists at that version answers 200, the metadata documents as stored
    (a group's with zarrgate's consolidated_metadata besides); chunks icechunk reports missing,
    and nodes of other versions, answer 404."""
    snap = SNAPSHOTS[snapshot]
    for key in snap["keys"]:
        r = get(zarr_url(version, key))
        assert r.status_code == 200, f"GET {r.url} -> {r.status_code} {r.text[:300]}"
        assert r.content, r.url
    for path, meta in list(snap["groups"].items()) + list(snap["arrays"].items()):
        r = get(zarr_url(version, f"{path.strip('/')}/zarr.json".lstrip("/")))
        assert r.status_code == 200, f"GET {r.url} -> {r.status_code} {r.text[:300]}"
        doc = r.json()
        if doc["node_type"] == "group":
            doc.pop("consolidated_metadata", None)
        assert doc == meta["zarr_json"], r.url
    for path, array in snap["arrays"].items():
        for chunk, kind in array["chunk_types"].items():
            if kind == "missing":
                r = get(zarr_url(version, f"{path.strip('/')}/{chunk}"))
                assert r.status_code == 404, f"GET {r.url} -> {r.status_code} (icechunk: no such chunk)"
    every = set().union(*(node_paths(s) for s in SNAPSHOTS.values()))
    for path in sorted(every - node_paths(snap)):
        r = get(zarr_url(version, f"{path}/zarr.json"))
        assert r.status_code == 404, f"GET {r.url} -> {r.status_code} (no such node at this version)"
    if "/" not in snap["groups"]:
        assert get(zarr_url(version, "zarr.json")).status_code == 404


def netcdf_temperature():
    """temperature of tests/fixtures/references/data.nc as xarray reads it (h5netcdf,
    mask_and_scale=False): read here when h5netcdf is installed, else as the references' fixture
    script recorded it (expected.json of tests/fixtures/references, the same reader)."""
    try:
        import h5netcdf  # noqa: F401
    except ImportError:
        refs = json.loads((FIXTURES / "references" / "expected.json").read_text())["arrays"]
        array = next(a for a in refs if a["source"] == "data.nc" and a["path"] == "temperature")
        assert "h5netcdf" in array["reader"] and "mask_and_scale=False" in array["reader"]
        return np.asarray(array["values"], dtype=np.dtype(array["dtype"])).reshape(array["shape"])
    with xr.open_dataset(
        FIXTURES / "references" / "data.nc", engine="h5netcdf", mask_and_scale=False, decode_times=False
    ) as ds:
        return ds["temperature"].values


@pytest.mark.parametrize("consolidated", [True, None], ids=["consolidated", "consolidated-default"])
def test_xarray_opens_the_virtual_group_at_tag_v1(consolidated):
    """The root group holds arrays without dimension_names (small), which xarray cannot open;
    its `virtual` group's arrays have ["time", "y", "x"]: opened with xarray, equal to the
    expected values and to the NetCDF file their chunks are read from."""
    snap = SNAPSHOTS[EXPECTED["versions"]["tag.v1"]]
    ds = xr.open_zarr(
        zarr_url("tag.v1"), group="virtual", consolidated=consolidated, mask_and_scale=False, decode_times=False
    )
    assert set(ds.data_vars) == {"temperature", "temperature_vcc"}
    assert ds.attrs == snap["groups"]["/virtual"]["attributes"]
    netcdf = netcdf_temperature()
    for name in ("temperature", "temperature_vcc"):
        array = snap["arrays"][f"/virtual/{name}"]
        var = ds[name]
        assert var.dims == ("time", "y", "x"), name
        attrs = dict(var.attrs)
        attrs.pop("_FillValue", None)
        assert attrs == array["attributes"], name
        values = var.values
        assert_values(values, array, f"xarray virtual/{name}")
        assert values.dtype == netcdf.dtype
        np.testing.assert_array_equal(values, netcdf, err_msg=f"virtual/{name} vs data.nc")
        # a region across chunks
        region = var.isel(time=slice(1, 3), y=slice(1, 5), x=slice(2, 7)).values
        np.testing.assert_array_equal(region, want(array)[1:3, 1:5, 2:7], err_msg=name)


def test_xarray_cannot_open_the_root_and_zarr_reads_its_arrays_at_tag_v1():
    """The root holds `small`, without dimension_names: xarray refuses the root (a client
    limitation, asserted so that a change shows), so its arrays are read with zarr-python, with
    `temperature`'s dimension_names as the fixture wrote them."""
    snap = SNAPSHOTS[EXPECTED["versions"]["tag.v1"]]
    with pytest.raises(KeyError, match="dimension_names"):
        xr.open_zarr(zarr_url("tag.v1"), consolidated=True)
    root = zarr.open_group(zarr_url("tag.v1"), mode="r")
    assert root["temperature"].metadata.dimension_names == ("time", "y", "x")
    assert root["small"].metadata.dimension_names is None
    assert_values(root["temperature"][...], snap["arrays"]["/temperature"], "temperature")
    assert_values(root["small"][...], snap["arrays"]["/small"], "small")


def test_versions_route():
    r = get(f"{URL}/api/v1/versions/{MOUNT}")
    assert r.status_code == 200, f"GET {r.url} -> {r.status_code} {r.text[:300]}"
    assert "no-cache" in r.headers.get("cache-control", "")
    doc = r.json()
    assert doc["mount"] == MOUNT
    assert doc["default"] == "branch.main"
    assert {b["name"]: b["snapshot"] for b in doc["branches"]} == EXPECTED["branches"]
    assert len(doc["branches"]) == len(EXPECTED["branches"])
    assert {t["name"]: t["snapshot"] for t in doc["tags"]} == EXPECTED["tags"]
    assert len(doc["tags"]) == len(EXPECTED["tags"])
    listed = {s["id"]: s for s in doc["snapshots"]}
    assert len(listed) == len(doc["snapshots"]), "each snapshot once"
    assert set(listed) == set(SNAPSHOTS)
    for sid, snap in SNAPSHOTS.items():
        got = listed[sid]
        assert got["message"] == snap["message"], sid
        assert got["parent"] == snap["parent_id"], sid
        delta = abs(rfc3339(got["time"]) - rfc3339(snap["written_at"]))
        assert delta <= datetime.timedelta(milliseconds=1), (sid, got["time"], snap["written_at"])
    times = [rfc3339(s["time"]) for s in doc["snapshots"]]
    assert times == sorted(times, reverse=True), "newest first"
    # each branch's ancestry is there, parent by parent
    for branch, ancestry in EXPECTED["ancestry"].items():
        for child, parent in zip(ancestry, ancestry[1:]):
            assert listed[child]["parent"] == parent, branch
        assert listed[ancestry[-1]]["parent"] is None
    # a mount without versions
    r = get(f"{URL}/api/v1/versions/fx")
    assert r.status_code >= 400 and r.status_code < 500, f"GET {r.url} -> {r.status_code}"


@pytest.mark.parametrize("version,snapshot", VERSIONS, ids=IDS)
def test_slice_and_list_apis_at_every_version(version, snapshot):
    snap = SNAPSHOTS[snapshot]
    seg = segment(version)
    for path, array in snap["arrays"].items():
        r = get(f"{URL}/api/v1/slice/{seg}{path}", params={"format": "npy"})
        assert r.status_code == 200, f"GET {r.url} -> {r.status_code} {r.text[:300]}"
        assert_values(np.load(io.BytesIO(r.content), allow_pickle=False), array, r.url)
    if "/" not in snap["groups"]:
        r = get(f"{URL}/api/v1/list/{seg}")
        if r.status_code == 200:
            assert r.json()["children"] == [], r.url
        else:
            assert r.status_code == 404, f"GET {r.url} -> {r.status_code} {r.text[:300]}"
        return
    r = get(f"{URL}/api/v1/list/{seg}")
    assert r.status_code == 200, f"GET {r.url} -> {r.status_code} {r.text[:300]}"
    doc = r.json()
    assert doc["node"]["node_type"] == "group", r.url
    children = {c["name"]: c["node_type"] for c in doc["children"]}
    kinds = {p: "array" for p in snap["arrays"]} | {p: "group" for p in snap["groups"]}
    expected = {p.lstrip("/"): k for p, k in kinds.items() if p.count("/") == 1 and p != "/"}
    assert children == expected, r.url


def test_snapshot_answers_are_immutable_and_revalidate():
    c1 = EXPECTED["tags"]["v1"]
    key = "temperature/c/0/0/0"
    url = zarr_url(f"snapshot.{c1}", key)
    r = get(url)
    assert r.status_code == 200, f"GET {r.url} -> {r.status_code} {r.text[:300]}"
    assert r.headers.get("cache-control") == IMMUTABLE, r.headers
    etag = r.headers.get("etag")
    assert etag, f"GET {url}: no ETag ({dict(r.headers)})"
    again = get(url, headers={"If-None-Match": etag})
    assert again.status_code == 304, f"GET {url} If-None-Match {etag} -> {again.status_code}"
    assert not again.content
    assert again.headers.get("etag") == etag
    # the tag names the same snapshot: the same bytes, but a tag moves, so not immutable
    by_tag = get(zarr_url("tag.v1", key))
    assert by_tag.status_code == 200
    assert by_tag.content == r.content
    assert "immutable" not in by_tag.headers.get("cache-control", "")
    # commit 2 rewrote temperature[0]: another snapshot's chunk differs
    c2 = EXPECTED["commits"]["c2"]
    other = get(zarr_url(f"snapshot.{c2}", key))
    assert other.status_code == 200
    assert other.content != r.content
    if other.headers.get("etag"):
        assert other.headers["etag"] != etag
    # metadata and the slice API of a snapshot are immutable too
    for u in (zarr_url(f"snapshot.{c1}", "zarr.json"), f"{URL}/api/v1/slice/{segment(f'snapshot.{c1}')}/small?format=npy"):
        r = get(u)
        assert r.status_code == 200, f"GET {u} -> {r.status_code} {r.text[:300]}"
        assert r.headers.get("cache-control") == IMMUTABLE, (u, r.headers.get("cache-control"))
