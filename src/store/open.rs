//! Opening a mount's store from its configuration: local directories, buckets (S3, GCS,
//! Azure) and HTTP origins through object_store, zip archives through [`super::zip`].
//! Credentials come from each cloud's standard environment (`AWS_*`, `GOOGLE_*`, `AZURE_*`),
//! never from the config file.

use std::sync::Arc;
use std::time::Duration;

use object_store::aws::{AmazonS3Builder, AmazonS3ConfigKey};
use object_store::azure::{AzureConfigKey, MicrosoftAzureBuilder};
use object_store::gcp::{GoogleCloudStorageBuilder, GoogleConfigKey};
use object_store::http::HttpBuilder;
use object_store::{BackoffConfig, ClientOptions, ObjectStore, RetryConfig};

use super::cached::{Freshness, RawCache};
use super::zip::ZipBackend;
use super::{ObjectStoreBackend, Store, StoreKey, open_local};
use crate::config::{MountConfig, MountSource, Remote};

/// What kind of mount a source is (shown by /api/v1/mounts).
pub fn kind(source: &MountSource) -> &'static str {
    match source {
        MountSource::Local(_) => "local",
        MountSource::Remote(Remote::S3, _) => "s3",
        MountSource::Remote(Remote::Gcs, _) => "gcs",
        MountSource::Remote(Remote::Azure, _) => "azure",
        MountSource::Remote(Remote::Http, _) => "http",
        MountSource::Zip(..) => "zip",
    }
}

/// `timeout_s` bounds each wait on the upstream (connecting, then every read of the response),
/// not a whole request: a large object streams for as long as its bytes keep coming, and a
/// stalled one fails after `timeout_s` of silence.
fn client_options(config: &MountConfig) -> ClientOptions {
    let timeout = Duration::from_secs_f64(config.timeout_s);
    ClientOptions::new()
        .with_timeout_disabled()
        .with_read_timeout(timeout)
        .with_connect_timeout(timeout.min(Duration::from_secs(5)))
        .with_allow_http(config.allow_http)
}

fn retry(config: &MountConfig) -> RetryConfig {
    RetryConfig {
        backoff: BackoffConfig {
            init_backoff: Duration::from_millis(100),
            max_backoff: Duration::from_secs(5),
            base: 2.0,
        },
        max_retries: config.retries,
        retry_timeout: Duration::from_secs_f64(config.timeout_s * (config.retries as f64 + 1.0)),
    }
}

/// `bucket` and `prefix` of `scheme://bucket/prefix`.
pub(super) fn bucket_and_prefix(url: &str) -> (&str, &str) {
    let rest = url.split_once("://").map_or(url, |(_, r)| r);
    rest.split_once('/').unwrap_or((rest, ""))
}

/// The container, and the account where the authority names one (`container@account.host`).
pub(super) fn azure_container(authority: &str) -> (&str, Option<&str>) {
    match authority.split_once('@') {
        Some((container, host)) => (container, host.split('.').next().filter(|a| !a.is_empty())),
        None => (authority, None),
    }
}

/// object_store's Azure emulator mode (`AZURE_STORAGE_USE_EMULATOR`, for Azurite) talks plain
/// http to the emulator's address whatever the mount says: a mount that names an endpoint, or
/// does not allow http, would have its settings passed over in silence, so it does not start.
fn azure_emulator_check(emulator: Option<&str>, config: &MountConfig) -> Result<(), String> {
    let on = emulator.is_some_and(|v| {
        matches!(
            v.trim().to_ascii_lowercase().as_str(),
            "1" | "true" | "on" | "yes" | "y"
        )
    });
    if !on {
        return Ok(());
    }
    if config.endpoint.is_some() {
        return Err(
            "AZURE_STORAGE_USE_EMULATOR is set, which makes az:// mounts use the emulator's \
                    address (AZURITE_BLOB_STORAGE_URL) instead of `endpoint`: unset one of them"
                .into(),
        );
    }
    if !config.allow_http {
        return Err(
            "AZURE_STORAGE_USE_EMULATOR is set, which makes az:// mounts use plain http: \
                    set allow_http = true on the mount"
                .into(),
        );
    }
    Ok(())
}

fn remote(remote: Remote, url: &str, config: &MountConfig) -> Result<ObjectStoreBackend, String> {
    let (bucket, prefix) = bucket_and_prefix(url);
    let (store, prefix): (Arc<dyn ObjectStore>, &str) = match remote {
        Remote::S3 => {
            let mut b = AmazonS3Builder::from_env()
                .with_bucket_name(bucket)
                .with_client_options(client_options(config))
                .with_retry(retry(config))
                .with_allow_http(config.allow_http)
                .with_skip_signature(config.anonymous);
            if let Some(r) = &config.region {
                b = b.with_region(r);
            }
            if let Some(e) = &config.endpoint {
                b = b.with_endpoint(e);
            }
            if let Some(e) = b.get_config_value(&AmazonS3ConfigKey::Endpoint) {
                config.check_endpoint(&e, Remote::S3)?;
            }
            (Arc::new(b.build().map_err(|e| e.to_string())?), prefix)
        }
        Remote::Gcs => {
            let mut b = GoogleCloudStorageBuilder::from_env()
                .with_bucket_name(bucket)
                .with_client_options(client_options(config))
                .with_retry(retry(config))
                .with_skip_signature(config.anonymous);
            // The base URL of the JSON and XML APIs (an emulator's, say); a trailing slash
            // would make every path start with `//`, and every key read as missing.
            if let Some(e) = config
                .endpoint
                .clone()
                .or_else(|| b.get_config_value(&GoogleConfigKey::BaseUrl))
            {
                config.check_endpoint(&e, Remote::Gcs)?;
                b = b.with_base_url(e.trim_end_matches('/'));
            }
            (Arc::new(b.build().map_err(|e| e.to_string())?), prefix)
        }
        Remote::Azure => {
            // `abfs://container@account.dfs.core.windows.net/path` names the account too;
            // `az://container/path` leaves it to AZURE_STORAGE_ACCOUNT_NAME.
            let (container, account) = azure_container(bucket);
            azure_emulator_check(std::env::var("AZURE_STORAGE_USE_EMULATOR").ok().as_deref(), config)?;
            let mut b = MicrosoftAzureBuilder::from_env()
                .with_container_name(container)
                .with_client_options(client_options(config))
                .with_retry(retry(config))
                .with_allow_http(config.allow_http)
                .with_skip_signature(config.anonymous);
            if let Some(a) = account {
                b = b.with_account(a);
            }
            if let Some(e) = &config.endpoint {
                b = b.with_endpoint(e.clone());
            }
            if let Some(e) = b.get_config_value(&AzureConfigKey::Endpoint) {
                config.check_endpoint(&e, Remote::Azure)?;
            }
            let store = b.build().map_err(|e| {
                format!(
                    "{e} (az:// mounts take the account from AZURE_STORAGE_ACCOUNT_NAME, or from the \
                     URL as abfss://container@account.dfs.core.windows.net/path)"
                )
            })?;
            (Arc::new(store), prefix)
        }
        Remote::Http => {
            // The origin URL includes the prefix.
            let b = HttpBuilder::new()
                .with_url(url)
                .with_client_options(client_options(config))
                .with_retry(retry(config))
                .with_http_connector(super::origin::OriginConnector);
            (Arc::new(b.build().map_err(|e| e.to_string())?), "")
        }
    };
    let mut backend = ObjectStoreBackend::new(store, prefix).with_concurrency(config.concurrency);
    // A public bucket read without credentials answers 403 for keys that do not exist (to a
    // caller who may not list it): they are missing (404), as clients probing keys expect.
    if config.anonymous {
        backend = backend.denied_is_missing();
    }
    Ok(match remote {
        Remote::Http => backend.without_listing(),
        Remote::Azure => backend.without_suffix_ranges(),
        _ => backend,
    })
}

/// Opens a mount's store. Remote stores are not contacted here: a mount whose bucket is
/// unreachable still starts, and its requests answer 502/504 until the bucket answers.
pub fn open(source: &MountSource, config: &MountConfig) -> Result<Store, String> {
    open_checked(source, config, super::zip::DIRECTORY_CHECK)
}

/// [`open_checked`], with remote stores (an archive's too) read through the raw cache, as the
/// mount named so (its entries keyed by `cache_id`) with that freshness.
pub fn open_cached(
    source: &MountSource,
    config: &MountConfig,
    zip_check: Duration,
    (raw, mount, cache_id, freshness): (&Arc<RawCache>, &str, &Arc<str>, Freshness),
) -> Result<Store, String> {
    Ok(match source {
        MountSource::Local(_) => open_checked(source, config, zip_check)?,
        MountSource::Remote(..) => raw.wrap(
            open_checked(source, config, zip_check)?,
            (mount, cache_id.clone()),
            freshness,
        ),
        MountSource::Zip(container, name) => {
            let container = open_cached(container, config, zip_check, (raw, mount, cache_id, freshness))?;
            let key = StoreKey::new(name).map_err(|e| format!("archive name '{name}': {e}"))?;
            Store::new(ZipBackend::new(container, key).checked_every(zip_check))
        }
    })
}

/// [`open`], with a zip archive's directory checked against the archive every `zip_check` by
/// requests that read no entry (the server passes `cache.ttl_seconds`, its bound on staleness).
pub fn open_checked(source: &MountSource, config: &MountConfig, zip_check: Duration) -> Result<Store, String> {
    Ok(match source {
        MountSource::Local(dir) => Store::new(open_local(dir)?),
        MountSource::Remote(r, url) => Store::new(remote(*r, url, config)?),
        MountSource::Zip(container, name) => {
            let container = open(container, config)?;
            let key = StoreKey::new(name).map_err(|e| format!("archive name '{name}': {e}"))?;
            Store::new(ZipBackend::new(container, key).checked_every(zip_check))
        }
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn urls_split() {
        assert_eq!(bucket_and_prefix("s3://b/a/c"), ("b", "a/c"));
        assert_eq!(bucket_and_prefix("gs://b"), ("b", ""));
    }

    #[test]
    fn the_azure_emulator_does_not_pass_over_a_mount_s_settings() {
        let mut c = MountConfig::new("az://container/prefix", "/");
        assert!(azure_emulator_check(None, &c).is_ok());
        assert!(azure_emulator_check(Some("false"), &c).is_ok());
        let err = azure_emulator_check(Some("true"), &c).unwrap_err();
        assert!(err.contains("allow_http"), "{err}");
        c.allow_http = true;
        assert!(azure_emulator_check(Some("TRUE"), &c).is_ok());
        c.endpoint = Some("https://example.invalid/account".into());
        let err = azure_emulator_check(Some("1"), &c).unwrap_err();
        assert!(err.contains("endpoint"), "{err}");
    }

    /// A gs:// mount takes an endpoint (an emulator's base URL, checked as other endpoints
    /// are): requests go there, with the endpoint's trailing slash dropped (else every path
    /// starts with `//` and every key reads as missing).
    #[tokio::test]
    async fn gcs_mounts_take_an_endpoint() {
        use tokio::io::{AsyncReadExt, AsyncWriteExt};
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let port = listener.local_addr().unwrap().port();
        let origin = tokio::spawn(async move {
            let (mut socket, _) = listener.accept().await.unwrap();
            let mut head = vec![0u8; 4096];
            let n = socket.read(&mut head).await.unwrap();
            socket
                .write_all(b"HTTP/1.1 404 Not Found\r\ncontent-length: 0\r\nconnection: close\r\n\r\n")
                .await
                .unwrap();
            String::from_utf8_lossy(&head[..n])
                .lines()
                .next()
                .unwrap_or("")
                .to_owned()
        });
        let mut c = MountConfig::new("gs://bucket/prefix", "/");
        c.anonymous = true;
        c.allow_http = true;
        c.retries = 0;
        c.endpoint = Some(format!("http://127.0.0.1:{port}/"));
        let store = open(&c.source("g").unwrap(), &c).unwrap();
        let key = StoreKey::new("zarr.json").unwrap();
        assert!(store.head(&key).await.unwrap().is_none());
        // object_store names GCS objects percent-encoded whole.
        assert_eq!(origin.await.unwrap(), "HEAD /bucket/prefix%2Fzarr%2Ejson HTTP/1.1");
    }

    #[test]
    fn remote_stores_open_without_network() {
        let mut c = MountConfig::new("s3://bucket/prefix", "/");
        c.region = Some("us-east-1".into());
        c.anonymous = true;
        let src = c.source("s").unwrap();
        assert_eq!(kind(&src), "s3");
        assert!(open(&src, &c).is_ok());
        let mut h = MountConfig::new("http://127.0.0.1:9/data", "/");
        h.allow_http = true;
        let src = h.source("h").unwrap();
        assert!(open(&src, &h).is_ok());
    }
}
