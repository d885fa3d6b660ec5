"""zarr 2.18 (the v2-era zarr-python, FSStore over fsspec HTTP): every v2 fixture it can read
locally, whole and in regions, equals the local read (and the manifest's values where zarr 2
wrote them); `zarr.open_consolidated` over HTTP on a group with a stored `.zmetadata` and on
groups without one (zarrgate synthesizes it)."""
import numpy as np
import pytest
import zarr

import consolidation_groups
from conftest import ALL_CASES, DATA, DEMO, URL, params, regions
from expected import load, same

Z2 = f"zarr {zarr.__version__}"
V2_CASES = [c for c in ALL_CASES if c.zarr_format == 2]


def open_local(path):
    try:
        arr = zarr.open_array(str(path), mode="r")
        whole = arr[...]
    except Exception as e:
        pytest.skip(f"{Z2} cannot read it locally: {type(e).__name__}: {str(e)[:160]}")
    return arr, whole


def defined(arr, path):
    """Mask of the elements whose values zarr 2 defines. With `fill_value: null` zarr 2 fills a
    missing chunk with uninitialised memory (np.empty), so only stored chunks can be compared."""
    mask = np.ones(arr.shape, dtype=bool)
    if arr.fill_value is not None or arr.dtype == object:
        return mask
    sep = arr._dimension_separator or "."
    for idx in np.ndindex(*arr.cdata_shape):
        if not (path / sep.join(map(str, idx))).exists():
            mask[tuple(slice(i * c, (i + 1) * c) for i, c in zip(idx, arr.chunks))] = False
    return mask


@pytest.mark.parametrize("case", params(V2_CASES))
def test_v2_fixture_over_http(case):
    local, local_whole = open_local(case.local)
    remote = zarr.open_array(case.url(), mode="r")
    assert remote.shape == local.shape and remote.dtype == local.dtype and remote.chunks == local.chunks
    ok = defined(local, case.local)
    whole = remote[...]
    assert same(whole[ok], local_whole[ok]), f"whole: {whole!r} != {local_whole!r}"
    if case.reader == Z2:
        expected = load(case.expected_file)
        assert same(whole[ok], expected[ok]), f"whole vs expected: {whole!r} != {expected!r}"
    for name, region in regions(local.shape, local.chunks).items():
        got, m = remote[region], ok[region]
        assert same(got[m], local[region][m]), f"{name} {region}: {got!r}"
        assert same(got[m], np.asarray(local_whole)[region][m]), name


def _nodes(group, prefix=""):
    """{path: node} for every array and group below `group` (zarr 2 API)."""
    out = {}
    for name, node in group.items():
        path = f"{prefix}{name}"
        out[path] = node
        if isinstance(node, zarr.hierarchy.Group):
            out.update(_nodes(node, path + "/"))
    return out


def assert_same_hierarchy(remote, local):
    assert remote.attrs.asdict() == local.attrs.asdict()
    r, l = _nodes(remote), _nodes(local)
    assert sorted(r) == sorted(l)
    for path, node in l.items():
        other = r[path]
        assert type(other) is type(node), path
        assert other.attrs.asdict() == node.attrs.asdict(), path
        if isinstance(node, zarr.core.Array):
            assert other.shape == node.shape and other.dtype == node.dtype, path
            assert same(other[...], node[...]), path


def test_v2_open_consolidated_stored_zmetadata():
    """fx/v2/group_consolidated has a `.zmetadata` on disk: served byte for byte, used by zarr."""
    local = zarr.open_consolidated(str(DATA / "v2" / "group_consolidated"), mode="r")
    remote = zarr.open_consolidated(f"{URL}/zarr/fx/v2/group_consolidated", mode="r")
    assert_same_hierarchy(remote, local)


@pytest.mark.parametrize(
    "mount,path,local",
    [
        ("demo", "v2.zarr", DEMO / "v2.zarr"),
        ("fx", "v2/group_nested", DATA / "v2" / "group_nested"),
    ],
    ids=["demo/v2.zarr", "fx/v2/group_nested"],
)
def test_v2_open_consolidated_synthesized(mount, path, local):
    """No `.zmetadata` on disk: zarrgate synthesizes one (mount option consolidated = true), so
    zarr 2 can open the whole hierarchy over HTTP, where it cannot list."""
    assert not (local / ".zmetadata").exists()
    remote = zarr.open_consolidated(f"{URL}/zarr/{mount}/{path}", mode="r")
    assert_same_hierarchy(remote, zarr.open_group(str(local), mode="r"))


# The table of what zarr-python opens (tests/fixtures/consolidation_cases.json): its zarr 2
# verdicts checked against zarr 2 itself, and what the synthesized group lists read by zarr 2
# as zarr 2 reads the documents as stored.

V2_CONSOLIDATION_CASES = consolidation_groups.cases(2)


@pytest.mark.parametrize("case", V2_CONSOLIDATION_CASES, ids=[c["name"] for c in V2_CONSOLIDATION_CASES])
def test_v2_the_table_says_what_zarr2_opens(case, tmp_path):
    consolidation_groups.write_case(case, tmp_path / "a")
    try:
        zarr.open_array(str(tmp_path / "a"), mode="r")[...]
        opened = True
    except Exception:
        opened = False
    assert opened == case["zarr2"]


def test_v2_synthesized_group_reads_as_stored(tmp_path):
    group = zarr.open_consolidated(f"{URL}/zarr/cases/v2", mode="r")
    listed = sorted(c["name"] for c in V2_CONSOLIDATION_CASES if c["listed"])
    assert sorted(group.array_keys()) == listed
    for case in V2_CONSOLIDATION_CASES:
        if case["listed"]:
            consolidation_groups.write_case(case, tmp_path / case["name"])
            stored = zarr.open_array(str(tmp_path / case["name"]), mode="r")
            remote = group[case["name"]]
            assert remote.dtype == stored.dtype, case["name"]
            assert same(remote[...], stored[...]), case["name"]
