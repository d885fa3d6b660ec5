//! The server over a real socket on 127.0.0.1:0 with a real HTTP client: what hyper does to
//! our responses (HEAD lengths, streaming, shutdown) is only visible here.

use crate::common::*;
use tokio::sync::oneshot;

/// zarrgate serving `config` on a free port of 127.0.0.1 until [`Served::stop`].
struct Served {
    addr: std::net::SocketAddr,
    base: String,
    stop: oneshot::Sender<()>,
    server: tokio::task::JoinHandle<std::io::Result<()>>,
}

async fn serve(config: zarrgate::config::Config) -> Served {
    serve_state(zarrgate::AppState::from_config(config).unwrap()).await
}

/// zarrgate serving `state` as [`serve`] does.
async fn serve_state(state: zarrgate::AppState) -> Served {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let (stop, stopped) = oneshot::channel::<()>();
    let server = tokio::spawn(zarrgate::run(listener, zarrgate::app(state), async {
        let _ = stopped.await;
    }));
    Served {
        addr,
        base: format!("http://{addr}"),
        stop,
        server,
    }
}

impl Served {
    /// Sends the shutdown signal and waits (up to 10 s) for the server to stop.
    async fn stop(self) -> std::io::Result<()> {
        self.stop.send(()).unwrap();
        tokio::time::timeout(std::time::Duration::from_secs(10), self.server)
            .await
            .expect("server stops after the shutdown signal")
            .unwrap()
    }
}

#[tokio::test]
async fn serves_over_tcp_and_shuts_down_gracefully() {
    let served = serve(config_with(&[("fx", &fixtures())])).await;
    let base = served.base.clone();
    let client = reqwest::Client::new();
    let file = std::fs::read(fixtures().join("v3/sharding_start_i4/c/0/0")).unwrap();
    let url = format!("{base}/zarr/fx/v3/sharding_start_i4/c/0/0");

    let r = client.get(&url).send().await.unwrap();
    assert_eq!(r.status(), 200);
    assert_eq!(r.headers()["content-length"], file.len().to_string().as_str());
    assert_eq!(&r.bytes().await.unwrap()[..], &file[..]);

    let r = client.head(&url).send().await.unwrap();
    assert_eq!(r.status(), 200);
    assert_eq!(
        r.headers()["content-length"],
        file.len().to_string().as_str(),
        "HEAD keeps the real length"
    );

    let r = client.get(&url).header("range", "bytes=-16").send().await.unwrap();
    assert_eq!(r.status(), 206);
    let n = file.len();
    assert_eq!(
        r.headers()["content-range"],
        format!("bytes {}-{}/{n}", n - 16, n - 1).as_str()
    );
    assert_eq!(&r.bytes().await.unwrap()[..], &file[n - 16..]);

    let r = client
        .get(format!("{base}/zarr/fx/v3/nothing/zarr.json"))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 404);
    let v: serde_json::Value = r.json().await.unwrap();
    assert_eq!(v["error"]["code"], "not_found");

    served.stop().await.unwrap();
    assert!(client.get(&url).send().await.is_err(), "nothing listens after shutdown");
}

/// After the shutdown signal, responses under way may finish for a while; then the server
/// stops anyway: a request stuck on a store that does not answer does not keep it up.
#[tokio::test]
async fn shutdown_stops_waiting_for_stuck_requests() {
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(dir.path().join(".zgroup"), br#"{"zarr_format": 2}"#).unwrap();
    let (_, state, _) = slow_listing_app(dir.path(), config_with(&[]), std::time::Duration::from_secs(3600));
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let base = format!("http://{}", listener.local_addr().unwrap());
    let (stop, stopped) = oneshot::channel::<()>();
    let drain = std::time::Duration::from_millis(300);
    let server = tokio::spawn(zarrgate::server::run_draining(
        listener,
        zarrgate::app(state),
        async {
            let _ = stopped.await;
        },
        drain,
    ));
    let client = reqwest::Client::new();
    assert_eq!(
        client.get(format!("{base}/healthz")).send().await.unwrap().status(),
        200
    );
    // Listing the mount waits an hour on the store.
    let stuck = tokio::spawn(client.get(format!("{base}/api/v1/list/m")).send());
    tokio::time::sleep(std::time::Duration::from_millis(200)).await;
    assert!(!stuck.is_finished());
    let start = std::time::Instant::now();
    stop.send(()).unwrap();
    stopped_within(server, 10, "the server stops after the drain time").await;
    let took = start.elapsed();
    assert!(took >= drain, "{took:?}: responses under way get the drain time");
    assert!(
        client.get(format!("{base}/healthz")).send().await.is_err(),
        "nothing listens"
    );
}

/// Connections the server accepts are closed by the kernel once stalled (TCP_USER_TIMEOUT):
/// read back from the server's own socket, found among this process's descriptors.
#[cfg(target_os = "linux")]
#[tokio::test]
async fn accepted_connections_time_out_when_stalled() {
    use std::os::fd::BorrowedFd;
    let served = serve(config_with(&[("fx", &fixtures())])).await;
    let addr = served.addr;
    let client = reqwest::Client::new();
    let r = client.get(format!("http://{addr}/healthz")).send().await.unwrap();
    assert_eq!(r.status(), 200);
    let mut accepted = Vec::new();
    for entry in std::fs::read_dir("/proc/self/fd").unwrap().flatten() {
        let Ok(fd) = entry.file_name().to_string_lossy().parse::<i32>() else {
            continue;
        };
        // SAFETY: the descriptor is open (listed) and only borrowed for two getsockopt calls;
        // one that is not a socket makes them fail, which is skipped.
        let fd = unsafe { BorrowedFd::borrow_raw(fd) };
        let socket = socket2::SockRef::from(&fd);
        let (Ok(local), Ok(_peer)) = (socket.local_addr(), socket.peer_addr()) else {
            continue;
        };
        if local.as_socket() == Some(addr) {
            accepted.push(socket.tcp_user_timeout().unwrap());
        }
    }
    assert!(!accepted.is_empty(), "the server's side of the connection was found");
    assert!(
        accepted.iter().all(|t| *t == Some(zarrgate::server::STALLED)),
        "{accepted:?}"
    );
    served.stop().await.unwrap();
}

/// Waits up to `seconds` for the server's task to end, and for it to have ended well.
async fn stopped_within(server: tokio::task::JoinHandle<std::io::Result<()>>, seconds: u64, what: &str) {
    tokio::time::timeout(std::time::Duration::from_secs(seconds), server)
        .await
        .expect(what)
        .unwrap()
        .unwrap();
}

/// `dir` served as mount `m` on a free port with a header read timeout of `header_read` and a drain
/// time of 20 s, until the sender is used: its address, the sender and the server's task.
async fn serve_timed(
    header_read: std::time::Duration,
    dir: &std::path::Path,
) -> (
    std::net::SocketAddr,
    oneshot::Sender<()>,
    tokio::task::JoinHandle<std::io::Result<()>>,
) {
    let (_, state, _) = counting_app(dir, config_with(&[]));
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let (stop, stopped) = oneshot::channel::<()>();
    let server = tokio::spawn(zarrgate::server::serve_with(
        listener,
        zarrgate::app(state),
        async {
            let _ = stopped.await;
        },
        std::time::Duration::from_secs(20),
        header_read,
    ));
    (addr, stop, server)
}

/// A client that sends half a request head (slowloris), one that sends nothing, and an idle
/// keep-alive connection are closed after the header read timeout; and such a connection does
/// not hold the shutdown for its drain time.
#[tokio::test]
async fn half_sent_requests_and_idle_connections_are_closed() {
    use tokio::io::AsyncWriteExt;
    let header_read = std::time::Duration::from_millis(500);
    let (addr, stop, server) = serve_timed(header_read, &fixtures()).await;
    let connect = || tokio::net::TcpStream::connect(addr);
    let mut half = connect().await.unwrap();
    half.write_all(b"GET /healthz HTTP/1.1\r\nHost: x\r\n").await.unwrap();
    let mut silent = connect().await.unwrap();
    let mut idle = connect().await.unwrap();
    healthz_over(&mut idle).await;
    // Each is closed by the server (end of stream, or a 408 first) within a few timeouts.
    for (name, conn) in [("half", &mut half), ("silent", &mut silent), ("idle", &mut idle)] {
        assert!(closed_within(conn, 5).await, "{name}: still open");
    }
    // A client that keeps sending a head, a byte at a time, never finishing it, is closed too.
    use tokio::io::AsyncReadExt;
    let mut trickle = connect().await.unwrap();
    trickle
        .write_all(b"GET /healthz HTTP/1.1\r\nHost: x\r\nX-Slow: ")
        .await
        .unwrap();
    let start = std::time::Instant::now();
    let mut buf = [0u8; 256];
    let closed = loop {
        if start.elapsed() > std::time::Duration::from_secs(5) {
            break false;
        }
        match tokio::time::timeout(std::time::Duration::from_millis(100), trickle.read(&mut buf)).await {
            // Closed, or an answer (a 408) before closing.
            Ok(_) => break true,
            Err(_) => {
                let _ = trickle.write_all(b"x").await;
            }
        }
    };
    assert!(closed, "trickle: still open");
    assert!(
        start.elapsed() >= header_read,
        "trickle: closed after {:?}",
        start.elapsed()
    );
    // A half-sent request does not keep the server up for the drain time.
    let mut another = connect().await.unwrap();
    another.write_all(b"GET /healthz HTTP/1.1\r\n").await.unwrap();
    stops_soon(stop, server).await;
}

/// On shutdown, a connection holding half a request head is dropped after a moment, not kept
/// until the header read timeout (here 20 s, as long as the drain).
#[tokio::test]
async fn shutdown_drops_half_sent_heads_at_once() {
    use tokio::io::AsyncWriteExt;
    let (addr, stop, server) = serve_timed(std::time::Duration::from_secs(20), &fixtures()).await;
    let mut half = tokio::net::TcpStream::connect(addr).await.unwrap();
    half.write_all(b"GET /healthz HTTP/1.1\r\nHost: x\r\n").await.unwrap();
    // A whole request answered: the server is serving connections when the signal comes.
    healthz_over(&mut tokio::net::TcpStream::connect(addr).await.unwrap()).await;
    stops_soon(stop, server).await;
    assert!(closed_within(&mut half, 5).await, "the half-sent connection is closed");
}

/// Sends the shutdown signal to a server of [`serve_timed`] and checks it stops within 5 s,
/// well within its drain time.
async fn stops_soon(stop: oneshot::Sender<()>, server: tokio::task::JoinHandle<std::io::Result<()>>) {
    let start = std::time::Instant::now();
    stop.send(()).unwrap();
    stopped_within(server, 10, "stops well within the drain time").await;
    assert!(
        start.elapsed() < std::time::Duration::from_secs(5),
        "{:?}",
        start.elapsed()
    );
}

/// Sends `GET /healthz` over `conn` and checks the answer is a 200.
async fn healthz_over(conn: &mut tokio::net::TcpStream) {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    conn.write_all(b"GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n")
        .await
        .unwrap();
    let mut buf = vec![0u8; 4096];
    let n = conn.read(&mut buf).await.unwrap();
    assert!(
        buf[..n].starts_with(b"HTTP/1.1 200"),
        "{:?}",
        String::from_utf8_lossy(&buf[..n])
    );
}

/// Whether the server closes `conn` (end of stream or an error, after whatever it sends)
/// within `seconds`.
async fn closed_within(conn: &mut tokio::net::TcpStream, seconds: u64) -> bool {
    use tokio::io::AsyncReadExt;
    let mut buf = vec![0u8; 4096];
    tokio::time::timeout(std::time::Duration::from_secs(seconds), async {
        while let Ok(n) = conn.read(&mut buf).await {
            if n == 0 {
                break;
            }
        }
    })
    .await
    .is_ok()
}

/// Bodies hyper sends to their stated length (and then drops without a last poll: a streamed
/// npy slice, a ranged raw key) are complete, not aborted, and nothing stays in flight.
#[tokio::test]
async fn bodies_sent_whole_are_not_counted_aborted() {
    let served = serve(config_with(&[("fx", &fixtures())])).await;
    let base = served.base.clone();
    let client = reqwest::Client::new();
    for (url, range) in [
        ("/api/v1/slice/fx/v2/compressor_none_i4?format=npy", None),
        ("/api/v1/slice/fx/v3/sharding_start_i4?format=bin", None),
        ("/zarr/fx/v3/sharding_start_i4/c/0/0", Some("bytes=2-9")),
        ("/zarr/fx/v3/sharding_start_i4/c/0/0", None),
    ] {
        let mut request = client.get(format!("{base}{url}"));
        if let Some(r) = range {
            request = request.header("range", r);
        }
        let r = request.send().await.unwrap();
        assert!(r.status().is_success(), "{url}");
        let length: usize = r.headers()["content-length"].to_str().unwrap().parse().unwrap();
        assert_eq!(r.bytes().await.unwrap().len(), length, "{url}");
    }
    // The server drops each body after its last bytes: wait until nothing but /metrics is in flight.
    let mut text = String::new();
    for _ in 0..50 {
        text = metrics_text(&client, &base).await;
        if text.contains("zarrgate_requests_in_flight 1\n") {
            break;
        }
        tokio::time::sleep(std::time::Duration::from_millis(20)).await;
    }
    assert!(text.contains("zarrgate_requests_in_flight 1\n"), "{text}");
    let aborted: Vec<&str> = text
        .lines()
        .filter(|l| l.starts_with("zarrgate_responses_aborted_total{"))
        .collect();
    assert!(aborted.iter().any(|l| l.contains("route=\"slice\"")), "{text}");
    assert!(aborted.iter().all(|l| l.ends_with(" 0")), "{aborted:?}");
    served.stop().await.unwrap();
}

/// At `limits.max_connections` open connections, the next one is not served until one closes;
/// /metrics counts the connections open.
#[tokio::test]
async fn connections_beyond_the_limit_wait_for_one_to_close() {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let mut config = config_with(&[("fx", &fixtures())]);
    config.limits.max_connections = 1;
    let served = serve(config).await;
    let addr = served.addr;
    // One connection, kept open after its response.
    let mut first = tokio::net::TcpStream::connect(addr).await.unwrap();
    first
        .write_all(b"GET /metrics HTTP/1.1\r\nhost: x\r\naccept: application/openmetrics-text\r\n\r\n")
        .await
        .unwrap();
    let mut seen = Vec::new();
    let mut buf = [0u8; 4096];
    while !String::from_utf8_lossy(&seen).contains("# EOF") {
        let n = first.read(&mut buf).await.unwrap();
        assert!(n > 0, "the server closed the first connection");
        seen.extend_from_slice(&buf[..n]);
    }
    assert!(String::from_utf8_lossy(&seen).contains("zarrgate_connections_open 1\n"));
    let second = tokio::spawn(reqwest::get(format!("http://{addr}/healthz")));
    tokio::time::sleep(std::time::Duration::from_millis(300)).await;
    assert!(!second.is_finished(), "the second connection waits");
    drop(first);
    let r = tokio::time::timeout(std::time::Duration::from_secs(10), second)
        .await
        .expect("served once the first closed")
        .unwrap()
        .unwrap();
    assert_eq!(r.status(), 200);
    served.stop().await.unwrap();
}

/// `server.health_bind`: a listener of its own answers `/healthz` and `/metrics` while every
/// one of `limits.max_connections` is taken on `bind` (where the next connection waits), and
/// 404 to anything else; it stops accepting on shutdown.
#[tokio::test]
async fn the_health_listener_answers_while_every_connection_is_taken() {
    let mut config = config_with(&[("fx", &fixtures()), ("secret", &fixtures())]);
    config.limits.max_connections = 1;
    config.mounts.get_mut("secret").unwrap().tokens = vec!["env:PATH".into()];
    let state = zarrgate::AppState::from_config(config).unwrap();
    let health = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let health_base = format!("http://{}", health.local_addr().unwrap());
    let (stop_health, health_stopped) = oneshot::channel::<()>();
    let health_server = tokio::spawn(zarrgate::server::serve_health(
        health,
        zarrgate::server::health_app(state.clone()),
        async {
            let _ = health_stopped.await;
        },
    ));
    let served = serve_state(state).await;
    // The one permit on `bind`, kept open: the next connection there waits.
    let mut first = tokio::net::TcpStream::connect(served.addr).await.unwrap();
    healthz_over(&mut first).await;
    let waiting = tokio::spawn(reqwest::get(format!("{}/healthz", served.base)));
    tokio::time::sleep(std::time::Duration::from_millis(300)).await;
    assert!(!waiting.is_finished(), "the next connection on bind waits");
    let client = reqwest::Client::new();
    let ask = |path: &str| {
        let request = client.get(format!("{health_base}{path}")).send();
        async move {
            tokio::time::timeout(std::time::Duration::from_secs(10), request)
                .await
                .expect("the health listener answers at once")
                .unwrap()
        }
    };
    let r = ask("/healthz").await;
    assert_eq!(r.status(), 200);
    assert_eq!(r.headers()["cache-control"], "no-cache");
    let r = ask("/metrics").await;
    assert_eq!(r.status(), 200);
    let text = r.text().await.unwrap();
    assert!(text.contains("zarrgate_connections_open 1\n"), "{text}");
    // Every other path is 404, a protected mount's too (its 401 would name it).
    for path in ["/api/v1/mounts", "/zarr/secret/x/.zarray", "/"] {
        let r = ask(path).await;
        assert_eq!(r.status(), 404, "{path}");
        assert_eq!(
            r.json::<serde_json::Value>().await.unwrap()["error"]["code"],
            "not_found"
        );
    }
    // HTTP/1.1 without Host is a 400 there too.
    {
        use tokio::io::{AsyncReadExt, AsyncWriteExt};
        let addr = health_base.trim_start_matches("http://");
        let mut conn = tokio::net::TcpStream::connect(addr).await.unwrap();
        conn.write_all(b"GET /healthz HTTP/1.1\r\nConnection: close\r\n\r\n")
            .await
            .unwrap();
        let mut answer = Vec::new();
        conn.read_to_end(&mut answer).await.unwrap();
        assert!(
            answer.starts_with(b"HTTP/1.1 400"),
            "{}",
            String::from_utf8_lossy(&answer)
        );
    }
    drop(first);
    let r = tokio::time::timeout(std::time::Duration::from_secs(10), waiting)
        .await
        .expect("served once the first closed")
        .unwrap()
        .unwrap();
    assert_eq!(r.status(), 200);
    stop_health.send(()).unwrap();
    tokio::time::timeout(std::time::Duration::from_secs(10), health_server)
        .await
        .expect("the health listener stops")
        .unwrap()
        .unwrap();
    served.stop().await.unwrap();
}

/// An HTTP/2 connection (prior knowledge, as h2c clients open it) is closed once it has had no
/// request under way for the header read timeout, as an idle HTTP/1 keep-alive connection is:
/// hyper keeps one as long as its client answers pings, and a few idle clients held every permit
/// of `limits.max_connections`. One with requests coming stays open.
#[tokio::test]
async fn idle_http2_connections_are_closed() {
    let header_read = std::time::Duration::from_millis(500);
    let (addr, stop, server) = serve_timed(header_read, &fixtures()).await;
    let tcp = tokio::net::TcpStream::connect(addr).await.unwrap();
    let (mut send, connection) =
        hyper::client::conn::http2::handshake(hyper_util::rt::TokioExecutor::new(), hyper_util::rt::TokioIo::new(tcp))
            .await
            .unwrap();
    let mut connection = tokio::spawn(connection);
    let start = std::time::Instant::now();
    // A request with no body.
    let empty = |method: axum::http::Method, url: String| {
        axum::http::Request::builder()
            .method(method)
            .uri(url)
            .body(http_body_util::Empty::<bytes::Bytes>::new())
            .unwrap()
    };
    while start.elapsed() < header_read * 3 {
        let request = empty(axum::http::Method::GET, format!("http://{addr}/healthz"));
        let response = send.send_request(request).await.expect("still open while used");
        assert_eq!(response.status(), 200);
        tokio::time::sleep(header_read / 5).await;
    }
    // A URL over `limits.max_url_bytes` (8 KiB) but over HTTP/2's default header list size
    // (16 KiB) too gets the JSON 414, not hyper's bare 431.
    let long = format!("http://{addr}/zarr/m/{}", "x".repeat(20 << 10));
    let response = send
        .send_request(empty(axum::http::Method::GET, long.clone()))
        .await
        .unwrap();
    assert_eq!(response.status(), 414);
    use http_body_util::BodyExt;
    let body = response.into_body().collect().await.unwrap().to_bytes();
    let error: serde_json::Value = serde_json::from_slice(&body).unwrap();
    assert_eq!(error["error"]["code"], "uri_too_long");
    // Its HEAD: no body (hyper sent it over HTTP/2, and clients refused the stream).
    let response = send.send_request(empty(axum::http::Method::HEAD, long)).await.unwrap();
    assert_eq!(response.status(), 414);
    let body = response.into_body().collect().await.expect("a body the stream allows");
    assert!(body.to_bytes().is_empty());
    let closed = tokio::time::timeout(std::time::Duration::from_secs(5), &mut connection).await;
    assert!(closed.is_ok(), "an idle HTTP/2 connection is still open");
    stop.send(()).unwrap();
    stopped_within(server, 5, "stops at once").await;
}

/// A connection sending a long response body is not idle, however long its client takes to
/// read it: a request pipelined behind it is answered (asked to finish mid-body, the
/// connection closed after the body and left it unanswered).
#[tokio::test]
async fn a_body_being_sent_keeps_its_connection() {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let dir = tempfile::tempdir().unwrap();
    let size = 32 << 20;
    std::fs::write(dir.path().join("big"), vec![7u8; size]).unwrap();
    let header_read = std::time::Duration::from_millis(300);
    let (addr, stop, server) = serve_timed(header_read, dir.path()).await;
    let mut conn = tokio::net::TcpStream::connect(addr).await.unwrap();
    conn.write_all(b"GET /zarr/m/big HTTP/1.1\r\nHost: x\r\n\r\nGET /healthz HTTP/1.1\r\nHost: x\r\n\r\n")
        .await
        .unwrap();
    // Read slowly: the body takes several times the timeout to arrive.
    let mut got = Vec::new();
    let mut buf = vec![0u8; 64 << 10];
    let start = std::time::Instant::now();
    let second = loop {
        let n = tokio::time::timeout(std::time::Duration::from_secs(5), conn.read(&mut buf))
            .await
            .expect("the connection answers")
            .unwrap();
        assert!(n > 0, "closed after {} bytes", got.len());
        got.extend_from_slice(&buf[..n]);
        if got.len() > size
            && let Some(at) = got[size..].windows(12).position(|w| w == b"HTTP/1.1 200")
        {
            break size + at;
        }
        tokio::time::sleep(std::time::Duration::from_millis(5)).await;
    };
    assert!(
        start.elapsed() > header_read * 3,
        "{:?}: not slow enough to test",
        start.elapsed()
    );
    assert!(got.starts_with(b"HTTP/1.1 200"));
    assert!(second > size, "the pipelined /healthz is answered after the body");
    stop.send(()).unwrap();
    stopped_within(server, 5, "stops at once").await;
}

/// A request still waiting for its answer when its client hangs up is dropped: its permit of
/// `limits.max_concurrent_requests` is released (the next request is served, not refused
/// with 503) and it is counted aborted, rather than held until the store answers (here an
/// hour). The same on a keep-alive connection whose first request was answered at once.
#[tokio::test]
async fn a_request_whose_client_hangs_up_is_dropped() {
    use tokio::io::AsyncWriteExt;
    let mut config = config_with(&[]);
    config.limits.max_concurrent_requests = 1;
    let dir = tempfile::tempdir().unwrap();
    let served = serve_slow_listing(dir.path(), config, std::time::Duration::from_secs(3600)).await;
    let (addr, base) = (served.addr, served.base.clone());
    let client = reqwest::Client::new();
    let mounts = || client.get(format!("{base}/api/v1/mounts")).send();
    let aborted = || async {
        let text = metrics_text(&client, &base).await;
        let line = text
            .lines()
            .find(|l| l.starts_with("zarrgate_responses_aborted_total{route=\"zom\"}"))
            .map(str::to_owned);
        line.and_then(|l| l.rsplit(' ').next()?.parse::<u64>().ok())
    };
    assert_eq!(aborted().await, Some(0));
    for (round, answered_first) in [(1u64, false), (2, true)] {
        // The listing waits on the store, holding the one permit: another request is refused.
        // It is sent again if it was refused itself: the workers may serve a request for the
        // mounts at the same moment.
        let start = std::time::Instant::now();
        let conn = 'holding: loop {
            let mut conn = tokio::net::TcpStream::connect(addr).await.unwrap();
            if answered_first {
                // A keep-alive connection that has already had a request answered.
                healthz_over(&mut conn).await;
            }
            conn.write_all(b"GET /api/v1/list/m HTTP/1.1\r\nHost: x\r\n\r\n")
                .await
                .unwrap();
            loop {
                assert!(
                    start.elapsed() < std::time::Duration::from_secs(5),
                    "round {round}: the listing never took the permit"
                );
                let status = mounts().await.unwrap().status();
                if status == 503 {
                    break 'holding conn;
                }
                assert_eq!(status, 200);
                // An answer to the listing: it was refused.
                if conn.try_read(&mut [0u8; 64]).is_ok() {
                    continue 'holding;
                }
                tokio::time::sleep(std::time::Duration::from_millis(20)).await;
            }
        };
        drop(conn);
        // Hung up: the listing is dropped and its permit released.
        let start = std::time::Instant::now();
        while mounts().await.unwrap().status() != 200 {
            assert!(
                start.elapsed() < std::time::Duration::from_secs(5),
                "round {round}: the request of a client that hung up still holds its permit"
            );
            tokio::time::sleep(std::time::Duration::from_millis(20)).await;
        }
        assert_eq!(aborted().await, Some(round), "round {round}");
    }
    served.stop().await.unwrap();
}

/// Bytes that arrive while a request waits for its answer are no hang-up: a request pipelined
/// behind a slow one (here a listing that waits 300 ms on the store) is answered after it, on
/// the same connection.
#[tokio::test]
async fn a_request_pipelined_behind_a_slow_one_is_no_hang_up() {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let delay = std::time::Duration::from_millis(300);
    let dir = tempfile::tempdir().unwrap();
    let served = serve_slow_listing(dir.path(), config_with(&[]), delay).await;
    let mut conn = tokio::net::TcpStream::connect(served.addr).await.unwrap();
    let start = std::time::Instant::now();
    conn.write_all(b"GET /api/v1/list/m HTTP/1.1\r\nHost: x\r\n\r\n")
        .await
        .unwrap();
    tokio::time::sleep(delay / 3).await;
    conn.write_all(b"GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n")
        .await
        .unwrap();
    let mut got = Vec::new();
    let mut buf = vec![0u8; 4096];
    let both = tokio::time::timeout(std::time::Duration::from_secs(5), async {
        while got.windows(12).filter(|w| w == b"HTTP/1.1 200").count() < 2 {
            let n = conn.read(&mut buf).await.unwrap();
            assert!(n > 0, "closed after {:?}", String::from_utf8_lossy(&got));
            got.extend_from_slice(&buf[..n]);
        }
    })
    .await;
    assert!(both.is_ok(), "{:?}", String::from_utf8_lossy(&got));
    assert!(start.elapsed() >= delay);
    let text = String::from_utf8_lossy(&got);
    let listing = text.find(r#""children":[]}"#);
    let health = text.find(r#"{"status":"ok"}"#);
    assert!(
        listing.is_some() && health.is_some() && listing < health,
        "the listing, then the health check: {text}"
    );
    served.stop().await.unwrap();
}

/// zarrgate serving, on a free port of 127.0.0.1, a mount `m` of an empty v2 group in `dir`
/// whose listing waits `list_delay` on the store.
async fn serve_slow_listing(
    dir: &std::path::Path,
    config: zarrgate::config::Config,
    list_delay: std::time::Duration,
) -> Served {
    std::fs::write(dir.join(".zgroup"), br#"{"zarr_format": 2}"#).unwrap();
    let (_, state, _) = slow_listing_app(dir, config, list_delay);
    serve_state(state).await
}

/// The text of `GET {base}/metrics`.
async fn metrics_text(client: &reqwest::Client, base: &str) -> String {
    let response = client.get(format!("{base}/metrics")).send().await.unwrap();
    response.text().await.unwrap()
}

/// A request's body reaches its handler over a real connection (requests without one are given
/// the empty body, which takes no allocation): a schema posted to /api/v1/validate is read,
/// and one that the node does not meet is answered so; an empty body is no JSON Schema.
#[tokio::test]
async fn request_bodies_reach_their_handler() {
    let served = serve(config_with(&[("fx", &fixtures())])).await;
    let url = format!("{}/api/v1/validate/fx/v3/group_nested", served.base);
    let client = reqwest::Client::new();
    let post = |body: &'static str| client.post(&url).body(body).send();
    let r = post(r#"{"type": "object", "required": ["node_type"]}"#).await.unwrap();
    assert_eq!(r.status(), 200);
    assert_eq!(r.json::<serde_json::Value>().await.unwrap()["valid"], true);
    let r = post(r#"{"type": "object", "required": ["no such member"]}"#)
        .await
        .unwrap();
    assert_eq!(r.status(), 200);
    assert_eq!(r.json::<serde_json::Value>().await.unwrap()["valid"], false);
    let r = post("").await.unwrap();
    assert_eq!(r.status(), 400);
    served.stop().await.unwrap();
}

/// Over HTTP/2, frames that arrive while a request waits for its answer are no hang-up either:
/// a quick request sent on the same connection while a slow listing (300 ms) waits is answered
/// first, and the listing after it.
#[tokio::test]
async fn http2_requests_beside_a_slow_one_are_no_hang_up() {
    let delay = std::time::Duration::from_millis(300);
    let dir = tempfile::tempdir().unwrap();
    let served = serve_slow_listing(dir.path(), config_with(&[]), delay).await;
    let addr = served.addr;
    let tcp = tokio::net::TcpStream::connect(addr).await.unwrap();
    let (send, connection) =
        hyper::client::conn::http2::handshake(hyper_util::rt::TokioExecutor::new(), hyper_util::rt::TokioIo::new(tcp))
            .await
            .unwrap();
    tokio::spawn(connection);
    let get = |path: &str| {
        let request = axum::http::Request::get(format!("http://{addr}{path}"))
            .body(http_body_util::Empty::<bytes::Bytes>::new())
            .unwrap();
        let mut send = send.clone();
        async move {
            let response = send.send_request(request).await.unwrap();
            let status = response.status();
            let body = http_body_util::BodyExt::collect(response.into_body()).await.unwrap();
            (status, body.to_bytes(), std::time::Instant::now())
        }
    };
    let start = std::time::Instant::now();
    let listing = tokio::spawn(get("/api/v1/list/m"));
    tokio::time::sleep(delay / 3).await;
    let (status, body, health_at) = get("/healthz").await;
    assert_eq!(
        (status, &body[..]),
        (axum::http::StatusCode::OK, &br#"{"status":"ok"}"#[..])
    );
    let (status, body, listing_at) = tokio::time::timeout(std::time::Duration::from_secs(5), listing)
        .await
        .expect("the listing is answered")
        .unwrap();
    assert_eq!(status, 200);
    let doc: serde_json::Value = serde_json::from_slice(&body).unwrap();
    assert_eq!(doc["children"], serde_json::json!([]));
    assert!(health_at < listing_at && listing_at - start >= delay);
    served.stop().await.unwrap();
}

/// What a client reads of an answer (`method` on `path`) over a connection of its own, HTTP/1 or
/// HTTP/2: status, headers, body.
async fn over(
    addr: std::net::SocketAddr,
    http2: bool,
    method: &str,
    path: &str,
) -> (axum::http::StatusCode, axum::http::HeaderMap, bytes::Bytes) {
    use hyper_util::rt::{TokioExecutor, TokioIo};
    let tcp = TokioIo::new(tokio::net::TcpStream::connect(addr).await.unwrap());
    let request = axum::http::Request::builder()
        .method(method)
        .uri(format!("http://{addr}{path}"))
        .header("host", addr.to_string())
        .body(http_body_util::Empty::<bytes::Bytes>::new())
        .unwrap();
    let response = if http2 {
        let (mut send, connection) = hyper::client::conn::http2::handshake(TokioExecutor::new(), tcp)
            .await
            .unwrap();
        tokio::spawn(connection);
        send.send_request(request).await.unwrap()
    } else {
        let (mut send, connection) = hyper::client::conn::http1::handshake(tcp).await.unwrap();
        tokio::spawn(connection);
        send.send_request(request).await.unwrap()
    };
    let (head, body) = response.into_parts();
    let body = http_body_util::BodyExt::collect(body).await.unwrap().to_bytes();
    (head.status, head.headers, body)
}

/// Answers of exact size state it over HTTP/1 and HTTP/2, though no handler or layer writes
/// `Content-Length` for them (the connection does, from the body's size): a tile, a JSON
/// answer, an error; a HEAD states the GET's. A slice's `Vary` is one line, naming `Accept`
/// and what CORS varies on.
#[tokio::test]
async fn answers_state_their_length_over_http1_and_http2() {
    let served = serve(config_with(&[("fx", &fixtures())])).await;
    let tile = "/api/v1/slice/fx/v2/compressor_zstd_i4?select=1:3,2:5&format=bin";
    for http2 in [false, true] {
        for (path, status) in [
            (tile, 200),
            ("/api/v1/slice/fx/v2/compressor_zstd_i4?select=1:3,2:5&format=npy", 200),
            ("/healthz", 200),
            ("/api/v1/slice/fx/v2/compressor_zstd_i4?select=99", 400),
        ] {
            let (got, headers, body) = over(served.addr, http2, "GET", path).await;
            assert_eq!(got.as_u16(), status, "{path} http2={http2}");
            assert!(!body.is_empty(), "{path}");
            let length = body.len().to_string();
            assert_eq!(
                headers.get_all("content-length").iter().collect::<Vec<_>>(),
                [length.as_str()],
                "{path} http2={http2}"
            );
            let (got, headers, head_body) = over(served.addr, http2, "HEAD", path).await;
            assert_eq!(
                (got.as_u16(), head_body.len()),
                (status, 0),
                "HEAD {path} http2={http2}"
            );
            assert_eq!(headers["content-length"], length.as_str(), "HEAD {path} http2={http2}");
        }
        let (_, headers, body) = over(served.addr, http2, "GET", tile).await;
        assert_eq!(body.len(), 2 * 3 * 4);
        assert_eq!(
            headers.get_all("vary").iter().collect::<Vec<_>>(),
            ["accept, origin, access-control-request-method, access-control-request-headers"],
            "http2={http2}"
        );
    }
    served.stop().await.unwrap();
}

/// With no workers (connections on the caller's runtime), one, or several: connections opened
/// at once, over HTTP/1 and HTTP/2, are each answered, and the server stops on its signal.
#[tokio::test]
async fn connections_are_served_with_any_number_of_workers() {
    let tile = "/api/v1/slice/fx/v2/compressor_zstd_i4?select=1:3,2:5&format=bin";
    // What zarr-python wrote, rows 1..3 and columns 2..5.
    let array = crate::common::expected::load_npy(&repo().join("tests/fixtures/expected/v2/compressor_zstd_i4.npy"));
    let zarrgate::dtype::elements::Elements::Fixed(data) = &array.elements else {
        panic!("fixed-size elements")
    };
    let row = array.shape[1] as usize * 4;
    let want_tile: Vec<u8> = (1..3).flat_map(|r| data[r * row + 8..r * row + 20].to_vec()).collect();
    for workers in [0, 1, 3] {
        let mut config = config_with(&[("fx", &fixtures())]);
        config.server.workers = workers;
        let served = serve(config).await;
        let answers = futures::future::join_all((0..8).map(|i| {
            over(
                served.addr,
                i % 2 == 1,
                "GET",
                if i % 4 < 2 { tile } else { "/healthz" },
            )
        }))
        .await;
        for (i, (status, _, body)) in answers.iter().enumerate() {
            assert_eq!(status.as_u16(), 200, "workers={workers} #{i}");
            let want: &[u8] = if i % 4 < 2 { &want_tile } else { br#"{"status":"ok"}"# };
            assert_eq!(&body[..], want, "workers={workers} #{i}");
        }
        served.stop().await.unwrap();
    }
}

/// RFC 9112 section 3.2: an HTTP/1.1 request with no Host field, or with two, is a 400 (with
/// the JSON error and CORS headers of any answer); one Host, or HTTP/1.0 without one, is
/// served.
#[tokio::test]
async fn http1_requests_need_one_host() {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let served = serve(config_with(&[("fx", &fixtures())])).await;
    for (head, status) in [
        ("GET /healthz HTTP/1.1\r\n", "400"),
        ("GET /healthz HTTP/1.1\r\nHost: a\r\nHost: b\r\n", "400"),
        (
            "GET /zarr/fx/v2/compressor_none_i4/.zarray HTTP/1.1\r\nOrigin: http://o\r\n",
            "400",
        ),
        ("GET /healthz HTTP/1.1\r\nHost: a\r\n", "200"),
        ("GET /healthz HTTP/1.0\r\n", "200"),
    ] {
        let mut conn = tokio::net::TcpStream::connect(served.addr).await.unwrap();
        conn.write_all(format!("{head}Connection: close\r\n\r\n").as_bytes())
            .await
            .unwrap();
        let mut answer = Vec::new();
        conn.read_to_end(&mut answer).await.unwrap();
        let answer = String::from_utf8_lossy(&answer).to_lowercase();
        assert!(answer[9..].starts_with(status), "{head:?}: {answer}");
        if status == "400" {
            assert!(
                answer.contains("\"code\":\"bad_request\"") && answer.contains("host"),
                "{answer}"
            );
            assert!(answer.contains("access-control-allow-origin: *"), "{answer}");
        }
    }
    served.stop().await.unwrap();
}

/// A request head longer than a URL of `limits.max_url_bytes` and 16 KiB of fields (give or
/// take hyper's reads) is refused (431) rather than buffered: hyper's default let each
/// connection hold ~400 KiB of it.
#[tokio::test]
async fn request_heads_past_their_bound_are_431() {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let config = config_with(&[("fx", &fixtures())]);
    let bound = config.limits.max_url_bytes + (16 << 10);
    let served = serve(config).await;
    for (field, status) in [(bound / 2, "200"), (4 * bound, "431")] {
        let mut conn = tokio::net::TcpStream::connect(served.addr).await.unwrap();
        let head = format!(
            "GET /healthz HTTP/1.1\r\nHost: a\r\nX-Long: {}\r\nConnection: close\r\n\r\n",
            "a".repeat(field)
        );
        // The server may answer (and close) before the whole head is sent.
        let _ = conn.write_all(head.as_bytes()).await;
        let mut answer = Vec::new();
        let _ = conn.read_to_end(&mut answer).await;
        let answer = String::from_utf8_lossy(&answer);
        assert!(answer.get(9..12) == Some(status), "{field}: {answer}");
    }
    served.stop().await.unwrap();
}

/// The `limits.send_timeout_s` of the tests of it.
const SEND_TIMEOUT_S: f64 = 1.0;

/// A server whose `limits.send_timeout_s` is [`SEND_TIMEOUT_S`], with a 64 MB slice of fill
/// (no chunk stored: streamed as fast as a client takes it) at
/// `/api/v1/slice/m/big?format=bin`, and arrays of chunks whose reads take 3 s past the first
/// 3 (`slow_a`, `slow_b`: four chunks of 8 MB, a band each, of 0.25, 1.25, ...).
async fn serve_big(dir: &std::path::Path) -> (Served, zarrgate::AppState) {
    write_v3_array(
        &dir.join("big"),
        &[8000, 2000],
        &[1000, 1000],
        "float32",
        serde_json::json!(1.5),
        serde_json::json!([{"name": "bytes"}]),
    );
    for name in ["slow_a", "slow_b"] {
        write_v3_array(
            &dir.join(name),
            &[4000, 2000],
            &[1000, 2000],
            "float32",
            serde_json::json!(0.0),
            serde_json::json!([{"name": "bytes"}]),
        );
        for row in 0..4u8 {
            let value = f32::from(row) + 0.25;
            std::fs::create_dir_all(dir.join(format!("{name}/c/{row}"))).unwrap();
            std::fs::write(
                dir.join(format!("{name}/c/{row}/0")),
                value.to_le_bytes().repeat(2_000_000),
            )
            .unwrap();
        }
    }
    let store = ReadHook {
        inner: zarrgate::store::Store::new(zarrgate::store::open_local(dir).unwrap()),
        head: None,
        read: Box::new(|inner, key, range| {
            Box::pin(async move {
                if key.as_str().ends_with("/c/3/0") {
                    tokio::time::sleep(std::time::Duration::from_secs(3)).await;
                }
                inner.get(&key, range).await
            })
        }),
    };
    let mount = wrapped_mount("lagging", store);
    let mut config = config_with(&[]);
    config.limits.send_timeout_s = SEND_TIMEOUT_S;
    let state = zarrgate::AppState::with_mounts(config, vec![mount]);
    (serve_state(state.clone()).await, state)
}

/// Waits up to 10 s for every stream permit of `state` to be free; the seconds it took.
async fn turns_back(state: &zarrgate::AppState) -> f64 {
    let start = std::time::Instant::now();
    while state.streams.available_permits() < zarrgate::state::MAX_STREAMS {
        assert!(start.elapsed().as_secs() < 10, "the stream permits are not released");
        tokio::time::sleep(std::time::Duration::from_millis(20)).await;
    }
    start.elapsed().as_secs_f64()
}

/// An HTTP/2 connection to `addr` whose streams' windows start at `window` bytes: its sender
/// and its task (ended when the server closes it).
async fn http2_connection(
    addr: std::net::SocketAddr,
    window: u32,
) -> (
    hyper::client::conn::http2::SendRequest<http_body_util::Empty<bytes::Bytes>>,
    tokio::task::JoinHandle<Result<(), hyper::Error>>,
) {
    let tcp = tokio::net::TcpStream::connect(addr).await.unwrap();
    let (send, connection) = hyper::client::conn::http2::Builder::new(hyper_util::rt::TokioExecutor::new())
        .initial_stream_window_size(window)
        .handshake(hyper_util::rt::TokioIo::new(tcp))
        .await
        .unwrap();
    (send, tokio::spawn(connection))
}

/// Waits up to 10 s for the server to close `connection` (a client's task, which must end
/// without panicking); the seconds it took.
async fn closed_after(connection: tokio::task::JoinHandle<Result<(), hyper::Error>>) -> f64 {
    let start = std::time::Instant::now();
    let ended = tokio::time::timeout(std::time::Duration::from_secs(10), connection)
        .await
        .expect("the server closes the connection");
    assert!(ended.is_ok(), "{ended:?}");
    start.elapsed().as_secs_f64()
}

fn get_request(addr: std::net::SocketAddr, path: &str) -> axum::http::Request<http_body_util::Empty<bytes::Bytes>> {
    axum::http::Request::get(format!("http://{addr}{path}"))
        .body(http_body_util::Empty::<bytes::Bytes>::new())
        .unwrap()
}

/// Over HTTP/2 a client that stops taking a streamed body (its stream's window stays closed)
/// keeps its connection busy answering pings, and no socket stalls: after
/// `limits.send_timeout_s` the server closes the connection, and the body's stream permit comes
/// back. Before, it was held for as long as the client kept the connection. So is a body
/// handed on whole (a small slice) to a stream whose window never opens. A client that takes
/// a body slowly, pausing for less than the timeout, gets all of it.
#[tokio::test]
async fn http2_bodies_left_unread_lose_their_connection_after_the_send_timeout() {
    use http_body_util::BodyExt;
    let dir = tempfile::tempdir().unwrap();
    let (served, state) = serve_big(dir.path()).await;
    let addr = served.addr;
    let within = SEND_TIMEOUT_S * 0.5..SEND_TIMEOUT_S + 4.0;

    // Stalled: the head is read, the body never.
    let (mut send, connection) = http2_connection(addr, 1 << 20).await;
    let response = send
        .send_request(get_request(addr, "/api/v1/slice/m/big?format=bin"))
        .await
        .unwrap();
    assert_eq!(response.status(), 200);
    assert_eq!(
        state.streams.available_permits(),
        zarrgate::state::MAX_STREAMS - 1,
        "the body holds a permit"
    );
    let seconds = closed_after(connection).await;
    assert!(within.contains(&seconds), "closed after {seconds} s");
    assert!(turns_back(&state).await < 1.0);
    // What the client had of the body ends in an error, not as if complete.
    let mut body = response.into_body();
    let mut got = 0usize;
    let end = loop {
        match body.frame().await {
            Some(Ok(frame)) => got += frame.data_ref().map_or(0, |d| d.len()),
            Some(Err(e)) => break Err(e),
            None => break Ok(()),
        }
    };
    assert!(end.is_err() && got <= 1 << 20, "{got} bytes, then {end:?}");

    // A window that never opens: a one-chunk slice (4 KB, one frame) waits, unsent.
    let (mut send, connection) = http2_connection(addr, 0).await;
    let response = send
        .send_request(get_request(addr, "/api/v1/slice/m/big?select=0:32,0:32&format=bin"))
        .await
        .unwrap();
    assert_eq!(response.status(), 200);
    let seconds = closed_after(connection).await;
    assert!(within.contains(&seconds), "closed after {seconds} s");

    // Slow but moving: pauses of 50 ms between pieces, far from the timeout.
    let (mut send, _connection) = http2_connection(addr, 1 << 20).await;
    let response = send
        .send_request(get_request(addr, "/api/v1/slice/m/big?format=bin"))
        .await
        .unwrap();
    assert_eq!(response.status(), 200);
    let mut body = response.into_body();
    let (mut got, mut pauses) = (0usize, 0);
    while let Some(frame) = body.frame().await {
        let frame = frame.expect("the slow client gets the whole body");
        if let Some(data) = frame.data_ref() {
            assert!(data.iter().step_by(4093).all(|b| [0x00, 0xc0, 0x3f].contains(b)));
            got += data.len();
        }
        if pauses < 10 && got > pauses * 4_000_000 {
            pauses += 1;
            tokio::time::sleep(std::time::Duration::from_millis(50)).await;
        }
    }
    assert_eq!((got, pauses), (64_000_000, 10));
    turns_back(&state).await;
    served.stop().await.unwrap();
}

/// Over HTTP/1 a client that stops reading a streamed body fills the socket's buffers: its
/// connection is closed after `limits.send_timeout_s` too (well before the kernel's
/// TCP_USER_TIMEOUT), and the permit comes back.
#[tokio::test]
async fn http1_bodies_left_unread_lose_their_connection_after_the_send_timeout() {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let dir = tempfile::tempdir().unwrap();
    let (served, state) = serve_big(dir.path()).await;
    let mut tcp = tokio::net::TcpStream::connect(served.addr).await.unwrap();
    tcp.write_all(b"GET /api/v1/slice/m/big?format=bin HTTP/1.1\r\nHost: x\r\n\r\n")
        .await
        .unwrap();
    let mut head = [0u8; 12];
    tcp.read_exact(&mut head).await.unwrap();
    assert_eq!(&head, b"HTTP/1.1 200");
    // The body's permit is taken, and released once the connection is closed.
    let start = std::time::Instant::now();
    while state.streams.available_permits() == zarrgate::state::MAX_STREAMS {
        assert!(start.elapsed().as_secs() < 5, "the body takes no permit");
        tokio::time::sleep(std::time::Duration::from_millis(10)).await;
    }
    let seconds = turns_back(&state).await;
    assert!(seconds > SEND_TIMEOUT_S * 0.5, "released after {seconds} s");
    // What was sent ends short of the body: the connection was closed under it.
    let mut rest = Vec::new();
    let _ = tcp.read_to_end(&mut rest).await;
    assert!(rest.len() < 64_000_000, "{} bytes", rest.len());
    served.stop().await.unwrap();
}

/// A body that waits for its store is not stalled: the last band's chunk takes 3 s to read,
/// three times `limits.send_timeout_s`, while the client, which keeps reading, waits for it
/// mid-body. It gets the whole 32 MB, over HTTP/1 and HTTP/2 (each its own array: nothing
/// cached).
#[tokio::test]
async fn bodies_waiting_for_their_store_are_not_stalled() {
    let dir = tempfile::tempdir().unwrap();
    let (served, _) = serve_big(dir.path()).await;
    for (http2, array) in [(false, "slow_a"), (true, "slow_b")] {
        let start = std::time::Instant::now();
        let path = format!("/api/v1/slice/m/{array}?format=bin");
        let (status, _, body) = over(served.addr, http2, "GET", &path).await;
        let seconds = start.elapsed().as_secs_f64();
        assert_eq!(status, 200, "http2={http2}");
        assert!(seconds >= 3.0, "http2={http2}: {seconds} s");
        assert_eq!(body.len(), 32_000_000, "http2={http2}");
        for row in 0..4usize {
            let want = (row as f32 + 0.25).to_le_bytes();
            assert_eq!(body[row * 8_000_000..][..4], want, "http2={http2} row {row}");
            assert_eq!(
                body[row * 8_000_000 + 7_999_996..][..4],
                want,
                "http2={http2} row {row}"
            );
        }
    }
    served.stop().await.unwrap();
}

/// Bodies hand on frames of at most `server::MAX_FRAME` (a whole 4 MB chunk answered in one
/// piece by its handler is 4 of them), so that a slow client's progress is seen frame by
/// frame; the size stated stays exact throughout, and the bytes are the chunk's.
#[tokio::test]
async fn large_frames_are_handed_on_in_pieces() {
    use http_body_util::BodyExt;
    use tower::ServiceExt;
    let dir = tempfile::tempdir().unwrap();
    let (served, state) = serve_big(dir.path()).await;
    let request = axum::http::Request::get("/api/v1/slice/m/big?select=0:1000,0:1000&format=bin")
        .body(axum::body::Body::empty())
        .unwrap();
    let response = zarrgate::app(state).oneshot(request).await.unwrap();
    assert_eq!(response.status(), 200);
    let mut body = response.into_body();
    let mut left = 4_000_000u64;
    let mut frames = 0;
    while left > 0 {
        assert_eq!(http_body::Body::size_hint(&body).exact(), Some(left));
        let data = body.frame().await.unwrap().unwrap().into_data().unwrap();
        assert!(
            !data.is_empty() && data.len() <= zarrgate::server::MAX_FRAME,
            "{}",
            data.len()
        );
        assert!(data.chunks_exact(4).all(|v| v == 1.5f32.to_le_bytes()));
        left -= data.len() as u64;
        frames += 1;
    }
    assert!(body.frame().await.is_none() && http_body::Body::is_end_stream(&body));
    assert_eq!(frames, 4_000_000usize.div_ceil(zarrgate::server::MAX_FRAME));
    served.stop().await.unwrap();
}
