//! The health listener: `/healthz` and `/metrics` on connections of their own.

use super::connection::HEADER_READ_TIMEOUT;
use super::connection::body_of;
use super::connection::next_connection;
use super::front::App;
use super::front::build;
use super::front::health_routes;
use super::front::mark_host;
use crate::http::api;
use crate::state::AppState;
use std::future::Future;
use tokio::net::TcpListener;

/// Connections the health listener ([`serve_health`]) keeps open at once; more wait to be
/// accepted.
pub const HEALTH_CONNECTIONS: usize = 16;

/// The service of the health listener ([`serve_health`]): `/healthz`, `/readyz` and
/// `/metrics` behind the front, every other path 404.
pub fn health_app(state: AppState) -> App {
    fn routes(state: AppState) -> axum::Router {
        health_routes()
            .method_not_allowed_fallback(api::method_not_allowed)
            .with_state(state)
    }
    build(state, routes, false, true)
}

/// Serves `/healthz`, `/readyz` and `/metrics` alone on `listener` (`server.health_bind`) until `shutdown`
/// resolves: a listener of its own, with connections of its own, so that a liveness probe or a
/// scrape is answered while every one of `limits.max_connections` is taken (by clients reading
/// slowly, say), where on `bind` it would wait to be accepted. Other paths are 404. The answers
/// are the front's (the metrics token, CORS, counts in `/metrics`), over HTTP/1.
pub async fn serve_health(
    listener: TcpListener,
    app: App,
    shutdown: impl Future<Output = ()> + Send + 'static,
) -> std::io::Result<()> {
    use hyper_util::rt::{TokioExecutor, TokioIo, TokioTimer};
    use hyper_util::server::conn::auto::Builder;

    let permits = std::sync::Arc::new(tokio::sync::Semaphore::new(HEALTH_CONNECTIONS));
    let mut builder = Builder::new(TokioExecutor::new()).http1_only();
    // A client has as long to send a request's head as on `bind`; an idle one is then closed.
    builder
        .http1()
        .timer(TokioTimer::new())
        .header_read_timeout(HEADER_READ_TIMEOUT);
    let builder = std::sync::Arc::new(builder);
    let mut shutdown = std::pin::pin!(shutdown);
    loop {
        let Some((tcp, permit)) = next_connection(&listener, &permits, shutdown.as_mut()).await else {
            break;
        };
        let (app, builder) = (app.clone(), builder.clone());
        let service = hyper::service::service_fn(move |mut request: hyper::Request<hyper::body::Incoming>| {
            mark_host(&mut request);
            futures::FutureExt::map(
                app.clone().serve(request.map(body_of), None),
                Ok::<_, std::convert::Infallible>,
            )
        });
        tokio::spawn(async move {
            let _permit = permit;
            if let Err(e) = builder.serve_connection(TokioIo::new(tcp), service).await {
                tracing::debug!(error = %e, "health connection ended");
            }
        });
    }
    Ok(())
}

/// Asks the server at the configured address for `GET /healthz` (its `server.health_bind` when
/// it has one; a wildcard address is asked on loopback), within 5 s: `Ok` with the status line
/// when it answers 200. The container's `HEALTHCHECK` (`zarrgate healthcheck`).
pub fn healthcheck(config: &crate::config::Config) -> Result<String, String> {
    use std::io::{Read, Write};
    // The health listener when there is one: what it is for.
    let mut addr = match config.health_addr().map_err(|e| e.to_string())? {
        Some(health) => health,
        None => config.bind_addr().map_err(|e| e.to_string())?,
    };
    if addr.ip().is_unspecified() {
        addr.set_ip(match addr {
            std::net::SocketAddr::V4(_) => std::net::Ipv4Addr::LOCALHOST.into(),
            std::net::SocketAddr::V6(_) => std::net::Ipv6Addr::LOCALHOST.into(),
        });
    }
    let wait = std::time::Duration::from_secs(5);
    let mut tcp = std::net::TcpStream::connect_timeout(&addr, wait).map_err(|e| format!("{addr}: {e}"))?;
    tcp.set_read_timeout(Some(wait)).map_err(|e| e.to_string())?;
    tcp.write_all(b"GET /healthz HTTP/1.0\r\nHost: localhost\r\n\r\n")
        .map_err(|e| format!("{addr}: {e}"))?;
    let mut head = [0u8; 12];
    tcp.read_exact(&mut head).map_err(|e| format!("{addr}: {e}"))?;
    let status = String::from_utf8_lossy(&head).into_owned();
    if status.ends_with(" 200") {
        Ok(format!("{addr}: {status}"))
    } else {
        Err(format!("{addr}: {status}"))
    }
}
