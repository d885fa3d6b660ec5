"""Expected values written by tests/fixtures/make_fixtures.py (.npy, or .json for vlen data)."""
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
    out = np.empty(len(values), dtype=object)
    out[:] = values
    return out.reshape(doc["shape"])


def same(actual, expected) -> bool:
    """Value equality that treats NaN == NaN and compares strings/bytes element-wise."""
    actual = np.asarray(actual)
    if actual.shape != expected.shape:
        return False
    if expected.dtype == object or actual.dtype.kind in "OT":
        return all(_eq(a, e) for a, e in zip(actual.ravel().tolist(), expected.ravel().tolist()))
    if expected.dtype.kind in "fc":
        return bool(np.array_equal(actual, expected, equal_nan=True))
    if expected.dtype.kind in "mM":
        return bool(np.array_equal(actual.view("i8"), expected.view("i8")))
    return bool(np.array_equal(actual, expected))


def _eq(a, e):
    if isinstance(a, float) and isinstance(e, float) and a != a and e != e:
        return True
    return a == e
