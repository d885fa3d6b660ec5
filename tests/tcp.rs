//! The server over a real socket on 127.0.0.1:0 with a real HTTP client: what hyper does to
//! our responses (HEAD lengths, streaming, shutdown) is only visible here.

mod common;

use common::*;
use tokio::sync::oneshot;

#[tokio::test]
async fn serves_over_tcp_and_shuts_down_gracefully() {
    let state = zarrgate::AppState::from_config(config_with(&[("fx", &fixtures())])).unwrap();
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let base = format!("http://{}", listener.local_addr().unwrap());
    let (stop, stopped) = oneshot::channel::<()>();
    let server = tokio::spawn(zarrgate::run(listener, state, async {
        let _ = stopped.await;
    }));
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

    stop.send(()).unwrap();
    tokio::time::timeout(std::time::Duration::from_secs(10), server)
        .await
        .expect("server stops after the shutdown signal")
        .unwrap()
        .unwrap();
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
        state,
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
    tokio::time::timeout(std::time::Duration::from_secs(10), server)
        .await
        .expect("the server stops after the drain time")
        .unwrap()
        .unwrap();
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
    let state = zarrgate::AppState::from_config(config_with(&[("fx", &fixtures())])).unwrap();
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let (stop, stopped) = oneshot::channel::<()>();
    let server = tokio::spawn(zarrgate::run(listener, state, async {
        let _ = stopped.await;
    }));
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
    stop.send(()).unwrap();
    server.await.unwrap().unwrap();
}
