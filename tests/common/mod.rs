//! Helpers shared by the integration tests.
#![allow(dead_code)]

use std::path::{Path, PathBuf};

use axum::Router;
use axum::body::Body;
use axum::http::{HeaderMap, Request, StatusCode};
use bytes::Bytes;
use http_body_util::BodyExt;
use tower::ServiceExt;
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

/// A config mounting `dirs` by name.
pub fn config_with(mounts: &[(&str, &Path)]) -> Config {
    let mut config = Config::default();
    for (name, dir) in mounts {
        config.mounts.insert(
            (*name).to_owned(),
            MountConfig {
                url: dir.display().to_string(),
                consolidated: true,
                base_dir: PathBuf::from("/"),
            },
        );
    }
    config
}

/// The app over the fixtures (`fx`) and the demo (`demo`).
pub fn fixture_app() -> Router {
    let fx = fixtures();
    let demo = repo().join("data/demo");
    app_for(&[("fx", &fx), ("demo", &demo)])
}

/// The app over the given directories.
pub fn app_for(mounts: &[(&str, &Path)]) -> Router {
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
pub async fn send(app: &Router, request: Request<Body>) -> Reply {
    let response = app.clone().oneshot(request).await.expect("infallible");
    let status = response.status();
    let headers = response.headers().clone();
    let body = response.into_body().collect().await.expect("body").to_bytes();
    Reply { status, headers, body }
}

/// `GET uri` with extra headers.
pub async fn get(app: &Router, uri: &str, headers: &[(&str, &str)]) -> Reply {
    request(app, "GET", uri, headers).await
}

/// Any method.
pub async fn request(app: &Router, method: &str, uri: &str, headers: &[(&str, &str)]) -> Reply {
    let mut builder = Request::builder().method(method).uri(uri);
    for (k, v) in headers {
        builder = builder.header(*k, *v);
    }
    send(app, builder.body(Body::empty()).expect("request")).await
}
