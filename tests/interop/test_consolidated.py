"""Consolidated metadata over HTTP with zarr-python 3: a stored `.zmetadata` is served byte for
byte; where the store has none, zarrgate synthesizes it (v2 `.zmetadata`, v3
`consolidated_metadata` inside the group's `zarr.json`, stored fields untouched), and
`zarr.open_consolidated` / `use_consolidated=True` opens the whole hierarchy, which plain HTTP
cannot list, with the same nodes, attributes and values as a local open."""
import json

import pytest
import requests
import zarr

import consolidation_groups
from conftest import DATA, DEMO, URL
from expected import same

SYNTH = [
    ("demo", "v2.zarr", DEMO / "v2.zarr", 2),
    ("demo", "v3.zarr", DEMO / "v3.zarr", 3),
    ("fx", "v2/group_nested", DATA / "v2" / "group_nested", 2),
    ("fx", "v3/group_nested", DATA / "v3" / "group_nested", 3),
]
IDS = [f"{m}/{p}" for m, p, _, _ in SYNTH]


def raw(mount, key):
    return requests.get(f"{URL}/zarr/{mount}/{key}", timeout=60)


def nodes(group, prefix=""):
    out = {}
    for name, node in group.members():
        out[prefix + name] = node
        if isinstance(node, zarr.Group):
            out.update(nodes(node, prefix + name + "/"))
    return out


def assert_same_hierarchy(remote, local):
    assert remote.attrs.asdict() == local.attrs.asdict()
    r, l = nodes(remote), nodes(local)
    assert sorted(r) == sorted(l)
    for path, node in l.items():
        other = r[path]
        assert type(other) is type(node), path
        assert other.attrs.asdict() == node.attrs.asdict(), path
        if isinstance(node, zarr.Array):
            assert other.shape == node.shape and other.dtype == node.dtype, path
            assert same(other[...], node[...]), path


def test_stored_zmetadata_served_verbatim():
    r = raw("fx", "v2/group_consolidated/.zmetadata")
    assert r.status_code == 200
    assert r.content == (DATA / "v2" / "group_consolidated" / ".zmetadata").read_bytes()
    remote = zarr.open_consolidated(f"{URL}/zarr/fx/v2/group_consolidated", mode="r", zarr_format=2)
    assert_same_hierarchy(remote, zarr.open_group(str(DATA / "v2" / "group_consolidated"), mode="r"))


@pytest.mark.parametrize("mount,path,local,zarr_format", SYNTH, ids=IDS)
def test_synthesized_metadata_documents(mount, path, local, zarr_format):
    if zarr_format == 2:
        assert not (local / ".zmetadata").exists()
        r = raw(mount, f"{path}/.zmetadata")
        assert r.status_code == 200, f"GET {r.url} -> {r.status_code} {r.text[:200]}"
        doc = r.json()
        assert doc["zarr_consolidated_format"] == 1
        meta = doc["metadata"]
        # every stored metadata document below the group, keyed by its path, as stored
        for f in sorted(local.rglob(".z*")):
            key = f.relative_to(local).as_posix()
            assert meta.get(key) == json.loads(f.read_text()), key
        assert len(meta) == len(list(local.rglob(".z*")))
        # never v3 metadata for a v2 node
        assert raw(mount, f"{path}/zarr.json").status_code == 404
    else:
        r = raw(mount, f"{path}/zarr.json")
        assert r.status_code == 200
        doc, on_disk = r.json(), json.loads((local / "zarr.json").read_text())
        cm = doc.pop("consolidated_metadata", None)
        assert doc == on_disk, "stored fields untouched"
        assert cm is not None, "consolidated_metadata synthesized"
        assert cm["kind"] == "inline" and cm["must_understand"] is False
        for f in sorted(local.rglob("*/zarr.json")):
            key = f.parent.relative_to(local).as_posix()
            want = json.loads(f.read_text())
            got = dict(cm["metadata"][key])
            got.pop("consolidated_metadata", None)
            assert got == want, key
        assert len(cm["metadata"]) == len(list(local.rglob("*/zarr.json")))
        # never v2 metadata for a v3 node
        assert raw(mount, f"{path}/.zmetadata").status_code == 404


@pytest.mark.parametrize("mount,path,local,zarr_format", SYNTH, ids=IDS)
def test_open_consolidated_over_http(mount, path, local, zarr_format):
    remote = zarr.open_consolidated(f"{URL}/zarr/{mount}/{path}", mode="r", zarr_format=zarr_format)
    assert remote.metadata.consolidated_metadata is not None
    assert_same_hierarchy(remote, zarr.open_group(str(local), mode="r"))


# The table of what zarr-python opens (tests/fixtures/consolidation_cases.json), which the
# synthesized documents follow: its verdicts checked against zarr-python 3 itself.

CONSOLIDATION_CASES = consolidation_groups.cases()


@pytest.mark.parametrize("case", CONSOLIDATION_CASES, ids=[c["name"] for c in CONSOLIDATION_CASES])
def test_the_table_says_what_zarr3_opens(case, tmp_path):
    consolidation_groups.write_case(case, tmp_path / "a")
    try:
        zarr.open_array(str(tmp_path / "a"), mode="r", zarr_format=case["zarr_format"])[...]
        opened = True
    except Exception:
        opened = False
    assert opened == case["zarr3"]
    if case["listed"]:
        # As consolidated metadata holds it, zarr 3 opens it.
        consolidation_groups.write_case(case, tmp_path / "b", normalized=True)
        zarr.open_array(str(tmp_path / "b"), mode="r", zarr_format=case["zarr_format"])[...]


@pytest.mark.parametrize("zarr_format", [2, 3])
def test_synthesized_groups_list_what_zarr3_opens(zarr_format, tmp_path):
    group = zarr.open_consolidated(f"{URL}/zarr/cases/v{zarr_format}", mode="r", zarr_format=zarr_format)
    listed = sorted(c["name"] for c in consolidation_groups.cases(zarr_format) if c["listed"])
    assert sorted(name for name, _ in group.members()) == listed
    for case in consolidation_groups.cases(zarr_format):
        if case["listed"]:
            consolidation_groups.write_case(case, tmp_path / case["name"], normalized=True)
            local = zarr.open_array(str(tmp_path / case["name"]), mode="r", zarr_format=zarr_format)
            assert same(group[case["name"]][...], local[...]), case["name"]
