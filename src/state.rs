//! Shared application state: the configuration and the mounts. Cheap to clone.

use std::collections::BTreeMap;
use std::sync::Arc;

use serde::Serialize;

use crate::array::{ReadContext, ReadOptions};
use crate::cache::{Caches, cached};
use crate::config::{Config, ConfigError, Secret, secret_from_env};
use crate::error::ApiError;
use crate::metrics::Metrics;
use crate::store::{self, Store, StoreKey};
use crate::zarr::{ArrayMeta, MetaError, OpenError, open_array};

/// One mounted hierarchy.
#[derive(Debug, Clone, Serialize)]
pub struct Mount {
    /// The URL segment that names it.
    pub name: Arc<str>,
    /// `local`, later `s3`, `gcs`, `azure`, `http`, `zip`.
    pub kind: &'static str,
    /// The configured URL, without credentials.
    pub url: String,
    /// Whether consolidated metadata is synthesized.
    pub consolidated: bool,
    /// The data.
    #[serde(skip)]
    pub store: Store,
    /// Bearer tokens that may read it; empty for a public mount.
    #[serde(skip)]
    pub tokens: Vec<Secret>,
    /// The `Cache-Control` of its answers (`mounts.NAME.cache_control`); `None`: `no-cache`.
    #[serde(skip)]
    pub cache_control: Option<axum::http::HeaderValue>,
}

impl Mount {
    /// Whether a request presenting `bearer` (if any) may read this mount.
    pub fn allows(&self, bearer: Option<&[u8]>) -> bool {
        self.tokens.is_empty() || bearer.is_some_and(|b| self.tokens.iter().any(|t| t.matches(b)))
    }
}

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
    pub metrics: Metrics,
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
        let mut mounts = Vec::new();
        for (name, m) in &config.mounts {
            let source = m.source(name)?;
            let kind = store::open::kind(&source);
            let ttl = std::time::Duration::from_secs(config.cache.ttl_seconds);
            let freshness = store::cached::Freshness {
                immutable: m.immutable,
                stale_if_error: std::time::Duration::from_secs(m.stale_if_error),
            };
            let store = store::open::open_cached(&source, m, ttl, (&caches.raw, name, freshness))
                .map_err(|e| ConfigError::Invalid(format!("mount '{name}': {e}")))?;
            let tokens = m
                .tokens
                .iter()
                .map(|t| secret_from_env(t, &format!("mount '{name}': tokens")))
                .collect::<Result<Vec<_>, _>>()?;
            let cache_control = m
                .cache_control
                .as_deref()
                .map(axum::http::HeaderValue::from_str)
                .transpose()
                .map_err(|_| ConfigError::Invalid(format!("mount '{name}': cache_control is not a header value")))?;
            mounts.push(Mount {
                name: name.as_str().into(),
                kind,
                url: crate::config::redact(&m.url),
                consolidated: m.consolidated,
                store,
                tokens,
                cache_control,
            });
        }
        Ok(Self::with_caches(config, mounts, caches))
    }

    /// State over ready-made mounts (tests use this with wrapped stores).
    pub fn with_mounts(config: Config, mounts: Vec<Mount>) -> Self {
        let caches = Arc::new(Caches::new(&config.cache));
        Self::with_caches(config, mounts, caches)
    }

    /// State over ready-made mounts and caches (the raw cache their stores read through).
    pub fn with_caches(config: Config, mounts: Vec<Mount>, caches: Arc<Caches>) -> Self {
        let whole_mib = whole_budget_mib(config.limits.max_slice_bytes);
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
            caches,
            metrics: Metrics::new(),
            read_options,
            streams: Arc::new(tokio::sync::Semaphore::new(MAX_STREAMS)),
            whole_mib: Arc::new(tokio::sync::Semaphore::new(whole_mib as usize)),
        }))
    }

    /// How reads on `mount` fetch and cache chunks.
    pub fn read_context(&self, mount: &Mount) -> ReadContext {
        ReadContext::new(
            mount.store.clone(),
            mount.name.clone(),
            Some(self.caches.clone()),
            self.read_options.clone(),
        )
    }

    /// The metadata of the array at `path` in `mount` (cached).
    pub async fn array(&self, mount: &Mount, path: &StoreKey) -> Result<Arc<ArrayMeta>, ApiError> {
        let key = (mount.name.clone(), path.clone());
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
        let name = match segment.contains('%') {
            true => percent_encoding::percent_decode_str(segment)
                .decode_utf8()
                .map_err(|_| store::KeyError::NotUtf8)?,
            false => segment.into(),
        };
        if let Some(mount) = self.mounts.get(name.as_ref()) {
            return Ok(mount);
        }
        StoreKey::new(&name)?;
        Err(ApiError::UnknownMount(name.into_owned()))
    }
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
