//! Shared application state: the configuration and the mounts. Cheap to clone.

use std::collections::BTreeMap;
use std::sync::Arc;

use serde::Serialize;

use crate::array::{ReadContext, ReadOptions};
use crate::auth::{Auth, MountAccess, Refusal};
use crate::cache::{Caches, cached};
use crate::config::{Config, ConfigError, MountConfig, Secret, secret_from_env};
use crate::error::ApiError;
use crate::metrics::Metrics;
use crate::store::{self, Store, StoreKey};
use crate::zarr::{ArrayMeta, MetaError, OpenError, open_array};

/// One mounted hierarchy.
#[derive(Debug, Clone, Serialize)]
pub struct Mount {
    /// The URL segment that names it.
    pub name: Arc<str>,
    /// `local`, `s3`, `gcs`, `azure`, `http`, `zip`.
    pub kind: &'static str,
    /// The configured URL, without credentials.
    pub url: String,
    /// Whether consolidated metadata is synthesized.
    pub consolidated: bool,
    /// The data.
    #[serde(skip)]
    pub store: Store,
    /// Who may read it.
    #[serde(skip)]
    pub access: MountAccess,
    /// The `Cache-Control` of its answers (`mounts.NAME.cache_control`); `None`: `no-cache`.
    #[serde(skip)]
    pub cache_control: Option<axum::http::HeaderValue>,
    /// What its entries in the caches are keyed by: its name, or for a mount a reload opened,
    /// its name and a number of its own, so that no entry of what the name stood for before
    /// is read.
    #[serde(skip)]
    pub cache_id: Arc<str>,
    /// The settings its store was opened with ([`store_settings`]): a reload keeps a mount
    /// whose store settings are the same.
    #[serde(skip)]
    pub store_settings: Option<MountConfig>,
    /// An Icechunk mount's repository: its versions, each a store of its own.
    #[serde(skip)]
    pub repository: Option<Arc<store::icechunk::Repository>>,
}

impl Mount {
    /// A public mount `name` of `store`, with consolidated metadata synthesized.
    pub fn new(name: &str, kind: &'static str, url: String, store: Store) -> Self {
        Self {
            name: name.into(),
            kind,
            url,
            consolidated: true,
            store,
            access: MountAccess::default(),
            cache_control: None,
            cache_id: name.into(),
            store_settings: None,
            repository: None,
        }
    }

    /// Whether a request presenting `bearer` (if any) may read this mount, JWTs checked by
    /// `auth`.
    pub fn admits(&self, auth: &Auth, bearer: Option<&[u8]>) -> Result<(), Refusal> {
        self.access.check(bearer, auth.jwt.as_deref())
    }
}

/// What a process keeps from start to exit, whatever reloads change: its readiness.
#[derive(Debug, Default)]
pub struct Lifecycle {
    draining: std::sync::atomic::AtomicBool,
}

impl Lifecycle {
    /// From now on `/readyz` says not ready (SIGTERM).
    pub fn start_draining(&self) {
        self.draining.store(true, std::sync::atomic::Ordering::Release);
    }

    /// Whether the server is draining.
    pub fn draining(&self) -> bool {
        self.draining.load(std::sync::atomic::Ordering::Acquire)
    }
}

/// The `Cache-Control` of answers read from an Icechunk snapshot named in the URL, unless
/// the mount sets its own: such an answer never changes.
pub const IMMUTABLE: &str = "public, max-age=31536000, immutable";

/// [`IMMUTABLE`], for a mount that needs credentials.
pub const IMMUTABLE_PRIVATE: &str = "private, max-age=31536000, immutable";

/// Numbers the mounts reloads open (their [`Mount::cache_id`]).
static MOUNT_GENERATION: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(1);

/// State shared by all handlers.
#[derive(Debug, Clone)]
pub struct AppState(Arc<StateInner>);

/// What [`AppState`] holds.
#[derive(Debug)]
pub struct StateInner {
    /// The validated configuration.
    pub config: Config,
    /// Mounts by name.
    pub mounts: BTreeMap<String, Mount>,
    /// Decoded chunks, shard indexes, metadata.
    pub caches: Arc<Caches>,
    /// Request and cache metrics.
    pub metrics: Arc<Metrics>,
    /// Verifiers of JWTs and signed URLs.
    pub auth: Auth,
    /// Readiness and draining, shared by the states reloads make.
    pub lifecycle: Arc<Lifecycle>,
    /// Read tuning.
    pub read_options: ReadOptions,
    /// The token protecting /metrics, if any.
    pub metrics_token: Option<Secret>,
    /// Permits to send a streamed slice (or one answered whole over a band's size), [`MAX_STREAMS`]
    /// of them. Such a body is sent after its request has left the request limit and timeout,
    /// holding a few bands of decoded chunks (or itself) while its client reads: this bounds how
    /// many do at once.
    pub streams: Arc<tokio::sync::Semaphore>,
    /// Mebibytes that slice answers built whole over a band's size (images, text of
    /// variable-length elements) may hold at once: their region and its encoding, held from
    /// before the region is read until the body is sent (or its encoding, which goes on when
    /// its client leaves, ends). [`whole_budget_mib`] of them.
    pub whole_mib: Arc<tokio::sync::Semaphore>,
    /// The compression of text answers.
    pub compression: crate::http::compress::Compression,
}

/// The mebibytes slice answers built whole may hold at once: four times
/// `limits.max_slice_bytes`, at least 64 MiB. The permits of [`AppState::streams`] bound how many
/// are sent at once, but one image of a region at the limit holds some 330 MB (the region, its
/// pixels and the image), and 32 of them held 10 GiB.
pub fn whole_budget_mib(max_slice_bytes: u64) -> u32 {
    u32::try_from((max_slice_bytes.saturating_mul(4) >> 20).max(64)).unwrap_or(u32::MAX >> 4)
}

/// How many streamed (or large whole) slice responses are sent at once; more are refused
/// with 503.
pub const MAX_STREAMS: usize = 32;

impl std::ops::Deref for AppState {
    type Target = StateInner;
    fn deref(&self) -> &StateInner {
        &self.0
    }
}

impl AppState {
    /// Opens every configured mount.
    pub fn from_config(config: Config) -> Result<Self, ConfigError> {
        let caches = Arc::new(Caches::new(&config.cache));
        let mounts = open_mounts(&config, &caches, None)?;
        let auth = Auth::from_config(&config.auth, None)?;
        let parts = Kept::new(&config, caches);
        Ok(Self::assemble(config, mounts, auth, parts))
    }

    /// The state of `config` read anew (SIGHUP), keeping what outlives a reload: the caches,
    /// metrics, readiness and budgets, the mounts whose settings are the same (their stores,
    /// their cached entries), and a JWT verifier of the same settings. The settings that
    /// size what was made at start (addresses, threads, connections, cache sizes) keep
    /// their old values; [`AppState::needs_restart`] names those that changed.
    pub fn reloaded(&self, config: Config) -> Result<Self, ConfigError> {
        let mounts = open_mounts(&config, &self.caches, Some(&self.mounts))?;
        let auth = Auth::from_config(&config.auth, Some(&self.auth))?;
        let mut parts = Kept {
            caches: self.caches.clone(),
            metrics: self.metrics.clone(),
            lifecycle: self.lifecycle.clone(),
            streams: self.streams.clone(),
            whole_mib: self.whole_mib.clone(),
        };
        if config.limits.max_slice_bytes != self.config.limits.max_slice_bytes {
            parts.whole_mib = Arc::new(tokio::sync::Semaphore::new(
                whole_budget_mib(config.limits.max_slice_bytes) as usize,
            ));
        }
        Ok(Self::assemble(config, mounts, auth, parts))
    }

    /// The settings of `new` that differ from this state's and take effect only on a restart.
    pub fn needs_restart(&self, new: &Config) -> Vec<&'static str> {
        let (old, new) = (&self.config, new);
        [
            ("server.bind", old.server.bind != new.server.bind),
            ("server.health_bind", old.server.health_bind != new.server.health_bind),
            ("server.workers", old.server.workers != new.server.workers),
            (
                "server.blocking_threads",
                old.server.blocking_threads != new.server.blocking_threads,
            ),
            ("server.log_format", old.server.log_format != new.server.log_format),
            (
                "server.drain_seconds",
                old.server.drain_seconds != new.server.drain_seconds,
            ),
            (
                "limits.max_url_bytes",
                old.limits.max_url_bytes != new.limits.max_url_bytes,
            ),
            (
                "limits.max_connections",
                old.limits.max_connections != new.limits.max_connections,
            ),
            (
                "limits.send_timeout_s",
                old.limits.send_timeout_s != new.limits.send_timeout_s,
            ),
            ("cache", old.cache != new.cache),
        ]
        .into_iter()
        .filter_map(|(name, changed)| changed.then_some(name))
        .collect()
    }

    /// State over ready-made mounts (tests use this with wrapped stores).
    pub fn with_mounts(config: Config, mounts: Vec<Mount>) -> Self {
        let caches = Arc::new(Caches::new(&config.cache));
        Self::with_caches(config, mounts, caches)
    }

    /// State over ready-made mounts and caches (the raw cache their stores read through).
    pub fn with_caches(config: Config, mounts: Vec<Mount>, caches: Arc<Caches>) -> Self {
        // Tests' configurations name no auth secrets; one that cannot be read refuses all.
        let auth = Auth::from_config(&config.auth, None).unwrap_or_default();
        let parts = Kept::new(&config, caches);
        Self::assemble(config, mounts, auth, parts)
    }

    fn assemble(config: Config, mounts: Vec<Mount>, auth: Auth, kept: Kept) -> Self {
        let mounts = mounts.into_iter().map(|m| (m.name.to_string(), m)).collect();
        let metrics_token = config
            .server
            .metrics_token
            .as_deref()
            // A token that cannot be read (checked by `validate`, so only through this
            // constructor's other callers) refuses every caller: it never opens /metrics.
            .map(|t| secret_from_env(t, "server.metrics_token").unwrap_or_else(|_| Secret::refusing()));
        let read_options = ReadOptions {
            max_result_bytes: config.limits.max_slice_bytes,
            ..ReadOptions::default()
        };
        let compression = crate::http::compress::Compression::new(config.server.compression);
        Self(Arc::new(StateInner {
            metrics_token,
            compression,
            config,
            mounts,
            caches: kept.caches,
            metrics: kept.metrics,
            auth,
            lifecycle: kept.lifecycle,
            read_options,
            streams: kept.streams,
            whole_mib: kept.whole_mib,
        }))
    }

    /// Whether the server takes traffic (`/readyz`): not draining, and every key set read.
    pub fn ready(&self) -> Result<(), &'static str> {
        if self.lifecycle.draining() {
            return Err("the server is draining");
        }
        match self.auth.ready() {
            true => Ok(()),
            false => Err("the JWT key set has not been read yet"),
        }
    }

    /// How reads on `mount` fetch and cache chunks.
    pub fn read_context(&self, mount: &Mount) -> ReadContext {
        ReadContext::new(
            mount.store.clone(),
            mount.cache_id.clone(),
            Some(self.caches.clone()),
            self.read_options.clone(),
        )
    }

    /// The metadata of the array at `path` in `mount` (cached).
    pub async fn array(&self, mount: &Mount, path: &StoreKey) -> Result<Arc<ArrayMeta>, ApiError> {
        let key = (mount.cache_id.clone(), path.clone());
        let load = || async { open_array(&mount.store, path).await.map(Arc::new) };
        let result = cached(&self.caches.metadata, &self.caches.metadata_counters, key, load).await;
        result.map_err(|e| match &*e {
            OpenError::NotFound(p) => ApiError::NotFound(format!("no array at '{p}' in mount '{}'", mount.name)),
            OpenError::Meta {
                error: MetaError::Unsupported(m),
                ..
            } => ApiError::Unsupported(format!("unsupported: {m}")),
            OpenError::Meta { key, error } => {
                tracing::warn!(mount = %mount.name, %key, %error, "invalid metadata");
                match error {
                    MetaError::Invalid(reason) => ApiError::invalid_metadata(key.clone(), reason),
                    other => ApiError::invalid_metadata(key.clone(), &other.to_string()),
                }
            }
            OpenError::Store(s) => s.clone().into(),
        })
    }

    /// The mount named by a URL's mount segment, percent-decoded once as the rest of the path
    /// is (`/zarr/f%78/` is `/zarr/fx/`), or a 404. A segment the rest of the path would be
    /// refused for (`.`, `..`, a backslash, NUL or another control character, bytes that are
    /// not UTF-8) is a 400, as it is there: no mount has such a name, and the message does not
    /// repeat it.
    pub fn mount(&self, segment: &str) -> Result<&Mount, ApiError> {
        let (name, _) = mount_name(segment)?;
        self.mount_named(&name)
    }

    /// The mount `name` names, or a 404 (a 400 for a name no key could have).
    fn mount_named(&self, name: &str) -> Result<&Mount, ApiError> {
        if let Some(mount) = self.mounts.get(name) {
            return Ok(mount);
        }
        StoreKey::new(name)?;
        Err(ApiError::UnknownMount(name.to_owned()))
    }

    /// The mount a mount segment names, and the version it names after `@` (percent-decoded
    /// as [`AppState::mount`] does), checked only for being a version of a versioned mount.
    pub fn mount_and_version(&self, segment: &str) -> Result<(&Mount, Option<store::icechunk::Version>), ApiError> {
        let (name, version) = mount_name(segment)?;
        let mount = self.mount_named(&name)?;
        let version = match (version, &mount.repository) {
            (None, _) => None,
            (Some(v), Some(_)) => Some(store::icechunk::Version::parse(&v).map_err(ApiError::UnknownVersion)?),
            (Some(_), None) => {
                return Err(ApiError::UnknownVersion(format!(
                    "mount '{}' has no versions (only Icechunk mounts do)",
                    mount.name
                )));
            }
        };
        Ok((mount, version))
    }

    /// The `Cache-Control` of successful answers read through a mount segment: the mount's,
    /// or for an Icechunk snapshot named outright, [`IMMUTABLE`]; `None`: the default.
    pub fn cache_control_of(&self, segment: &str) -> Option<axum::http::HeaderValue> {
        let (mount, version) = self.mount_and_version(segment).ok()?;
        cache_control_at(mount, version.as_ref())
    }

    /// The mount a mount segment names, as the version it names (or its default) is now: for
    /// an Icechunk mount, the store of one snapshot, its cache entries keyed by that snapshot
    /// (so that no answer mixes two), and a snapshot named outright `immutable` to caches
    /// downstream unless the mount says otherwise. Other mounts as they are.
    pub async fn mount_at(&self, segment: &str) -> Result<std::borrow::Cow<'_, Mount>, ApiError> {
        let (mount, version) = self.mount_and_version(segment)?;
        let Some(repository) = &mount.repository else {
            return Ok(std::borrow::Cow::Borrowed(mount));
        };
        let at = repository.at(version.as_ref()).await?;
        let cache_control = cache_control_at(mount, version.as_ref());
        Ok(std::borrow::Cow::Owned(Mount {
            name: mount.name.clone(),
            kind: mount.kind,
            url: mount.url.clone(),
            consolidated: mount.consolidated,
            store: at.store,
            access: mount.access.clone(),
            cache_control,
            cache_id: format!("{}@{}", mount.cache_id, at.snapshot).into(),
            store_settings: None,
            repository: mount.repository.clone(),
        }))
    }
}

/// A mount segment's mount name and the version after its `@`, percent-decoded once.
fn mount_name(segment: &str) -> Result<(String, Option<String>), ApiError> {
    let decoded = match segment.contains('%') {
        true => percent_encoding::percent_decode_str(segment)
            .decode_utf8()
            .map_err(|_| store::KeyError::NotUtf8)?,
        false => segment.into(),
    };
    Ok(match decoded.split_once('@') {
        Some((name, version)) => (name.to_owned(), Some(version.to_owned())),
        None => (decoded.into_owned(), None),
    })
}

/// The `Cache-Control` of `mount`'s successful answers read at `version`: its own, or for a
/// snapshot named outright, [`IMMUTABLE`] (private on a protected mount: its answers are the
/// reader's to keep, not a shared cache's).
fn cache_control_at(mount: &Mount, version: Option<&store::icechunk::Version>) -> Option<axum::http::HeaderValue> {
    match (&mount.cache_control, version) {
        (None, Some(v)) if v.is_immutable() => {
            Some(axum::http::HeaderValue::from_static(match mount.access.is_public() {
                true => IMMUTABLE,
                false => IMMUTABLE_PRIVATE,
            }))
        }
        (cache_control, _) => cache_control.clone(),
    }
}

/// What a reload keeps of the state before it.
struct Kept {
    caches: Arc<Caches>,
    metrics: Arc<Metrics>,
    lifecycle: Arc<Lifecycle>,
    streams: Arc<tokio::sync::Semaphore>,
    whole_mib: Arc<tokio::sync::Semaphore>,
}

impl Kept {
    fn new(config: &Config, caches: Arc<Caches>) -> Self {
        Self {
            caches,
            metrics: Arc::new(Metrics::new()),
            lifecycle: Arc::default(),
            streams: Arc::new(tokio::sync::Semaphore::new(MAX_STREAMS)),
            whole_mib: Arc::new(tokio::sync::Semaphore::new(
                whole_budget_mib(config.limits.max_slice_bytes) as usize,
            )),
        }
    }
}

/// A mount's settings that its store depends on: who may read it, and what its answers say
/// to caches, are not among them.
fn store_settings(m: &MountConfig) -> MountConfig {
    MountConfig {
        tokens: Vec::new(),
        jwt_scope: None,
        cache_control: None,
        ..m.clone()
    }
}

/// Opens the mounts of `config`; a reload passes the mounts open now, of which those with the
/// same settings are kept as they are.
fn open_mounts(
    config: &Config,
    caches: &Arc<Caches>,
    open_now: Option<&BTreeMap<String, Mount>>,
) -> Result<Vec<Mount>, ConfigError> {
    let mut mounts = Vec::new();
    for (name, m) in &config.mounts {
        let tokens = m
            .tokens
            .iter()
            .map(|t| secret_from_env(t, &format!("mount '{name}': tokens")))
            .collect::<Result<Vec<_>, _>>()?;
        let access = MountAccess {
            tokens,
            jwt_scope: m.jwt_scope.clone(),
        };
        let cache_control = m
            .cache_control
            .as_deref()
            .map(axum::http::HeaderValue::from_str)
            .transpose()
            .map_err(|_| ConfigError::Invalid(format!("mount '{name}': cache_control is not a header value")))?;
        let settings = store_settings(m);
        let kept = open_now
            .and_then(|open| open.get(name))
            .filter(|mount| mount.store_settings.as_ref() == Some(&settings));
        let mut repository = kept.and_then(|mount| mount.repository.clone());
        let (store, kind, cache_id) = match kept {
            Some(mount) => (mount.store.clone(), mount.kind, mount.cache_id.clone()),
            None => {
                let cache_id: Arc<str> = match open_now {
                    None => name.as_str().into(),
                    Some(_) => {
                        let n = MOUNT_GENERATION.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                        format!("{name}#{n}").into()
                    }
                };
                let ttl = std::time::Duration::from_secs(config.cache.ttl_seconds);
                let freshness = store::cached::Freshness {
                    immutable: m.immutable,
                    stale_if_error: std::time::Duration::from_secs(m.stale_if_error),
                };
                let (store, kind) = match m.format {
                    crate::config::MountFormat::References => (
                        store::references::open(name, m, ttl, (&caches.raw, &cache_id, freshness)),
                        "references",
                    ),
                    crate::config::MountFormat::Icechunk => (
                        store::icechunk::open(
                            name,
                            m,
                            (ttl, config.cache.hierarchy_bytes),
                            (&caches.raw, &cache_id, freshness),
                        )
                        .map(|(store, opened)| {
                            repository = Some(opened);
                            store
                        }),
                        "icechunk",
                    ),
                    _ => {
                        let source = m.source(name)?;
                        (
                            store::open::open_cached(&source, m, ttl, (&caches.raw, name, &cache_id, freshness)),
                            store::open::kind(&source),
                        )
                    }
                };
                let store = store.map_err(|e| ConfigError::Invalid(format!("mount '{name}': {e}")))?;
                (store, kind, cache_id)
            }
        };
        mounts.push(Mount {
            name: name.as_str().into(),
            kind,
            url: crate::config::redact(&m.url),
            consolidated: m.consolidated,
            store,
            access,
            cache_control,
            cache_id,
            store_settings: Some(settings),
            repository,
        });
    }
    Ok(mounts)
}

#[cfg(test)]
mod tests {
    use crate::config::redact;

    #[test]
    fn credentials_are_not_shown() {
        assert_eq!(redact("https://user:pw@host/p?sig=abc"), "https://host/p");
        assert_eq!(redact("s3://bucket/prefix"), "s3://bucket/prefix");
        assert_eq!(redact("./data/demo"), "./data/demo");
    }
}
