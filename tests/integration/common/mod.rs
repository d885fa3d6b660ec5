//! Helpers shared by the integration tests.
#![allow(dead_code)]

use std::path::{Path, PathBuf};

use axum::body::Body;
use axum::http::{HeaderMap, Request, StatusCode};
use bytes::Bytes;
use http_body_util::BodyExt;
use tower::ServiceExt;
use zarrgate::App;
use zarrgate::AppState;
use zarrgate::config::{Config, MountConfig};

/// The repository root.
pub fn repo() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

/// The committed fixture stores.
pub fn fixtures() -> PathBuf {
    repo().join("tests/fixtures/data")
}

/// Copies the tree below `from` to `to` (directories, empty ones too, and files).
pub fn copy_dir(from: &Path, to: &Path) {
    std::fs::create_dir_all(to).unwrap();
    for entry in std::fs::read_dir(from).unwrap() {
        let path = entry.unwrap().path();
        let target = to.join(path.file_name().unwrap());
        if path.is_dir() {
            copy_dir(&path, &target);
        } else {
            std::fs::copy(&path, &target).unwrap();
        }
    }
}

/// A config mounting `dirs` by name.
pub fn config_with(mounts: &[(&str, &Path)]) -> Config {
    let mut config = Config::default();
    for (name, dir) in mounts {
        config
            .mounts
            .insert((*name).to_owned(), MountConfig::new(dir.display().to_string(), "/"));
    }
    config
}

/// The app over the fixtures (`fx`) and the demo (`demo`).
pub fn fixture_app() -> App {
    let fx = fixtures();
    let demo = repo().join("data/demo");
    app_for(&[("fx", &fx), ("demo", &demo)])
}

/// The app over the given directories.
pub fn app_for(mounts: &[(&str, &Path)]) -> App {
    let state = AppState::from_config(config_with(mounts)).expect("fixture mounts open");
    zarrgate::app(state)
}

/// A response, collected.
pub struct Reply {
    pub status: StatusCode,
    pub headers: HeaderMap,
    pub body: Bytes,
}

impl Reply {
    pub fn header(&self, name: &str) -> Option<&str> {
        self.headers.get(name).and_then(|v| v.to_str().ok())
    }

    pub fn json(&self) -> serde_json::Value {
        serde_json::from_slice(&self.body).unwrap_or_else(|e| panic!("body is not JSON ({e}): {:?}", self.body))
    }

    /// The `error.code` of a JSON error body.
    pub fn error_code(&self) -> String {
        self.json()["error"]["code"].as_str().unwrap_or_default().to_owned()
    }
}

/// Sends one request through the app.
pub async fn send(app: &App, request: Request<Body>) -> Reply {
    let response = app.clone().oneshot(request).await.expect("infallible");
    let status = response.status();
    let headers = response.headers().clone();
    let body = response.into_body().collect().await.expect("body").to_bytes();
    Reply { status, headers, body }
}

/// `GET uri` with extra headers.
pub async fn get(app: &App, uri: &str, headers: &[(&str, &str)]) -> Reply {
    request(app, "GET", uri, headers).await
}

/// Any method.
pub async fn request(app: &App, method: &str, uri: &str, headers: &[(&str, &str)]) -> Reply {
    let mut builder = Request::builder().method(method).uri(uri);
    for (k, v) in headers {
        builder = builder.header(*k, *v);
    }
    send(app, builder.body(Body::empty()).expect("request")).await
}
pub mod cases;
pub mod expected;
pub mod remote;

include!("png_rgba.rs");

/// What a [`ReadHook`] does for a read: given the wrapped store, the key and the range.
pub type ReadFn = Box<
    dyn Fn(
            zarrgate::store::Store,
            zarrgate::store::StoreKey,
            Option<zarrgate::store::ByteRange>,
        ) -> futures::future::BoxFuture<
            'static,
            Result<Option<zarrgate::store::GetObject>, zarrgate::store::StoreError>,
        > + Send
        + Sync,
>;

/// What a [`ReadHook`] does for a HEAD: given the wrapped store and the key.
pub type HeadFn = Box<
    dyn Fn(
            zarrgate::store::Store,
            zarrgate::store::StoreKey,
        ) -> futures::future::BoxFuture<
            'static,
            Result<Option<zarrgate::store::ObjectMeta>, zarrgate::store::StoreError>,
        > + Send
        + Sync,
>;

/// A store that forwards to `inner`, except that its reads (`get`) go through `read`, and its
/// HEADs through `head` if set: for tests whose store changes only what a read does (delays
/// it, alters what it reports).
pub struct ReadHook {
    pub inner: zarrgate::store::Store,
    pub read: ReadFn,
    pub head: Option<HeadFn>,
}

impl std::fmt::Debug for ReadHook {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ReadHook")
            .field("inner", &self.inner)
            .finish_non_exhaustive()
    }
}

#[async_trait::async_trait]
impl zarrgate::store::Backend for ReadHook {
    async fn head(
        &self,
        key: &zarrgate::store::StoreKey,
    ) -> Result<Option<zarrgate::store::ObjectMeta>, zarrgate::store::StoreError> {
        match &self.head {
            Some(head) => head(self.inner.clone(), key.clone()).await,
            None => self.inner.head(key).await,
        }
    }

    async fn get(
        &self,
        key: &zarrgate::store::StoreKey,
        range: Option<zarrgate::store::ByteRange>,
    ) -> Result<Option<zarrgate::store::GetObject>, zarrgate::store::StoreError> {
        (self.read)(self.inner.clone(), key.clone(), range).await
    }

    async fn list(
        &self,
        prefix: &zarrgate::store::StoreKey,
    ) -> Result<zarrgate::store::Listing, zarrgate::store::StoreError> {
        self.inner.list(prefix).await
    }
}

/// A mount `m` of `store` that calls itself remote (`s3`, at `url`): a wrapped store standing
/// for a bucket (one that lags, fails or counts).
pub fn wrapped_mount(url: &str, store: impl zarrgate::store::Backend) -> zarrgate::state::Mount {
    zarrgate::state::Mount::new("m", "s3", url.into(), zarrgate::store::Store::new(store))
}

/// A store wrapper that counts reads, to prove what the caches save, and can make listings
/// slow (a remote store's), to show what waits for them, or fail.
#[derive(Debug)]
pub struct CountingStore {
    pub inner: zarrgate::store::Store,
    pub gets: std::sync::Arc<std::sync::atomic::AtomicUsize>,
    pub list_delay: std::time::Duration,
    /// When set, listings fail with this error (a bucket that refuses LIST).
    pub list_error: Option<fn() -> zarrgate::store::StoreError>,
}

#[async_trait::async_trait]
impl zarrgate::store::Backend for CountingStore {
    async fn head(
        &self,
        key: &zarrgate::store::StoreKey,
    ) -> Result<Option<zarrgate::store::ObjectMeta>, zarrgate::store::StoreError> {
        self.gets.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
        self.inner.head(key).await
    }

    async fn get(
        &self,
        key: &zarrgate::store::StoreKey,
        range: Option<zarrgate::store::ByteRange>,
    ) -> Result<Option<zarrgate::store::GetObject>, zarrgate::store::StoreError> {
        self.gets.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
        self.inner.get(key, range).await
    }

    async fn list(
        &self,
        prefix: &zarrgate::store::StoreKey,
    ) -> Result<zarrgate::store::Listing, zarrgate::store::StoreError> {
        self.gets.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
        tokio::time::sleep(self.list_delay).await;
        match self.list_error {
            Some(error) => Err(error()),
            None => self.inner.list(prefix).await,
        }
    }

    fn resolves_ranges(&self) -> bool {
        self.inner.resolves_ranges()
    }
}

/// A hierarchy without end, as a walk meets one (a bucket of very many groups): every prefix
/// lists `width` groups `g0`, `g1`, ..., and every key is read as the key of its name at the
/// root of `inner` (so each group is the root group again).
#[derive(Debug)]
pub struct EndlessGroups {
    pub inner: zarrgate::store::Store,
    pub width: usize,
}

impl EndlessGroups {
    fn at_root(key: &zarrgate::store::StoreKey) -> zarrgate::store::StoreKey {
        zarrgate::store::StoreKey::new(key.name()).unwrap_or_else(|_| key.clone())
    }
}

#[async_trait::async_trait]
impl zarrgate::store::Backend for EndlessGroups {
    async fn head(
        &self,
        key: &zarrgate::store::StoreKey,
    ) -> Result<Option<zarrgate::store::ObjectMeta>, zarrgate::store::StoreError> {
        self.inner.head(&Self::at_root(key)).await
    }

    async fn get(
        &self,
        key: &zarrgate::store::StoreKey,
        range: Option<zarrgate::store::ByteRange>,
    ) -> Result<Option<zarrgate::store::GetObject>, zarrgate::store::StoreError> {
        self.inner.get(&Self::at_root(key), range).await
    }

    async fn list(
        &self,
        _prefix: &zarrgate::store::StoreKey,
    ) -> Result<zarrgate::store::Listing, zarrgate::store::StoreError> {
        Ok(zarrgate::store::Listing {
            prefixes: (0..self.width).map(|i| format!("g{i}")).collect(),
            objects: Vec::new(),
        })
    }
}

/// The app over [`EndlessGroups`] of `width` made from the root documents in `dir`, its reads
/// counted.
pub fn endless_app(
    dir: &Path,
    width: usize,
    config: Config,
) -> (App, zarrgate::AppState, std::sync::Arc<std::sync::atomic::AtomicUsize>) {
    let gets = std::sync::Arc::new(std::sync::atomic::AtomicUsize::new(0));
    let inner = zarrgate::store::Store::new(zarrgate::store::open_local(dir).unwrap());
    let mut mount = wrapped_mount(
        "s3://endless",
        CountingStore {
            inner: zarrgate::store::Store::new(EndlessGroups { inner, width }),
            gets: gets.clone(),
            list_delay: std::time::Duration::ZERO,
            list_error: None,
        },
    );
    mount.kind = "local";
    let state = AppState::with_mounts(config, vec![mount]);
    (zarrgate::app(state.clone()), state, gets)
}

/// The app over one directory whose reads are counted.
pub fn counting_app(
    dir: &Path,
    config: Config,
) -> (App, zarrgate::AppState, std::sync::Arc<std::sync::atomic::AtomicUsize>) {
    slow_listing_app(dir, config, std::time::Duration::ZERO)
}

/// [`counting_app`] whose store takes `list_delay` to list a directory.
pub fn slow_listing_app(
    dir: &Path,
    config: Config,
    list_delay: std::time::Duration,
) -> (App, zarrgate::AppState, std::sync::Arc<std::sync::atomic::AtomicUsize>) {
    let gets = std::sync::Arc::new(std::sync::atomic::AtomicUsize::new(0));
    let inner = zarrgate::store::Store::new(zarrgate::store::open_local(dir).unwrap());
    let mount = zarrgate::state::Mount::new(
        "m",
        "local",
        dir.display().to_string(),
        zarrgate::store::Store::new(CountingStore {
            inner,
            gets: gets.clone(),
            list_delay,
            list_error: None,
        }),
    );
    let state = AppState::with_mounts(config, vec![mount]);
    (zarrgate::app(state.clone()), state, gets)
}

/// Writes a v3 array with raw little-endian chunks (`bytes` codec only) for tests.
pub fn write_v3_array(
    dir: &Path,
    shape: &[u64],
    chunks: &[u64],
    data_type: &str,
    fill: serde_json::Value,
    codecs: serde_json::Value,
) {
    std::fs::create_dir_all(dir).unwrap();
    let doc = serde_json::json!({
        "zarr_format": 3, "node_type": "array", "shape": shape, "data_type": data_type,
        "chunk_grid": {"name": "regular", "configuration": {"chunk_shape": chunks}},
        "chunk_key_encoding": {"name": "default", "configuration": {"separator": "/"}},
        "fill_value": fill, "codecs": codecs, "attributes": {}
    });
    std::fs::write(dir.join("zarr.json"), serde_json::to_vec(&doc).unwrap()).unwrap();
}
