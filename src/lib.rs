//! zarrgate: an HTTP array server for Zarr.
//!
//! Layout (a request flows down this list):
//! - [`server`]: the router (`app`), middleware (CORS, access log) and the serve loop (`run`),
//!   which hands each connection to one of the [`workers`], threads with a runtime each.
//! - [`http`]: one module per route family (raw keys, slices, mounts/health/metrics), and the
//!   compression of answers of text (`http::compress`).
//! - [`state`]: the mounts, caches and configuration shared by handlers.
//! - [`auth`]: who may read a mount (static tokens, JWTs, signed URLs).
//! - [`format`]: slice output encoders (json, bin, npy, csv, png).
//! - [`array`]: selections, chunk planning, concurrent fetch + decode, assembly.
//! - [`zarr`]: v1/v2/v3 metadata into one model: data types, fill values, chunk keys.
//! - [`codec`]: one codec per file and the chain that decodes a stored chunk.
//! - [`cache`]: moka caches of decoded chunks, shard indexes and metadata; [`metrics`].
//! - [`store`]: the storage seam; a missing key is `Ok(None)`, bodies are streams.
//! - [`config`]: file + environment + command line into one checked [`config::Config`].
//! - [`error`]: [`error::ApiError`], the only error type a client ever sees.
//!
//! `main.rs` only parses arguments, sets up logging and calls [`server::run`] (and reloads on SIGHUP).

#[cfg(target_os = "linux")]
pub mod alloc;
pub mod array;
pub mod auth;
pub mod buffers;
pub mod cache;
pub mod codec;
pub mod config;
pub mod dtype;
pub mod error;
pub mod format;
pub mod http;
pub mod json_text;
pub mod metrics;
pub mod server;
pub mod state;
pub mod store;
pub mod version;
pub mod workers;
pub mod zarr;

pub use server::{App, app, run};
pub use state::AppState;
