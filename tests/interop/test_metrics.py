"""/metrics as Prometheus reads it: asked with Prometheus's Accept header, the exposition parses
with the Prometheus client library's strict OpenMetrics parser (sample names match their
families, the text ends with # EOF), under the content type it claims, and the families the
docs/operations.md documents are there with their labels. Asked without it (curl, older scrapers), it is
the text format 0.0.4, which the library's parser for that format reads into the same families."""
import pytest
import requests
from prometheus_client.openmetrics.parser import text_string_to_metric_families
from prometheus_client.parser import text_string_to_metric_families as text_0_0_4_families

from conftest import URL


# What Prometheus 2 and 3 send.
PROMETHEUS_ACCEPT = (
    "application/openmetrics-text;version=1.0.0,application/openmetrics-text;version=0.0.1;q=0.75,"
    "text/plain;version=0.0.4;q=0.5,*/*;q=0.1"
)


def families(openmetrics=True):
    # A few requests first, so that the labelled families have samples.
    requests.get(f"{URL}/api/v1/slice/demo/v2.zarr/counts?select=0:4", timeout=30).raise_for_status()
    requests.get(f"{URL}/zarr/demo/v2.zarr/.zgroup", timeout=30).raise_for_status()
    headers = {"Accept": PROMETHEUS_ACCEPT} if openmetrics else {}
    r = requests.get(f"{URL}/metrics", headers=headers, timeout=30)
    r.raise_for_status()
    parse = text_string_to_metric_families if openmetrics else text_0_0_4_families
    return r, {f.name: f for f in parse(r.text)}


@pytest.mark.parametrize("openmetrics", [True, False], ids=["openmetrics", "text-0.0.4"])
def test_metrics_parse_as_claimed(openmetrics):
    r, found = families(openmetrics)
    if openmetrics:
        assert r.headers["content-type"].startswith("application/openmetrics-text; version=1.0.0")
        assert r.text.endswith("# EOF\n")
    else:
        assert r.headers["content-type"].startswith("text/plain; version=0.0.4")
        assert "# EOF" not in r.text
    kinds = {
        "zarrgate_requests": "counter",
        "zarrgate_request_duration_seconds": "histogram",
        "zarrgate_cache_hits": "counter",
        "zarrgate_cache_misses": "counter",
        "zarrgate_cache_evictions": "counter",
        "zarrgate_cache_weighted_bytes": "gauge",
        "zarrgate_cache_entries": "gauge",
        "zarrgate_chunks_decoded": "counter",
        "zarrgate_spare_buffer_bytes": "gauge",
        "zarrgate_spare_buffer_reuses": "counter",
        "zarrgate_response_body_bytes": "counter",
        "zarrgate_responses_aborted": "counter",
        "zarrgate_requests_in_flight": "gauge",
        "zarrgate_connections_open": "gauge",
        "zarrgate_raw_cache_revalidations": "counter",
        "zarrgate_raw_cache_coalesced": "counter",
        "zarrgate_raw_cache_stale": "counter",
        "zarrgate_upstream_requests": "counter",
        "zarrgate_upstream_bytes": "counter",
    }
    assert {name: found[name].type for name in kinds if name in found} == kinds


@pytest.mark.parametrize("openmetrics", [True, False], ids=["openmetrics", "text-0.0.4"])
def test_metrics_values_and_labels(openmetrics):
    _, found = families(openmetrics)
    caches = {s.labels["cache"] for s in found["zarrgate_cache_hits"].samples}
    assert caches == {"chunks", "shard_indexes", "metadata", "hierarchies", "consolidated", "raw"}
    slice_ok = [
        s.value
        for s in found["zarrgate_requests"].samples
        if s.name == "zarrgate_requests_total" and s.labels == {"route": "slice", "status": "200"}
    ]
    assert slice_ok and slice_ok[0] >= 1
    buckets = [s for s in found["zarrgate_request_duration_seconds"].samples if s.name.endswith("_bucket")]
    top = max(float(s.labels["le"]) for s in buckets if s.labels["le"] != "+Inf")
    assert top > 60, "the buckets reach past the default request timeout"
    assert all(s.value >= 0 for f in found.values() for s in f.samples)
