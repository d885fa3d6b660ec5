"""/metrics as Prometheus reads it: the exposition parses with the Prometheus client library's
strict OpenMetrics parser (sample names match their families, the text ends with # EOF), under
the content type it claims, and the families the README documents are there with their labels."""
import requests
from prometheus_client.openmetrics.parser import text_string_to_metric_families

from conftest import URL


def families():
    # A few requests first, so that the labelled families have samples.
    requests.get(f"{URL}/api/v1/slice/demo/v2.zarr/counts?select=0:4", timeout=30).raise_for_status()
    requests.get(f"{URL}/zarr/demo/v2.zarr/.zgroup", timeout=30).raise_for_status()
    r = requests.get(f"{URL}/metrics", timeout=30)
    r.raise_for_status()
    return r, {f.name: f for f in text_string_to_metric_families(r.text)}


def test_metrics_parse_as_openmetrics():
    r, found = families()
    assert r.headers["content-type"].startswith("application/openmetrics-text; version=1.0.0")
    assert r.text.endswith("# EOF\n")
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
    }
    assert {name: found[name].type for name in kinds if name in found} == kinds


def test_metrics_values_and_labels():
    _, found = families()
    caches = {s.labels["cache"] for s in found["zarrgate_cache_hits"].samples}
    assert caches == {"chunks", "shard_indexes", "metadata", "hierarchies", "consolidated"}
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
