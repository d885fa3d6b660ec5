//! The binary's start-up errors: they name the culprit and exit non-zero.

use std::process::Command;

fn zarrgate(args: &[&str], dir: &std::path::Path) -> (bool, String) {
    let out = Command::new(env!("CARGO_BIN_EXE_zarrgate"))
        .args(args)
        .current_dir(dir)
        .env_remove("ZARRGATE_CONFIG")
        .env_remove("ZARRGATE_BIND")
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
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let bind = format!("127.0.0.1:{port}");
    let mut child = Command::new(env!("CARGO_BIN_EXE_zarrgate"))
        .args(["serve", "--bind", &bind, "--mount", "d=."])
        .current_dir(dir.path())
        .env_remove("ZARRGATE_CONFIG")
        .env_remove("ZARRGATE_BIND")
        .env("ZARRGATE_LOG", "info,[")
        .stdout(std::process::Stdio::null())
        .stderr(std::fs::File::create(dir.path().join("log")).unwrap())
        .spawn()
        .unwrap();
    let start = std::time::Instant::now();
    let mut conn = loop {
        match std::net::TcpStream::connect(&bind) {
            Ok(c) => break c,
            Err(_) if start.elapsed() < std::time::Duration::from_secs(10) => {
                std::thread::sleep(std::time::Duration::from_millis(50))
            }
            Err(e) => panic!("the server did not start: {e}"),
        }
    };
    // `zarrgate healthcheck` asks the server where `serve` with the same options listens (a
    // wildcard address on loopback), and fails where nothing answers.
    let check = |bind: &str| {
        Command::new(env!("CARGO_BIN_EXE_zarrgate"))
            .args(["healthcheck", "--bind", bind, "--mount", "d=."])
            .current_dir(dir.path())
            .env_remove("ZARRGATE_CONFIG")
            .env_remove("ZARRGATE_BIND")
            .output()
            .unwrap()
    };
    for bind in [bind.clone(), format!("0.0.0.0:{port}")] {
        let out = check(&bind);
        assert!(out.status.success(), "{bind}: {}", String::from_utf8_lossy(&out.stderr));
        assert!(String::from_utf8_lossy(&out.stdout).contains("healthy"));
    }
    let nobody = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap();
    let out = check(&nobody.to_string());
    assert!(!out.status.success());
    assert!(String::from_utf8_lossy(&out.stderr).contains("unhealthy"));
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
    let second = std::time::Instant::now();
    unsafe { libc::kill(pid, libc::SIGTERM) };
    let status = loop {
        if let Some(status) = child.try_wait().unwrap() {
            break status;
        }
        if second.elapsed() > std::time::Duration::from_secs(10) {
            let _ = child.kill();
            panic!("still running 10 s after a second signal");
        }
        std::thread::sleep(std::time::Duration::from_millis(50));
    };
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
