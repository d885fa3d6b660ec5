//! zarrgate: an HTTP array server for Zarr.
//!
//! Layout (a request flows down this list):
//! - [`server`]: the router (`app`), middleware (CORS, access log) and the serve loop (`run`).
//! - [`http`]: one module per route family (raw keys, mounts/health).
//! - [`state`]: the mounts and configuration shared by handlers.
//! - [`store`]: the storage seam; a missing key is `Ok(None)`, bodies are streams.
//! - [`config`]: file + environment + command line into one checked [`config::Config`].
//! - [`error`]: [`error::ApiError`], the only error type a client ever sees.
//!
//! `main.rs` only parses arguments, sets up logging and calls [`server::run`].

pub mod config;
pub mod error;
pub mod http;
pub mod server;
pub mod state;
pub mod store;

pub use server::{app, run};
pub use state::AppState;
