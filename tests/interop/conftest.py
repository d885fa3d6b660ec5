"""Shared fixtures for the interop suite: where the server is, what it serves, and which regions
of each array the clients read.

This file is loaded by both venvs (zarr 3 and zarr 2.18), so it imports only the standard
library, numpy and pytest. Which test files a venv runs is decided here: the zarr 2 venv runs
only `test_v2_*.py`, every other venv skips those.
"""
import dataclasses
import json
import os
import pathlib
import urllib.error
import urllib.request

import pytest

HERE = pathlib.Path(__file__).resolve().parent
REPO = pathlib.Path(os.environ.get("ZARRGATE_REPO", HERE.parents[1]))
URL = os.environ.get("ZARRGATE_URL", "http://127.0.0.1:8080")
FIXTURES = REPO / "tests" / "fixtures"
DATA = FIXTURES / "data"
DEMO = REPO / "data" / "demo"
ZARRITA = REPO.parent / "shared" / "fixtures" / "zarrita"


def _zarr_major():
    try:
        import zarr
    except ImportError:
        return None
    return int(zarr.__version__.split(".")[0])


# browser/ and webpage/ belong to the Node suites (run through their own scripts).
collect_ignore_glob = ["browser/*", "webpage/*"]
if _zarr_major() == 2:
    collect_ignore = [str(p) for p in HERE.glob("test_*.py") if not p.name.startswith("test_v2_")]
else:
    collect_ignore = [str(p) for p in HERE.glob("test_v2_*.py")]


def manifest(path: pathlib.Path):
    return json.loads(path.read_text()) if path.exists() else []


@dataclasses.dataclass(frozen=True)
class Case:
    """One array of a fixture manifest, as served by one mount."""

    mount: str  # "fx" (tests/fixtures/data) or "zarrita" (../shared/fixtures/zarrita)
    path: str  # key prefix inside the mount
    local: pathlib.Path  # the same array on disk
    expected_file: pathlib.Path  # the read-back values (.npy or .json)
    zarr_format: int
    dtype: object  # numpy descr (str or list), "string" or "object"
    shape: tuple
    reader: str  # the library that produced expected_file
    notes: str

    @property
    def id(self) -> str:
        return f"{self.mount}/{self.path}"

    def url(self, base: str = URL) -> str:
        return f"{base}/zarr/{self.mount}/{self.path}"

    @property
    def vlen(self) -> bool:
        """Expected values are variable-length (strings, bytes, objects): a .json file."""
        return self.expected_file.suffix == ".json"


def _cases(manifest_path: pathlib.Path, mount: str, root: pathlib.Path):
    out = []
    for c in manifest(manifest_path):
        if not c["expected"]:
            continue
        out.append(
            Case(
                mount=mount,
                path=c["path"],
                local=root / c["path"],
                expected_file=manifest_path.parent / c["expected"],
                zarr_format=c["zarr_format"],
                dtype=c["dtype"],
                shape=tuple(c["shape"]),
                reader=c["reader"],
                notes=c.get("notes", ""),
            )
        )
    return out


FX_CASES = _cases(FIXTURES / "cases.json", "fx", DATA)
ZARRITA_CASES = _cases(FIXTURES / "zarrita_expected" / "cases.json", "zarrita", ZARRITA)
ALL_CASES = FX_CASES + ZARRITA_CASES


def params(cases):
    """pytest.param per case, id = mount/path; zarrita cases skip when its directory is absent."""
    no_zarrita = pytest.mark.skipif(not ZARRITA.is_dir(), reason="../shared/fixtures/zarrita is absent")
    return [pytest.param(c, id=c.id, marks=[no_zarrita] if c.mount == "zarrita" else []) for c in cases]


def read_chunk_shape(local: pathlib.Path):
    """The shape of the smallest unit a reader decodes: the chunk, or for sharded v3 arrays the
    innermost inner chunk. Read from the metadata on disk (v1 `meta`, v2 `.zarray`, v3 `zarr.json`)."""
    if (local / "zarr.json").exists():
        meta = json.loads((local / "zarr.json").read_text())
        shape = meta["chunk_grid"]["configuration"]["chunk_shape"]
        codecs = meta.get("codecs", [])
        while True:
            shard = next((c for c in codecs if c.get("name") == "sharding_indexed"), None)
            if shard is None:
                break
            shape = shard["configuration"]["chunk_shape"]
            codecs = shard["configuration"].get("codecs", [])
        return tuple(shape)
    for name in (".zarray", "meta"):
        if (local / name).exists():
            return tuple(json.loads((local / name).read_text())["chunks"])
    raise FileNotFoundError(f"no array metadata in {local}")


def regions(shape, chunks):
    """Named regions of an array with `shape` read in units of `chunks`:

    - sub_chunk: strictly inside the first chunk (for sharded arrays: inside one inner chunk of
      one shard), so a client reads part of one chunk / ranges of one shard;
    - cross: from 1 to n-1 in every dimension, crossing chunk (and shard) boundaries;
    - strided: every second element from 1 (`1::2`), touching many chunks sparsely.

    A 0-d array has no regions (its whole read is the only read).
    """
    if len(shape) == 0:
        return {}
    sub, cross, strided = [], [], []
    for n, c in zip(shape, chunks):
        c = min(c, n)
        start = 1 if c >= 2 else 0
        stop = c - 1 if c >= 3 else c
        sub.append(slice(start, max(stop, start + 1)))
        cross.append(slice(1, n - 1) if n >= 3 else slice(0, n))
        strided.append(slice(1, None, 2))
    return {"sub_chunk": tuple(sub), "cross": tuple(cross), "strided": tuple(strided)}


def select_param(region) -> str:
    """A region as zarrgate's `select` query value, e.g. `1:4,1::2`."""
    terms = []
    for s in region:
        start = "" if s.start is None else str(s.start)
        stop = "" if s.stop is None else str(s.stop)
        terms.append(f"{start}:{stop}" + (f":{s.step}" if s.step not in (None, 1) else ""))
    return ",".join(terms)


def route_absent(url: str) -> bool:
    """True when the server answers 404 for the route itself ("no such route"): the feature is
    not in this build. A 404 for a missing node (e.g. code not_found naming the node) is not."""
    try:
        with urllib.request.urlopen(url, timeout=30):
            return False
    except urllib.error.HTTPError as e:
        if e.code != 404:
            return False
        try:
            err = json.loads(e.read().decode())["error"]
        except Exception:
            return False
        return err.get("code") == "not_found" and "route" in err.get("message", "")


@pytest.fixture(scope="session")
def base_url() -> str:
    return URL
