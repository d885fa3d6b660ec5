"""ZOM (ZEP0006) JSON from `GET /api/v1/zom/{mount}/{path}` validates as pydantic-zarr's
GroupSpec / ArraySpec of the node's zarr_format, equals pydantic-zarr's own model of the same
hierarchy read locally (`GroupSpec.from_zarr`), and carries the stored metadata documents' fields
(v3 `zarr.json`; v2 `.zarray` / `.zgroup` with `.zattrs` as `attributes`).

Skipped as a whole only when the route itself is absent (404 "no such route" for
/api/v1/zom/demo/v3.zarr): the feature is not in this build."""
import json

import pytest
import requests
import zarr
from pydantic_zarr import v2, v3

from conftest import DATA, DEMO, URL, route_absent

SPECS = {2: v2, 3: v3}
GROUPS = [
    ("demo", "v2.zarr", DEMO / "v2.zarr", 2),
    ("demo", "v3.zarr", DEMO / "v3.zarr", 3),
    ("fx", "v2/group_nested", DATA / "v2" / "group_nested", 2),
    ("fx", "v3/group_nested", DATA / "v3" / "group_nested", 3),
]
ARRAYS = [
    ("demo", "v2.zarr/image", DEMO / "v2.zarr" / "image", 2),
    ("demo", "v3.zarr/volume", DEMO / "v3.zarr" / "volume", 3),
    ("demo", "v3.zarr/temperature", DEMO / "v3.zarr" / "temperature", 3),
]


@pytest.fixture(scope="module", autouse=True)
def zom_route():
    if route_absent(f"{URL}/api/v1/zom/demo/v3.zarr"):
        pytest.skip("GET /api/v1/zom is not in this build (404 'no such route')")


def get_zom(mount, path, **params):
    r = requests.get(f"{URL}/api/v1/zom/{mount}/{path}", params=params, timeout=60)
    assert r.status_code == 200, f"GET {r.url} -> {r.status_code} {r.text[:300]}"
    assert r.headers["content-type"].startswith("application/json"), r.headers["content-type"]
    return r.json()


def validate(doc, zarr_format):
    """The ZOM document as a typed pydantic-zarr model, members validated recursively."""
    spec = SPECS[zarr_format]
    assert doc.get("zarr_format") == zarr_format, doc.get("zarr_format")
    is_group = doc.get("node_type") == "group" if zarr_format == 3 else "shape" not in doc
    if not is_group:
        return spec.ArraySpec.model_validate(doc)
    members = doc.get("members")
    if members is not None:
        members = {name: validate(m, zarr_format) for name, m in members.items()}
    return spec.GroupSpec.model_validate({**doc, "members": members})


def stored(local, zarr_format):
    """The node as its stored documents say (the contract): fields + attributes (+ members)."""
    if zarr_format == 3:
        doc = json.loads((local / "zarr.json").read_text())
        doc.setdefault("attributes", {})
        is_group = doc["node_type"] == "group"
        child = lambda p: (p / "zarr.json").exists()
    else:
        is_group = (local / ".zgroup").exists()
        doc = json.loads((local / (".zgroup" if is_group else ".zarray")).read_text())
        attrs = local / ".zattrs"
        doc["attributes"] = json.loads(attrs.read_text()) if attrs.exists() else {}
        child = lambda p: (p / ".zarray").exists() or (p / ".zgroup").exists()
    if is_group:
        doc["members"] = {p.name: stored(p, zarr_format) for p in sorted(local.iterdir()) if p.is_dir() and child(p)}
    return doc


def as_json(model):
    return json.loads(model.model_dump_json())


@pytest.mark.parametrize("mount,path,local,zarr_format", GROUPS, ids=[f"{m}/{p}" for m, p, _, _ in GROUPS])
def test_zom_group(mount, path, local, zarr_format):
    doc = get_zom(mount, path)
    model = validate(doc, zarr_format)
    assert isinstance(model, SPECS[zarr_format].GroupSpec)
    assert doc == stored(local, zarr_format)
    mine = SPECS[zarr_format].GroupSpec.from_zarr(zarr.open_group(str(local), mode="r"))
    assert as_json(model) == as_json(mine)


@pytest.mark.parametrize("mount,path,local,zarr_format", ARRAYS, ids=[f"{m}/{p}" for m, p, _, _ in ARRAYS])
def test_zom_array(mount, path, local, zarr_format):
    doc = get_zom(mount, path)
    model = validate(doc, zarr_format)
    assert isinstance(model, SPECS[zarr_format].ArraySpec)
    assert doc == stored(local, zarr_format)
    mine = SPECS[zarr_format].ArraySpec.from_zarr(zarr.open_array(str(local), mode="r"))
    assert as_json(model) == as_json(mine)


@pytest.mark.parametrize("mount,path,local,zarr_format", GROUPS[:2], ids=["demo/v2.zarr", "demo/v3.zarr"])
def test_zom_depth_zero_has_no_members(mount, path, local, zarr_format):
    doc = get_zom(mount, path, depth=0)
    validate(doc, zarr_format)
    assert not doc.get("members"), doc.get("members")
    want = stored(local, zarr_format)
    want.pop("members")
    assert {k: v for k, v in doc.items() if k != "members"} == want
