//! The router and the server loop.
//!
//! `app(state)` builds the whole service so tests can drive it with `oneshot`; `run` serves it
//! on a listener until `shutdown` resolves, letting requests in flight finish.

mod access_log;
mod activity;
mod connection;
mod cors;
mod front;
mod hang_up;
mod health;
mod limits;
mod reload;
mod signals;

use crate::state::AppState;
pub use access_log::{LoggedBody, MAX_FRAME};
use connection::Accepted;
use connection::OpenConnection;
use connection::next_connection;
use connection::{ConnectionSettings, serve_connection};
pub use connection::{HEADER_READ_TIMEOUT, STALLED, send_timeout};
pub use front::{App, app, front, routes};
use hang_up::HangUpWatch;
pub use health::{HEALTH_CONNECTIONS, health_app, healthcheck, serve_health};
pub use reload::{reload, start_background};
#[cfg(unix)]
pub use signals::reload_signals;
pub use signals::{StopSignals, shutdown_signals, signalled};
use std::future::Future;
use std::time::Duration;
use tokio::net::TcpListener;

/// Serves `app` on `listener` until `shutdown` resolves, then lets the responses under way
/// finish for up to `server.drain_seconds`.
pub async fn run(
    listener: TcpListener,
    app: App,
    shutdown: impl Future<Output = ()> + Send + 'static,
) -> std::io::Result<()> {
    let drain = drain_time(&app.state());
    run_draining(listener, app, shutdown, drain).await
}

/// `server.drain_seconds` (validated at load: finite, 0 to a day).
pub fn drain_time(state: &AppState) -> Duration {
    Duration::try_from_secs_f64(state.config.server.drain_seconds).unwrap_or(Duration::ZERO)
}

/// Resolves when the server is to stop accepting: at the first SIGINT; after the first
/// SIGTERM, once `server.drain_seconds` have passed (or a second signal came), while
/// `/readyz` says not ready and every request is still served, so that load balancers move
/// their traffic away before connections are refused.
///
/// `drain` is `server.drain_seconds` as the server started with it (a reload does not change
/// it). The listeners each wait on one of these; the first logs.
pub async fn stop_accepting(signals: tokio::sync::watch::Receiver<StopSignals>, app: App, drain: Duration) {
    signalled(signals.clone(), 1).await;
    if !signals.borrow().first_was_term {
        return;
    }
    let lifecycle = app.state().lifecycle.clone();
    if lifecycle.draining() {
        return wait_drain(signals, drain).await;
    }
    lifecycle.start_draining();
    tracing::info!(
        drain_seconds = drain.as_secs_f64(),
        "SIGTERM: not ready, serving on while load balancers move away"
    );
    wait_drain(signals, drain).await
}

async fn wait_drain(signals: tokio::sync::watch::Receiver<StopSignals>, drain: Duration) {
    tokio::select! {
        () = tokio::time::sleep(drain) => {},
        () = signalled(signals, 2) => {},
    }
}

/// [`run`], letting responses under way finish for up to `drain` after `shutdown`, then
/// returning whether or not they have: a client reading a large body slowly, or a request
/// waiting on a store that does not answer, does not keep the caller waiting. The connections
/// still open are then ended with the workers serving them (`server.workers`); with none, they
/// are tasks of the caller's runtime, which ends them when it shuts down (`main` does so right
/// after).
pub async fn run_draining(
    listener: TcpListener,
    app: App,
    shutdown: impl Future<Output = ()> + Send + 'static,
    drain: Duration,
) -> std::io::Result<()> {
    serve_with(listener, app, shutdown, drain, HEADER_READ_TIMEOUT).await
}

/// [`run_draining`] giving a client `header_read` to send a request's head (and a keep-alive
/// connection as long idle between requests).
pub async fn serve_with(
    listener: TcpListener,
    app: App,
    shutdown: impl Future<Output = ()> + Send + 'static,
    drain: Duration,
    header_read: Duration,
) -> std::io::Result<()> {
    // What is sized at start (connections, workers) keeps the settings it started with.
    let state = app.state();
    // Each connection holds a permit: at the limit, new ones wait in the listen backlog, so
    // what connections hold (buffers, bodies under way, descriptors) is bounded.
    let max_connections = state.config.limits.max_connections;
    let connections = std::sync::Arc::new(tokio::sync::Semaphore::new(max_connections));
    let metrics = state.metrics.clone();
    let settings = std::sync::Arc::new(ConnectionSettings::new(&state.config.limits, header_read));
    // Connections are served by the workers, or on this runtime when there are none.
    let mut workers = match state.config.server.workers {
        0 => None,
        n => Some(crate::workers::Workers::start(n, state.config.server.blocking_threads).await?),
    };
    // Not held past start: a reload's state replaces it (its mounts, its JWT key set's refresh).
    drop(state);
    let (stop, stopping) = tokio::sync::watch::channel(());
    let mut shutdown = std::pin::pin!(shutdown);
    loop {
        let Some((tcp, permit)) = next_connection(&listener, &connections, shutdown.as_mut()).await else {
            break;
        };
        // Given to a worker, it is registered anew with the worker's runtime.
        let tcp = match &workers {
            None => Accepted::Here(tcp),
            Some(_) => match tcp.into_std() {
                Ok(tcp) => Accepted::HandedOver(tcp),
                Err(e) => {
                    tracing::warn!(error = %e, "handing an accepted connection over failed");
                    continue;
                }
            },
        };
        let (app, settings, mut stopping) = (app.clone(), settings.clone(), stopping.clone());
        let open = OpenConnection::new(metrics.clone(), permit);
        let connection = async move {
            let _open = open;
            let tcp = match tcp {
                Accepted::Here(tcp) => tcp,
                Accepted::HandedOver(tcp) => match tokio::net::TcpStream::from_std(tcp) {
                    Ok(tcp) => tcp,
                    Err(e) => {
                        tracing::warn!(error = %e, "registering a connection with its worker's runtime failed");
                        return;
                    }
                },
            };
            // A connection that sends nothing is closed after `header_read` too (telling
            // HTTP/1 from HTTP/2 waits for its first bytes, before hyper's timer), and at once
            // on shutdown.
            let mut first = [0u8; 1];
            let sent = tokio::select! {
                peeked = tokio::time::timeout(header_read, tcp.peek(&mut first)) => matches!(peeked, Ok(Ok(1))),
                _ = stopping.changed() => false,
            };
            if !sent {
                return;
            }
            let hang_up = HangUpWatch::new(&tcp);
            serve_connection(tcp, Some(hang_up), app, &settings, stopping).await;
        };
        match &mut workers {
            Some(workers) => workers.spawn(connection),
            None => {
                tokio::spawn(connection);
            }
        }
    }
    // Nothing more is accepted; the responses under way get `drain` to finish: until every
    // connection has released its permit.
    tracing::info!(drain_seconds = drain.as_secs_f64(), "shutting down");
    drop(listener);
    let _ = stop.send(());
    let every_permit = u32::try_from(max_connections).unwrap_or(u32::MAX);
    tokio::select! {
        _ = connections.acquire_many(every_permit) => Ok(()),
        () = tokio::time::sleep(drain) => {
            tracing::warn!(seconds = drain.as_secs_f64(), "closing the connections still open after the shutdown signal");
            Ok(())
        }
    }
}
