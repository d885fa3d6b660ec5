//! Prometheus metrics: request counts and latency histograms by route family, plus the
//! cache counters (hits, misses, evictions, weighted size, entries) read at scrape time.

use std::fmt::Write;
use std::sync::OnceLock;
use std::sync::atomic::Ordering;
use std::time::Duration;

use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::{Histogram, exponential_buckets};
use prometheus_client::registry::Registry;

use crate::cache::{CacheCounters, Caches};

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct RequestLabels {
    route: &'static str,
    status: u16,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct RouteLabels {
    route: &'static str,
}

/// One exported cache series: name, type, help, and how to read it from (counters, weighted
/// size, entries).
type Series = (
    &'static str,
    &'static str,
    &'static str,
    fn(&CacheCounters, u64, u64) -> u64,
);

/// The server's metrics.
#[derive(Debug)]
pub struct Metrics {
    registry: Registry,
    requests: Family<RequestLabels, Counter>,
    latency: Family<RouteLabels, Histogram>,
    in_flight: Gauge,
    connections: Gauge,
    /// Each route's series of the families (its body bytes and aborted responses held only
    /// here and by the registry), by [`route_index`].
    by_route: [RouteSeries; ROUTES.len()],
}

/// The statuses whose request counters a route keeps at hand ([`RouteSeries`]).
const HANDY_STATUSES: [u16; 4] = [200, 206, 304, 404];

/// A route's series, shared with the families that export them (a metric's clone counts into
/// the same value). A family finds a series by hashing its labels under a lock: three times a
/// request, that was 3% of a warm tile's user-space instructions. Series a route has not used
/// yet are made at first use, so that the exposition lists only those, as the families would.
#[derive(Debug)]
struct RouteSeries {
    latency: OnceLock<Histogram>,
    /// Request counters of the [`HANDY_STATUSES`]; other statuses go through the family.
    requests: [OnceLock<Counter>; HANDY_STATUSES.len()],
    body_bytes: Counter,
    aborted: Counter,
}

impl Default for Metrics {
    fn default() -> Self {
        Self::new()
    }
}

/// The route families, the values of the `route` label ([`route_of`]).
pub const ROUTES: [&str; 9] = [
    "raw", "slice", "zom", "validate", "mounts", "metrics", "health", "page", "other",
];

/// The route family of a path (bounded label values).
pub fn route_of(path: &str) -> &'static str {
    ROUTES[route_index(path)]
}

/// The index in [`ROUTES`] of a path's route family.
pub fn route_index(path: &str) -> usize {
    // A signed URL counts as the route it stands for.
    let path = match path.strip_prefix("/signed/") {
        Some(rest) => rest.find('/').map_or("", |at| &rest[at..]),
        None => path,
    };
    if path.starts_with("/zarr/") || path == "/zarr" {
        0
    } else if path.starts_with("/api/v1/slice/") {
        1
    } else if path.starts_with("/api/v1/zom") || path.starts_with("/api/v1/list/") {
        2
    } else if path.starts_with("/api/v1/validate") {
        3
    } else if path == "/api/v1/mounts" {
        4
    } else if path == "/metrics" {
        5
    } else if path == "/healthz" || path == "/readyz" {
        6
    } else if path == "/" {
        7
    } else {
        8
    }
}

impl Metrics {
    /// Registers the metrics.
    pub fn new() -> Self {
        let mut registry = Registry::default();
        let requests = Family::<RequestLabels, Counter>::default();
        let latency = Family::<RouteLabels, Histogram>::new_with_constructor(|| {
            // 50 µs .. ~105 s: above the longest default timeout (60 s), so that timed-out
            // requests land in a bucket of their own rather than only in +Inf.
            Histogram::new(exponential_buckets(0.00005, 2.0, 22))
        });
        registry.register(
            "zarrgate_requests",
            "HTTP requests by route family and status",
            requests.clone(),
        );
        registry.register(
            "zarrgate_request_duration_seconds",
            "Time to the response head, by route family",
            latency.clone(),
        );
        let body_bytes = Family::<RouteLabels, Counter>::default();
        registry.register(
            "zarrgate_response_body_bytes",
            "Bytes of response bodies handed to the connections, by route family",
            body_bytes.clone(),
        );
        let aborted = Family::<RouteLabels, Counter>::default();
        registry.register(
            "zarrgate_responses_aborted",
            "Responses whose body was not sent to its end, or requests given up before their response (the client left, or the body failed), by route family",
            aborted.clone(),
        );
        let in_flight = Gauge::default();
        registry.register(
            "zarrgate_requests_in_flight",
            "Requests received whose response body has not ended",
            in_flight.clone(),
        );
        // Every route's body and aborted series exist from the start (at 0), so that rates and
        // alerts on them have samples before the first aborted response.
        let by_route = ROUTES.map(|route| RouteSeries {
            latency: OnceLock::new(),
            requests: Default::default(),
            body_bytes: body_bytes.get_or_create(&RouteLabels { route }).clone(),
            aborted: aborted.get_or_create(&RouteLabels { route }).clone(),
        });
        let connections = Gauge::default();
        registry.register(
            "zarrgate_connections_open",
            "Client connections open (at most limits.max_connections)",
            connections.clone(),
        );
        Self {
            registry,
            requests,
            latency,
            in_flight,
            connections,
            by_route,
        }
    }

    /// Records one request's response head: its route ([`route_index`]), its status and the
    /// time it took.
    pub fn observe(&self, route: usize, status: u16, elapsed: Duration) {
        let (series, name) = (&self.by_route[route], ROUTES[route]);
        let labels = RequestLabels { route: name, status };
        match HANDY_STATUSES.iter().position(|&s| s == status) {
            Some(i) => series.requests[i]
                .get_or_init(|| self.requests.get_or_create(&labels).clone())
                .inc(),
            None => self.requests.get_or_create(&labels).inc(),
        };
        series
            .latency
            .get_or_init(|| self.latency.get_or_create(&RouteLabels { route: name }).clone())
            .observe(elapsed.as_secs_f64());
    }

    /// A request has come in; [`Metrics::ended`] follows when its response is over.
    pub fn started(&self) {
        self.in_flight.inc();
    }

    /// A client connection was accepted.
    pub fn connection_opened(&self) {
        self.connections.inc();
    }

    /// A client connection closed.
    pub fn connection_closed(&self) {
        self.connections.dec();
    }

    /// A response of route `route` ([`route_index`]) is over: its body sent to the end
    /// (`complete`) or not, after `bytes` of it.
    pub fn ended(&self, route: usize, bytes: u64, complete: bool) {
        self.in_flight.dec();
        let series = &self.by_route[route];
        series.body_bytes.inc_by(bytes);
        if !complete {
            series.aborted.inc();
        }
    }

    /// The Prometheus text exposition.
    pub fn render(&self, caches: &Caches) -> String {
        let mut out = String::new();
        if prometheus_client::encoding::text::encode_registry(&mut out, &self.registry).is_err() {
            out.clear();
        }
        let raw = &caches.raw;
        let raw_counters = CacheCounters {
            hits: raw.counters.hits.load(Ordering::Relaxed).into(),
            misses: raw.counters.misses.load(Ordering::Relaxed).into(),
            evictions: std::sync::Arc::new(raw.counters.evictions.load(Ordering::Relaxed).into()),
        };
        let cache_rows: [(&str, &CacheCounters, u64, u64); 6] = [
            (
                "chunks",
                &caches.chunk_counters,
                caches.chunks.weighted_size(),
                caches.chunks.entry_count(),
            ),
            (
                "shard_indexes",
                &caches.index_counters,
                caches.shard_indexes.weighted_size(),
                caches.shard_indexes.entry_count(),
            ),
            (
                "metadata",
                &caches.metadata_counters,
                caches.metadata.weighted_size(),
                caches.metadata.entry_count(),
            ),
            (
                "hierarchies",
                &caches.hierarchy_counters,
                caches.hierarchies.weighted_size(),
                caches.hierarchies.entry_count(),
            ),
            (
                "consolidated",
                &caches.consolidated_counters,
                caches.consolidated.weighted_size(),
                caches.consolidated.entry_count(),
            ),
            ("raw", &raw_counters, raw.weighted_size(), raw.entry_count()),
        ];
        let series: [Series; 5] = [
            (
                "zarrgate_cache_hits",
                "counter",
                "Cache lookups answered from memory",
                |c, _, _| c.hits.load(Ordering::Relaxed),
            ),
            (
                "zarrgate_cache_misses",
                "counter",
                "Cache lookups that loaded",
                |c, _, _| c.misses.load(Ordering::Relaxed),
            ),
            (
                "zarrgate_cache_evictions",
                "counter",
                "Entries evicted for capacity",
                |c, _, _| c.evictions.load(Ordering::Relaxed),
            ),
            (
                "zarrgate_cache_weighted_bytes",
                "gauge",
                "Weighted size of the cache (bytes; estimated from their JSON for metadata and hierarchies)",
                |_, w, _| w,
            ),
            ("zarrgate_cache_entries", "gauge", "Entries in the cache", |_, _, n| n),
        ];
        let mut text = String::new();
        // OpenMetrics, as the registry writes it: a counter family `x` has the samples `x_total`.
        for (family, kind, help, get) in series {
            let _ = writeln!(text, "# HELP {family} {help}.\n# TYPE {family} {kind}");
            let sample = if kind == "counter" { "_total" } else { "" };
            for (cache, counters, weighted, entries) in &cache_rows {
                let _ = writeln!(
                    text,
                    "{family}{sample}{{cache=\"{cache}\"}} {}",
                    get(counters, *weighted, *entries)
                );
            }
        }
        let _ = writeln!(
            text,
            "# HELP zarrgate_chunks_decoded Chunks and inner chunks decoded.\n# TYPE zarrgate_chunks_decoded counter\nzarrgate_chunks_decoded_total {}",
            caches.decodes.load(Ordering::Relaxed)
        );
        let _ = writeln!(
            text,
            "# HELP zarrgate_spare_buffer_bytes Bytes of freed buffers kept for reuse (decoded: of chunks that left the chunk cache; reads: of store reads).\n# TYPE zarrgate_spare_buffer_bytes gauge\nzarrgate_spare_buffer_bytes{{pool=\"decoded\"}} {}\nzarrgate_spare_buffer_bytes{{pool=\"reads\"}} {}",
            crate::buffers::DECODED.kept_bytes(),
            crate::buffers::READS.kept_bytes()
        );
        let _ = writeln!(
            text,
            "# HELP zarrgate_spare_buffer_reuses Kept buffers handed out again.\n# TYPE zarrgate_spare_buffer_reuses counter\nzarrgate_spare_buffer_reuses_total{{pool=\"decoded\"}} {}\nzarrgate_spare_buffer_reuses_total{{pool=\"reads\"}} {}",
            crate::buffers::DECODED.reuses(),
            crate::buffers::READS.reuses()
        );
        let c = &raw.counters;
        let _ = writeln!(
            text,
            "# HELP zarrgate_raw_cache_revalidations Raw-cache objects the upstream confirmed unchanged (304) after their TTL.\n# TYPE zarrgate_raw_cache_revalidations counter\nzarrgate_raw_cache_revalidations_total{{tier=\"memory\"}} {}\n# HELP zarrgate_raw_cache_coalesced Raw-cache reads that waited for a fetch another read had begun.\n# TYPE zarrgate_raw_cache_coalesced counter\nzarrgate_raw_cache_coalesced_total{{tier=\"memory\"}} {}\n# HELP zarrgate_raw_cache_stale Raw-cache reads answered past freshness while the upstream failed (stale_if_error).\n# TYPE zarrgate_raw_cache_stale counter\nzarrgate_raw_cache_stale_total{{tier=\"memory\"}} {}",
            c.revalidated.load(Ordering::Relaxed),
            c.coalesced.load(Ordering::Relaxed),
            c.stale.load(Ordering::Relaxed)
        );
        let upstream = raw.upstream();
        let _ = writeln!(
            text,
            "# HELP zarrgate_upstream_requests Requests sent to remote stores, by mount and kind.\n# TYPE zarrgate_upstream_requests counter"
        );
        for (mount, counters) in &upstream {
            for (kind, n) in [
                ("get", &counters.gets),
                ("range", &counters.ranges),
                ("head", &counters.heads),
                ("list", &counters.lists),
            ] {
                let _ = writeln!(
                    text,
                    "zarrgate_upstream_requests_total{{mount=\"{mount}\",kind=\"{kind}\"}} {}",
                    n.load(Ordering::Relaxed)
                );
            }
        }
        let _ = writeln!(
            text,
            "# HELP zarrgate_upstream_bytes Body bytes received from remote stores, by mount.\n# TYPE zarrgate_upstream_bytes counter"
        );
        for (mount, counters) in &upstream {
            let _ = writeln!(
                text,
                "zarrgate_upstream_bytes_total{{mount=\"{mount}\"}} {}",
                counters.bytes.load(Ordering::Relaxed)
            );
        }
        let orphans = &crate::cache::DETACHED_LOADS;
        let _ = writeln!(
            text,
            "# HELP zarrgate_orphaned_loads Loads (chunks, shard indexes, consolidated documents) running on after their request ended, to be cached.\n# TYPE zarrgate_orphaned_loads gauge\nzarrgate_orphaned_loads {}\n# HELP zarrgate_orphaned_loads_stopped Loads stopped when their request ended, for want of room to run on.\n# TYPE zarrgate_orphaned_loads_stopped counter\nzarrgate_orphaned_loads_stopped_total {}",
            orphans.running(),
            orphans.stopped()
        );
        // An OpenMetrics exposition ends with "# EOF" (the registry's part does not write it).
        out + &text + "# EOF\n"
    }
}

/// Whether an `Accept` header asks for OpenMetrics (`application/openmetrics-text` with a
/// quality above 0), as Prometheus's does; anything else (curl's `*/*`, no header, older
/// scrapers' `text/plain`) gets the Prometheus text format 0.0.4.
pub fn wants_openmetrics(accept: Option<&str>) -> bool {
    accept.is_some_and(|accept| {
        crate::format::media_ranges(accept)
            .any(|(kind, sub, q)| kind == "application" && sub == "openmetrics-text" && q > 0.0)
    })
}

/// An OpenMetrics exposition (as [`Metrics::render`] writes it) in the Prometheus text format
/// 0.0.4: a counter's `# HELP` and `# TYPE` name its samples (`x_total`, not the family `x`),
/// help texts escape no quotes, and there are no `# UNIT` or `# EOF` lines. Samples are the
/// same in both.
pub fn prometheus_text(openmetrics: &str) -> String {
    let counters: std::collections::HashSet<&str> = openmetrics
        .lines()
        .filter_map(|line| line.strip_prefix("# TYPE ")?.strip_suffix(" counter"))
        .collect();
    let mut out = String::with_capacity(openmetrics.len() + 16 * counters.len());
    for line in openmetrics.lines() {
        if line == "# EOF" || line.starts_with("# UNIT ") {
            continue;
        }
        let described = ["# HELP ", "# TYPE "]
            .into_iter()
            .find_map(|tag| Some((tag, line.strip_prefix(tag)?)));
        match described {
            Some((tag, rest)) => {
                let (family, tail) = rest.split_once(' ').unwrap_or((rest, ""));
                out.push_str(tag);
                out.push_str(family);
                if counters.contains(family) {
                    out.push_str("_total");
                }
                out.push(' ');
                match tag {
                    "# HELP " => out.push_str(&tail.replace("\\\"", "\"")),
                    _ => out.push_str(tail),
                }
            }
            None => out.push_str(line),
        }
        out.push('\n');
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn paths_go_to_their_route_family() {
        for (path, route) in [
            ("/zarr/m/k", "raw"),
            ("/zarr", "raw"),
            ("/api/v1/slice/m/a", "slice"),
            ("/api/v1/zom/m", "zom"),
            ("/api/v1/list/m/", "zom"),
            ("/api/v1/validate/m", "validate"),
            ("/api/v1/mounts", "mounts"),
            ("/metrics", "metrics"),
            ("/healthz", "health"),
            ("/", "page"),
            ("/nothing", "other"),
            ("/zarrx", "other"),
        ] {
            assert_eq!(route_of(path), route, "{path}");
        }
    }

    /// The series a route keeps at hand are the exported ones: counts made through them and
    /// through the families add up in one sample, and a status or route not used yet has none.
    #[test]
    fn series_at_hand_count_into_the_exported_samples() {
        let m = Metrics::new();
        let slice = route_index("/api/v1/slice/m/a");
        for _ in 0..3 {
            m.observe(slice, 200, Duration::from_millis(2));
        }
        m.requests
            .get_or_create(&RequestLabels {
                route: "slice",
                status: 200,
            })
            .inc();
        m.observe(slice, 418, Duration::from_millis(2));
        m.ended(slice, 100, true);
        m.ended(slice, 20, false);
        let text = m.render(&Caches::new(&crate::config::CacheConfig::default()));
        for line in [
            "zarrgate_requests_total{route=\"slice\",status=\"200\"} 4",
            "zarrgate_requests_total{route=\"slice\",status=\"418\"} 1",
            "zarrgate_request_duration_seconds_count{route=\"slice\"} 4",
            "zarrgate_response_body_bytes_total{route=\"slice\"} 120",
            "zarrgate_responses_aborted_total{route=\"slice\"} 1",
            "zarrgate_responses_aborted_total{route=\"raw\"} 0",
        ] {
            assert!(text.lines().any(|l| l == line), "{line} in\n{text}");
        }
        assert!(!text.contains("status=\"206\""), "{text}");
        assert!(
            !text.contains("zarrgate_request_duration_seconds_count{route=\"raw\"}"),
            "{text}"
        );
    }

    /// Prometheus's `Accept` gets OpenMetrics; curl's, none, plain text, or OpenMetrics at
    /// quality 0 get the text format 0.0.4.
    #[test]
    fn openmetrics_only_when_asked_for() {
        let prometheus = "application/openmetrics-text;version=1.0.0,application/openmetrics-text;version=0.0.1;q=0.75,text/plain;version=0.0.4;q=0.5,*/*;q=0.1";
        assert!(wants_openmetrics(Some(prometheus)));
        assert!(wants_openmetrics(Some(
            "text/plain, Application/OpenMetrics-Text ; q=0.2"
        )));
        for accept in [
            None,
            Some("*/*"),
            Some("text/plain;version=0.0.4"),
            Some("application/openmetrics-text;q=0"),
            Some("application/openmetrics-textual"),
        ] {
            assert!(!wants_openmetrics(accept), "{accept:?}");
        }
    }

    /// The text format names a counter by its samples, and has no `# EOF` or `# UNIT`; the rest
    /// is as OpenMetrics has it.
    #[test]
    fn prometheus_text_names_counters_by_their_samples() {
        let open = "# HELP a_things Things \\\"quoted\\\".\n# TYPE a_things counter\n# UNIT a_things things\na_things_total{x=\"1\"} 3\n# HELP b Level.\n# TYPE b gauge\nb 2\n# HELP c Time.\n# TYPE c histogram\nc_bucket{le=\"+Inf\"} 1\nc_sum 0.5\nc_count 1\n# EOF\n";
        let text = prometheus_text(open);
        assert_eq!(
            text,
            "# HELP a_things_total Things \"quoted\".\n# TYPE a_things_total counter\na_things_total{x=\"1\"} 3\n# HELP b Level.\n# TYPE b gauge\nb 2\n# HELP c Time.\n# TYPE c histogram\nc_bucket{le=\"+Inf\"} 1\nc_sum 0.5\nc_count 1\n"
        );
        let m = Metrics::new();
        m.observe(route_index("/api/v1/slice/m/a"), 200, Duration::from_millis(2));
        let text = prometheus_text(&m.render(&Caches::new(&crate::config::CacheConfig::default())));
        for line in [
            "# TYPE zarrgate_requests_total counter",
            "zarrgate_requests_total{route=\"slice\",status=\"200\"} 1",
            "# TYPE zarrgate_cache_hits_total counter",
            "# TYPE zarrgate_cache_entries gauge",
            "# TYPE zarrgate_request_duration_seconds histogram",
        ] {
            assert!(text.lines().any(|l| l == line), "{line} in\n{text}");
        }
        assert!(
            !text.contains("# EOF") && !text.contains("# TYPE zarrgate_requests counter"),
            "{text}"
        );
    }
}
