"""Neuroglancer reads arrays from zarrgate; the values it returns are compared with the expected data.

    python neuroglancer_read.py PLAN.json      (started by neuroglancer.cjs, in the venv made from
                                               requirements-neuroglancer.txt)

PLAN.json: {"cases": [{"name", "source", "expected": {"npy": FILE} | {"local": {"driver", "path"}},
"region": bool}]}. `source` is a neuroglancer data source URL (`zarr2://http://...`,
`zarr3://http://...`) on zarrgate.

Starts neuroglancer's own server on 127.0.0.1 (neuroglancer.Viewer, serving the client bundled in
the wheel), adds one image layer per case and prints `{"url": ...}` on stdout: neuroglancer.cjs
opens that URL in headless Chromium. Then, per case, `viewer.volume(layer)` makes the client in the
browser fetch the array's chunks from zarrgate with its own zarr driver and send the decoded
chunks back here; the whole array (and, with "region", a region 1..n-1 in every dimension of
size > 2, which starts and ends inside chunks) must equal the expected values:
- {"npy": FILE}: the fixture manifests' values, written by zarr-python;
- {"local": ...}: tensorstore reading the same array from the local files.
The bounds and data type that neuroglancer reports are checked too. One JSON line per case:
`{"case": NAME, "errors": [...], "info": {...}}`, then `{"done": true}`.
"""

import json
import sys
import time

import numpy as np
import tensorstore as ts

import neuroglancer

TIMEOUT_S = 60


def emit(obj):
    print(json.dumps(obj), flush=True)


def expected_values(spec):
    if "npy" in spec:
        return np.load(spec["npy"], allow_pickle=False)
    local = spec["local"]
    store = ts.open({"driver": local["driver"], "kvstore": {"driver": "file", "path": local["path"]}}, read=True).result()
    return store.read().result()


def difference(actual, want):
    """None when equal (NaN equals NaN), else a short description of the first difference."""
    if actual.shape != want.shape:
        return f"shape {actual.shape} != expected {want.shape}"
    same = actual == want
    if want.dtype.kind in "fc":
        same |= np.isnan(actual) & np.isnan(want)
    if same.all():
        return None
    bad = np.argwhere(~same)
    first = tuple(int(i) for i in bad[0])
    return f"{len(bad)} of {want.size} values differ; first at {list(first)}: got {actual[first].item()!r}, expected {want[first].item()!r}"


def check(viewer, layer, case):
    errors = []
    want = expected_values(case["expected"])
    info = viewer.volume_info(layer).result(timeout=TIMEOUT_S)
    summary = {
        "dataType": info.data_type,
        "lowerBound": [int(x) for x in info.lower_bound],
        "upperBound": [int(x) for x in info.upper_bound],
        "chunkShape": [int(x) for x in info.chunk_shape],
    }
    if summary["lowerBound"] != [0] * want.ndim or summary["upperBound"] != list(want.shape):
        errors.append(f"bounds {summary['lowerBound']}..{summary['upperBound']}, expected 0..{list(want.shape)}")
    native = want.dtype.newbyteorder("=")
    if np.dtype(info.data_type) != native:
        errors.append(f"data type {info.data_type}, expected {native}")
    volume = viewer.volume(layer).result(timeout=TIMEOUT_S)
    t0 = time.monotonic()
    whole = volume.read().result(timeout=TIMEOUT_S)
    summary["seconds"] = round(time.monotonic() - t0, 3)
    diff = difference(np.asarray(whole), want.astype(native))
    if diff:
        errors.append(f"whole array: {diff}")
    if case.get("region"):
        region = tuple(slice(1, n - 1) if n > 2 else slice(None) for n in want.shape)
        part = volume[region].read().result(timeout=TIMEOUT_S)
        diff = difference(np.asarray(part), want.astype(native)[region])
        if diff:
            errors.append(f"region {[(s.start, s.stop) for s in region]}: {diff}")
        summary["region"] = [[s.start, s.stop] for s in region]
    return errors, summary


def main():
    plan = json.loads(open(sys.argv[1]).read())
    neuroglancer.set_server_bind_address("127.0.0.1", 0)
    viewer = neuroglancer.Viewer()
    layers = {}
    with viewer.txn() as s:
        s.layout = "xy"
        for i, case in enumerate(plan["cases"]):
            layers[case["name"]] = f"case{i}"
            s.layers[f"case{i}"] = neuroglancer.ImageLayer(source=case["source"])
    emit({"url": viewer.get_viewer_url()})
    for case in plan["cases"]:
        try:
            errors, info = check(viewer, layers[case["name"]], case)
        except TimeoutError:
            errors, info = [f"no answer from the viewer within {TIMEOUT_S} s"], {}
        except Exception as e:  # e.g. an error the client reported for the layer
            errors, info = [f"{type(e).__name__}: {e}"], {}
        emit({"case": case["name"], "errors": errors, "info": info})
    emit({"done": True})
    neuroglancer.stop()


if __name__ == "__main__":
    main()
