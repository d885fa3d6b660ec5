"""Shared fixtures for the interop suite: where the server is and what it serves."""
import json
import os
import pathlib

import pytest

REPO = pathlib.Path(os.environ.get("ZARRGATE_REPO", pathlib.Path(__file__).resolve().parents[2]))
URL = os.environ.get("ZARRGATE_URL", "http://127.0.0.1:8080")
FIXTURES = REPO / "tests" / "fixtures"
ZARRITA = REPO.parent / "shared" / "fixtures" / "zarrita"


def manifest(path: pathlib.Path):
    return json.loads(path.read_text()) if path.exists() else []


@pytest.fixture(scope="session")
def base_url() -> str:
    return URL
