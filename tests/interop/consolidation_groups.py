"""Writes the documents of tests/fixtures/consolidation_cases.json under DIR: the v2 cases as
arrays of the v2 group DIR/v2, the v3 cases of the v3 group DIR/v3 (no chunks: every value is
the fill). Standard library only, so that either venv can run it; importable for the tests."""
import json
import pathlib
import sys

CASES_FILE = pathlib.Path(__file__).resolve().parents[1] / "fixtures" / "consolidation_cases.json"


def cases(zarr_format=None):
    every = json.loads(CASES_FILE.read_text())
    return [c for c in every if zarr_format in (None, c["zarr_format"])]


def write_case(case, at: pathlib.Path, normalized=False):
    """One case's array at `at`, its document as stored (or as consolidated metadata holds it)."""
    doc = dict(case["document"])
    if normalized:
        doc.update(case["normalized"])
    at.mkdir(parents=True, exist_ok=True)
    name = ".zarray" if case["zarr_format"] == 2 else "zarr.json"
    (at / name).write_text(json.dumps(doc))


def main(out: pathlib.Path):
    (out / "v2").mkdir(parents=True, exist_ok=True)
    (out / "v2" / ".zgroup").write_text('{"zarr_format": 2}')
    (out / "v3").mkdir(parents=True, exist_ok=True)
    (out / "v3" / "zarr.json").write_text('{"zarr_format": 3, "node_type": "group"}')
    for case in cases():
        write_case(case, out / f"v{case['zarr_format']}" / case["name"])


if __name__ == "__main__":
    main(pathlib.Path(sys.argv[1]))
