//! One accepted connection: socket options, its permit, and the loop that serves it.

use super::activity::ConnectionActivity;
use super::hang_up::HangUpWatch;
use std::future::Future;
use std::time::Duration;
use tokio::net::TcpListener;

/// `limits.send_timeout_s`: how long a response's body may wait for its client to take more
/// of it ([`ConnectionActivity::stalled`]); then its connection is closed: a client that stopped reading
/// a streamed response releases its permit ([`crate::state::MAX_STREAMS`]).
pub fn send_timeout(limits: &crate::config::LimitsConfig) -> Duration {
    // Validated at load: finite, a millisecond to a day (a state made in code is not
    // validated: at least a millisecond).
    Duration::try_from_secs_f64(limits.send_timeout_s)
        .unwrap_or(Duration::from_secs(120))
        .max(Duration::from_millis(1))
}

/// How long the kernel lets a connection leave what it was sent unacknowledged (the peer gone,
/// or its receive window closed) before it closes it. Not `limits.send_timeout_s`, which may
/// be shorter than retransmissions take on a lossy network.
pub const STALLED: Duration = Duration::from_secs(120);

/// Socket options of an accepted connection: a stalled peer is dropped after [`STALLED`].
/// (TCP_NODELAY measured 1-2% fewer warm tiles a second at 64 connections, and no gain.)
#[cfg_attr(not(any(target_os = "linux", target_os = "android")), allow(unused_variables))]
pub(super) fn tune_connection(tcp: &mut tokio::net::TcpStream) {
    #[cfg(any(target_os = "linux", target_os = "android"))]
    if let Err(e) = socket2::SockRef::from(&*tcp).set_tcp_user_timeout(Some(STALLED)) {
        tracing::debug!(error = %e, "TCP_USER_TIMEOUT not set");
    }
}

/// An accepted connection: its permit ([`crate::config::LimitsConfig::max_connections`]) and its
/// count in the metrics, released when it closes.
pub(super) struct OpenConnection {
    pub(super) metrics: std::sync::Arc<crate::metrics::Metrics>,
    pub(super) _permit: tokio::sync::OwnedSemaphorePermit,
}

impl OpenConnection {
    pub(super) fn new(
        metrics: std::sync::Arc<crate::metrics::Metrics>,
        permit: tokio::sync::OwnedSemaphorePermit,
    ) -> Self {
        metrics.connection_opened();
        Self {
            metrics,
            _permit: permit,
        }
    }
}

impl Drop for OpenConnection {
    fn drop(&mut self) {
        self.metrics.connection_closed();
    }
}

/// The next connection on `listener` with its permit of `permits` (waited for first: at the limit,
/// new connections wait in the listen backlog), its socket tuned ([`tune_connection`]); `None`
/// once `shutdown` resolves. An accept that fails (out of descriptors, say) is tried again
/// soon; the connections under way go on.
pub(super) async fn next_connection<F: Future<Output = ()>>(
    listener: &TcpListener,
    permits: &std::sync::Arc<tokio::sync::Semaphore>,
    mut shutdown: std::pin::Pin<&mut F>,
) -> Option<(tokio::net::TcpStream, tokio::sync::OwnedSemaphorePermit)> {
    let permit = tokio::select! {
        permit = permits.clone().acquire_owned() => permit.ok()?,
        () = &mut shutdown => return None,
    };
    loop {
        tokio::select! {
            accepted = listener.accept() => match accepted {
                Ok((mut tcp, _)) => {
                    tune_connection(&mut tcp);
                    return Some((tcp, permit));
                }
                Err(e) => {
                    tracing::warn!(error = %e, "accepting a connection failed");
                    tokio::time::sleep(Duration::from_millis(100)).await;
                }
            },
            () = &mut shutdown => return None,
        }
    }
}

/// An accepted connection, on the runtime that accepted it or handed over to a worker's.
pub(super) enum Accepted {
    Here(tokio::net::TcpStream),
    HandedOver(std::net::TcpStream),
}

/// A request's body as the handlers take it. A request without one (a GET, as nearly all are)
/// gets the empty body, which takes no allocation; hyper's would be boxed.
pub(super) fn body_of(incoming: hyper::body::Incoming) -> axum::body::Body {
    match http_body::Body::is_end_stream(&incoming) {
        true => axum::body::Body::empty(),
        false => axum::body::Body::new(incoming),
    }
}

/// How long after the shutdown signal, or after it was asked to finish for having had no
/// request under way for the header read timeout, a connection with still none under way is
/// dropped, even if it holds part of a request's head (at most the header read timeout).
pub(super) const SHUTDOWN_HEAD_GRACE: Duration = Duration::from_secs(1);

/// How long a client may take to send a request's head, and a keep-alive connection may stay
/// idle between requests.
pub const HEADER_READ_TIMEOUT: Duration = Duration::from_secs(30);

/// How connections are served: hyper's settings, and the timeouts of the connection's loop.
pub(super) struct ConnectionSettings {
    builder: hyper_util::server::conn::auto::Builder<hyper_util::rt::TokioExecutor>,
    /// How long a client may take to send a request's head, or leave a connection idle.
    header_read: Duration,
    /// `limits.send_timeout_s` ([`send_timeout`]).
    stalled: Duration,
}

impl ConnectionSettings {
    pub(super) fn new(limits: &crate::config::LimitsConfig, header_read: Duration) -> Self {
        use hyper_util::rt::{TokioExecutor, TokioTimer};
        use hyper_util::server::conn::auto::Builder;
        let header_list = limits.max_url_bytes.saturating_add(16 << 10);
        let mut builder = Builder::new(TokioExecutor::new());
        // A client has `header_read` to send a request's head, and an idle keep-alive
        // connection is closed after as long: half-sent requests (slowloris) and idle
        // connections do not hold descriptors, nor the shutdown, for ever. The connection's own
        // loop ([`serve_connection`]) sees to both, from a time it keeps in an atomic and a
        // timer that wakes once a period: hyper's header read timeout makes, registers and
        // drops a timer for every request.
        builder.http1().header_read_timeout(None);
        // hyper notices a client hanging up mid-request by reading the socket after every
        // request head, which made the connection allocate a second read buffer for every
        // request. The connection's loop watches for it instead, and only while a request waits
        // for its answer ([`HangUpWatch`]).
        #[cfg(unix)]
        builder.http1().half_close(true);
        // A request head is at most a URL of `limits.max_url_bytes` and 16 KiB of fields, as
        // over HTTP/2 below: a longer one is a 431 from hyper. Its default buffer, ~400 KiB,
        // let each connection hold that much of a head that never ends.
        builder.http1().max_buf_size(header_list.max(8192));
        // HTTP/2 refuses a request whose headers exceed the list size with a bare 431 (16 KiB
        // by default, less than `limits.max_url_bytes` may allow): a URL over that limit by up
        // to 16 KiB gets the JSON 414 that HTTP/1 gives.
        builder
            .http2()
            .timer(TokioTimer::new())
            .keep_alive_interval(header_read)
            .keep_alive_timeout(header_read)
            .max_header_list_size(u32::try_from(header_list).unwrap_or(u32::MAX));
        Self {
            builder,
            header_read,
            stalled: send_timeout(limits),
        }
    }
}

/// Serves `app` on one connection (`io`, whose client has sent its first bytes) until it
/// ends: its client closes it or hangs up while a request waits (`hang_up`, for a socket), it has been
/// idle for the header read timeout, a response body has waited for its client for
/// `limits.send_timeout_s`, or `stopping` changes (shutdown: requests under way finish first).
pub(super) async fn serve_connection<IO>(
    io: IO,
    mut hang_up: Option<HangUpWatch>,
    app: super::App,
    settings: &ConnectionSettings,
    mut stopping: tokio::sync::watch::Receiver<()>,
) where
    IO: tokio::io::AsyncRead + tokio::io::AsyncWrite + Unpin + Send + 'static,
{
    let (header_read, stalled) = (settings.header_read, settings.stalled);
    let activity = std::sync::Arc::new(ConnectionActivity::new());
    let service = {
        let activity = activity.clone();
        hyper::service::service_fn(move |mut request: hyper::Request<hyper::body::Incoming>| {
            let in_flight = ConnectionActivity::begin(&activity);
            super::front::mark_host(&mut request);
            let served = app.clone().serve(request.map(body_of), Some(in_flight));
            // Not `async move { Ok(served.await) }`: that future holds `served` twice over (as
            // captured, and as awaited), and hyper moves it whole for every request.
            futures::FutureExt::map(served, Ok::<_, std::convert::Infallible>)
        })
    };
    let connection = settings
        .builder
        .serve_connection_with_upgrades(hyper_util::rt::TokioIo::new(io), service)
        .into_owned();
    let mut connection = std::pin::pin!(connection);
    // Asked to finish (it takes no new request, ends those under way, then closes)
    // on shutdown, or when it has had no request under way for `header_read`: hyper
    // closes an idle HTTP/1 connection itself, but keeps an idle HTTP/2 one as long as
    // its client answers pings, and an HTTP/1 one holding part of a request's head
    // until the head is whole. Such a connection, with still no request under way a
    // moment later, is dropped (`cut_off`).
    let mut finishing = false;
    // While requests are under way, bodies are checked for stalling this often (a
    // quarter of the timeout past it, at most).
    let check = header_read.min((stalled / 4).max(Duration::from_millis(10)));
    let mut idle = std::pin::pin!(tokio::time::sleep(check));
    // A connection with no request under way `grace` after it was asked to finish (for
    // idleness or on shutdown) is dropped: one holding half a request head (a slow or
    // stalled client) would otherwise stay open, and keep the exit, until the head is
    // whole.
    let (mut stopped, mut cutting) = (false, false);
    let grace = header_read.min(SHUTDOWN_HEAD_GRACE);
    let mut cut_off = std::pin::pin!(tokio::time::sleep(Duration::ZERO));
    loop {
        tokio::select! {
            // The connection first: the branches after it see what its poll left.
            biased;
            ended = connection.as_mut() => {
                if let Err(e) = ended {
                    tracing::debug!(error = %e, "connection ended");
                }
                break;
            }
            // Its client gone, the requests waiting for their answers are dropped (and
            // with them their permits), as hyper's own check did.
            () = std::future::poll_fn(|cx| match &mut hang_up {
                Some(hang_up) => hang_up.poll(cx, activity.waiting()),
                None => std::task::Poll::Pending,
            }) => {
                tracing::debug!("client hung up with a request waiting for its answer");
                break;
            }
            () = idle.as_mut() => {
                // A client that has left a body unread for `stalled` loses the
                // connection, and its bodies what they hold (their permits among it),
                // also while it finishes: over HTTP/2 a stream whose window stays
                // closed stalls no socket, and nothing else would end it.
                if activity.stalled(stalled) {
                    tracing::info!(
                        seconds = stalled.as_secs_f64(),
                        "closing a connection whose client left a response unread for limits.send_timeout_s"
                    );
                    break;
                }
                match activity.busy_until(header_read, check) {
                    Some(until) => idle.as_mut().reset(until),
                    None if !finishing => {
                        finishing = true;
                        connection.as_mut().graceful_shutdown();
                        cutting = true;
                        cut_off.as_mut().reset(tokio::time::Instant::now() + grace);
                    }
                    None => idle.as_mut().reset(tokio::time::Instant::now() + check),
                }
            }
            _ = stopping.changed(), if !stopped => {
                stopped = true;
                if !finishing {
                    finishing = true;
                    connection.as_mut().graceful_shutdown();
                }
                cutting = true;
                cut_off.as_mut().reset(tokio::time::Instant::now() + grace);
            }
            () = cut_off.as_mut(), if cutting => {
                if activity.nothing_under_way() {
                    break;
                }
                // A request under way: the connection ends with its response (hyper
                // takes no other), within the drain.
                cutting = false;
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use http_body_util::BodyExt;

    /// A connection served over an in-memory stream, with a client on its other end.
    struct Served {
        client: hyper::client::conn::http1::SendRequest<http_body_util::Empty<bytes::Bytes>>,
        server: tokio::task::JoinHandle<()>,
        stop: tokio::sync::watch::Sender<()>,
    }

    async fn serve(header_read: Duration) -> Served {
        let state = crate::state::AppState::from_config(crate::config::Config::default()).unwrap();
        let settings = ConnectionSettings::new(&state.config.limits, header_read);
        let (server_end, client_end) = tokio::io::duplex(64 << 10);
        let (stop, stopping) = tokio::sync::watch::channel(());
        let app = super::super::app(state);
        let server = tokio::spawn(async move { serve_connection(server_end, None, app, &settings, stopping).await });
        let (client, connection) = hyper::client::conn::http1::handshake(hyper_util::rt::TokioIo::new(client_end))
            .await
            .unwrap();
        tokio::spawn(connection);
        Served { client, server, stop }
    }

    async fn get(
        client: &mut hyper::client::conn::http1::SendRequest<http_body_util::Empty<bytes::Bytes>>,
        path: &str,
    ) -> (u16, bytes::Bytes) {
        let request = hyper::Request::get(path)
            .header("host", "test")
            .body(http_body_util::Empty::new())
            .unwrap();
        let response = client.send_request(request).await.unwrap();
        let status = response.status().as_u16();
        (status, response.into_body().collect().await.unwrap().to_bytes())
    }

    #[tokio::test]
    async fn serves_requests_one_after_another_and_closes_when_idle() {
        let mut served = serve(Duration::from_millis(300)).await;
        let (status, body) = get(&mut served.client, "/healthz").await;
        assert_eq!((status, &body[..]), (200, &br#"{"status":"ok"}"#[..]));
        let (status, body) = get(&mut served.client, "/nothing").await;
        assert_eq!(status, 404);
        assert!(String::from_utf8_lossy(&body).contains("not_found"));
        // Idle for the header read timeout: asked to finish, and closed.
        let ended = tokio::time::timeout(Duration::from_secs(5), served.server).await;
        assert!(ended.is_ok(), "the idle connection was not closed");
    }

    #[tokio::test]
    async fn stops_on_shutdown() {
        let mut served = serve(Duration::from_secs(30)).await;
        assert_eq!(get(&mut served.client, "/healthz").await.0, 200);
        served.stop.send(()).unwrap();
        let ended = tokio::time::timeout(Duration::from_secs(5), served.server).await;
        assert!(ended.is_ok(), "the connection did not end on shutdown");
    }

    #[tokio::test]
    async fn a_request_without_host_is_refused() {
        let mut served = serve(Duration::from_secs(30)).await;
        let request = hyper::Request::get("/healthz")
            .body(http_body_util::Empty::new())
            .unwrap();
        let response = served.client.send_request(request).await.unwrap();
        assert_eq!(response.status(), 400);
        drop(served.stop);
    }
}
