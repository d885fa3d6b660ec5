//! Every raw-key rule of DESIGN.md, asserted on status, headers and bytes against the files on
//! disk, through `app(state)` without sockets.

use crate::common::*;
use proptest::prelude::*;

const CHUNK: &str = "/zarr/fx/v2/compressor_zstd_i4/0.0";

fn chunk_bytes() -> Vec<u8> {
    std::fs::read(fixtures().join("v2/compressor_zstd_i4/0.0")).unwrap()
}

#[tokio::test]
async fn get_serves_the_file_byte_for_byte() {
    let app = fixture_app();
    let expected = chunk_bytes();
    let r = get(&app, CHUNK, &[("accept-encoding", "gzip, br, zstd")]).await;
    assert_eq!(r.status, 200);
    assert_eq!(&r.body[..], &expected[..]);
    assert_eq!(r.header("content-length"), Some(expected.len().to_string().as_str()));
    assert_eq!(r.header("accept-ranges"), Some("bytes"));
    assert_eq!(r.header("content-encoding"), None, "chunks are never re-encoded");
    assert_eq!(r.header("content-type"), Some("application/octet-stream"));
    let etag = r.header("etag").unwrap();
    assert!(
        etag.starts_with('"') && etag.ends_with('"') && etag.len() > 2,
        "strong etag: {etag}"
    );
    let modified = httpdate::parse_http_date(r.header("last-modified").unwrap()).unwrap();
    let on_disk = std::fs::metadata(fixtures().join("v2/compressor_zstd_i4/0.0"))
        .unwrap()
        .modified()
        .unwrap();
    assert!(on_disk.duration_since(modified).unwrap().as_secs() < 1);
}

/// A plain GET (and a ranged one, on a store that resolves ranges) is one store read; the
/// same validators come back as with HEAD, and a conditional GET still answers 304.
#[tokio::test]
async fn a_plain_get_is_one_store_read() {
    use std::sync::atomic::Ordering;
    let (app, _, reads) = counting_app(&fixtures(), zarrgate::config::Config::default());
    let uri = "/zarr/m/v2/compressor_zstd_i4/0.0";
    let expected = chunk_bytes();
    for (range, want) in [
        (None, &expected[..]),
        (Some("bytes=-5"), &expected[expected.len() - 5..]),
    ] {
        let before = reads.load(Ordering::SeqCst);
        let headers: Vec<(&str, &str)> = range.iter().map(|r| ("range", *r)).collect();
        let r = get(&app, uri, &headers).await;
        assert_eq!(&r.body[..], want);
        assert_eq!(reads.load(Ordering::SeqCst) - before, 1, "{range:?}");
    }
    let whole = get(&app, uri, &[]).await;
    let head = request(&app, "HEAD", uri, &[]).await;
    for h in [
        "etag",
        "last-modified",
        "content-length",
        "content-type",
        "accept-ranges",
    ] {
        assert_eq!(whole.header(h), head.header(h), "{h}");
    }
    let etag = whole.header("etag").unwrap().to_owned();
    assert_eq!(get(&app, uri, &[("if-none-match", &etag)]).await.status, 304);
    let r = get(&app, uri, &[("range", "bytes=100000-")]).await;
    assert_eq!(r.status, 416);
    assert_eq!(
        r.header("content-range"),
        Some(format!("bytes */{}", expected.len()).as_str())
    );
    assert_eq!(get(&app, "/zarr/m/v2/compressor_zstd_i4/9.9", &[]).await.status, 404);
}

#[tokio::test]
async fn metadata_keys_are_json() {
    let app = fixture_app();
    let r = get(&app, "/zarr/fx/v2/compressor_zstd_i4/.zarray", &[]).await;
    assert_eq!(r.status, 200);
    assert_eq!(r.header("content-type"), Some("application/json"));
    assert_eq!(r.json()["zarr_format"], 2);
}

#[tokio::test]
async fn head_gives_exact_length_and_no_body() {
    let app = fixture_app();
    let expected = chunk_bytes();
    let r = request(&app, "HEAD", CHUNK, &[]).await;
    assert_eq!(r.status, 200);
    assert!(r.body.is_empty());
    assert_eq!(r.header("content-length"), Some(expected.len().to_string().as_str()));
    assert!(r.header("etag").is_some());
}

#[tokio::test]
async fn missing_keys_and_directories_are_404_on_get_and_head() {
    let app = fixture_app();
    for uri in [
        "/zarr/fx/v2/compressor_zstd_i4/.zgroup",
        "/zarr/fx/v2/compressor_zstd_i4/zarr.json",
        "/zarr/fx/v2/compressor_zstd_i4/9.9",
        "/zarr/fx/v2/compressor_zstd_i4",
        "/zarr/fx/v2/compressor_zstd_i4/",
        "/zarr/fx/v2",
        "/zarr/fx/",
        "/zarr/fx",
    ] {
        let r = get(&app, uri, &[]).await;
        assert_eq!(r.status, 404, "GET {uri}");
        assert_eq!(r.error_code(), "not_found", "GET {uri}");
        let r = request(&app, "HEAD", uri, &[]).await;
        assert_eq!(r.status, 404, "HEAD {uri}");
    }
    let r = get(&app, "/zarr/nope/x", &[]).await;
    assert_eq!(r.status, 404);
    assert_eq!(r.error_code(), "unknown_mount");
}

#[tokio::test]
async fn single_ranges() {
    let app = fixture_app();
    let full = chunk_bytes();
    let n = full.len();
    assert!(n > 20, "fixture chunk is big enough for the range cases");
    let last = format!("bytes={}-{}", n - 1, n - 1);
    let cases: [(&str, std::ops::Range<usize>); 6] = [
        ("bytes=0-9", 0..10),
        ("bytes=5-", 5..n),
        ("bytes=-7", n - 7..n),
        ("bytes=3-100000", 3..n),
        ("bytes=-100000", 0..n),
        (&last, n - 1..n),
    ];
    for (range, want) in cases {
        let r = get(&app, CHUNK, &[("range", range)]).await;
        assert_eq!(r.status, 206, "{range}");
        assert_eq!(&r.body[..], &full[want.clone()], "{range}");
        assert_eq!(
            r.header("content-range"),
            Some(format!("bytes {}-{}/{}", want.start, want.end - 1, n).as_str()),
            "{range}"
        );
        assert_eq!(r.header("content-length"), Some(want.len().to_string().as_str()));
    }
}

/// HEAD ignores Range (RFC 9110 section 14.2: ranges are defined for GET only): it states
/// the whole object, as the GET without a range, for a range it could serve and one it could
/// not.
#[tokio::test]
async fn head_ignores_range() {
    let app = fixture_app();
    let n = chunk_bytes().len().to_string();
    for range in ["bytes=0-9", "bytes=-7", "bytes=100000-"] {
        for conditional in [None, Some(("if-modified-since", "Thu, 01 Jan 1970 00:00:00 GMT"))] {
            let mut headers = vec![("range", range)];
            headers.extend(conditional);
            let r = request(&app, "HEAD", CHUNK, &headers).await;
            assert_eq!(r.status, 200, "{range} {conditional:?}");
            assert_eq!(r.header("content-length"), Some(n.as_str()), "{range}");
            assert_eq!(r.header("content-range"), None, "{range}");
            assert!(r.body.is_empty());
        }
    }
    // GET still honours it.
    assert_eq!(get(&app, CHUNK, &[("range", "bytes=0-9")]).await.status, 206);
}

/// A modification time still to come is stated as now (RFC 9110 section 8.8.2.1: never later
/// than the response's date), so that a client revalidating by the date it was given gets the
/// bytes of a later change rather than 304s until then.
#[tokio::test]
async fn modification_times_to_come_are_stated_as_now() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("future");
    std::fs::write(&path, b"old").unwrap();
    let later = std::time::SystemTime::now() + std::time::Duration::from_secs(3 * 365 * 86400);
    std::fs::File::options()
        .write(true)
        .open(&path)
        .unwrap()
        .set_modified(later)
        .unwrap();
    let app = app_for(&[("t", dir.path())]);
    for method in ["GET", "HEAD"] {
        let r = request(&app, method, "/zarr/t/future", &[]).await;
        assert_eq!(r.status, 200);
        let stated = httpdate::parse_http_date(r.header("last-modified").unwrap()).unwrap();
        assert!(stated <= std::time::SystemTime::now(), "{method}: {stated:?}");
    }
}

#[tokio::test]
async fn unsatisfiable_and_ignored_ranges() {
    let app = fixture_app();
    let full = chunk_bytes();
    let n = full.len();
    for range in [
        format!("bytes={n}-"),
        format!("bytes={}-{}", n + 5, n + 9),
        "bytes=-0".to_string(),
    ] {
        let r = get(&app, CHUNK, &[("range", &range)]).await;
        assert_eq!(r.status, 416, "{range}");
        assert_eq!(r.header("content-range"), Some(format!("bytes */{n}").as_str()));
        assert_eq!(r.error_code(), "range_not_satisfiable");
    }
    // Multi-range, other units and bad syntax: the whole object with 200.
    for range in ["bytes=0-1,4-5", "items=0-3", "bytes=9-2", "bytes=x-y"] {
        let r = get(&app, CHUNK, &[("range", range)]).await;
        assert_eq!(r.status, 200, "{range}");
        assert_eq!(&r.body[..], &full[..]);
    }
    // The unit in any case, and empty list elements, as RFC 9110 allows.
    let r = get(&app, CHUNK, &[("range", "Bytes=0-3,")]).await;
    assert_eq!((r.status.as_u16(), &r.body[..]), (206, &full[..4]));
    // A zero-length object has no bytes to name: any range gets it whole (200, empty), on the
    // plain path and the conditional one.
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(dir.path().join("empty"), b"").unwrap();
    let app = app_for(&[("e", dir.path())]);
    for headers in [
        vec![("range", "bytes=-5")],
        vec![("range", "bytes=0-")],
        vec![("range", "bytes=-5"), ("if-none-match", "\"other\"")],
    ] {
        let r = get(&app, "/zarr/e/empty", &headers).await;
        assert_eq!((r.status.as_u16(), r.body.len()), (200, 0), "{headers:?}");
        assert_eq!(r.header("content-range"), None);
    }
}

#[tokio::test]
async fn conditional_requests() {
    let app = fixture_app();
    let first = get(&app, CHUNK, &[]).await;
    let etag = first.header("etag").unwrap().to_owned();
    let last_modified = first.header("last-modified").unwrap().to_owned();

    let r = get(&app, CHUNK, &[("if-none-match", &etag)]).await;
    assert_eq!(r.status, 304);
    assert!(r.body.is_empty());
    assert_eq!(r.header("etag"), Some(etag.as_str()));
    let r = get(&app, CHUNK, &[("if-none-match", &format!("\"other\", W/{etag}"))]).await;
    assert_eq!(r.status, 304, "weak comparison for If-None-Match");
    let r = get(&app, CHUNK, &[("if-none-match", "\"other\"")]).await;
    assert_eq!(r.status, 200);
    let r = request(&app, "HEAD", CHUNK, &[("if-none-match", "*")]).await;
    assert_eq!(r.status, 304);
    // Repeated field lines are one list (RFC 9110 section 5.3), as a proxy may split them.
    let r = get(&app, CHUNK, &[("if-none-match", "\"a\""), ("if-none-match", &etag)]).await;
    assert_eq!(r.status, 304, "the second If-None-Match line is read");
    let r = get(&app, CHUNK, &[("if-match", "\"a\""), ("if-match", &etag)]).await;
    assert_eq!(r.status, 200, "the second If-Match line is read");
    let r = get(&app, CHUNK, &[("if-match", "\"a\""), ("if-match", "\"b\"")]).await;
    assert_eq!(r.status, 412);

    let r = get(&app, CHUNK, &[("if-match", "\"other\"")]).await;
    assert_eq!(r.status, 412);
    assert_eq!(r.error_code(), "precondition_failed");
    let r = get(&app, CHUNK, &[("if-match", &etag)]).await;
    assert_eq!(r.status, 200);

    let r = get(&app, CHUNK, &[("if-modified-since", &last_modified)]).await;
    assert_eq!(r.status, 304);
    let r = get(&app, CHUNK, &[("if-modified-since", "Thu, 01 Jan 1970 00:00:00 GMT")]).await;
    assert_eq!(r.status, 200);

    // If-Unmodified-Since: 412 when changed since; If-Match, when present, decides instead.
    let epoch = "Thu, 01 Jan 1970 00:00:00 GMT";
    let r = get(&app, CHUNK, &[("if-unmodified-since", epoch)]).await;
    assert_eq!(
        (r.status.as_u16(), r.error_code().as_str()),
        (412, "precondition_failed")
    );
    let r = get(&app, CHUNK, &[("if-unmodified-since", &last_modified)]).await;
    assert_eq!(r.status, 200);
    assert_eq!(r.body, chunk_bytes());
    let r = get(&app, CHUNK, &[("if-match", &etag), ("if-unmodified-since", epoch)]).await;
    assert_eq!(r.status, 200);

    // If-Range: the range only applies to the representation the client has.
    let r = get(&app, CHUNK, &[("range", "bytes=0-3"), ("if-range", &etag)]).await;
    assert_eq!(r.status, 206);
    let r = get(&app, CHUNK, &[("range", "bytes=0-3"), ("if-range", "\"stale\"")]).await;
    assert_eq!(r.status, 200);
    assert_eq!(r.body.len(), chunk_bytes().len());
}

#[tokio::test]
async fn cors_on_every_response_and_preflight() {
    let app = fixture_app();
    let origin = ("origin", "http://viewer.example");
    for uri in [CHUNK, "/zarr/fx/missing", "/zarr/nope/x", "/api/v1/mounts", "/no/route"] {
        let r = get(&app, uri, &[origin]).await;
        assert_eq!(r.header("access-control-allow-origin"), Some("*"), "{uri}");
        let exposed = r
            .header("access-control-expose-headers")
            .unwrap_or_default()
            .to_ascii_lowercase();
        for h in [
            "content-range",
            "content-length",
            "etag",
            "x-zarr-shape",
            "x-zarr-dtype",
            "x-zarr-vmin",
            "x-zarr-vmax",
            "retry-after",
            "www-authenticate",
        ] {
            assert!(exposed.contains(h), "{uri} exposes {h}: {exposed}");
        }
    }
    let r = request(
        &app,
        "OPTIONS",
        CHUNK,
        &[
            origin,
            ("access-control-request-method", "GET"),
            ("access-control-request-headers", "range,cache-control,x-requested-with"),
        ],
    )
    .await;
    assert!(r.status.is_success(), "{}", r.status);
    assert_eq!(r.header("access-control-allow-origin"), Some("*"));
    let methods = r.header("access-control-allow-methods").unwrap().to_ascii_uppercase();
    assert!(methods.contains("GET") && methods.contains("HEAD"), "{methods}");
    // The headers a page asks for, its client library's own too.
    let allowed = r.header("access-control-allow-headers").unwrap().to_ascii_lowercase();
    for h in ["range", "cache-control", "x-requested-with"] {
        assert!(allowed.contains(h), "{h}: {allowed}");
    }
    // OPTIONS that is no preflight (no Access-Control-Request-Method) is the route's: 204
    // with the methods it takes (the CORS layer answered it as a preflight, with no Allow).
    for (uri, allow) in [(CHUNK, "GET, HEAD, OPTIONS"), ("/api/v1/validate/fx", "POST, OPTIONS")] {
        let r = request(&app, "OPTIONS", uri, &[]).await;
        assert_eq!((r.status.as_u16(), r.header("allow")), (204, Some(allow)), "{uri}");
        assert_eq!(r.header("access-control-allow-origin"), None, "no Origin, no CORS");
        // From a page (after its preflight), the answer carries CORS as every response does.
        let r = request(&app, "OPTIONS", uri, &[origin]).await;
        assert_eq!((r.status.as_u16(), r.header("allow")), (204, Some(allow)), "{uri}");
        assert_eq!(r.header("access-control-allow-origin"), Some("*"), "{uri}");
        assert!(r.header("access-control-expose-headers").unwrap().contains("etag"));
    }
    // A list of origins: the one asking, if it is listed, with Vary: Origin.
    let mut config = config_with(&[("fx", &fixtures())]);
    config.server.cors_origins = vec!["http://viewer.example".into()];
    let listed = zarrgate::app(zarrgate::AppState::from_config(config).unwrap());
    let r = request(&listed, "OPTIONS", CHUNK, &[origin]).await;
    assert_eq!(r.header("access-control-allow-origin"), Some("http://viewer.example"));
    assert_eq!(r.header("vary"), Some("origin"));
    let r = request(&listed, "OPTIONS", CHUNK, &[("origin", "http://other.example")]).await;
    assert_eq!(
        (r.status.as_u16(), r.header("access-control-allow-origin")),
        (204, None)
    );
}

#[tokio::test]
async fn writes_are_405() {
    let app = fixture_app();
    for method in ["PUT", "POST", "DELETE", "PATCH"] {
        let r = request(&app, method, CHUNK, &[]).await;
        assert_eq!(r.status, 405, "{method}");
        assert_eq!(r.error_code(), "method_not_allowed");
        assert_eq!(r.header("allow"), Some("GET, HEAD, OPTIONS"));
    }
    let r = get(&app, "/api/v1/validate/fx", &[]).await;
    assert_eq!(
        (r.status.as_u16(), r.error_code().as_str()),
        (405, "method_not_allowed")
    );
    assert_eq!(r.header("allow"), Some("POST, OPTIONS"));
    assert_eq!(
        chunk_bytes().len() as u64,
        std::fs::metadata(fixtures().join("v2/compressor_zstd_i4/0.0"))
            .unwrap()
            .len()
    );
}

#[tokio::test]
async fn unsafe_paths_are_400() {
    let app = fixture_app();
    for uri in [
        "/zarr/fx/..%2f..%2fCargo.toml",
        "/zarr/fx/v2/%2e%2e/%2e%2e/Cargo.toml",
        "/zarr/fx/../../Cargo.toml",
        "/zarr/fx/v2/./compressor_zstd_i4/0.0",
        "/zarr/fx/v2%5c..%5cx",
        "/zarr/fx/a%00b",
        "/zarr/fx//etc/passwd",
        "/zarr/fx//",
        "/zarr/fx/%2F",
        "/zarr/fx/%2fetc%2fpasswd",
        "/zarr/fx/%ff",
    ] {
        let r = get(&app, uri, &[]).await;
        assert_eq!(r.status, 400, "{uri}");
        assert_eq!(r.error_code(), "invalid_path", "{uri}");
    }
    // Percent-encoding inside names is decoded once and served.
    let r = get(&app, "/zarr/fx/v2/compressor%5Fzstd%5Fi4/0.0", &[]).await;
    assert_eq!(r.status, 200);
    assert_eq!(&r.body[..], &chunk_bytes()[..]);
}

/// A mount segment the rest of a path would be refused for is refused as it would be (400,
/// `invalid_path`) on every route that names a mount, and its bytes are not repeated in the
/// message; a well-formed name that no mount has is a 404.
#[tokio::test]
async fn unsafe_mount_segments_are_400() {
    let app = fixture_app();
    for segment in ["..", ".", "%2e%2e", "%2E", "f%5Cx", "f%00x", "f%01x", "%ff"] {
        for uri in [
            format!("/zarr/{segment}/fx/v2/.zgroup"),
            format!("/api/v1/slice/{segment}/v2/compressor_zlib_i4?select=0"),
            format!("/api/v1/zom/{segment}/v2"),
            format!("/api/v1/list/{segment}/v2"),
        ] {
            let r = get(&app, &uri, &[]).await;
            assert_eq!(
                (r.status.as_u16(), r.error_code().as_str()),
                (400, "invalid_path"),
                "{uri}"
            );
            let message = r.json()["error"]["message"].as_str().unwrap_or_default().to_owned();
            assert!(
                !message.contains('\0') && !message.contains('\u{1}'),
                "{uri}: {message}"
            );
        }
    }
    for segment in ["nope", "f%78x", "a.b", "f%2Fx"] {
        let r = get(&app, &format!("/zarr/{segment}/v2/.zgroup"), &[]).await;
        assert_eq!(
            (r.status.as_u16(), r.error_code().as_str()),
            (404, "unknown_mount"),
            "{segment}"
        );
    }
}

/// Query strings on raw keys are ignored (cache-busters, signatures): the key is served as it
/// is without one, parameters the slice API would refuse included.
#[tokio::test]
async fn raw_keys_ignore_query_strings() {
    let app = fixture_app();
    let plain = get(&app, "/zarr/fx/v2/compressor_zstd_i4/0.0", &[]).await;
    assert_eq!(plain.status, 200);
    for query in ["?x=1", "?select=0&format=png", "?", "?%ff=%00", "?t=1&t=2"] {
        let r = get(&app, &format!("/zarr/fx/v2/compressor_zstd_i4/0.0{query}"), &[]).await;
        assert_eq!(r.status, 200, "{query}");
        assert_eq!(r.body, plain.body, "{query}");
        let r = request(
            &app,
            "HEAD",
            &format!("/zarr/fx/v2/compressor_zstd_i4/.zarray{query}"),
            &[],
        )
        .await;
        assert_eq!(r.status, 200, "{query}");
    }
    let r = get(&app, "/zarr/fx/v2/nothing_here?x=1", &[]).await;
    assert_eq!(r.status, 404);
}

/// A root with a secret next to it, and symlinks pointing in and out.
fn symlink_tree() -> tempfile::TempDir {
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path().join("root");
    std::fs::create_dir_all(root.join("sub")).unwrap();
    std::fs::write(dir.path().join("secret.txt"), b"TOP SECRET").unwrap();
    std::fs::write(root.join("sub/inside.txt"), b"inside").unwrap();
    #[cfg(unix)]
    {
        std::os::unix::fs::symlink(dir.path().join("secret.txt"), root.join("escape")).unwrap();
        std::os::unix::fs::symlink(dir.path(), root.join("up")).unwrap();
        std::os::unix::fs::symlink(root.join("sub/inside.txt"), root.join("alias")).unwrap();
    }
    dir
}

#[cfg(unix)]
#[tokio::test]
async fn symlinks_leaving_the_root_are_not_followed() {
    let dir = symlink_tree();
    let app = app_for(&[("m", &dir.path().join("root"))]);
    for uri in ["/zarr/m/escape", "/zarr/m/up/secret.txt"] {
        let r = get(&app, uri, &[]).await;
        assert_eq!(r.status, 404, "{uri}");
        let r = request(&app, "HEAD", uri, &[]).await;
        assert_eq!(r.status, 404, "{uri}");
    }
    let r = get(&app, "/zarr/m/alias", &[]).await;
    assert_eq!(r.status, 200);
    assert_eq!(&r.body[..], b"inside");
    // The listing shows what can be read: not the link to a directory outside.
    let r = get(&app, "/api/v1/list/m", &[]).await;
    assert_eq!(r.status, 200);
    let names: Vec<String> = r.json()["children"]
        .as_array()
        .unwrap()
        .iter()
        .map(|e| e["name"].as_str().unwrap().to_owned())
        .collect();
    assert_eq!(names, ["sub"], "{}", r.json());
}

#[cfg(unix)]
#[tokio::test]
async fn names_the_filesystem_rejects_are_404() {
    let dir = tempfile::tempdir().unwrap();
    std::os::unix::fs::symlink("loop", dir.path().join("loop")).unwrap();
    let app = app_for(&[("m", dir.path())]);
    let long = "a".repeat(300);
    for uri in [
        format!("/zarr/m/{long}"),
        format!("/zarr/m/{long}/zarr.json"),
        "/zarr/m/loop".into(),
        "/zarr/m/loop/zarr.json".into(),
    ] {
        let r = get(&app, &uri, &[]).await;
        assert_eq!(
            (r.status.as_u16(), r.error_code().as_str()),
            (404, "not_found"),
            "{uri}"
        );
        assert_eq!(request(&app, "HEAD", &uri, &[]).await.status, 404, "HEAD {uri}");
    }
}

/// Files a key cannot be: a FIFO is missing (opening it would block a thread forever), and a
/// chunk file that claims a terabyte (sparse) is refused (413), not read or an abort.
#[cfg(unix)]
#[tokio::test]
async fn fifos_and_huge_sparse_chunks_do_not_stop_the_server() {
    let dir = tempfile::tempdir().unwrap();
    let made = std::process::Command::new("mkfifo")
        .arg(dir.path().join("fifo"))
        .status();
    assert!(made.is_ok_and(|s| s.success()), "mkfifo");
    write_v3_array(
        &dir.path().join("sparse"),
        &[4],
        &[4],
        "int32",
        serde_json::json!(0),
        serde_json::json!([{"name": "bytes", "configuration": {"endian": "little"}}]),
    );
    std::fs::create_dir_all(dir.path().join("sparse/c")).unwrap();
    std::fs::File::create(dir.path().join("sparse/c/0"))
        .unwrap()
        .set_len(1 << 40)
        .unwrap();
    let app = app_for(&[("m", dir.path())]);
    let start = std::time::Instant::now();
    for method in ["GET", "HEAD"] {
        let r = request(&app, method, "/zarr/m/fifo", &[]).await;
        assert_eq!(r.status, 404, "{method}");
    }
    // Refused after reading no more of it than a result may hold (not read to its end).
    let r = get(&app, "/api/v1/slice/m/sparse", &[]).await;
    assert_eq!((r.status.as_u16(), r.error_code().as_str()), (413, "too_large"));
    let message = r.json()["error"]["message"].as_str().unwrap().to_owned();
    assert!(
        message.contains("'sparse/c/0' holds a stored chunk of 1099511627776 bytes"),
        "{message}"
    );
    // The same through a store read by requests (the size comes with the response).
    let (counted, _, _) = counting_app(dir.path(), zarrgate::config::Config::default());
    let r = get(&counted, "/api/v1/slice/m/sparse", &[]).await;
    assert_eq!((r.status.as_u16(), r.error_code().as_str()), (413, "too_large"));
    assert!(start.elapsed().as_secs() < 10);
    assert_eq!(get(&app, "/healthz", &[]).await.status, 200);
}

#[tokio::test]
async fn large_keys_stream_in_pieces() {
    use http_body_util::BodyExt;
    use tower::ServiceExt;
    let dir = tempfile::tempdir().unwrap();
    let data: Vec<u8> = (0..8u32 << 20)
        .map(|i| (i.wrapping_mul(2_654_435_761) >> 24) as u8)
        .collect();
    std::fs::write(dir.path().join("big"), &data).unwrap();
    let app = app_for(&[("m", dir.path())]);
    let request = axum::http::Request::get("/zarr/m/big")
        .body(axum::body::Body::empty())
        .unwrap();
    let mut body = app.oneshot(request).await.unwrap().into_body();
    let (mut frames, mut got) = (0, Vec::new());
    while let Some(frame) = body.frame().await {
        let frame = frame.unwrap().into_data().unwrap();
        assert!(frame.len() <= 1 << 20, "frames are bounded, got {}", frame.len());
        got.extend_from_slice(&frame);
        frames += 1;
    }
    assert!(frames >= 8, "8 MiB arrived in {frames} frames: not streamed");
    assert!(got == data);
}

#[tokio::test]
async fn mounts_and_health() {
    let app = fixture_app();
    let r = get(&app, "/api/v1/mounts", &[]).await;
    assert_eq!(r.status, 200);
    let v = r.json();
    let names: Vec<&str> = v["mounts"]
        .as_array()
        .unwrap()
        .iter()
        .map(|m| m["name"].as_str().unwrap())
        .collect();
    assert_eq!(names, ["demo", "fx"]);
    assert_eq!(v["mounts"][0]["kind"], "local");
    // The list depends on the bearer token (protected mounts are left out without it).
    assert_eq!(r.header("vary"), Some("authorization"));
    let r = get(&app, "/healthz", &[]).await;
    assert_eq!(r.status, 200);
    assert_eq!(r.json()["status"], "ok");
    let r = get(&app, "/", &[]).await;
    assert_eq!(r.status, 200);
    assert!(std::str::from_utf8(&r.body).unwrap().contains("zarrgate"));
    let r = request(&app, "POST", "/api/v1/mounts", &[]).await;
    assert_eq!(r.status, 405);
    assert_eq!(r.error_code(), "method_not_allowed");
    // The mount segment is percent-decoded once, as the rest of the path is.
    let plain = get(&app, "/zarr/fx/v2/compressor_zlib_i4/.zarray", &[]).await;
    assert_eq!(plain.status, 200);
    for uri in [
        "/zarr/f%78/v2/compressor_zlib_i4/.zarray",
        "/api/v1/zom/f%78/v2/compressor_zlib_i4",
        "/api/v1/list/%66x/v2",
        "/api/v1/slice/f%78/v2/compressor_zlib_i4?select=0",
    ] {
        let r = get(&app, uri, &[]).await;
        assert_eq!(r.status, 200, "{uri}");
    }
    assert_eq!(
        get(&app, "/zarr/f%78/v2/compressor_zlib_i4/.zarray", &[]).await.body,
        plain.body
    );
    let r = get(&app, "/zarr/f%2578/v2/compressor_zlib_i4/.zarray", &[]).await;
    assert_eq!((r.status.as_u16(), r.error_code().as_str()), (404, "unknown_mount"));
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 256, ..ProptestConfig::default() })]

    /// End to end: whatever path is asked, the secret outside the root is never served.
    #[test]
    fn no_request_path_reaches_outside_the_root(
        parts in prop::collection::vec(
            prop_oneof![
                Just(".."), Just("."), Just("%2e%2e"), Just("%2E."), Just("%2f"), Just("%5c"),
                Just("secret.txt"), Just("root"), Just("escape"), Just("up"), Just("sub"),
                Just("inside.txt"), Just(""), Just("%00"), Just("%252e%252e"),
            ],
            0..7,
        )
    ) {
        let dir = symlink_tree();
        let app = app_for(&[("m", &dir.path().join("root"))]);
        let uri = format!("/zarr/m/{}", parts.join("/"));
        let rt = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
        let reply = rt.block_on(async {
            let builder = axum::http::Request::get(&uri);
            match builder.body(axum::body::Body::empty()) {
                Ok(req) => Some(send(&app, req).await),
                Err(_) => None,
            }
        });
        if let Some(r) = reply {
            prop_assert!(!r.body.windows(10).any(|w| w == b"TOP SECRET"), "{} leaked", uri);
            prop_assert!(r.status != 500, "{} -> 500", uri);
        }
    }
}

/// The app over one local mount "m" at `root` whose reads of bytes go through `read`.
fn hooked_app(root: &std::path::Path, read: ReadFn) -> zarrgate::App {
    let mount = zarrgate::state::Mount {
        consolidated: false,
        ..zarrgate::state::Mount::new(
            "m",
            "local",
            "m".into(),
            zarrgate::store::Store::new(ReadHook {
                inner: zarrgate::store::Store::new(zarrgate::store::open_local(root).unwrap()),
                head: None,
                read,
            }),
        )
    };
    zarrgate::app(zarrgate::AppState::with_mounts(
        zarrgate::config::Config::default(),
        vec![mount],
    ))
}

/// Headers and bytes come from the same object: when the object is replaced between the read
/// of its validators and the read of its bytes, the request is served anew (once), and a store
/// that keeps changing is a 502, never old headers over new bytes.
#[tokio::test]
async fn an_object_replaced_while_served_is_served_anew() {
    use std::sync::atomic::{AtomicUsize, Ordering};
    let file = fixtures().join("v3/crc32c_i4/zarr.json");
    let want = std::fs::read(&file).unwrap();
    for (lies, status) in [(1, 200), (2, 502)] {
        let gets = std::sync::Arc::new(AtomicUsize::new(0));
        // Its first `lies` reads report another version of the object than its HEAD did (the
        // object replaced between the two).
        let app = hooked_app(&fixtures(), {
            let (lies, gets) = (std::sync::Arc::new(AtomicUsize::new(lies)), gets.clone());
            Box::new(move |inner, key, range| {
                let (lies, gets) = (lies.clone(), gets.clone());
                Box::pin(async move {
                    gets.fetch_add(1, Ordering::SeqCst);
                    let mut object = inner.get(&key, range).await?;
                    let lie = lies
                        .fetch_update(Ordering::SeqCst, Ordering::SeqCst, |n| n.checked_sub(1))
                        .is_ok();
                    if let Some(o) = object.as_mut().filter(|_| lie) {
                        o.meta.version = Some("replaced".into());
                    }
                    Ok(object)
                })
            })
        });
        // A conditional GET reads the validators first, then the bytes.
        let r = get(
            &app,
            "/zarr/m/v3/crc32c_i4/zarr.json",
            &[("if-none-match", "\"other\"")],
        )
        .await;
        assert_eq!(r.status, status, "{lies} lies");
        assert_eq!(gets.load(Ordering::SeqCst), 2, "{lies} lies");
        if status == 200 {
            assert_eq!(&r.body[..], &want[..]);
            assert_eq!(r.header("content-length"), Some(want.len().to_string().as_str()));
        }
    }
}

/// An object replaced by a shorter one between the read of its validators and of its bytes is
/// served anew too: the range that no longer fits the new object is no upstream failure.
#[tokio::test]
async fn an_object_shortened_while_served_is_served_anew() {
    use std::sync::atomic::{AtomicBool, Ordering};
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("obj");
    std::fs::write(&path, vec![7u8; 1000]).unwrap();
    let replaced = std::sync::Arc::new(AtomicBool::new(false));
    // Before its first read of bytes, the object is replaced by one of 10 bytes.
    let app = hooked_app(dir.path(), {
        let (replaced, path) = (replaced.clone(), path.clone());
        Box::new(move |inner, key, range| {
            let (replaced, path) = (replaced.clone(), path.clone());
            Box::pin(async move {
                if !replaced.swap(true, Ordering::SeqCst) {
                    let new = path.with_extension("new");
                    std::fs::write(&new, b"0123456789").unwrap();
                    std::fs::rename(&new, &path).unwrap();
                }
                inner.get(&key, range).await
            })
        })
    });
    let r = get(
        &app,
        "/zarr/m/obj",
        &[("if-none-match", "\"other\""), ("range", "bytes=500-600")],
    )
    .await;
    assert_eq!(
        (r.status.as_u16(), r.header("content-range")),
        (416, Some("bytes */10"))
    );
    assert!(replaced.load(Ordering::SeqCst));
    let r = get(
        &app,
        "/zarr/m/obj",
        &[("if-none-match", "\"other\""), ("range", "bytes=5-")],
    )
    .await;
    assert_eq!((r.status.as_u16(), &r.body[..]), (206, &b"56789"[..]));
}

/// `cors_origins = []`: no CORS headers at all, not even `Vary` or the exposed headers, and
/// preflights are not answered as CORS.
#[tokio::test]
async fn no_cors_origins_no_cors_headers() {
    let mut config = config_with(&[("fx", &fixtures())]);
    config.server.cors_origins = Vec::new();
    let app = zarrgate::app(zarrgate::AppState::from_config(config).unwrap());
    let origin = ("origin", "http://example.org");
    let r = request(&app, "GET", CHUNK, &[origin]).await;
    assert_eq!(r.status, 200);
    let cors: Vec<&str> = r
        .headers
        .keys()
        .map(|k| k.as_str())
        .filter(|k| k.starts_with("access-control-") || *k == "vary")
        .collect();
    assert!(cors.is_empty(), "{cors:?}");
    // OPTIONS is answered as HTTP does, with the methods, and no CORS.
    for (uri, allow) in [
        (CHUNK, "GET, HEAD, OPTIONS"),
        ("/api/v1/slice/fx/v3/zstd_i4", "GET, HEAD, OPTIONS"),
        ("/api/v1/validate/fx", "POST, OPTIONS"),
    ] {
        let r = request(
            &app,
            "OPTIONS",
            uri,
            &[origin, ("access-control-request-method", "GET")],
        )
        .await;
        assert_eq!((r.status.as_u16(), r.header("allow")), (204, Some(allow)), "{uri}");
        assert!(
            !r.headers.keys().any(|k| k.as_str().starts_with("access-control-")),
            "{uri}"
        );
    }
}

/// HTTP details of raw keys: they are revalidated rather than cached for a heuristic time
/// (`Cache-Control: no-cache` on 200, 206 and 304); a 304 to HEAD says the length a 200 would;
/// a last-pos past u64 is the end of the object; two Range field lines are no valid Range.
#[tokio::test]
async fn cache_control_304_lengths_and_odd_ranges() {
    let app = fixture_app();
    let whole = get(&app, CHUNK, &[]).await;
    let (len, etag) = (whole.body.len(), whole.header("etag").unwrap().to_owned());
    assert_eq!(whole.header("cache-control"), Some("no-cache"));
    let r = get(&app, CHUNK, &[("range", "bytes=0-99999999999999999999")]).await;
    assert_eq!(r.status, 206);
    assert_eq!(r.header("cache-control"), Some("no-cache"));
    assert_eq!(
        r.header("content-range"),
        Some(format!("bytes 0-{}/{len}", len - 1).as_str())
    );
    assert_eq!(r.body, whole.body);
    let r = get(&app, CHUNK, &[("range", "bytes=99999999999999999999-")]).await;
    assert_eq!(r.status, 416);
    let r = get(&app, CHUNK, &[("range", "bytes=0-1"), ("range", "bytes=4-5")]).await;
    assert_eq!((r.status.as_u16(), r.body.len()), (200, len));
    for method in ["GET", "HEAD"] {
        let r = request(&app, method, CHUNK, &[("if-none-match", &etag)]).await;
        assert_eq!(r.status, 304, "{method}");
        assert_eq!(r.header("cache-control"), Some("no-cache"), "{method}");
        assert_eq!(r.header("content-length"), Some(len.to_string().as_str()), "{method}");
        assert!(r.body.is_empty(), "{method}");
    }
}

/// Raw keys and slices, which the app answers without its router, are answered exactly as the
/// router answers them (status, headers, body), odd paths, methods and HEAD included.
#[tokio::test]
async fn direct_answers_are_the_routers() {
    let state = zarrgate::AppState::from_config(config_with(&[("fx", &fixtures())])).unwrap();
    let app = zarrgate::app(state.clone());
    let routed = zarrgate::server::front(state.clone(), zarrgate::server::routes(state));
    let paths = [
        "/zarr/fx/v2/compressor_zstd_i4/.zarray",
        "/zarr/fx/v2/compressor_zstd_i4/0.0",
        "/zarr/fx/v2/compressor_zstd_i4/9.9",
        "/zarr/fx",
        "/zarr/fx/",
        "/zarr/",
        "/zarr",
        "/zarr//v2",
        "/zarr/nope/x",
        "/api/v1/slice/fx/v3/sharding_start_i4?select=[1,::2]",
        "/api/v1/slice/fx/v2/fill_nan_f4?format=npy",
        "/api/v1/slice/fx/v2/fill_nan_f4?format=csv",
        "/api/v1/slice/fx/v3/vlen_utf8",
        "/api/v1/slice/fx/v3",
        "/api/v1/slice/fx/",
        "/api/v1/slice/fx",
        "/api/v1/slice/",
        "/api/v1/slice//v3",
        "/api/v1/slice/fx/v2/fill_nan_f4?select=99",
    ];
    for path in paths {
        for method in ["GET", "HEAD", "POST", "PUT", "OPTIONS"] {
            for headers in [
                &[][..],
                &[("range", "bytes=-3"), ("origin", "https://a.example")][..],
                &[("accept-encoding", "gzip, zstd")][..],
            ] {
                let (a, b) = (
                    request(&app, method, path, headers).await,
                    request(&routed, method, path, headers).await,
                );
                let what = format!("{method} {path} {headers:?}");
                assert_eq!(a.status, b.status, "{what}");
                assert_eq!(a.headers, b.headers, "{what}");
                assert_eq!(a.body, b.body, "{what}");
            }
        }
    }
}
