//! Configuration: defaults < config file < environment < command line, checked once at
//! start-up into one [`Config`]. A bad file or mount stops the server with a message that
//! names the culprit.

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};

use clap::{Args, Parser, Subcommand};
use serde::{Deserialize, Serialize};

/// Command line of the `zarrgate` binary.
#[derive(Debug, Parser)]
#[command(
    name = "zarrgate",
    version,
    about = "An HTTP array server for Zarr",
    args_conflicts_with_subcommands = true
)]
pub struct Cli {
    /// What to do (default: serve).
    #[command(subcommand)]
    pub command: Option<Command>,
    /// The options of `serve`, given without it (`zarrgate --mount ...`, as in `docker run
    /// zarrgate --mount ...`).
    #[command(flatten)]
    pub serve: ServeArgs,
}

impl Cli {
    /// Whether to serve or to check a server, and the options (of `serve` or `healthcheck`, or
    /// those given without a subcommand).
    pub fn action(self) -> (Action, ServeArgs) {
        match self.command {
            Some(Command::Serve(args)) => (Action::Serve, args),
            Some(Command::Healthcheck(args)) => (Action::Healthcheck, args),
            Some(Command::Sign(sign)) => {
                let args = ServeArgs {
                    config: sign.config.clone(),
                    ..ServeArgs::default()
                };
                (Action::Sign(sign), args)
            }
            None => (Action::Serve, self.serve),
        }
    }
}

/// What the binary does.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Action {
    /// Serve (`serve`, the default).
    Serve,
    /// Check a running server (`healthcheck`).
    Healthcheck,
    /// Print a signed URL (`sign`).
    Sign(SignArgs),
}

/// Subcommands.
#[derive(Debug, Subcommand)]
pub enum Command {
    /// Serve the configured mounts over HTTP.
    Serve(ServeArgs),
    /// Ask the server listening where `serve` with these options would listen for /healthz;
    /// exit 0 when it answers 200 (a container's HEALTHCHECK: the image has no curl).
    Healthcheck(ServeArgs),
    /// Print a signed URL: a capability to read a prefix of a mount until a time, for clients
    /// that cannot send headers. The key is `auth.url_signing_key`'s environment variable.
    Sign(SignArgs),
}

/// Options of `zarrgate sign`.
#[derive(Debug, Default, Clone, PartialEq, Eq, Args)]
pub struct SignArgs {
    /// The mount.
    #[arg(long, value_name = "NAME")]
    pub mount: String,
    /// The prefix below the mount the URL may read (a group or an array); empty: all of it.
    #[arg(long, value_name = "PATH", default_value = "")]
    pub prefix: String,
    /// How long the URL is valid: seconds, or a number with s, m, h or d (1h, 7d).
    #[arg(long, value_name = "DURATION")]
    pub expires: String,
    /// Config file (default: ./config.toml when it exists; env ZARRGATE_CONFIG).
    #[arg(long, value_name = "FILE")]
    pub config: Option<PathBuf>,
    /// The server's URL as clients reach it (default: http:// and the configured bind
    /// address).
    #[arg(long, value_name = "URL")]
    pub base_url: Option<String>,
}

/// Options of `zarrgate serve`.
#[derive(Debug, Default, Clone, Args)]
pub struct ServeArgs {
    /// Config file (default: ./config.toml when it exists; env ZARRGATE_CONFIG).
    #[arg(long, value_name = "FILE")]
    pub config: Option<PathBuf>,
    /// Address to listen on, e.g. 127.0.0.1:8080 (env ZARRGATE_BIND).
    #[arg(long, value_name = "ADDR")]
    pub bind: Option<String>,
    /// A second address answering /healthz and /metrics alone, e.g. 127.0.0.1:8081 (env
    /// ZARRGATE_HEALTH_BIND).
    #[arg(long, value_name = "ADDR")]
    pub health_bind: Option<String>,
    /// Add or replace a mount; repeatable. Relative paths are relative to the working directory.
    #[arg(long = "mount", value_name = "NAME=URL")]
    pub mounts: Vec<String>,
}

/// Errors that stop the server from starting.
#[derive(Debug, thiserror::Error)]
pub enum ConfigError {
    #[error("cannot read config file {path}: {source}")]
    Read { path: PathBuf, source: std::io::Error },
    #[error("config file {path}: {message}")]
    Parse { path: PathBuf, message: String },
    #[error("{0}")]
    Invalid(String),
}

/// The whole configuration.
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct Config {
    /// `[server]`
    pub server: ServerConfig,
    /// `[limits]`
    pub limits: LimitsConfig,
    /// `[cache]`
    pub cache: CacheConfig,
    /// `[mounts.NAME]`, by name.
    pub mounts: BTreeMap<String, MountConfig>,
    /// `[auth]`
    pub auth: AuthConfig,
}

/// `[auth]`: what, beside a mount's static `tokens`, may read a protected mount.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct AuthConfig {
    /// The HMAC key of signed URLs, as `"env:VAR"`; none: signed URLs are refused.
    pub url_signing_key: Option<String>,
    /// `[auth.jwt]`: bearer JWTs checked against a JWKS.
    pub jwt: Option<JwtConfig>,
}

/// `[auth.jwt]`
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct JwtConfig {
    /// The JSON Web Key Set: a file path (relative to the config file) or an `https://` URL.
    pub jwks: String,
    /// The `iss` every token must carry.
    pub issuer: String,
    /// The `aud` every token must carry (one of its values).
    pub audience: String,
    /// Seconds between fetches of the key set (a token naming an unknown key also fetches
    /// it, at most once per `refresh_seconds / 10`).
    #[serde(default = "default_jwks_refresh")]
    pub refresh_seconds: u64,
    /// Directory a relative `jwks` path is relative to.
    #[serde(skip)]
    pub base_dir: PathBuf,
}

fn default_jwks_refresh() -> u64 {
    300
}

impl JwtConfig {
    /// Checks the settings: a key set that is a path or an `https://` URL (`http://` on
    /// loopback alone), an issuer and an audience, a refresh of a second to a day.
    fn validate(&self) -> Result<(), ConfigError> {
        let invalid = |m: &str| Err(ConfigError::Invalid(format!("auth.jwt: {m}")));
        if let Some(rest) = self.jwks.strip_prefix("http://") {
            let authority = rest.split(['/', '?', '#']).next().unwrap_or("");
            let host = match authority.strip_prefix('[') {
                Some(v6) => v6.split(']').next().unwrap_or(""),
                None => authority.rsplit_once(':').map_or(authority, |(host, _)| host),
            };
            let loopback = host == "localhost" || host.parse::<std::net::IpAddr>().is_ok_and(|ip| ip.is_loopback());
            if authority.contains('@') || !loopback {
                return invalid("jwks must be a file path or an https:// URL (http:// only on loopback)");
            }
        } else if self.jwks.contains("://") && !self.jwks.starts_with("https://") {
            return invalid("jwks must be a file path or an https:// URL");
        }
        if self.jwks.trim().is_empty() || self.issuer.trim().is_empty() || self.audience.trim().is_empty() {
            return invalid("jwks, issuer and audience must not be empty");
        }
        if !(1..=86_400).contains(&self.refresh_seconds) {
            return invalid("refresh_seconds must be between 1 and 86400");
        }
        Ok(())
    }
}

/// `[server]`
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct ServerConfig {
    /// Listen address.
    pub bind: String,
    /// A second listen address answering `/healthz` and `/metrics` alone, on connections of its
    /// own (at most 16, `server::HEALTH_CONNECTIONS`): probes and scrapes are answered
    /// while every one of `limits.max_connections` is taken. None: `bind` alone.
    pub health_bind: Option<String>,
    /// Allowed CORS origins; `"*"` allows any.
    pub cors_origins: Vec<String>,
    /// Bearer token protecting /metrics, as `"env:VAR"` (read at start).
    pub metrics_token: Option<String>,
    /// Most threads reading local files and decoding chunks at once (tokio's blocking pool);
    /// more work waits for a free thread. Bounds the memory of work in flight.
    pub blocking_threads: usize,
    /// Threads serving connections, each a runtime of its own that keeps the connections it
    /// is given, all sharing the blocking pool ([`crate::workers`]); 0 serves them on the
    /// caller's runtime. One a core by default.
    pub workers: usize,
    /// After SIGTERM: seconds the server goes on accepting and serving while `/readyz` says it
    /// is not ready (so that load balancers move away first), and then seconds the responses
    /// under way may take to finish before the connections still open are closed. Ctrl-C
    /// (SIGINT) skips the first part.
    #[serde(alias = "drain_s")]
    pub drain_seconds: f64,
    /// How log lines are written to stderr: `text` (one line per event) or `json` (one JSON
    /// object per line, for log collectors). Env `ZARRGATE_LOG_FORMAT` outranks it.
    pub log_format: LogFormat,
    /// Whether answers of text (JSON, CSV, the web page, metrics) are compressed (zstd or
    /// gzip) for clients whose `Accept-Encoding` takes it (`http::compress`).
    pub compression: bool,
    /// Whether `/api/v1/mounts` shows every caller each mount's URL (local paths, bucket names);
    /// otherwise only callers that present one of a mount's tokens see its URL.
    pub show_mount_urls: bool,
}

/// `server.log_format`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum LogFormat {
    /// Human-readable lines.
    #[default]
    Text,
    /// One JSON object per line.
    Json,
}

impl Default for ServerConfig {
    fn default() -> Self {
        Self {
            bind: "127.0.0.1:8080".into(),
            health_bind: None,
            cors_origins: vec!["*".into()],
            metrics_token: None,
            blocking_threads: 64,
            workers: std::thread::available_parallelism().map_or(1, |n| n.get()),
            drain_seconds: 5.0,
            log_format: LogFormat::Text,
            compression: true,
            show_mount_urls: false,
        }
    }
}

/// `[limits]`
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct LimitsConfig {
    /// Decoded bytes one slice response may hold.
    pub max_slice_bytes: u64,
    /// Stored objects (chunks or shards) one slice may touch.
    pub max_chunks_per_slice: u64,
    /// Requests handled at once; more are answered 503 with Retry-After.
    pub max_concurrent_requests: usize,
    /// Seconds a request may take to its response head; then 504.
    pub request_timeout_s: f64,
    /// Seconds a response's body may wait for its client to take more of it (the socket's
    /// buffers full over HTTP/1, the stream's window closed over HTTP/2); then its connection
    /// is closed, and with it what its bodies hold (nginx's `send_timeout`).
    pub send_timeout_s: f64,
    /// Longest request target (path and query) in bytes; longer is 414.
    pub max_url_bytes: usize,
    /// Client connections open at once; more wait in the listen backlog until one closes.
    pub max_connections: usize,
}

impl Default for LimitsConfig {
    fn default() -> Self {
        Self {
            max_slice_bytes: 256 << 20,
            max_chunks_per_slice: 100_000,
            max_concurrent_requests: 1024,
            request_timeout_s: 60.0,
            send_timeout_s: 120.0,
            max_url_bytes: 8192,
            max_connections: 1024,
        }
    }
}

/// The most upstream requests a mount may run at once.
pub const MAX_MOUNT_CONCURRENCY: usize = 4096;
/// The most retries of one upstream request.
pub const MAX_RETRIES: usize = 100;
/// The most requests the server may hold in flight.
pub const MAX_CONCURRENT_REQUESTS: usize = 1 << 20;

/// A URL for display and messages: without user information and query (which may hold
/// credentials or signatures).
pub fn redact(url: &str) -> String {
    let without_query = url.split(['?', '#']).next().unwrap_or(url);
    // `abfs://container@account...`: the part before `@` is a container, not a user.
    if without_query.starts_with("abfs://") {
        return without_query.to_owned();
    }
    match without_query.split_once("://") {
        Some((scheme, rest)) => match rest.split_once('/') {
            Some((authority, path)) => {
                let host = authority.rsplit('@').next().unwrap_or(authority);
                format!("{scheme}://{host}/{path}")
            }
            None => format!("{scheme}://{}", rest.rsplit('@').next().unwrap_or(rest)),
        },
        None => without_query.to_owned(),
    }
}

/// The longest timeout (`limits.request_timeout_s`, a mount's `timeout_s`): a day.
pub const MAX_TIMEOUT_S: f64 = 86_400.0;
/// Most `server.workers`: a thread each.
pub const MAX_WORKERS: usize = 1024;
/// The shortest timeout: a millisecond (less would time out nearly every request).
pub const MIN_TIMEOUT_S: f64 = 0.001;
/// The smallest `limits.max_url_bytes`: the server's own routes and a modest key fit.
pub const MIN_URL_BYTES: usize = 256;
/// The longest URL the `http` crate takes. As `limits.max_url_bytes`' bound: hyper refuses
/// longer request targets itself, with a bare 414 (no JSON, no CORS headers, not logged).
pub const MAX_URL_BYTES: usize = 65_534;

/// Whether `origin` can match a browser's `Origin` header: `*`, or `scheme://host[:port]`
/// (no path, not even `/`, no user, query or fragment).
fn valid_origin(origin: &str) -> bool {
    if origin == "*" {
        return true;
    }
    let Some((scheme, host)) = origin.split_once("://") else {
        return false;
    };
    !scheme.is_empty()
        && scheme
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || matches!(c, '+' | '-' | '.'))
        && !host.is_empty()
        && host
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || matches!(c, '-' | '.' | ':' | '[' | ']'))
}

/// The smallest `cache.raw_block_bytes`.
pub const MIN_RAW_BLOCK: u64 = 4 << 10;
/// The most `cache.raw_block_bytes` and `cache.raw_object_max` may be: what one fill of the raw
/// cache holds in memory.
pub const MAX_RAW_READ: u64 = 64 << 20;

/// The longest `cache.ttl_seconds`: ten years (moka refuses more than a thousand).
pub const MAX_TTL_SECONDS: u64 = 10 * 365 * 24 * 3600;

/// `[cache]`
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct CacheConfig {
    /// Capacity of the decoded-chunk cache in bytes.
    pub chunk_bytes: u64,
    /// Capacity of the shard-index cache in bytes.
    pub shard_index_bytes: u64,
    /// Capacity of the cache of walked hierarchies (for ZOM and consolidated metadata), weighed
    /// at 1 KiB a node plus four times its documents' JSON. A hierarchy heavier than this is
    /// walked again for every request that needs it.
    pub hierarchy_bytes: u64,
    /// Seconds a cached chunk, shard index, metadata document or raw object may be served
    /// without looking at the store again: the bound on serving changed data.
    pub ttl_seconds: u64,
    /// Capacity in bytes of the cache of raw bytes of remote mounts (objects and blocks of
    /// them), shared by raw-key reads and slices; 0 turns it off.
    pub raw_bytes: u64,
    /// Objects up to this many bytes are cached whole; larger ones in blocks.
    pub raw_object_max: u64,
    /// The size of a cached block of a large object (its blocks are aligned to it).
    pub raw_block_bytes: u64,
}

impl Default for CacheConfig {
    fn default() -> Self {
        Self {
            chunk_bytes: 512 << 20,
            shard_index_bytes: 64 << 20,
            hierarchy_bytes: 256 << 20,
            ttl_seconds: 60,
            raw_bytes: 256 << 20,
            raw_object_max: 1 << 20,
            raw_block_bytes: 1 << 20,
        }
    }
}

/// `[mounts.NAME]`
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct MountConfig {
    /// Where the hierarchy lives: a directory path, `file:///abs`, later buckets and origins.
    pub url: String,
    /// Synthesize consolidated metadata where the store has none.
    #[serde(default = "yes")]
    pub consolidated: bool,
    /// Bucket region (S3).
    #[serde(default)]
    pub region: Option<String>,
    /// Endpoint of an S3-compatible store (or a custom Azure endpoint).
    #[serde(default)]
    pub endpoint: Option<String>,
    /// Send unsigned requests (public buckets).
    #[serde(default)]
    pub anonymous: bool,
    /// Allow plain http:// endpoints and origins.
    #[serde(default)]
    pub allow_http: bool,
    /// Seconds one upstream request may take.
    #[serde(default = "default_timeout")]
    pub timeout_s: f64,
    /// Retries of transient upstream failures, with exponential backoff.
    #[serde(default = "default_retries")]
    pub retries: usize,
    /// Upstream requests in flight at once for this mount.
    #[serde(default = "default_concurrency")]
    pub concurrency: usize,
    /// Bearer tokens that may read this mount, as `"env:VAR"` (read at start). Empty: public.
    #[serde(default)]
    pub tokens: Vec<String>,
    /// The `Cache-Control` of this mount's answers (raw keys, slices, hierarchies), for the
    /// caches downstream (CDNs, browsers); `None`: `no-cache`.
    #[serde(default)]
    pub cache_control: Option<String>,
    /// The mount's objects never change (published, versioned data): cached raw bytes are
    /// never revalidated.
    #[serde(default)]
    pub immutable: bool,
    /// Seconds past `cache.ttl_seconds` that cached raw bytes are still served while the
    /// upstream fails (RFC 5861's `stale-if-error`); 0: never.
    #[serde(default)]
    pub stale_if_error: u64,
    /// A bearer JWT ([`AuthConfig::jwt`]) whose `scope` claim holds this may read the mount.
    #[serde(default)]
    pub jwt_scope: Option<String>,
    /// What `url` holds: a Zarr hierarchy, or a reference file describing one.
    #[serde(default)]
    pub format: MountFormat,
    /// The version of an Icechunk mount that requests naming none read (`branch.NAME`,
    /// `tag.NAME`, `snapshot.ID`); `None`: `branch.main`.
    #[serde(default)]
    pub version: Option<String>,
    /// URL prefixes (`s3://b/p/`, `https://h/p/`, `file:///abs/dir/`) that references and
    /// virtual chunks may read from, besides the reference file's own directory.
    #[serde(default)]
    pub virtual_prefixes: Vec<String>,
    /// URL prefixes that references and virtual chunks may read from, each read from another
    /// place (a directory, bucket or origin URL, as `url` is written): data that moved, or a
    /// local copy of it.
    #[serde(default)]
    pub virtual_locations: BTreeMap<String, String>,
    /// Directory that a relative `url` is relative to (the config file's, or the working
    /// directory for `--mount`).
    #[serde(skip)]
    pub base_dir: PathBuf,
}

fn yes() -> bool {
    true
}

fn default_timeout() -> f64 {
    30.0
}

fn default_retries() -> usize {
    3
}

fn default_concurrency() -> usize {
    64
}

impl MountConfig {
    /// For a reference mount: the settings of the directory holding its reference file (the
    /// same, with that directory's URL), and the file's name.
    pub fn reference_file(&self) -> Result<(MountConfig, String), String> {
        let url = self.url.trim();
        let (parent, file) = match url.rsplit_once('/') {
            None => (".", url),
            Some(("", file)) => ("/", file),
            Some((parent, file)) => (parent, file),
        };
        if file.is_empty() || parent.ends_with(":/") || parent.ends_with(':') {
            return Err(format!("{} names no reference file", redact(url)));
        }
        let directory = MountConfig {
            url: parent.to_owned(),
            ..self.clone()
        };
        Ok((directory, file.to_owned()))
    }

    /// A mount of `url` with default options.
    pub fn new(url: impl Into<String>, base_dir: impl Into<PathBuf>) -> Self {
        Self {
            url: url.into(),
            consolidated: true,
            region: None,
            endpoint: None,
            anonymous: false,
            allow_http: false,
            timeout_s: default_timeout(),
            retries: default_retries(),
            concurrency: default_concurrency(),
            tokens: Vec::new(),
            cache_control: None,
            immutable: false,
            stale_if_error: 0,
            jwt_scope: None,
            format: MountFormat::Zarr,
            version: None,
            virtual_prefixes: Vec::new(),
            virtual_locations: BTreeMap::new(),
            base_dir: base_dir.into(),
        }
    }
}

/// `mounts.NAME.format`.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum MountFormat {
    /// A Zarr hierarchy (v1, v2, v3).
    #[default]
    Zarr,
    /// An Icechunk repository: each of its versions served as a Zarr v3 hierarchy.
    Icechunk,
    /// A kerchunk reference file (JSON, version 0 or 1).
    References,
}

/// Remote stores.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Remote {
    /// `s3://bucket/prefix`
    S3,
    /// `gs://bucket/prefix`
    Gcs,
    /// `az://container/prefix`
    Azure,
    /// `http(s)://host/prefix`
    Http,
}

/// Where a mount's data lives, resolved from its URL.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum MountSource {
    /// A local directory (absolute path).
    Local(PathBuf),
    /// A bucket, container or HTTP origin: the URL of the mount root.
    Remote(Remote, String),
    /// A zip archive: the directory or bucket holding it, and its name there.
    Zip(Box<MountSource>, String),
}

impl MountConfig {
    /// An `endpoint` is for S3-compatible, Google Cloud Storage (its base URL) and Azure
    /// stores, an http(s) URL without credentials (it would reach requests, errors and the log
    /// as the URL's do), plain http only with `allow_http`. Endpoints that the cloud's own
    /// environment gives (`AWS_ENDPOINT`, `GOOGLE_BASE_URL`, ...) are held to the same rules.
    pub(crate) fn check_endpoint(&self, endpoint: &str, remote: Remote) -> Result<(), String> {
        let shown = redact(endpoint);
        if !matches!(remote, Remote::S3 | Remote::Gcs | Remote::Azure) {
            return Err(format!(
                "endpoint {shown}: only s3://, gs:// and az:// mounts take an endpoint"
            ));
        }
        let (scheme, rest) = endpoint.split_once("://").unwrap_or(("", endpoint));
        if endpoint.contains(['?', '#']) || rest.split('/').next().unwrap_or("").contains('@') {
            return Err(format!(
                "endpoint {shown} may not hold credentials (user@, ?query or #fragment); \
                 give them through the environment (AWS_*, AZURE_*)"
            ));
        }
        match scheme {
            "https" => Ok(()),
            "http" if self.allow_http => Ok(()),
            "http" => Err(format!(
                "endpoint {shown} is plain http: set allow_http = true to use it"
            )),
            _ => Err(format!("endpoint {shown} must be an http:// or https:// URL")),
        }
    }

    /// Resolves the URL to a source, checking what can be checked before start.
    pub fn source(&self, name: &str) -> Result<MountSource, ConfigError> {
        let invalid = |msg: String| ConfigError::Invalid(format!("mount '{name}': {msg}"));
        // Trailing slashes go, but "/" stays the root directory and `s3://` a URL (of no bucket).
        let url = match self.url.trim() {
            u if u.chars().all(|c| c == '/') && !u.is_empty() => "/",
            u => match u.trim_end_matches('/') {
                scheme if scheme.ends_with(':') && u.len() > scheme.len() + 1 => &u[..scheme.len() + 2],
                trimmed => trimmed,
            },
        };
        if url.is_empty() {
            // Joined to the config file's directory, it would serve that directory (and the
            // config file in it).
            return Err(invalid("url is empty".into()));
        }
        let shown = redact(url);
        if !(MIN_TIMEOUT_S..=MAX_TIMEOUT_S).contains(&self.timeout_s) {
            return Err(invalid(format!(
                "timeout_s must be between {MIN_TIMEOUT_S} s and {MAX_TIMEOUT_S} s (a day)"
            )));
        }
        if !(1..=MAX_MOUNT_CONCURRENCY).contains(&self.concurrency) || self.retries > MAX_RETRIES {
            return Err(invalid(format!(
                "concurrency must be 1 to {MAX_MOUNT_CONCURRENCY}, retries at most {MAX_RETRIES}"
            )));
        }
        let is_zip = url.to_ascii_lowercase().ends_with(".zip");
        if let Some((scheme, rest)) = url.split_once("://").filter(|(s, _)| *s != "file") {
            let remote = match scheme {
                "s3" => Remote::S3,
                "gs" | "gcs" => Remote::Gcs,
                "az" | "azure" | "abfs" => Remote::Azure,
                "http" | "https" => Remote::Http,
                other => return Err(invalid(format!("unsupported URL scheme '{other}' in {shown}"))),
            };
            let authority = rest.split('/').next().unwrap_or("");
            if authority.is_empty() {
                return Err(invalid(format!("{shown} names no bucket, container or host")));
            }
            // Credentials come from each cloud's environment, never from the configuration: a
            // URL holding some (`user:password@`, a signed URL's query) would go to object
            // store's requests and errors, and so to the log. (`abfs://container@account` names
            // a container, not a user.)
            if url.contains(['?', '#']) || (scheme != "abfs" && authority.contains('@')) {
                return Err(invalid(format!(
                    "{shown}: a mount URL may not hold credentials (user@, ?query or #fragment); \
                     give them through the environment (AWS_*, GOOGLE_*, AZURE_*)"
                )));
            }
            if let Some(endpoint) = &self.endpoint {
                self.check_endpoint(endpoint, remote).map_err(invalid)?;
            }
            if remote == Remote::Http && scheme == "http" && !self.allow_http {
                return Err(invalid(format!(
                    "{shown} is plain http: set allow_http = true to use it"
                )));
            }
            return Ok(match (is_zip, url.rsplit_once('/')) {
                (true, Some((parent, file))) => MountSource::Zip(
                    Box::new(MountSource::Remote(remote, parent.to_owned())),
                    file.to_owned(),
                ),
                _ => MountSource::Remote(remote, url.to_owned()),
            });
        }
        let path = match url.strip_prefix("file://") {
            Some(rest) if !rest.starts_with('/') => return Err(invalid(format!("file URL must be absolute: {url}"))),
            Some(rest) => PathBuf::from(rest),
            None => self.base_dir.join(url),
        };
        match std::fs::metadata(&path) {
            Ok(m) if m.is_dir() => Ok(MountSource::Local(path)),
            Ok(m) if m.is_file() && is_zip => {
                // The archive is a key of its directory, which may not be left by a link: a
                // link to an archive elsewhere is followed here, once, at start.
                let path = std::fs::canonicalize(&path).unwrap_or(path);
                let parent = path.parent().map(Path::to_owned).unwrap_or_default();
                let file = path
                    .file_name()
                    .map(|f| f.to_string_lossy().into_owned())
                    .unwrap_or_default();
                Ok(MountSource::Zip(Box::new(MountSource::Local(parent)), file))
            }
            Ok(_) => Err(invalid(format!(
                "{} is neither a directory nor a .zip file",
                path.display()
            ))),
            Err(e) => Err(invalid(format!("{}: {e}", path.display()))),
        }
    }
}

/// A secret read from the environment: `"env:VAR"` names the variable. Secrets never sit in
/// the config file, and their Debug form never shows them.
#[derive(Clone, PartialEq, Eq)]
pub struct Secret(Vec<u8>);

impl std::fmt::Debug for Secret {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Secret(..)")
    }
}

impl Secret {
    /// A secret no token matches.
    pub fn refusing() -> Self {
        Secret(Vec::new())
    }

    /// The secret's bytes (a key to sign with).
    pub fn as_bytes(&self) -> &[u8] {
        &self.0
    }

    /// Compares with `candidate` in time that depends only on the lengths.
    pub fn matches(&self, candidate: &[u8]) -> bool {
        // Secrets read from the environment are never empty; an empty one matches nothing. The
        // bytes are compared in constant time (`subtle`: a hand-written loop may be compiled to
        // one that stops at the first difference); a length that differs answers at once.
        !self.0.is_empty() && bool::from(subtle::ConstantTimeEq::ct_eq(self.0.as_slice(), candidate))
    }
}

/// Reads an `"env:VAR"` secret; `what` names the setting in errors.
pub fn secret_from_env(spec: &str, what: &str) -> Result<Secret, ConfigError> {
    secret_from(spec, what, |var| std::env::var(var).ok())
}

/// [`secret_from_env`] with the environment looked up by `env`.
fn secret_from(spec: &str, what: &str, env: impl Fn(&str) -> Option<String>) -> Result<Secret, ConfigError> {
    let var = spec
        .strip_prefix("env:")
        .ok_or_else(|| ConfigError::Invalid(format!("{what}: write tokens as \"env:VARIABLE\", not literally")))?;
    // Surrounding white space goes, as it does from the token a client sends (a secret read
    // from a file often ends with a newline, which no Authorization header can carry).
    match env(var) {
        Some(v) if !v.trim().is_empty() => Ok(Secret(v.trim().as_bytes().to_vec())),
        Some(_) => Err(ConfigError::Invalid(format!(
            "{what}: environment variable {var} is empty"
        ))),
        None => Err(ConfigError::Invalid(format!(
            "{what}: environment variable {var} is not set"
        ))),
    }
}

fn valid_mount_name(name: &str) -> bool {
    !name.is_empty()
        && name != "."
        && name != ".."
        && name
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || matches!(c, '-' | '_' | '.'))
}

/// The mount whose table (`[mounts.NAME]`, or a table below it) holds byte `at` of a config
/// file's text, for naming it in a parse error.
fn mount_at(text: &str, at: usize) -> Option<String> {
    let before = text.get(..at)?;
    // An error spanning a table header (a field missing from the table, the table given twice)
    // belongs to the table it opens, not to the one before it.
    let line_start = before.rfind('\n').map_or(0, |n| n + 1);
    let line = text.get(line_start..)?.lines().next().unwrap_or("").trim();
    let header = match line.starts_with('[') {
        true => line,
        false => before.lines().rev().map(str::trim).find(|l| l.starts_with('['))?,
    };
    let name = header
        .trim_start_matches('[')
        .trim_end_matches(']')
        .trim()
        .strip_prefix("mounts.")?
        .trim_start();
    // A quoted name may hold dots (`[mounts."v2.zarr"]`); a bare one ends at the first.
    let name = match name.chars().next() {
        Some(q @ ('"' | '\'')) => name[1..].split(q).next()?,
        _ => name.split('.').next()?.trim(),
    };
    (!name.is_empty()).then(|| name.to_owned())
}

impl Config {
    /// Parses a config file's text. Relative mount paths are taken relative to `base_dir`.
    pub fn from_toml(text: &str, path: &Path, base_dir: &Path) -> Result<Self, ConfigError> {
        let mut config: Config = toml::from_str(text).map_err(|e| ConfigError::Parse {
            path: path.to_owned(),
            message: match e.span().and_then(|span| mount_at(text, span.start)) {
                Some(mount) => format!("mount '{mount}': {e}"),
                None => e.to_string(),
            },
        })?;
        for mount in config.mounts.values_mut() {
            mount.base_dir = base_dir.to_owned();
        }
        if let Some(jwt) = &mut config.auth.jwt {
            jwt.base_dir = base_dir.to_owned();
        }
        Ok(config)
    }

    /// Builds the configuration from the command line, the environment and the config file,
    /// and checks it ([`Config::validate`]).
    pub fn load(args: &ServeArgs, env: impl Fn(&str) -> Option<String>) -> Result<Self, ConfigError> {
        let config = Self::read(args, env)?;
        config.validate()?;
        Ok(config)
    }

    /// [`Config::load`] without checking what it read beyond parsing it: what `zarrgate
    /// healthcheck` needs is the address, not the mounts (whose directories or token variables
    /// may be missing in the shell that runs it while the server is fine).
    pub fn read(args: &ServeArgs, env: impl Fn(&str) -> Option<String>) -> Result<Self, ConfigError> {
        // Empty is unset, as `-e ZARRGATE_BIND=` in a container or compose file leaves it (and
        // as `ZARRGATE_LOG` is read).
        let env = |name: &str| env(name).filter(|value| !value.trim().is_empty());
        let cwd = std::env::current_dir().map_err(|e| ConfigError::Invalid(format!("no working directory: {e}")))?;
        let file = args
            .config
            .clone()
            .or_else(|| env("ZARRGATE_CONFIG").map(PathBuf::from))
            .or_else(|| Some(PathBuf::from("config.toml")).filter(|p| p.is_file()));
        let mut config = match file {
            Some(path) => {
                let text = std::fs::read_to_string(&path).map_err(|source| ConfigError::Read {
                    path: path.clone(),
                    source,
                })?;
                let base = cwd
                    .join(&path)
                    .parent()
                    .map(Path::to_owned)
                    .unwrap_or_else(|| cwd.clone());
                Config::from_toml(&text, &path, &base)?
            }
            None => Config::default(),
        };
        if let Some(bind) = env("ZARRGATE_BIND") {
            config.server.bind = bind;
        }
        if let Some(bind) = env("ZARRGATE_HEALTH_BIND") {
            config.server.health_bind = Some(bind);
        }
        if let Some(format) = env("ZARRGATE_LOG_FORMAT") {
            // The names the file's `log_format` takes (serde's), not a second list of them.
            use serde::de::IntoDeserializer;
            let read: Result<LogFormat, serde::de::value::Error> =
                LogFormat::deserialize(format.as_str().into_deserializer());
            config.server.log_format = read.map_err(|_| {
                ConfigError::Invalid(format!("ZARRGATE_LOG_FORMAT must be text or json, got '{format}'"))
            })?;
        }
        if let Some(bind) = &args.bind {
            config.server.bind.clone_from(bind);
        }
        if let Some(bind) = &args.health_bind {
            config.server.health_bind = Some(bind.clone());
        }
        for spec in &args.mounts {
            let (name, url) = spec
                .split_once('=')
                .ok_or_else(|| ConfigError::Invalid(format!("--mount expects NAME=URL, got '{spec}'")))?;
            // A mount of the file given another URL keeps its other settings: its tokens
            // above all (a protected mount must not turn public because its URL was changed).
            match config.mounts.get_mut(name) {
                Some(mount) => {
                    mount.url = url.to_owned();
                    mount.base_dir.clone_from(&cwd);
                }
                None => {
                    config
                        .mounts
                        .insert(name.to_owned(), MountConfig::new(url, cwd.clone()));
                }
            }
        }
        Ok(config)
    }

    /// Checks everything that can be checked without starting: the bind address, limits,
    /// mount names and their sources.
    pub fn validate(&self) -> Result<(), ConfigError> {
        let bind = self.bind_addr()?;
        // Port 0 is any free port: two of them are not one address.
        if self.health_addr()? == Some(bind) && bind.port() != 0 {
            return Err(ConfigError::Invalid(format!(
                "server.health_bind: '{bind}' is server.bind itself; give it an address of its own"
            )));
        }
        let l = &self.limits;
        if l.max_slice_bytes == 0
            || l.max_chunks_per_slice == 0
            || l.max_concurrent_requests == 0
            || l.max_connections == 0
        {
            return Err(ConfigError::Invalid("limits must be positive".into()));
        }
        if l.max_url_bytes < MIN_URL_BYTES {
            return Err(ConfigError::Invalid(format!(
                "limits.max_url_bytes must be at least {MIN_URL_BYTES} (shorter refuses the server's own routes)"
            )));
        }
        if l.max_url_bytes > MAX_URL_BYTES {
            return Err(ConfigError::Invalid(format!(
                "limits.max_url_bytes must be at most {MAX_URL_BYTES} (the HTTP parser's own limit)"
            )));
        }
        if l.max_concurrent_requests > MAX_CONCURRENT_REQUESTS {
            return Err(ConfigError::Invalid(format!(
                "limits.max_concurrent_requests must be at most {MAX_CONCURRENT_REQUESTS}"
            )));
        }
        if l.max_connections > MAX_CONCURRENT_REQUESTS {
            return Err(ConfigError::Invalid(format!(
                "limits.max_connections must be at most {MAX_CONCURRENT_REQUESTS}"
            )));
        }
        if !(1..=MAX_TTL_SECONDS).contains(&self.cache.ttl_seconds) {
            return Err(ConfigError::Invalid(format!(
                "cache.ttl_seconds must be between 1 and {MAX_TTL_SECONDS} (ten years), got {}",
                self.cache.ttl_seconds
            )));
        }
        let c = &self.cache;
        if !(MIN_RAW_BLOCK..=MAX_RAW_READ).contains(&c.raw_block_bytes) || c.raw_object_max > MAX_RAW_READ {
            return Err(ConfigError::Invalid(format!(
                "cache.raw_block_bytes must be between {MIN_RAW_BLOCK} and {MAX_RAW_READ}, and cache.raw_object_max at most {MAX_RAW_READ}"
            )));
        }
        if !(0.0..=MAX_TIMEOUT_S).contains(&self.server.drain_seconds) {
            return Err(ConfigError::Invalid(format!(
                "server.drain_seconds must be between 0 and {MAX_TIMEOUT_S} s (a day)"
            )));
        }
        if let Some(key) = &self.auth.url_signing_key {
            secret_from_env(key, "auth.url_signing_key")?;
        }
        if let Some(jwt) = &self.auth.jwt {
            jwt.validate()?;
        }
        if self.server.blocking_threads == 0 {
            return Err(ConfigError::Invalid("server.blocking_threads must be positive".into()));
        }
        if self.server.workers > MAX_WORKERS {
            return Err(ConfigError::Invalid(format!(
                "server.workers must be between 0 and {MAX_WORKERS}"
            )));
        }
        if !(MIN_TIMEOUT_S..=MAX_TIMEOUT_S).contains(&l.request_timeout_s) {
            return Err(ConfigError::Invalid(format!(
                "limits.request_timeout_s must be between {MIN_TIMEOUT_S} s and {MAX_TIMEOUT_S} s (a day)"
            )));
        }
        if !(MIN_TIMEOUT_S..=MAX_TIMEOUT_S).contains(&l.send_timeout_s) {
            return Err(ConfigError::Invalid(format!(
                "limits.send_timeout_s must be between {MIN_TIMEOUT_S} s and {MAX_TIMEOUT_S} s (a day)"
            )));
        }
        for origin in &self.server.cors_origins {
            if !valid_origin(origin) {
                return Err(ConfigError::Invalid(format!(
                    "server.cors_origins: '{origin}' is not an origin (\"*\", or scheme://host[:port] with no path)"
                )));
            }
        }
        if let Some(t) = &self.server.metrics_token {
            secret_from_env(t, "server.metrics_token")?;
        }
        for (name, mount) in &self.mounts {
            if !valid_mount_name(name) {
                return Err(ConfigError::Invalid(format!(
                    "mount name '{name}' may only hold letters, digits, '-', '_' and '.'"
                )));
            }
            match mount.format {
                MountFormat::Icechunk => {
                    if let Some(version) = &mount.version {
                        crate::version::Version::parse(version)
                            .map_err(|e| ConfigError::Invalid(format!("mount '{name}': version: {e}")))?;
                    }
                    if let MountSource::Zip(..) = mount.source(name)? {
                        return Err(ConfigError::Invalid(format!(
                            "mount '{name}': an Icechunk repository is a directory or a bucket prefix, not a zip archive"
                        )));
                    }
                }
                MountFormat::References => {
                    let (directory, _) = mount
                        .reference_file()
                        .map_err(|e| ConfigError::Invalid(format!("mount '{name}': {e}")))?;
                    directory.source(name)?;
                }
                MountFormat::Zarr if !mount.virtual_prefixes.is_empty() || !mount.virtual_locations.is_empty() => {
                    return Err(ConfigError::Invalid(format!(
                        "mount '{name}': virtual_prefixes and virtual_locations apply to format = \"references\" or \"icechunk\""
                    )));
                }
                MountFormat::Zarr => {
                    mount.source(name)?;
                }
            }
            if mount.version.is_some() && mount.format != MountFormat::Icechunk {
                return Err(ConfigError::Invalid(format!(
                    "mount '{name}': version applies to format = \"icechunk\" alone"
                )));
            }
            for prefix in mount.virtual_prefixes.iter().chain(mount.virtual_locations.keys()) {
                let local = prefix.strip_prefix("file://");
                if local.is_some_and(|p| !p.starts_with('/')) || (local.is_none() && !prefix.contains("://")) {
                    return Err(ConfigError::Invalid(format!(
                        "mount '{name}': virtual_prefixes are URLs (s3://, gs://, az://, https://, file:///absolute/path/), not '{prefix}'"
                    )));
                }
            }
            if let Some(value) = &mount.cache_control
                && axum::http::HeaderValue::from_str(value).is_err()
            {
                return Err(ConfigError::Invalid(format!(
                    "mount '{name}': cache_control '{value}' is not a header value"
                )));
            }
            if mount.stale_if_error > MAX_TTL_SECONDS {
                return Err(ConfigError::Invalid(format!(
                    "mount '{name}': stale_if_error must be at most {MAX_TTL_SECONDS} s"
                )));
            }
            for t in &mount.tokens {
                secret_from_env(t, &format!("mount '{name}': tokens"))?;
            }
            match &mount.jwt_scope {
                Some(scope) if self.auth.jwt.is_none() => {
                    return Err(ConfigError::Invalid(format!(
                        "mount '{name}': jwt_scope '{scope}' needs an [auth.jwt] section to check tokens"
                    )));
                }
                Some(scope) if scope.is_empty() || scope.contains(char::is_whitespace) => {
                    return Err(ConfigError::Invalid(format!(
                        "mount '{name}': jwt_scope must be one scope, not empty, without spaces"
                    )));
                }
                _ => {}
            }
        }
        Ok(())
    }

    /// The listen address.
    pub fn bind_addr(&self) -> Result<SocketAddr, ConfigError> {
        address("server.bind", &self.server.bind)
    }

    /// `server.health_bind`, parsed (`None` when it is not set).
    pub fn health_addr(&self) -> Result<Option<SocketAddr>, ConfigError> {
        self.server
            .health_bind
            .as_deref()
            .map(|bind| address("server.health_bind", bind))
            .transpose()
    }
}

/// A listen address, or an error naming the setting `what` that gave it.
fn address(what: &str, text: &str) -> Result<SocketAddr, ConfigError> {
    text.parse()
        .map_err(|_| ConfigError::Invalid(format!("{what}: '{text}' is not an address like 127.0.0.1:8080")))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(text: &str) -> Result<Config, ConfigError> {
        Config::from_toml(text, Path::new("test.toml"), Path::new("/"))
    }

    #[test]
    fn parse_errors_in_a_mount_s_table_name_the_mount() {
        let text = "[server]\nbind = \"127.0.0.1:1\"\n\n[mounts.foo]\nurl = \"/\"\nconsolidated = tru\n";
        let err = Config::from_toml(text, Path::new("e.toml"), Path::new("/"))
            .unwrap_err()
            .to_string();
        assert!(err.contains("mount 'foo'") && err.contains("line 6"), "{err}");
        let text = "[server]\nbind = 7\n[mounts.foo]\nurl = \"/\"\n";
        let err = Config::from_toml(text, Path::new("e.toml"), Path::new("/"))
            .unwrap_err()
            .to_string();
        assert!(!err.contains("mount '"), "{err}");
        assert_eq!(mount_at("[mounts.\"a b\"]\nx = 1\n", 16).as_deref(), Some("a b"));
        assert_eq!(
            mount_at("[mounts.\"v2.zarr\"]\nx = 1\n", 20).as_deref(),
            Some("v2.zarr")
        );
        assert_eq!(
            mount_at("[mounts.'v2.zarr'.x]\nx = 1\n", 22).as_deref(),
            Some("v2.zarr")
        );
        assert_eq!(
            mount_at("[mounts.s3data.extra]\nx = 1\n", 23).as_deref(),
            Some("s3data")
        );
        let text = "[mounts.foo]\nurl = \"/\"\n[limits\n";
        let err = Config::from_toml(text, Path::new("e.toml"), Path::new("/"))
            .unwrap_err()
            .to_string();
        assert!(!err.contains("mount '"), "{err}");
        // A field missing from a mount's table is an error at its header.
        let text = "[mounts.foo]\nurl = \"/\"\n[mounts.bar]\nconsolidated = false\n";
        let err = Config::from_toml(text, Path::new("e.toml"), Path::new("/"))
            .unwrap_err()
            .to_string();
        assert!(err.contains("mount 'bar'") && err.contains("url"), "{err}");
    }

    #[test]
    fn defaults_apply() {
        let c = parse("").unwrap();
        assert_eq!(c.server.bind, "127.0.0.1:8080");
        assert_eq!(c.server.cors_origins, vec!["*"]);
        assert_eq!(c.limits.max_slice_bytes, 268_435_456);
        assert_eq!(c.cache.chunk_bytes, 536_870_912);
        assert_eq!(c.cache.shard_index_bytes, 67_108_864);
        assert_eq!(c.cache.hierarchy_bytes, 268_435_456);
        assert_eq!(c.server.blocking_threads, 64);
    }

    #[test]
    fn counts_are_bounded_urls_keep_the_root_and_passwords_are_hidden() {
        for bad in [
            "concurrency = 0",
            "concurrency = 9223372036854775807",
            "retries = 300000000000000",
        ] {
            let err = parse(&format!("[mounts.m]\nurl = \"/\"\n{bad}\n"))
                .unwrap()
                .validate()
                .unwrap_err()
                .to_string();
            assert!(
                err.contains("mount 'm'") && err.contains("concurrency must be"),
                "{bad}: {err}"
            );
        }
        let err = parse("[limits]\nmax_concurrent_requests = 9223372036854775807\n")
            .unwrap()
            .validate()
            .unwrap_err()
            .to_string();
        assert!(err.contains("max_concurrent_requests"), "{err}");
        // "/" is the root directory, not the config file's (trailing slashes go otherwise).
        let c = parse("[mounts.r]\nurl = \"/\"\n").unwrap();
        assert!(matches!(c.mounts["r"].source("r").unwrap(), MountSource::Local(p) if p == Path::new("/")));
        let err = parse("[mounts.h]\nurl = \"http://u:pw@127.0.0.1/d\"\n")
            .unwrap()
            .validate()
            .unwrap_err()
            .to_string();
        assert!(err.contains("http://127.0.0.1/d") && !err.contains("pw"), "{err}");
        assert_eq!(redact("az://c@acct/z?sig=x"), "az://acct/z");
        assert_eq!(redact("/a/b"), "/a/b");
    }

    #[test]
    fn timeouts_are_bounded() {
        for bad in ["0", "-1", "1e20", "nan", "inf"] {
            for key in ["request_timeout_s", "send_timeout_s"] {
                let err = parse(&format!("[limits]\n{key} = {bad}\n"))
                    .unwrap()
                    .validate()
                    .unwrap_err()
                    .to_string();
                assert!(err.contains(key), "{bad}: {err}");
            }
            let err = parse(&format!("[mounts.m]\nurl = \"/\"\ntimeout_s = {bad}\n"))
                .unwrap()
                .validate()
                .unwrap_err()
                .to_string();
            assert!(err.contains("mount 'm'") && err.contains("timeout_s"), "{bad}: {err}");
        }
        assert!(
            parse("[limits]\nrequest_timeout_s = 86400\nsend_timeout_s = 86400\n")
                .unwrap()
                .validate()
                .is_ok()
        );
    }

    #[test]
    fn ttl_is_bounded() {
        assert!(parse("[cache]\nttl_seconds = 1\n").unwrap().validate().is_ok());
        for bad in ["0", "40000000000"] {
            let err = parse(&format!("[cache]\nttl_seconds = {bad}\n"))
                .unwrap()
                .validate()
                .unwrap_err()
                .to_string();
            assert!(err.contains("cache.ttl_seconds") && err.contains(bad), "{err}");
        }
    }

    #[test]
    fn blocking_threads_is_configurable_and_positive() {
        let c = parse("[server]\nblocking_threads = 8\n").unwrap();
        assert_eq!(c.server.blocking_threads, 8);
        let err = parse("[server]\nblocking_threads = 0\n")
            .unwrap()
            .validate()
            .unwrap_err()
            .to_string();
        assert!(err.contains("server.blocking_threads"), "{err}");
    }

    #[test]
    fn workers_are_one_a_core_by_default_and_bounded() {
        let cores = std::thread::available_parallelism().map_or(1, |n| n.get());
        assert_eq!(parse("").unwrap().server.workers, cores);
        for n in [0, 3, MAX_WORKERS] {
            let c = parse(&format!("[server]\nworkers = {n}\n")).unwrap();
            assert_eq!(c.server.workers, n);
            c.validate().unwrap();
        }
        let err = parse(&format!("[server]\nworkers = {}\n", MAX_WORKERS + 1))
            .unwrap()
            .validate()
            .unwrap_err()
            .to_string();
        assert!(err.contains("server.workers"), "{err}");
    }

    #[test]
    fn unknown_keys_are_named() {
        let err = parse("[server]\nbnd = \"x\"\n").unwrap_err().to_string();
        assert!(err.contains("bnd"), "{err}");
        let err = parse("[mounts.a]\nurl = \"/\"\nconsolidatd = true\n")
            .unwrap_err()
            .to_string();
        assert!(err.contains("consolidatd"), "{err}");
        let err = parse("[sever]\n").unwrap_err().to_string();
        assert!(err.contains("sever"), "{err}");
    }

    #[test]
    fn mount_errors_name_the_mount() {
        let c = parse("[mounts.gone]\nurl = \"/definitely/not/here\"\n").unwrap();
        let err = c.validate().unwrap_err().to_string();
        assert!(err.contains("mount 'gone'"), "{err}");
        let c = parse("[mounts.plain]\nurl = \"http://example.org/data\"\n").unwrap();
        assert!(c.validate().unwrap_err().to_string().contains("allow_http"));
        for url in ["s3://", "s3:///", "gs://"] {
            let c = parse(&format!("[mounts.b]\nurl = \"{url}\"\n")).unwrap();
            let err = c.validate().unwrap_err().to_string();
            assert!(err.contains("names no bucket"), "{url}: {err}");
        }
        let c = parse("[mounts.weird]\nurl = \"ftp://x/y\"\n").unwrap();
        let err = c.validate().unwrap_err().to_string();
        assert!(err.contains("mount 'weird'") && err.contains("ftp"), "{err}");
        let c = parse("[mounts.\"a/b\"]\nurl = \"/\"\n").unwrap();
        assert!(c.validate().unwrap_err().to_string().contains("a/b"));
        // An empty URL would be the config file's own directory.
        for url in ["", "  "] {
            let c = parse(&format!("[mounts.e]\nurl = \"{url}\"\n")).unwrap();
            let err = c.validate().unwrap_err().to_string();
            assert!(err.contains("mount 'e'") && err.contains("url is empty"), "{err}");
        }
    }

    #[test]
    fn secrets_compare_and_hide() {
        let s = Secret(b"abc".to_vec());
        assert!(s.matches(b"abc"));
        assert!(!s.matches(b"abd") && !s.matches(b"ab") && !s.matches(b"abcd") && !s.matches(b""));
        assert_eq!(format!("{s:?}"), "Secret(..)");
        assert!(!Secret::refusing().matches(b"") && !Secret::refusing().matches(b"x"));
        assert!(
            secret_from_env("literal", "x")
                .unwrap_err()
                .to_string()
                .contains("env:")
        );
        assert!(
            secret_from_env("env:ZARRGATE_SURELY_UNSET_VAR", "x")
                .unwrap_err()
                .to_string()
                .contains("not set")
        );
        // A secret read from a file ends with a newline no Authorization header can carry.
        let from = |value: &str| secret_from("env:T", "x", |_| Some(value.to_owned()));
        let s = from("t1\n").unwrap();
        assert!(s.matches(b"t1") && !s.matches(b"t1\n"));
        assert!(from(" \n").unwrap_err().to_string().contains("is empty"));
    }

    #[test]
    fn limits_too_small_to_serve_and_origins_that_cannot_match_are_refused() {
        for (toml, named) in [
            ("[limits]\nrequest_timeout_s = 1e-12\n", "request_timeout_s"),
            ("[limits]\nsend_timeout_s = 1e-12\n", "send_timeout_s"),
            ("[limits]\nmax_url_bytes = 5\n", "max_url_bytes"),
            ("[limits]\nmax_url_bytes = 65535\n", "max_url_bytes"),
            ("[mounts.a]\nurl = \"/\"\ntimeout_s = 0.0000001\n", "timeout_s"),
            ("[server]\ncors_origins = [\"https://a.example/\"]\n", "cors_origins"),
            ("[server]\ncors_origins = [\"a.example\"]\n", "cors_origins"),
            ("[server]\ndrain_seconds = -1\n", "drain_seconds"),
            ("[server]\ndrain_seconds = nan\n", "drain_seconds"),
            ("[server]\ndrain_s = inf\n", "drain_seconds"),
        ] {
            let err = parse(toml).unwrap().validate().unwrap_err().to_string();
            assert!(err.contains(named), "{toml}: {err}");
        }
        // `drain_s`, the key's name before `drain_seconds`, still reads.
        let c = parse("[server]\ndrain_s = 0\nlog_format = \"json\"\n").unwrap();
        assert!(c.validate().is_ok());
        assert_eq!(c.server.drain_seconds, 0.0);
        assert_eq!(c.server.log_format, LogFormat::Json);
        assert!(parse("[server]\nlog_format = \"yaml\"\n").is_err());
        for origins in [
            "[\"*\"]",
            "[]",
            "[\"https://a.example\", \"http://127.0.0.1:8080\", \"http://[::1]:3000\"]",
        ] {
            let c = parse(&format!("[server]\ncors_origins = {origins}\n")).unwrap();
            assert!(c.validate().is_ok(), "{origins}");
        }
    }

    #[test]
    fn urls_with_credentials_are_refused_without_showing_them() {
        for url in [
            "https://user:hunter2@example.org/data",
            "https://example.org/data?sig=hunter2",
            "https://example.org/data#hunter2",
            "s3://key:hunter2@bucket/data",
        ] {
            let err = MountConfig::new(url, "/").source("x").unwrap_err().to_string();
            assert!(err.contains("may not hold credentials"), "{err}");
            assert!(!err.contains("hunter2"), "{err}");
        }
        let abfs = MountConfig::new("abfs://container@account.dfs.core.windows.net/p", "/");
        assert!(abfs.source("x").is_ok());
        assert_eq!(redact(&abfs.url), "abfs://container@account.dfs.core.windows.net/p");
        assert_eq!(redact("https://u:p@host/x?sig=1"), "https://host/x");
    }

    /// An endpoint is checked at start as a mount URL is: no credentials (not shown either),
    /// plain http only with allow_http, and only where one is used (s3, gcs, azure).
    #[test]
    fn endpoints_are_checked_at_start() {
        let with = |url: &str, endpoint: &str, allow_http: bool| {
            let mut m = MountConfig::new(url, "/");
            m.endpoint = Some(endpoint.into());
            m.allow_http = allow_http;
            m.source("x").map_err(|e| e.to_string())
        };
        for endpoint in [
            "http://AKIA:hunter2@127.0.0.1:9000",
            "https://minio.example?sig=hunter2",
        ] {
            let err = with("s3://b/p", endpoint, true).unwrap_err();
            assert!(
                err.contains("may not hold credentials") && !err.contains("hunter2"),
                "{err}"
            );
        }
        let err = with("s3://b/p", "http://127.0.0.1:9000", false).unwrap_err();
        assert!(err.contains("allow_http"), "{err}");
        assert!(with("s3://b/p", "http://127.0.0.1:9000", true).is_ok());
        assert!(with("az://c/p", "https://acct.blob.example", false).is_ok());
        assert!(
            with("s3://b/p", "127.0.0.1:9000", true)
                .unwrap_err()
                .contains("http:// or https://")
        );
        assert!(with("gs://b/p", "http://127.0.0.1:4443", true).is_ok());
        assert!(with("gs://b/p", "http://127.0.0.1:4443", false).is_err());
        let err = with("https://host/p", "https://storage.example", false).unwrap_err();
        assert!(err.contains("only s3://, gs:// and az://"), "{err}");
    }

    #[test]
    fn remote_and_zip_urls() {
        let m = |url: &str| MountConfig::new(url, "/");
        assert_eq!(
            m("s3://bucket/a/b").source("x").unwrap(),
            MountSource::Remote(Remote::S3, "s3://bucket/a/b".into())
        );
        assert_eq!(
            m("gs://b").source("x").unwrap(),
            MountSource::Remote(Remote::Gcs, "gs://b".into())
        );
        assert_eq!(
            m("az://c/p/").source("x").unwrap(),
            MountSource::Remote(Remote::Azure, "az://c/p".into())
        );
        assert_eq!(
            m("s3://bucket/dir/data.zarr.zip").source("x").unwrap(),
            MountSource::Zip(
                Box::new(MountSource::Remote(Remote::S3, "s3://bucket/dir".into())),
                "data.zarr.zip".into()
            )
        );
        assert!(m("s3:///nobucket").source("x").is_err());
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(dir.path().join("a.zip"), b"PK").unwrap();
        assert_eq!(
            m(&dir.path().join("a.zip").display().to_string()).source("x").unwrap(),
            MountSource::Zip(Box::new(MountSource::Local(dir.path().to_owned())), "a.zip".into())
        );
        // A link to an archive in another directory mounts the archive it points to.
        let elsewhere = tempfile::tempdir().unwrap();
        let link = elsewhere.path().join("link.zip");
        std::os::unix::fs::symlink(dir.path().join("a.zip"), &link).unwrap();
        assert_eq!(
            m(&link.display().to_string()).source("x").unwrap(),
            MountSource::Zip(
                Box::new(MountSource::Local(std::fs::canonicalize(dir.path()).unwrap())),
                "a.zip".into()
            )
        );
        let toml = "[mounts.b]\nurl = \"s3://b/p\"\nregion = \"eu-west-1\"\nendpoint = \"http://127.0.0.1:9000\"\nanonymous = true\nallow_http = true\ntimeout_s = 2.5\nretries = 1\nconcurrency = 8\n";
        let c = parse(toml).unwrap();
        assert_eq!(c.mounts["b"].region.as_deref(), Some("eu-west-1"));
        assert_eq!(
            (
                c.mounts["b"].timeout_s,
                c.mounts["b"].retries,
                c.mounts["b"].concurrency
            ),
            (2.5, 1, 8)
        );
    }

    #[test]
    fn precedence_file_env_cli() {
        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join("c.toml");
        std::fs::create_dir(dir.path().join("data")).unwrap();
        std::fs::write(&file, "[server]\nbind = \"127.0.0.1:1\"\n[mounts.d]\nurl = \"data\"\n").unwrap();
        let args = ServeArgs {
            config: Some(file.clone()),
            ..Default::default()
        };
        let c = Config::load(&args, |_| None).unwrap();
        assert_eq!(c.server.bind, "127.0.0.1:1");
        // Relative to the config file, not the working directory.
        assert_eq!(
            c.mounts["d"].source("d").unwrap(),
            MountSource::Local(dir.path().join("data"))
        );
        let env = |k: &str| (k == "ZARRGATE_BIND").then(|| "127.0.0.1:2".to_string());
        assert_eq!(Config::load(&args, env).unwrap().server.bind, "127.0.0.1:2");
        let args = ServeArgs {
            bind: Some("127.0.0.1:3".into()),
            ..args
        };
        assert_eq!(Config::load(&args, env).unwrap().server.bind, "127.0.0.1:3");
    }

    /// `ZARRGATE_CONFIG` names the file when `--config` does not (the container image relies on
    /// it); `--config` wins over it; an empty variable is unset.
    #[test]
    fn the_config_file_may_come_from_the_environment() {
        let dir = tempfile::tempdir().unwrap();
        for (name, port) in [("env.toml", 4), ("cli.toml", 5)] {
            std::fs::write(
                dir.path().join(name),
                format!("[server]\nbind = \"127.0.0.1:{port}\"\n"),
            )
            .unwrap();
        }
        let from_env = dir.path().join("env.toml").display().to_string();
        let env = |k: &str| (k == "ZARRGATE_CONFIG").then(|| from_env.clone());
        let none = ServeArgs::default();
        assert_eq!(Config::load(&none, env).unwrap().server.bind, "127.0.0.1:4");
        let cli = ServeArgs {
            config: Some(dir.path().join("cli.toml")),
            ..Default::default()
        };
        assert_eq!(Config::load(&cli, env).unwrap().server.bind, "127.0.0.1:5");
        let env = |k: &str| (k == "ZARRGATE_CONFIG" || k == "ZARRGATE_BIND").then(|| " ".to_string());
        assert_eq!(Config::load(&cli, env).unwrap().server.bind, "127.0.0.1:5");
        let missing = |k: &str| (k == "ZARRGATE_CONFIG").then(|| "/no/such/zarrgate.toml".to_string());
        assert!(matches!(Config::load(&none, missing), Err(ConfigError::Read { .. })));
    }

    /// `server.health_bind` (env ZARRGATE_HEALTH_BIND): unset by default; an address of its own.
    #[test]
    fn health_bind() {
        let none = ServeArgs::default();
        let c = Config::load(&none, |_| None).unwrap();
        assert_eq!(c.health_addr().unwrap(), None);
        let env = |k: &str| (k == "ZARRGATE_HEALTH_BIND").then(|| "127.0.0.1:9090".to_string());
        let c = Config::load(&none, env).unwrap();
        assert_eq!(c.health_addr().unwrap(), Some("127.0.0.1:9090".parse().unwrap()));
        // The command line outranks the environment.
        let cli = ServeArgs {
            health_bind: Some("127.0.0.1:9091".into()),
            ..Default::default()
        };
        let c = Config::load(&cli, env).unwrap();
        assert_eq!(c.health_addr().unwrap(), Some("127.0.0.1:9091".parse().unwrap()));
        // Empty is unset, as for every ZARRGATE_* variable.
        let empty = |k: &str| (k == "ZARRGATE_HEALTH_BIND").then(String::new);
        assert_eq!(Config::load(&none, empty).unwrap().health_addr().unwrap(), None);
        let text = "[server]\nbind = \"127.0.0.1:8080\"\nhealth_bind = \"127.0.0.1:8080\"\n";
        let err = Config::from_toml(text, Path::new("c.toml"), Path::new("/"))
            .unwrap()
            .validate()
            .unwrap_err();
        assert!(err.to_string().contains("is server.bind itself"), "{err}");
        let text = "[server]\nhealth_bind = \"localhost:9090\"\n";
        let err = Config::from_toml(text, Path::new("c.toml"), Path::new("/"))
            .unwrap()
            .validate()
            .unwrap_err();
        assert!(
            err.to_string().contains("server.health_bind: 'localhost:9090'"),
            "{err}"
        );
    }

    /// `--mount NAME=URL` for a mount of the file changes its URL only: a protected mount
    /// keeps its tokens (it must not turn public), and its other settings.
    #[test]
    fn a_mount_given_another_url_keeps_its_settings() {
        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join("c.toml");
        std::fs::create_dir(dir.path().join("old")).unwrap();
        std::fs::write(
            &file,
            "[mounts.d]\nurl = \"old\"\ntokens = [\"env:PATH\"]\nconsolidated = false\n",
        )
        .unwrap();
        let args = ServeArgs {
            config: Some(file),
            mounts: vec![format!("d={}", dir.path().display()), "e=/".into()],
            ..Default::default()
        };
        let c = Config::load(&args, |_| None).unwrap();
        let d = &c.mounts["d"];
        assert_eq!(d.source("d").unwrap(), MountSource::Local(dir.path().to_owned()));
        assert_eq!(
            (d.tokens.as_slice(), d.consolidated),
            (&["env:PATH".to_owned()][..], false)
        );
        assert!(c.mounts["e"].tokens.is_empty() && c.mounts["e"].consolidated);
    }
}
