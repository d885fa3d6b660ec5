//! Helpers of the tests of remote mounts (remote.rs, clouds.rs): protocol servers
//! started on 127.0.0.1 and stopped on drop, the project's installers of what they need, and
//! the checks that a remote mount reads as the local fixtures do.

use std::net::TcpListener;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use zarrgate::config::Config;
use zarrgate::state::Mount;
use zarrgate::store::{Store, open_local};

use super::cases::run_manifest_on;
use super::{CountingStore, fixtures, get, repo, request};

/// A port for an emulator, which must be told one: free when picked, and never one this process
/// has handed out before. The kernel may give a port again as soon as the listener that found
/// it is closed, and the tests that start emulators run at the same time.
pub fn free_port() -> u16 {
    static GIVEN: std::sync::Mutex<std::collections::BTreeSet<u16>> =
        std::sync::Mutex::new(std::collections::BTreeSet::new());
    loop {
        let port = TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port();
        if GIVEN.lock().unwrap_or_else(|e| e.into_inner()).insert(port) {
            return port;
        }
    }
}

pub fn wait_for_port(port: u16, limit: Duration) -> bool {
    let start = Instant::now();
    while start.elapsed() < limit {
        if std::net::TcpStream::connect(("127.0.0.1", port)).is_ok() {
            return true;
        }
        std::thread::sleep(Duration::from_millis(100));
    }
    false
}

/// A server process of a test, listening on `port` once started; killed on drop.
pub struct Server {
    child: Option<Child>,
    pub port: u16,
}

impl Server {
    /// Starts `command` (its output discarded) and waits up to 60 s for `port` to listen.
    pub fn start(mut command: Command, port: u16) -> Server {
        let child = command
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .unwrap_or_else(|e| panic!("{command:?} starts: {e}"));
        let mut server = Server {
            child: Some(child),
            port,
        };
        if !wait_for_port(port, Duration::from_secs(60)) {
            server.stop();
            panic!("{command:?} listens on {port}");
        }
        server
    }

    pub fn stop(&mut self) {
        if let Some(mut c) = self.child.take() {
            let _ = c.kill();
            let _ = c.wait();
        }
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        self.stop();
    }
}

/// A test that cannot have what it needs skips with `why`, except where
/// `ZARRGATE_EXPECT_EMULATORS` is set (CI, whose machine reaches the package registries), where
/// it fails: a skip there would hide an installer that broke.
pub fn skip(why: &str) {
    assert!(
        std::env::var_os("ZARRGATE_EXPECT_EMULATORS").is_none(),
        "ZARRGATE_EXPECT_EMULATORS is set, and {why}"
    );
    eprintln!("skipped: {why}");
}

/// Runs one of the project's installers (`scripts/python-env.sh`, `scripts/node-env.sh`), which
/// prints the directory it made; `None` ([`skip`]) when it fails (no network, say).
fn installed(script: &str, args: &[&str], what: &str) -> Option<PathBuf> {
    let out = Command::new(repo().join(script))
        .args(args)
        .current_dir(repo())
        .stderr(Stdio::inherit())
        .output();
    match out {
        Ok(out) if out.status.success() => Some(PathBuf::from(String::from_utf8_lossy(&out.stdout).trim())),
        _ => {
            skip(&format!(
                "{what} could not be installed ({script} {} failed)",
                args.join(" ")
            ));
            None
        }
    }
}

/// The Python venv `name` with `requirements` (a path in the repository).
pub fn python_env(name: &str, requirements: &str) -> Option<PathBuf> {
    installed("scripts/python-env.sh", &[name, requirements], name)
}

/// The node_modules of the npm packages pinned in `dir` (a path in the repository).
pub fn node_env(dir: &str) -> Option<PathBuf> {
    installed("scripts/node-env.sh", &[dir], dir)
}

pub fn counted(store: Store, gets: &Arc<AtomicUsize>) -> Store {
    Store::new(CountingStore {
        inner: store,
        gets: gets.clone(),
        list_delay: Duration::ZERO,
        list_error: None,
    })
}

pub fn app_with(mounts: Vec<Mount>) -> (zarrgate::App, zarrgate::AppState) {
    let state = zarrgate::AppState::with_mounts(Config::default(), mounts);
    (zarrgate::app(state.clone()), state)
}

pub fn local_mount() -> Mount {
    Mount::new("fx", "local", "fx".into(), Store::new(open_local(&fixtures()).unwrap()))
}

/// A mount named `kind` of `store`.
pub fn remote_mount(kind: &'static str, store: Store) -> Mount {
    Mount::new(kind, kind, format!("{kind}://test"), store)
}

/// Every file below `dir`, as (key relative to `dir` with `/` separators, path).
pub fn files_below(dir: &Path) -> Vec<(String, PathBuf)> {
    let mut found = Vec::new();
    let mut stack = vec![dir.to_owned()];
    while let Some(d) = stack.pop() {
        for entry in std::fs::read_dir(&d).unwrap() {
            let path = entry.unwrap().path();
            if path.is_dir() {
                stack.push(path);
            } else {
                let rel = path.strip_prefix(dir).unwrap();
                let key = rel.iter().map(|s| s.to_str().unwrap()).collect::<Vec<_>>().join("/");
                found.push((key, path));
            }
        }
    }
    found
}

/// Raw keys, slices and ZOM through `remote` equal those of the local fixtures.
pub async fn same_as_local(app: &zarrgate::App, remote: &str) {
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
        let r = get(app, &format!("/zarr/{remote}/{key}"), &[("range", "bytes=2-5")]).await;
        assert_eq!(r.status, 206, "{remote} {key}");
        assert_eq!(&r.body[..], &want[2..6]);
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

/// A remote `store` holding the fixtures (below its root) reads as they do: every fixture array
/// equals zarr-python's values, raw keys, slices and ZOM equal the local mount's, and a
/// one-chunk slice of a sharded array reads three objects (metadata, shard index, inner chunk),
/// then none once cached.
pub fn reads_as_local(rt: &tokio::runtime::Runtime, store: &Store, kind: &'static str) {
    let (n, failures) = run_manifest_on(store, &repo().join("tests/fixtures/cases.json"), |p| Some(p.to_owned()));
    assert!(
        n > 150 && failures.is_empty(),
        "{kind}: {} of {n} failed:\n{}",
        failures.len(),
        failures.join("\n")
    );
    rt.block_on(async {
        let (app, _) = app_with(vec![remote_mount(kind, store.clone()), local_mount()]);
        same_as_local(&app, kind).await;

        let gets = Arc::new(AtomicUsize::new(0));
        let (app, _) = app_with(vec![remote_mount(kind, counted(store.clone(), &gets)), local_mount()]);
        let one = format!("/api/v1/slice/{kind}/v3/sharding_start_i4?select=0,0");
        let r = get(&app, &one, &[]).await;
        assert_eq!(r.status, 200, "{kind}");
        assert_eq!(
            gets.load(Ordering::SeqCst),
            3,
            "{kind}: zarr.json + shard index + one inner chunk"
        );
        get(&app, &one, &[]).await;
        assert_eq!(gets.load(Ordering::SeqCst), 3, "{kind}: warm, nothing read");
        let meta: serde_json::Value =
            serde_json::from_slice(&std::fs::read(fixtures().join("v3/sharding_start_i4/zarr.json")).unwrap()).unwrap();
        let inner = meta["codecs"][0]["configuration"]["chunk_shape"][1].as_u64().unwrap();
        let other = format!("/api/v1/slice/{kind}/v3/sharding_start_i4?select=0,{inner}");
        assert_eq!(get(&app, &other, &[]).await.status, 200);
        assert_eq!(
            gets.load(Ordering::SeqCst),
            4,
            "{kind}: same shard, another inner chunk: the index is cached"
        );
        let expected = get(&app, "/api/v1/slice/fx/v3/sharding_start_i4?select=0,0", &[]).await;
        assert_eq!(r.json(), expected.json(), "{kind}");
    });
}

/// With its server gone, a remote mount answers 502/504 quickly, and the server goes on
/// serving its other mounts.
pub fn fails_quickly_when_gone(rt: &tokio::runtime::Runtime, store: &Store, kind: &'static str) {
    rt.block_on(async {
        let (app, _) = app_with(vec![remote_mount(kind, store.clone()), local_mount()]);
        let start = Instant::now();
        let r = get(&app, &format!("/zarr/{kind}/v3/zstd_i4/zarr.json"), &[]).await;
        assert!(
            matches!(r.status.as_u16(), 502 | 504),
            "{kind}: {} {:?}",
            r.status,
            r.body
        );
        assert!(
            matches!(r.error_code().as_str(), "upstream_error" | "upstream_timeout"),
            "{kind}: {:?}",
            r.body
        );
        let r = get(&app, &format!("/api/v1/slice/{kind}/v3/zstd_i4"), &[]).await;
        assert!(matches!(r.status.as_u16(), 502 | 504), "{kind}: {}", r.status);
        assert!(
            start.elapsed() < Duration::from_secs(15),
            "{kind}: failed in {:?}",
            start.elapsed()
        );
        assert_eq!(get(&app, "/healthz", &[]).await.status, 200);
        assert_eq!(get(&app, "/api/v1/slice/fx/v3/zstd_i4", &[]).await.status, 200);
    });
}

/// A TCP proxy on 127.0.0.1 in front of an upstream (an emulator): it passes bytes both ways
/// and keeps the head of every request clients send through it (its request line, and its
/// Range and If-None-Match fields), to count what reaches the upstream. Requests are taken to
/// have no body, as reads have none.
pub struct CountingProxy {
    pub port: u16,
    pub requests: Arc<std::sync::Mutex<Vec<String>>>,
}

impl CountingProxy {
    pub fn start(upstream: u16) -> CountingProxy {
        use std::io::{Read, Write};
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let port = listener.local_addr().unwrap().port();
        let requests = Arc::new(std::sync::Mutex::new(Vec::new()));
        let seen = requests.clone();
        std::thread::spawn(move || {
            for client in listener.incoming() {
                let Ok(mut client) = client else { continue };
                let Ok(mut server) = std::net::TcpStream::connect(("127.0.0.1", upstream)) else {
                    continue;
                };
                let (mut client_back, mut server_back) = (client.try_clone().unwrap(), server.try_clone().unwrap());
                std::thread::spawn(move || {
                    let _ = std::io::copy(&mut server_back, &mut client_back);
                    let _ = client_back.shutdown(std::net::Shutdown::Both);
                });
                let seen = seen.clone();
                std::thread::spawn(move || {
                    let (mut pending, mut buf) = (Vec::new(), [0u8; 16 << 10]);
                    loop {
                        let n = match client.read(&mut buf) {
                            Ok(0) | Err(_) => break,
                            Ok(n) => n,
                        };
                        pending.extend_from_slice(&buf[..n]);
                        while let Some(end) = pending.windows(4).position(|w| w == b"\r\n\r\n") {
                            let head = String::from_utf8_lossy(&pending[..end]).into_owned();
                            pending.drain(..end + 4);
                            let mut lines = head.lines();
                            let mut noted = lines.next().unwrap_or("").to_owned();
                            for line in lines {
                                let lower = line.to_ascii_lowercase();
                                if lower.starts_with("range:") || lower.starts_with("if-none-match:") {
                                    noted.push_str(" | ");
                                    noted.push_str(line);
                                }
                            }
                            seen.lock().unwrap().push(noted);
                        }
                        if server.write_all(&buf[..n]).is_err() {
                            break;
                        }
                    }
                    let _ = server.shutdown(std::net::Shutdown::Both);
                });
            }
        });
        CountingProxy { port, requests }
    }

    /// The requests seen whose noted head contains `part` (in any case).
    pub fn count(&self, part: &str) -> usize {
        let part = part.to_ascii_lowercase();
        let requests = self.requests.lock().unwrap();
        requests
            .iter()
            .filter(|r| r.to_ascii_lowercase().contains(&part))
            .count()
    }
}
