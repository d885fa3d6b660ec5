//! Shared application state: the configuration and the mounts. Cheap to clone.

use std::collections::BTreeMap;
use std::sync::Arc;

use serde::Serialize;

use crate::config::{Config, ConfigError, MountSource};
use crate::error::ApiError;
use crate::store::{Store, open_local};

/// One mounted hierarchy.
#[derive(Debug, Clone, Serialize)]
pub struct Mount {
    /// The URL segment that names it.
    pub name: String,
    /// `local`, later `s3`, `gcs`, `azure`, `http`, `zip`.
    pub kind: &'static str,
    /// The configured URL, without credentials.
    pub url: String,
    /// Whether consolidated metadata is synthesized.
    pub consolidated: bool,
    /// The data.
    #[serde(skip)]
    pub store: Store,
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
}

impl std::ops::Deref for AppState {
    type Target = StateInner;
    fn deref(&self) -> &StateInner {
        &self.0
    }
}

/// Removes user info and query from a URL for display.
fn redact(url: &str) -> String {
    let without_query = url.split(['?', '#']).next().unwrap_or(url);
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

impl AppState {
    /// Opens every configured mount.
    pub fn from_config(config: Config) -> Result<Self, ConfigError> {
        let mut mounts = Vec::new();
        for (name, m) in &config.mounts {
            let (kind, store) = match m.source(name)? {
                MountSource::Local(dir) => (
                    "local",
                    Store::new(open_local(&dir).map_err(|e| ConfigError::Invalid(format!("mount '{name}': {e}")))?),
                ),
            };
            mounts.push(Mount {
                name: name.clone(),
                kind,
                url: redact(&m.url),
                consolidated: m.consolidated,
                store,
            });
        }
        Ok(Self::with_mounts(config, mounts))
    }

    /// State over ready-made mounts (tests use this with wrapped stores).
    pub fn with_mounts(config: Config, mounts: Vec<Mount>) -> Self {
        let mounts = mounts.into_iter().map(|m| (m.name.clone(), m)).collect();
        Self(Arc::new(StateInner { config, mounts }))
    }

    /// The mount of that name, or a 404.
    pub fn mount(&self, name: &str) -> Result<&Mount, ApiError> {
        self.mounts
            .get(name)
            .ok_or_else(|| ApiError::UnknownMount(name.to_owned()))
    }
}

#[cfg(test)]
mod tests {
    use super::redact;

    #[test]
    fn credentials_are_not_shown() {
        assert_eq!(redact("https://user:pw@host/p?sig=abc"), "https://host/p");
        assert_eq!(redact("s3://bucket/prefix"), "s3://bucket/prefix");
        assert_eq!(redact("./data/demo"), "./data/demo");
    }
}
