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
