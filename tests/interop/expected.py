"""Expected values written by tests/fixtures/make_fixtures.py (.npy, or .json for vlen data), and
a value comparison that every suite shares (numpy only: both venvs import it)."""
import base64
import json
import pathlib

import numpy as np


def load(path: pathlib.Path):
    """The expected array, as numpy (object arrays for vlen strings/bytes)."""
    if path.suffix == ".npy":
        return np.load(path, allow_pickle=False)
    doc = json.loads(path.read_text())
    values = doc["values"]
    if doc.get("kind") == "bytes":
        values = [None if v is None else base64.b64decode(v) for v in values]
    return object_array(values, doc["shape"])


def kind(path: pathlib.Path) -> str:
    """"npy" for fixed-size values, else the .json kind: "string", "bytes" or "object"."""
    if path.suffix == ".npy":
        return "npy"
    return json.loads(path.read_text()).get("kind", "object")


def object_array(flat, shape):
    out = np.empty(len(flat), dtype=object)
    out[:] = flat
    return out.reshape(shape)


def nested_to_object(data, shape):
    """A nested JSON list of `shape` (or a scalar for shape []) as an object array."""
    flat = []

    def walk(x, depth):
        if depth == len(shape):
            flat.append(x)
        else:
            for y in x:
                walk(y, depth + 1)

    walk(data, 0)
    return object_array(flat, shape)


def same(actual, expected) -> bool:
    """Value equality that treats NaN == NaN (NaT == NaT), ignores byte order, compares structured
    arrays field by field and strings/bytes/objects element-wise."""
    actual = np.asarray(actual)
    expected = np.asarray(expected)
    if actual.shape != expected.shape:
        return False
    if expected.dtype.names or actual.dtype.names:
        if expected.dtype.names != actual.dtype.names:
            return False
        return all(same(actual[n], expected[n]) for n in expected.dtype.names)
    if expected.dtype.kind in "OT" or actual.dtype.kind in "OT":
        return all(_eq(a, e) for a, e in zip(actual.ravel().tolist(), expected.ravel().tolist()))
    if expected.dtype.kind in "mM" or actual.dtype.kind in "mM":
        if actual.dtype.kind != expected.dtype.kind:
            return False
        if np.datetime_data(actual.dtype) != np.datetime_data(expected.dtype):
            return False
        return bool(np.array_equal(_native(actual).view("i8"), _native(expected).view("i8")))
    if expected.dtype.kind in "fc":
        return bool(np.array_equal(actual, expected, equal_nan=True))
    return bool(np.array_equal(actual, expected))


def same_dtype(a, b) -> bool:
    """dtype equality up to byte order."""
    return np.dtype(a).newbyteorder("<") == np.dtype(b).newbyteorder("<")


def _native(a):
    return a.astype(a.dtype.newbyteorder("="))


def _eq(a, e):
    return _json_like(a) == _json_like(e)


def _json_like(v):
    """An element as the fixtures' .json files (and zarrgate's JSON) write objects: bytes as
    base64 (dict keys too), NaN and infinities as "NaN" / "Infinity" / "-Infinity", arrays
    (vlen-array items) and tuples as lists. Python objects zarr reads and the JSON of an
    expected file then compare equal."""
    if isinstance(v, (bytes, bytearray, np.bytes_)):
        return base64.b64encode(bytes(v)).decode("ascii")
    if isinstance(v, np.ndarray):
        return _json_like(v.tolist())
    if isinstance(v, np.generic):
        return _json_like(v.item())
    if isinstance(v, float) and (v != v or v in (float("inf"), float("-inf"))):
        return "NaN" if v != v else ("Infinity" if v > 0 else "-Infinity")
    if isinstance(v, (list, tuple)):
        return [_json_like(x) for x in v]
    if isinstance(v, dict):
        return {_json_like(k) if isinstance(k, bytes) else k: _json_like(x) for k, x in v.items()}
    return v
