//! HTTP origins as remote mounts, against servers on 127.0.0.1 (a zarrgate serving the
//! fixtures, and hand-written origins that misbehave): what comes through them must equal what
//! the local fixtures give, with the upstream requests counted. Buckets (S3, GCS, Azure) are in
//! tests/clouds.rs.

use std::net::TcpListener;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use crate::common::cases::{run_manifest_on, runtime};
use crate::common::remote::*;
use crate::common::*;
use zarrgate::config::MountConfig;
use zarrgate::state::Mount;

/// Serves zarrgate's `app` on a free port from a thread of its own; returns the base URL.
fn serve_app(app: zarrgate::App) -> String {
    serve_in_background(axum::Router::new().fallback_service(app))
}

/// Serves `router` on a free port from a thread of its own; returns the base URL.
fn serve_in_background(router: axum::Router) -> String {
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = listener.local_addr().unwrap();
    listener.set_nonblocking(true).unwrap();
    std::thread::spawn(move || {
        let rt = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(1)
            .enable_all()
            .build()
            .unwrap();
        rt.block_on(async move {
            let listener = tokio::net::TcpListener::from_std(listener).unwrap();
            axum::serve(listener, router).await.unwrap();
        });
    });
    format!("http://{addr}")
}

#[test]
fn http_origins_behave_like_local_ones() {
    let origin = serve_app(app_for(&[("fx", &fixtures())]));
    let bare = {
        let mut config = config_with(&[("fx", &fixtures())]);
        config.mounts.get_mut("fx").unwrap().consolidated = false;
        let app = zarrgate::app(zarrgate::AppState::from_config(config).unwrap());
        serve_app(app)
    };
    let mount = |name: &str, base: &str| http_mount(name, format!("{base}/zarr/fx"), 5.0, 3);
    let http = mount("web", &origin);
    let (n, failures) = run_manifest_on(&http.store, &repo().join("tests/fixtures/cases.json"), |p| {
        Some(p.to_owned())
    });
    assert!(
        n > 150 && failures.is_empty(),
        "{} of {n} failed:\n{}",
        failures.len(),
        failures.join("\n")
    );
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap();
    rt.block_on(async {
        // A key too long for any URL is missing (object_store panicked building the request).
        let long = mount("long", &origin);
        let key = zarrgate::store::StoreKey::new(&"x".repeat(70_000)).unwrap();
        assert!(long.store.head(&key).await.unwrap().is_none());
        assert!(long.store.get(&key, None).await.unwrap().is_none());
        let (app, _) = app_with(vec![http, mount("bare", &bare), local_mount()]);
        // ZOM works through the origin's consolidated metadata, since an origin cannot list.
        same_as_local(&app, "web").await;
        let r = get(&app, "/api/v1/zom/bare/v3/group_nested", &[]).await;
        assert_eq!((r.status.as_u16(), r.error_code().as_str()), (422, "unsupported"));
        assert!(r.json()["error"]["message"].as_str().unwrap().contains("cannot list"));
        // Raw keys of groups it cannot consolidate are what the origin stores, or missing.
        let r = get(&app, "/zarr/bare/v3/group_nested/zarr.json", &[]).await;
        assert_eq!(r.status, 200);
        let stored = std::fs::read(fixtures().join("v3/group_nested/zarr.json")).unwrap();
        assert_eq!(r.body, stored);
        let r = get(&app, "/zarr/bare/v2/group_nested/.zmetadata", &[]).await;
        assert_eq!((r.status.as_u16(), r.error_code().as_str()), (404, "not_found"));
        // Through the consolidating origin, both are synthesized.
        let r = get(&app, "/zarr/web/v3/group_nested/zarr.json", &[]).await;
        assert!(r.json()["consolidated_metadata"].is_object());
        let r = get(&app, "/zarr/web/v2/group_nested/.zmetadata", &[]).await;
        assert!(r.json()["metadata"].is_object());
        // A subgroup of a group consolidated at its root only: its members come from the
        // root's .zmetadata, and equal what a local mount finds by listing.
        let local = get(&app, "/api/v1/zom/fx/v2/group_consolidated/sub", &[]).await;
        assert_eq!(local.status, 200);
        assert!(local.json()["members"].as_object().is_some_and(|m| !m.is_empty()));
        for depth in ["", "?depth=0"] {
            let r = get(&app, &format!("/api/v1/zom/bare/v2/group_consolidated/sub{depth}"), &[]).await;
            assert_eq!(r.status, 200, "{depth}: {:?}", r.body);
            let l = get(&app, &format!("/api/v1/zom/fx/v2/group_consolidated/sub{depth}"), &[]).await;
            assert_eq!(r.json(), l.json(), "{depth}");
        }
    });
}

/// A raw GET with a Range on a remote mount is one ranged GET upstream (suffix and open ranges
/// too), with no HEAD first; a range the object cannot satisfy is 416 naming its size; any
/// range of an empty object is the whole (empty) object, and the origin's 200 to it does not
/// make later ranges whole-object reads.
#[test]
fn ranged_raw_reads_are_one_upstream_request() {
    let dir = tempfile::tempdir().unwrap();
    let blob: Vec<u8> = (0..100u8).collect();
    std::fs::write(dir.path().join("blob"), &blob).unwrap();
    std::fs::write(dir.path().join("empty"), b"").unwrap();
    let origin = serve_app(app_for(&[("d", dir.path())]));
    let calls = Arc::new(AtomicUsize::new(0));
    let mut mount = http_mount("web", format!("{origin}/zarr/d"), 5.0, 0);
    mount.store = counted(mount.store, &calls);
    let made = |before: usize| calls.load(Ordering::SeqCst) - before;
    runtime().block_on(async {
        let (app, _) = app_with(vec![mount]);
        let ranged = [
            ("bytes=10-19", 10..20),
            ("bytes=-5", 95..100),
            ("bytes=90-", 90..100),
            ("bytes=-500", 0..100),
            ("bytes=95-1000", 95..100),
        ];
        for round in ["", " after the empty object"] {
            for (range, part) in ranged.clone() {
                let before = calls.load(Ordering::SeqCst);
                let r = get(&app, "/zarr/web/blob", &[("range", range)]).await;
                assert_eq!(
                    (r.status.as_u16(), &r.body[..]),
                    (206, &blob[part.clone()]),
                    "{range}{round}"
                );
                let want = format!("bytes {}-{}/100", part.start, part.end - 1);
                assert_eq!(r.header("content-range"), Some(want.as_str()), "{range}{round}");
                assert_eq!(made(before), 1, "{range}{round}: one ranged GET upstream");
            }
            for range in ["bytes=100-", "bytes=200-300"] {
                let r = get(&app, "/zarr/web/blob", &[("range", range)]).await;
                assert_eq!(r.status, 416, "{range}");
                assert_eq!(r.header("content-range"), Some("bytes */100"), "{range}");
            }
            let r = get(&app, "/zarr/web/empty", &[("range", "bytes=0-9")]).await;
            assert_eq!((r.status.as_u16(), r.body.len()), (200, 0));
        }
        let r = get(&app, "/zarr/web/nothing", &[("range", "bytes=-4")]).await;
        assert_eq!((r.status.as_u16(), r.error_code().as_str()), (404, "not_found"));
    });
}

/// A body read slowly (here, not read at all) does not hold the mount's upstream requests: with
/// `concurrency = 1`, another read goes ahead while the first body is still unread.
#[test]
fn unread_bodies_do_not_hold_the_mount_s_requests() {
    use tower::ServiceExt;
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(dir.path().join("big"), vec![7u8; 1 << 20]).unwrap();
    std::fs::write(dir.path().join("small"), b"small").unwrap();
    let origin = serve_app(app_for(&[("d", dir.path())]));
    let mut config = MountConfig::new(format!("{origin}/zarr/d"), "/");
    config.allow_http = true;
    config.concurrency = 1;
    config.retries = 0;
    let mut mount = http_mount("web", format!("{origin}/zarr/d"), 5.0, 0);
    mount.store = zarrgate::store::open::open(&config.source("web").unwrap(), &config).unwrap();
    runtime().block_on(async {
        let (app, _) = app_with(vec![mount]);
        let request = axum::http::Request::get("/zarr/web/big")
            .body(axum::body::Body::empty())
            .unwrap();
        let held = app.clone().oneshot(request).await.unwrap();
        assert_eq!(held.status(), 200);
        let second = tokio::time::timeout(Duration::from_secs(3), get(&app, "/zarr/web/small", &[])).await;
        let r = second.expect("the second read waited for the first body");
        assert_eq!((r.status.as_u16(), &r.body[..]), (200, &b"small"[..]));
        // The first body is still whole.
        let body = axum::body::to_bytes(held.into_body(), 2 << 20).await.unwrap();
        assert_eq!(body.len(), 1 << 20);
    });
}

/// A mount of an HTTP origin at `url`.
fn http_mount(name: &str, url: String, timeout_s: f64, retries: usize) -> Mount {
    let mut config = MountConfig::new(url, "/");
    config.allow_http = true;
    config.timeout_s = timeout_s;
    config.retries = retries;
    let source = config.source(name).unwrap();
    Mount::new(
        name,
        "http",
        config.url.clone(),
        zarrgate::store::open::open(&source, &config).unwrap(),
    )
}

/// An origin that accepts connections and never answers: 504 upstream_timeout after the mount's
/// timeout, and an origin that refuses connections: 502 upstream_error, even after retries
/// (whose errors name the retry_timeout setting).
#[test]
fn silent_origins_time_out_and_refusing_ones_fail() {
    let silent = TcpListener::bind("127.0.0.1:0").unwrap();
    let silent_addr = silent.local_addr().unwrap();
    std::thread::spawn(move || {
        let mut held = Vec::new();
        for stream in silent.incoming().flatten() {
            held.push(stream); // kept open, never answered
        }
    });
    let refusing = {
        let l = TcpListener::bind("127.0.0.1:0").unwrap();
        l.local_addr().unwrap() // dropped: nothing listens there any more
    };
    runtime().block_on(async {
        let (app, _) = app_with(vec![
            http_mount("silent", format!("http://{silent_addr}/d"), 0.5, 0),
            http_mount("refusing", format!("http://{refusing}/d"), 0.5, 2),
        ]);
        let r = get(&app, "/zarr/silent/zarr.json", &[]).await;
        assert_eq!((r.status.as_u16(), r.error_code().as_str()), (504, "upstream_timeout"));
        let r = get(&app, "/zarr/refusing/zarr.json", &[]).await;
        assert_eq!((r.status.as_u16(), r.error_code().as_str()), (502, "upstream_error"));
    });
}

/// Reads a request's head from `stream`; returns its request line ("GET /x HTTP/1.1\r\n").
fn request_line(stream: &std::net::TcpStream) -> String {
    use std::io::BufRead;
    let mut reader = std::io::BufReader::new(stream.try_clone().unwrap());
    let mut line = String::new();
    let _ = reader.read_line(&mut line);
    loop {
        let mut h = String::new();
        if reader.read_line(&mut h).unwrap_or(0) == 0 || h == "\r\n" {
            break;
        }
    }
    line
}

/// A ranged read that fails upstream (503 after the retries) is a 502 at once: the HEAD that
/// tells a 416 from other failures is asked only after a 416, not after every failure (it
/// doubled the requests, and the wait, of a failing or throttling upstream).
#[test]
fn failed_ranged_reads_ask_no_head() {
    use std::io::Write;
    use std::sync::{Arc, Mutex};
    let origin = TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = origin.local_addr().unwrap();
    let methods = Arc::new(Mutex::new(Vec::<String>::new()));
    let seen = methods.clone();
    std::thread::spawn(move || {
        for stream in origin.incoming().flatten() {
            let line = request_line(&stream);
            seen.lock()
                .unwrap()
                .push(line.split(' ').next().unwrap_or("").to_owned());
            let mut out = stream;
            let _ = write!(
                out,
                "HTTP/1.1 503 Service Unavailable\r\nContent-Length: 0\r\nConnection: close\r\n\r\n"
            );
        }
    });
    runtime().block_on(async {
        let (app, _) = app_with(vec![http_mount("busy", format!("http://{addr}/d"), 5.0, 1)]);
        let r = get(&app, "/zarr/busy/blob", &[("range", "bytes=0-3")]).await;
        assert_eq!((r.status.as_u16(), r.error_code().as_str()), (502, "upstream_error"));
        let asked = methods.lock().unwrap().clone();
        assert!(!asked.is_empty() && asked.iter().all(|m| m == "GET"), "{asked:?}");
    });
}

/// An origin that dates its objects in the obsolete asctime form (RFC 9110 has recipients
/// accept it), or with no date at all: its objects are served (object_store alone fails the
/// read on either), dated in the IMF form, or undated.
#[test]
fn origins_with_old_or_bad_dates_are_read() {
    use std::io::Write;
    let origin = TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = origin.local_addr().unwrap();
    std::thread::spawn(move || {
        for stream in origin.incoming().flatten() {
            let line = request_line(&stream);
            let date = if line.contains("/old/") {
                "Sun Nov  6 08:49:37 1994"
            } else {
                "yesterday"
            };
            let mut out = stream;
            let _ = write!(
                out,
                "HTTP/1.1 200 OK\r\nContent-Length: 5\r\nLast-Modified: {date}\r\nConnection: close\r\n\r\n"
            );
            if !line.starts_with("HEAD") {
                let _ = out.write_all(b"hello");
            }
        }
    });
    runtime().block_on(async {
        let (app, _) = app_with(vec![
            http_mount("old", format!("http://{addr}/old"), 5.0, 0),
            http_mount("bad", format!("http://{addr}/bad"), 5.0, 0),
        ]);
        let r = get(&app, "/zarr/old/blob", &[]).await;
        assert_eq!((r.status.as_u16(), &r.body[..]), (200, &b"hello"[..]));
        assert_eq!(r.header("last-modified"), Some("Sun, 06 Nov 1994 08:49:37 GMT"));
        let r = get(&app, "/zarr/bad/blob", &[]).await;
        assert_eq!((r.status.as_u16(), &r.body[..]), (200, &b"hello"[..]));
        assert_eq!(r.header("last-modified"), None);
    });
}

/// An origin that sends a large body slowly but steadily: the mount's timeout bounds each wait,
/// not the whole request, so the body arrives whole although it takes four times the timeout.
#[test]
fn slow_steady_bodies_are_not_cut_at_the_timeout() {
    use std::io::Write;
    let origin = TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = origin.local_addr().unwrap();
    let body: Vec<u8> = (0..200_000u32).map(|i| (i % 253) as u8).collect();
    let sent = body.clone();
    std::thread::spawn(move || {
        for stream in origin.incoming().flatten() {
            let sent = sent.clone();
            std::thread::spawn(move || {
                let head = request_line(&stream).starts_with("HEAD");
                let mut out = stream;
                let _ = write!(
                    out,
                    "HTTP/1.1 200 OK\r\nContent-Length: {}\r\nETag: \"v1\"\r\nConnection: close\r\n\r\n",
                    sent.len()
                );
                if !head {
                    for piece in sent.chunks(sent.len() / 10) {
                        std::thread::sleep(Duration::from_millis(200));
                        if out.write_all(piece).is_err() {
                            return;
                        }
                    }
                }
            });
        }
    });
    runtime().block_on(async {
        let (app, _) = app_with(vec![http_mount("slow", format!("http://{addr}/d"), 0.5, 3)]);
        let start = Instant::now();
        let r = get(&app, "/zarr/slow/blob", &[]).await;
        assert_eq!(r.status, 200);
        assert!(r.body[..] == body[..], "{} of {} bytes", r.body.len(), body.len());
        assert!(start.elapsed() >= Duration::from_secs(2));
    });
}

/// An origin as simple static servers are: it answers every GET with the whole file (no
/// ranges), and 403 for what it does not have (as public buckets do to callers who may not
/// list them).
fn plain_origin() -> String {
    async fn file(axum::extract::Path(key): axum::extract::Path<String>) -> axum::response::Response {
        use axum::response::IntoResponse;
        match std::fs::read(fixtures().join(&key)) {
            Ok(bytes) if !key.contains("..") => bytes.into_response(),
            _ => axum::http::StatusCode::FORBIDDEN.into_response(),
        }
    }
    serve_in_background(axum::Router::new().route("/f/{*key}", axum::routing::get(file)))
}

#[test]
fn origins_that_ignore_ranges_or_refuse_missing_keys() {
    let base = plain_origin();
    let mut public = http_mount("public", format!("{base}/f"), 5.0, 0);
    {
        let mut config = MountConfig::new(format!("{base}/f"), "/");
        config.allow_http = true;
        config.anonymous = true;
        config.retries = 0;
        public.store = zarrgate::store::open::open(&config.source("public").unwrap(), &config).unwrap();
    }
    let plain = http_mount("plain", format!("{base}/f"), 5.0, 0);
    runtime().block_on(async {
        let (app, _) = app_with(vec![public, plain, local_mount()]);
        for remote in ["public", "plain"] {
            // Ranges, suffix ranges and conditional requests are cut out of the whole object.
            let key = "v3/sharding_start_i4/c/1/0";
            let want = std::fs::read(fixtures().join(key)).unwrap();
            for (range, part) in [
                ("bytes=-4", &want[want.len() - 4..]),
                ("bytes=2-9", &want[2..10]),
                ("bytes=5-", &want[5..]),
            ] {
                let r = get(&app, &format!("/zarr/{remote}/{key}"), &[("range", range)]).await;
                assert_eq!((r.status.as_u16(), &r.body[..]), (206, part), "{remote} {range}");
            }
            let r = get(
                &app,
                &format!("/zarr/{remote}/{key}"),
                &[("if-none-match", "\"other\"")],
            )
            .await;
            assert_eq!((r.status.as_u16(), &r.body[..]), (200, &want[..]), "{remote}");
            // The origin sends no ETag and no Last-Modified: no validator is made up (object
            // store reads the missing time as 1970), so nothing is "not modified".
            assert_eq!((r.header("etag"), r.header("last-modified")), (None, None), "{remote}");
            let since = [("if-modified-since", "Sun, 01 Jan 2023 00:00:00 GMT")];
            assert_eq!(get(&app, &format!("/zarr/{remote}/{key}"), &since).await.status, 200);
            // Stored documents of a consolidating mount, and shards read by ranges.
            let r = get(&app, &format!("/zarr/{remote}/v3/group_nested/zarr.json"), &[]).await;
            assert_eq!(r.status, 200, "{remote}: {:?}", r.body);
            for uri in [
                "slice/{}/v3/sharding_start_i4?select=1:,::2",
                "slice/{}/v3/sharding_nested_i4",
            ] {
                let a = get(&app, &format!("/api/v1/{}", uri.replace("{}", remote)), &[]).await;
                let b = get(&app, &format!("/api/v1/{}", uri.replace("{}", "fx")), &[]).await;
                assert_eq!(a.status, 200, "{remote} {uri}: {:?}", a.body);
                assert_eq!(a.json(), b.json(), "{remote} {uri}");
            }
        }
        // A refused key: missing on an anonymous (public) mount, a refusal otherwise.
        let r = get(&app, "/zarr/public/v3/nothing/zarr.json", &[]).await;
        assert_eq!(r.status, 404);
        let r = get(&app, "/api/v1/slice/public/v3/nothing", &[]).await;
        assert_eq!(r.status, 404);
        let r = get(&app, "/zarr/plain/v3/nothing/zarr.json", &[]).await;
        assert_eq!((r.status.as_u16(), r.error_code().as_str()), (502, "upstream_denied"));
    });
}
