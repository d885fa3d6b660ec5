"""Runs last (file name order): the server's access log of this run shows no 5xx."""
import os
import re


def test_no_server_errors_in_access_log():
    path = os.environ.get("ZARRGATE_ACCESS_LOG")
    assert path, "run through tests/interop/run.sh"
    text = open(path).read()
    lines = [l for l in text.splitlines() if "zarrgate::access" in l]
    assert lines, "the access log has lines"
    bad = [l for l in lines if re.search(r"status=5\d\d", l)]
    assert not bad, bad[:5]
