//! The binary's start-up errors: they name the culprit and exit non-zero.

use std::process::Command;

fn zarrgate(args: &[&str], dir: &std::path::Path) -> (bool, String) {
    zarrgate_with(args, dir, &[])
}

/// The binary, run in `dir`, without the settings this test process's environment may hold.
fn command(dir: &std::path::Path) -> Command {
    let mut command = Command::new(env!("CARGO_BIN_EXE_zarrgate"));
    command
        .current_dir(dir)
        .env_remove("ZARRGATE_CONFIG")
        .env_remove("ZARRGATE_BIND")
        .env_remove("ZARRGATE_HEALTH_BIND")
        .env_remove("ZARRGATE_LOG_FORMAT");
    command
}

fn zarrgate_with(args: &[&str], dir: &std::path::Path, envs: &[(&str, &str)]) -> (bool, String) {
    let out = command(dir)
        .args(args)
        .envs(envs.iter().copied())
        .output()
        .expect("the binary runs");
    (out.status.success(), String::from_utf8_lossy(&out.stderr).into_owned())
}

#[test]
fn bad_config_stops_start_up_with_a_message() {
    let dir = tempfile::tempdir().unwrap();
    // With `serve`, or without it (as `docker run zarrgate --mount ...` gives them).
    for args in [
        &["serve", "--mount", "lost=./no/such/dir"][..],
        &["--mount", "lost=./no/such/dir"],
    ] {
        let (ok, err) = zarrgate(args, dir.path());
        assert!(!ok);
        assert!(err.contains("mount 'lost'"), "{args:?}: {err}");
    }
    // Options on both sides of the subcommand are refused.
    let (ok, err) = zarrgate(&["--bind", "127.0.0.1:0", "serve"], dir.path());
    assert!(!ok && err.contains("cannot be used with"), "{err}");

    std::fs::write(
        dir.path().join("config.toml"),
        "[server]\nbind = \"127.0.0.1:0\"\ncors = 1\n",
    )
    .unwrap();
    let (ok, err) = zarrgate(&[], dir.path());
    assert!(!ok);
    assert!(err.contains("cors"), "{err}");

    let (ok, err) = zarrgate(&["serve", "--config", "missing.toml"], dir.path());
    assert!(!ok);
    assert!(err.contains("missing.toml"), "{err}");

    let (ok, err) = zarrgate(&["serve", "--config", "/dev/null", "--mount", "x=s3x://b"], dir.path());
    assert!(!ok);
    assert!(err.contains("mount 'x'") && err.contains("s3x"), "{err}");

    // An empty URL is no mount of the working directory.
    let (ok, err) = zarrgate(&["serve", "--config", "/dev/null", "--mount", "e= "], dir.path());
    assert!(
        !ok && err.contains("mount 'e'") && err.contains("url is empty"),
        "{err}"
    );
}

/// Start-up lines go to a standard output that may be closed (`zarrgate serve | head -1`): the
/// server serves on. An empty `ZARRGATE_LOG` is unset: requests are logged at `info`.
#[test]
fn a_closed_stdout_and_an_empty_log_filter() {
    use std::io::{Read, Write};
    let dir = tempfile::tempdir().unwrap();
    // Its first line read and its standard output closed, as `| head -1` does.
    let (mut child, _, mut conn) = spawn_server(dir.path(), &[], &[("ZARRGATE_LOG", "")]);
    conn.write_all(b"GET /healthz HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
        .unwrap();
    let mut reply = String::new();
    conn.read_to_string(&mut reply).unwrap();
    assert!(reply.starts_with("HTTP/1.1 200"), "{reply}");
    let _ = child.kill();
    let _ = child.wait();
    let log = std::fs::read_to_string(dir.path().join("log")).unwrap();
    assert!(!log.contains("panicked"), "{log}");
    // The text format quotes the path, as it does every string field.
    assert!(
        log.contains("zarrgate::access") && log.contains("path=\"/healthz\""),
        "{log}"
    );
}

/// A server process of a test, killed (and reaped) when the test ends, a failed assertion
/// included: a failing test does not leave its server running.
struct Spawned(std::process::Child);

impl std::ops::Deref for Spawned {
    type Target = std::process::Child;
    fn deref(&self) -> &Self::Target {
        &self.0
    }
}

impl std::ops::DerefMut for Spawned {
    fn deref_mut(&mut self) -> &mut Self::Target {
        &mut self.0
    }
}

impl Drop for Spawned {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// Starts `zarrgate serve` on a port of its choosing in `dir`, mounting it as `d`, with `args`
/// and `envs` added and stderr written to `dir/log`; returns the child, its address (from its
/// first line of output, after which the pipe is closed, as `| head -1` does) and a connection
/// to it. A port picked ahead (bound to port 0, closed, then given to the server) could be
/// taken in between by the server of another test running at the same time, which this test
/// would then talk to.
fn spawn_server(dir: &std::path::Path, args: &[&str], envs: &[(&str, &str)]) -> (Spawned, String, std::net::TcpStream) {
    use std::io::BufRead;
    let mut child = Spawned(
        command(dir)
            .args(["serve", "--bind", "127.0.0.1:0", "--mount", "d=."])
            .args(args)
            .envs(envs.iter().copied())
            .stdout(std::process::Stdio::piped())
            .stderr(std::fs::File::create(dir.join("log")).unwrap())
            .spawn()
            .unwrap(),
    );
    let mut line = String::new();
    if let Some(stdout) = child.stdout.take() {
        // Nothing when the server exits first: the check below says so.
        let _ = std::io::BufReader::new(stdout).read_line(&mut line);
    }
    let Some(bind) = line
        .trim()
        .strip_prefix("zarrgate listening on http://")
        .and_then(|rest| rest.strip_suffix('/'))
        .map(str::to_string)
    else {
        panic!("the server did not start: its first line was {line:?}")
    };
    let conn = std::net::TcpStream::connect(&bind).unwrap();
    (child, bind, conn)
}

/// Waits up to `most` for the child to exit.
fn exit_within(child: &mut std::process::Child, most: std::time::Duration) -> std::process::ExitStatus {
    let start = std::time::Instant::now();
    loop {
        if let Some(status) = child.try_wait().unwrap() {
            return status;
        }
        if start.elapsed() > most {
            let _ = child.kill();
            panic!("still running {most:?} later");
        }
        std::thread::sleep(std::time::Duration::from_millis(50));
    }
}

/// `ZARRGATE_HEALTH_BIND`: `serve` listens there too and says where (its second line), and
/// `zarrgate healthcheck` asks there when it is set, whatever `bind` says.
#[test]
fn the_health_listener_is_where_healthcheck_asks() {
    use std::io::BufRead;
    let dir = tempfile::tempdir().unwrap();
    let mut child = Spawned(
        command(dir.path())
            .args(["serve", "--bind", "127.0.0.1:0", "--mount", "d=."])
            .env("ZARRGATE_HEALTH_BIND", "127.0.0.1:0")
            .stdout(std::process::Stdio::piped())
            .stderr(std::process::Stdio::null())
            .spawn()
            .unwrap(),
    );
    let mut lines = std::io::BufReader::new(child.stdout.take().unwrap()).lines();
    let first = lines.next().unwrap().unwrap();
    let bind = first
        .trim()
        .strip_prefix("zarrgate listening on http://")
        .and_then(|rest| rest.strip_suffix('/'))
        .unwrap_or_else(|| panic!("{first}"))
        .to_string();
    let second = lines.next().unwrap().unwrap();
    let health = second
        .trim()
        .strip_prefix("health and metrics also on http://")
        .and_then(|rest| rest.strip_suffix("/healthz, /readyz, /metrics"))
        .unwrap_or_else(|| panic!("{second}"))
        .to_string();
    // Bound and never answering (a port released could be another test's server's by then).
    let silent = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let nobody = silent.local_addr().unwrap().to_string();
    let check = |bind: &str, health_bind: &str| {
        command(dir.path())
            .args(["healthcheck", "--bind", bind])
            .env("ZARRGATE_HEALTH_BIND", health_bind)
            .output()
            .unwrap()
    };
    let out = check(&nobody, &health);
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    assert!(String::from_utf8_lossy(&out.stdout).contains(&health));
    // Set, it is asked rather than bind: with the server on bind and nothing at it, unhealthy.
    let out = check(&bind, &nobody);
    assert!(!out.status.success());
    drop(silent);
    drop(lines);
    drop(child);
}

/// A running server as a container sees it: `zarrgate healthcheck` finds it healthy; SIGTERM
/// stops accepting and lets responses under way finish, and a second signal ends them at once
/// rather than after the drain time (30 s). The log says so of a ZARRGATE_LOG that is no
/// filter, and writes a long URL's path cut at 1 KiB.
#[cfg(unix)]
#[test]
fn healthcheck_signals_and_the_log() {
    use std::io::{Read, Write};
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(dir.path().join("big"), vec![7u8; 64 << 20]).unwrap();
    let (mut child, bind, mut conn) = spawn_server(dir.path(), &[], &[("ZARRGATE_LOG", "info,[")]);
    let port = conn.peer_addr().unwrap().port();
    // `zarrgate healthcheck` asks the server where `serve` with the same options listens (a
    // wildcard address on loopback), and fails where nothing answers.
    let check = |bind: &str, mount: &str| {
        command(dir.path())
            .args(["healthcheck", "--bind", bind, "--mount", mount])
            .output()
            .unwrap()
    };
    for bind in [bind.clone(), format!("0.0.0.0:{port}")] {
        let out = check(&bind, "d=.");
        assert!(out.status.success(), "{bind}: {}", String::from_utf8_lossy(&out.stderr));
        assert!(String::from_utf8_lossy(&out.stdout).contains("healthy"));
    }
    let nobody = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap();
    let out = check(&nobody.to_string(), "d=.");
    assert!(!out.status.success());
    assert!(String::from_utf8_lossy(&out.stderr).contains("unhealthy"));
    // It needs the address, not the mounts: one whose directory is missing where it runs (or
    // whose token variable is unset there) does not make a healthy server unhealthy.
    let out = check(&bind, "gone=./no/such/dir");
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    // A request of a long URL (414) is logged with its path cut at 1 KiB.
    let mut long = std::net::TcpStream::connect(&bind).unwrap();
    let path = format!("/zarr/d/{}", "x".repeat(9000));
    write!(long, "GET {path} HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n").unwrap();
    let mut reply = String::new();
    long.read_to_string(&mut reply).unwrap();
    assert!(reply.starts_with("HTTP/1.1 414"), "{reply}");
    // A response under way that this client does not read: it stalls once the buffers fill.
    conn.write_all(b"GET /zarr/d/big HTTP/1.1\r\nHost: x\r\n\r\n").unwrap();
    let mut head = [0u8; 12];
    conn.read_exact(&mut head).unwrap();
    assert_eq!(&head, b"HTTP/1.1 200");
    let pid = child.id() as i32;
    // SAFETY: signals sent to the child this test started.
    unsafe { libc::kill(pid, libc::SIGTERM) };
    std::thread::sleep(std::time::Duration::from_millis(500));
    assert!(
        child.try_wait().unwrap().is_none(),
        "the response under way is let finish"
    );
    unsafe { libc::kill(pid, libc::SIGTERM) };
    let status = exit_within(&mut child, std::time::Duration::from_secs(10));
    assert!(status.success(), "{status:?}");
    drop(conn);
    let log = std::fs::read_to_string(dir.path().join("log")).unwrap();
    // A bad ZARRGATE_LOG is said, not silently replaced.
    assert!(log.contains("ZARRGATE_LOG is not a log filter"), "{log}");
    let line = log
        .lines()
        .find(|l| l.contains("status=414"))
        .expect("the 414 is logged");
    assert!(line.len() < 1300 && line.contains("xxx..."), "{} chars", line.len());
}

/// SIGTERM drains for `server.drain_seconds`: `/readyz` turns 503 at once while requests,
/// on new connections too, are still served; then nothing more is accepted, and a response
/// its client does not read is given up after `drain_seconds` more, with no second signal. `ZARRGATE_LOG_FORMAT=json` writes each log line as one JSON object,
/// the access line's fields at its top level; a value other than text or json stops start-up.
#[cfg(unix)]
#[test]
fn drain_time_and_json_logs() {
    use std::io::{Read, Write};
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(dir.path().join("big"), vec![7u8; 64 << 20]).unwrap();
    std::fs::write(dir.path().join("small"), b"0123456789").unwrap();
    std::fs::write(dir.path().join("zg.toml"), "[server]\ndrain_seconds = 1.5\n").unwrap();
    let (mut child, bind, mut conn) = spawn_server(
        dir.path(),
        &["--config", "zg.toml"],
        &[("ZARRGATE_LOG_FORMAT", "json"), ("ZARRGATE_LOG", "info")],
    );
    conn.write_all(b"GET /zarr/d/small HTTP/1.1\r\nHost: x\r\n\r\n")
        .unwrap();
    let mut reply = [0u8; 512];
    let n = conn.read(&mut reply).unwrap();
    assert!(reply[..n].starts_with(b"HTTP/1.1 200"));
    // A response under way that this client does not read.
    conn.write_all(b"GET /zarr/d/big HTTP/1.1\r\nHost: x\r\n\r\n").unwrap();
    std::thread::sleep(std::time::Duration::from_millis(300));
    let signalled = std::time::Instant::now();
    // SAFETY: a signal sent to the child this test started.
    unsafe { libc::kill(child.id() as i32, libc::SIGTERM) };
    std::thread::sleep(std::time::Duration::from_millis(300));
    let ask = |path: &str| {
        let mut c = std::net::TcpStream::connect(&bind).unwrap();
        c.write_all(format!("GET {path} HTTP/1.1\r\nHost: x\r\n\r\n").as_bytes())
            .unwrap();
        let mut reply = Vec::new();
        // The answer closes the connection while draining: read to its end.
        c.read_to_end(&mut reply).unwrap();
        String::from_utf8_lossy(&reply).into_owned()
    };
    let ready = ask("/readyz");
    assert!(
        ready.starts_with("HTTP/1.1 503") && ready.contains("not_ready"),
        "{ready}"
    );
    let small = ask("/zarr/d/small");
    assert!(
        small.starts_with("HTTP/1.1 200") && small.to_ascii_lowercase().contains("connection: close"),
        "{small}"
    );
    assert!(small.ends_with("0123456789"), "{small}");
    std::thread::sleep(std::time::Duration::from_millis(700));
    assert!(child.try_wait().unwrap().is_none(), "the drain lasts drain_seconds");
    let status = exit_within(&mut child, std::time::Duration::from_secs(10));
    let took = signalled.elapsed();
    assert!(status.success(), "{status:?}");
    // Serving on for 1.5 s, then 1.5 s for the response its client does not read.
    assert!(took >= std::time::Duration::from_millis(2900), "{took:?}");
    drop(conn);
    let log = std::fs::read_to_string(dir.path().join("log")).unwrap();
    let lines: Vec<serde_json::Value> = log
        .lines()
        .map(|l| serde_json::from_str(l).unwrap_or_else(|e| panic!("{e}: {l}")))
        .collect();
    let access = lines
        .iter()
        .find(|l| l["target"] == "zarrgate::access" && l["path"] == "/zarr/d/small")
        .unwrap_or_else(|| panic!("no access line for /zarr/d/small: {log}"));
    assert_eq!(access["status"], 200, "{access}");
    assert_eq!(access["bytes"], 10, "{access}");
    assert_eq!(access["method"], "GET", "{access}");
    // Milliseconds to the microsecond: three decimals at most.
    for field in ["ms", "head_ms"] {
        let ms = access[field].as_f64().unwrap_or(-1.0);
        assert!(
            ms >= 0.0 && (ms * 1e3 - (ms * 1e3).round()).abs() < 1e-6,
            "{field}: {access}"
        );
    }
    assert!(
        lines
            .iter()
            .all(|l| l["level"].is_string() && l["timestamp"].is_string())
    );

    let (ok, err) = zarrgate_with(
        &["serve", "--mount", "d=."],
        dir.path(),
        &[("ZARRGATE_LOG_FORMAT", "yaml")],
    );
    assert!(!ok && err.contains("ZARRGATE_LOG_FORMAT"), "{err}");
}
