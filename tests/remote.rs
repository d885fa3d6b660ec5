//! Remote mounts against real protocol servers on 127.0.0.1: an S3 server (moto, installed by
//! scripts/python-env.sh and started here; the test skips with a message when it cannot be
//! installed) and an HTTP origin (a zarrgate serving the fixtures). What comes through them must
//! equal what the local fixtures give, with the upstream requests counted.

mod common;

use std::net::TcpListener;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use common::cases::run_manifest_on;
use common::*;
use object_store::ObjectStoreExt;
use zarrgate::config::{Config, MountConfig};
use zarrgate::state::Mount;
use zarrgate::store::{Store, open_local};

fn free_port() -> u16 {
    TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port()
}

fn wait_for_port(port: u16, limit: Duration) -> bool {
    let start = Instant::now();
    while start.elapsed() < limit {
        if std::net::TcpStream::connect(("127.0.0.1", port)).is_ok() {
            return true;
        }
        std::thread::sleep(Duration::from_millis(100));
    }
    false
}

/// The moto venv, installed by the project's script; `None` (test skipped) when it cannot be.
fn moto_venv() -> Option<PathBuf> {
    let out = Command::new(repo().join("scripts/python-env.sh"))
        .args(["moto", "tests/remote/requirements-moto.txt"])
        .current_dir(repo())
        .stderr(Stdio::inherit())
        .output()
        .ok()?;
    if !out.status.success() {
        eprintln!("skipped: moto could not be installed (scripts/python-env.sh moto failed)");
        return None;
    }
    let venv = PathBuf::from(String::from_utf8_lossy(&out.stdout).trim());
    venv.join("bin/moto_server").exists().then_some(venv)
}

/// A moto server process, stopped on drop.
struct Moto {
    child: Option<Child>,
    venv: PathBuf,
    port: u16,
}

impl Moto {
    fn start(venv: &Path, port: u16) -> Moto {
        let child = Command::new(venv.join("bin/moto_server"))
            .args(["-H", "127.0.0.1", "-p", &port.to_string()])
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("moto_server starts");
        assert!(wait_for_port(port, Duration::from_secs(30)), "moto listens on {port}");
        Moto {
            child: Some(child),
            venv: venv.to_owned(),
            port,
        }
    }

    fn stop(&mut self) {
        if let Some(mut c) = self.child.take() {
            let _ = c.kill();
            let _ = c.wait();
        }
    }

    fn restart(&mut self) {
        self.stop();
        *self = Moto::start(&self.venv.clone(), self.port);
    }
}

impl Drop for Moto {
    fn drop(&mut self) {
        self.stop();
    }
}

/// Creates the bucket and uploads every file below `dir` under `prefix`.
/// A client of the moto server's `bucket`.
fn s3_client(port: u16, bucket: &str) -> object_store::aws::AmazonS3 {
    object_store::aws::AmazonS3Builder::new()
        .with_bucket_name(bucket)
        .with_region("us-east-1")
        .with_endpoint(format!("http://127.0.0.1:{port}"))
        .with_allow_http(true)
        .with_access_key_id("testing")
        .with_secret_access_key("testing")
        .build()
        .unwrap()
}

async fn upload(port: u16, bucket: &str, dir: &Path, prefix: &str) {
    let url = format!("http://127.0.0.1:{port}/{bucket}");
    let created = reqwest::Client::new().put(&url).send().await.unwrap();
    assert!(created.status().is_success(), "bucket created: {}", created.status());
    let s3 = s3_client(port, bucket);
    let mut stack = vec![dir.to_owned()];
    let mut n = 0;
    while let Some(d) = stack.pop() {
        for entry in std::fs::read_dir(&d).unwrap() {
            let path = entry.unwrap().path();
            if path.is_dir() {
                stack.push(path);
            } else {
                let rel = path.strip_prefix(dir).unwrap().to_string_lossy().replace('\\', "/");
                let key = object_store::path::Path::parse(format!("{prefix}/{rel}")).unwrap();
                s3.put(&key, std::fs::read(&path).unwrap().into()).await.unwrap();
                n += 1;
            }
        }
    }
    assert!(n > 100, "uploaded {n} files");
}

fn counted(store: Store, gets: &Arc<AtomicUsize>) -> Store {
    Store::new(CountingStore {
        inner: store,
        gets: gets.clone(),
        list_delay: Duration::ZERO,
        list_error: None,
    })
}

fn app_with(mounts: Vec<Mount>) -> (axum::Router, zarrgate::AppState) {
    let state = zarrgate::AppState::with_mounts(Config::default(), mounts);
    (zarrgate::app(state.clone()), state)
}

fn local_mount() -> Mount {
    Mount {
        name: "fx".into(),
        kind: "local",
        url: "fx".into(),
        consolidated: true,
        store: Store::new(open_local(&fixtures()).unwrap()),
        tokens: Vec::new(),
    }
}

/// Raw keys, slices and ZOM through `remote` equal those of the local fixtures.
async fn same_as_local(app: &axum::Router, remote: &str) {
    for key in [
        "v3/sharding_start_i4/c/1/0",
        "v2/compressor_zstd_i4/.zarray",
        "v3/group_nested/top/zarr.json",
    ] {
        let want = std::fs::read(fixtures().join(key)).unwrap();
        let r = get(app, &format!("/zarr/{remote}/{key}"), &[]).await;
        assert_eq!(r.status, 200, "{remote} {key}");
        assert_eq!(&r.body[..], &want[..], "{remote} {key}");
        let r = get(app, &format!("/zarr/{remote}/{key}"), &[("range", "bytes=-4")]).await;
        assert_eq!(r.status, 206, "{remote} {key}");
        assert_eq!(&r.body[..], &want[want.len() - 4..]);
        let r = request(app, "HEAD", &format!("/zarr/{remote}/{key}"), &[]).await;
        assert_eq!(r.header("content-length"), Some(want.len().to_string().as_str()));
    }
    assert_eq!(
        get(app, &format!("/zarr/{remote}/v3/nothing/zarr.json"), &[])
            .await
            .status,
        404
    );
    for uri in [
        "slice/{}/v3/sharding_start_i4?select=1:,::2",
        "slice/{}/v3/sharding_nested_i4",
        "slice/{}/v2/object_vlen_utf8",
        "slice/{}/v2/group_nested/sub/inner",
        "zom/{}/v3/group_nested",
        "zom/{}/v2/group_nested",
    ] {
        let a = get(app, &format!("/api/v1/{}", uri.replace("{}", remote)), &[]).await;
        let b = get(app, &format!("/api/v1/{}", uri.replace("{}", "fx")), &[]).await;
        assert_eq!(a.status, 200, "{remote} {uri}: {:?}", a.body);
        assert_eq!(a.json(), b.json(), "{remote} {uri}");
    }
}

#[test]
fn s3_mounts_behave_like_local_ones() {
    let Some(venv) = moto_venv() else { return };
    // Credentials come from the standard environment, as in a deployment. This test binary has
    // one test, so nothing else reads the environment concurrently.
    for (k, v) in [
        ("AWS_ACCESS_KEY_ID", "testing"),
        ("AWS_SECRET_ACCESS_KEY", "testing"),
        ("AWS_DEFAULT_REGION", "us-east-1"),
        ("AWS_EC2_METADATA_DISABLED", "true"),
    ] {
        // SAFETY: single-threaded at this point; no other test runs in this binary.
        unsafe { std::env::set_var(k, v) };
    }
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap();
    let port = free_port();
    let mut moto = Moto::start(&venv, port);
    rt.block_on(upload(port, "zarr", &fixtures(), "data"));

    let mut config = MountConfig::new("s3://zarr/data", "/");
    config.endpoint = Some(format!("http://127.0.0.1:{port}"));
    config.allow_http = true;
    config.timeout_s = 2.0;
    config.retries = 1;
    let source = config.source("s3").unwrap();
    assert_eq!(zarrgate::store::open::kind(&source), "s3");
    let s3 = zarrgate::store::open::open(&source, &config).unwrap();

    // Every fixture array, read through S3, equals zarr-python's values.
    let (n, failures) = run_manifest_on(&s3, &repo().join("tests/fixtures/cases.json"), |p| Some(p.to_owned()));
    assert!(
        n > 150 && failures.is_empty(),
        "{} of {n} failed:\n{}",
        failures.len(),
        failures.join("\n")
    );

    let gets = Arc::new(AtomicUsize::new(0));
    let s3_mount = |store: Store| Mount {
        name: "s3".into(),
        kind: "s3",
        url: "s3://zarr/data".into(),
        consolidated: true,
        store,
        tokens: Vec::new(),
    };
    rt.block_on(async {
        let (app, _) = app_with(vec![s3_mount(s3.clone()), local_mount()]);
        same_as_local(&app, "s3").await;

        // Upstream requests of a one-chunk slice of a sharded array: metadata, index, one range.
        let (app, _) = app_with(vec![s3_mount(counted(s3.clone(), &gets)), local_mount()]);
        let one = "/api/v1/slice/s3/v3/sharding_start_i4?select=0,0";
        let r = get(&app, one, &[]).await;
        assert_eq!(r.status, 200);
        assert_eq!(
            gets.load(Ordering::SeqCst),
            3,
            "zarr.json + shard index + one inner chunk"
        );
        get(&app, one, &[]).await;
        assert_eq!(gets.load(Ordering::SeqCst), 3, "warm: nothing read");
        let meta: serde_json::Value =
            serde_json::from_slice(&std::fs::read(fixtures().join("v3/sharding_start_i4/zarr.json")).unwrap()).unwrap();
        let inner = meta["codecs"][0]["configuration"]["chunk_shape"][1].as_u64().unwrap();
        let other = format!("/api/v1/slice/s3/v3/sharding_start_i4?select=0,{inner}");
        assert_eq!(get(&app, &other, &[]).await.status, 200);
        assert_eq!(
            gets.load(Ordering::SeqCst),
            4,
            "same shard, another inner chunk: the index is cached"
        );
        let expected = get(&app, "/api/v1/slice/fx/v3/sharding_start_i4?select=0,0", &[]).await;
        assert_eq!(r.json(), expected.json());

        // Bucket keys that cannot be keys here are not members (a backslash, which S3 allows).
        let client = s3_client(port, "zarr");
        for key in ["odd/.zgroup", "odd/g/.zgroup", "odd/back\\slash/.zgroup"] {
            let doc = br#"{"zarr_format": 2}"#.to_vec();
            client
                .put(&object_store::path::Path::parse(key).unwrap(), doc.into())
                .await
                .unwrap();
        }
        let mut odd_config = MountConfig::new("s3://zarr/odd", "/");
        odd_config.endpoint = Some(format!("http://127.0.0.1:{port}"));
        odd_config.allow_http = true;
        let odd = zarrgate::store::open::open(&odd_config.source("s3").unwrap(), &odd_config).unwrap();
        let listing = odd.list(&zarrgate::store::StoreKey::root()).await.unwrap();
        assert_eq!(listing.prefixes, ["g"]);
        let (app, _) = app_with(vec![s3_mount(odd), local_mount()]);
        let zom = get(&app, "/api/v1/zom/s3", &[]).await;
        assert_eq!(zom.status, 200);
        assert_eq!(
            zom.json()["members"].as_object().unwrap().keys().collect::<Vec<_>>(),
            ["g"]
        );

        // Credentials never show.
        let mounts = get(&app, "/api/v1/mounts", &[]).await;
        assert!(!String::from_utf8_lossy(&mounts.body).contains("testing"));
    });

    // The bucket goes away: quick 502/504s, the server stays up; it comes back: data again.
    moto.stop();
    rt.block_on(async {
        let (app, _) = app_with(vec![s3_mount(s3.clone()), local_mount()]);
        let start = Instant::now();
        let r = get(&app, "/zarr/s3/v3/zstd_i4/zarr.json", &[]).await;
        assert!(matches!(r.status.as_u16(), 502 | 504), "{} {:?}", r.status, r.body);
        assert!(matches!(r.error_code().as_str(), "upstream_error" | "upstream_timeout"));
        assert!(
            start.elapsed() < Duration::from_secs(15),
            "failed in {:?}",
            start.elapsed()
        );
        let r = get(&app, "/api/v1/slice/s3/v3/zstd_i4", &[]).await;
        assert!(matches!(r.status.as_u16(), 502 | 504), "{}", r.status);
        assert_eq!(get(&app, "/healthz", &[]).await.status, 200);
        assert_eq!(get(&app, "/api/v1/slice/fx/v3/zstd_i4", &[]).await.status, 200);
        moto.restart();
        upload(moto.port, "zarr", &fixtures(), "data").await;
        let r = get(&app, "/api/v1/slice/s3/v3/zstd_i4", &[]).await;
        assert_eq!(r.status, 200, "recovered without a restart: {:?}", r.body);
        assert_eq!(r.json(), get(&app, "/api/v1/slice/fx/v3/zstd_i4", &[]).await.json());
    });
}

/// Serves `app` on a free port from a thread of its own; returns the base URL.
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
    let origin = serve_in_background(app_for(&[("fx", &fixtures())]));
    let bare = {
        let mut config = config_with(&[("fx", &fixtures())]);
        config.mounts.get_mut("fx").unwrap().consolidated = false;
        serve_in_background(zarrgate::app(zarrgate::AppState::from_config(config).unwrap()))
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
    let origin = serve_in_background(app_for(&[("d", dir.path())]));
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
    let origin = serve_in_background(app_for(&[("d", dir.path())]));
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
    Mount {
        name: name.into(),
        kind: "http",
        url: config.url.clone(),
        consolidated: true,
        store: zarrgate::store::open::open(&source, &config).unwrap(),
        tokens: Vec::new(),
    }
}

fn runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap()
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
