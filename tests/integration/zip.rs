//! Zip mounts: the zarrita archives (hierarchy at the root, or inside one top-level folder;
//! stored and deflated entries) read value for value, and an archive of our own fixtures
//! (ZIP64 records, deflated metadata, stored chunks) served through the HTTP routes.

use crate::common::cases::run_manifest_on;
use crate::common::*;
use serde_json::json;
use zarrgate::config::MountConfig;
use zarrgate::store::Store;

fn zip_store(path: &std::path::Path) -> Store {
    let config = MountConfig::new(path.display().to_string(), "/");
    let source = config.source("z").unwrap();
    assert_eq!(zarrgate::store::open::kind(&source), "zip");
    zarrgate::store::open::open(&source, &config).unwrap()
}

#[test]
fn zarrita_zips_match_zarr_python() {
    let root = repo().join("../shared/fixtures/zarrita");
    if !root.is_dir() {
        eprintln!("skipped: ../shared/fixtures/zarrita is absent");
        return;
    }
    let manifest = repo().join("tests/fixtures/zarrita_expected/cases.json");
    let mut total = 0;
    for (version, archive) in [
        ("v2", "data.zipped_from_parent.zarr.zip"),
        ("v2", "data.zipped_from_within.zarr.zip"),
        ("v3", "data.zipped_from_parent.zarr.zip"),
        ("v3", "data.zipped_from_within.zarr.zip"),
        ("v3", "data.uncompressed.zarr.zip"),
    ] {
        let store = zip_store(&root.join(version).join(archive));
        let prefix = format!("{version}/data.zarr/");
        let (n, failures) = run_manifest_on(&store, &manifest, |p| p.strip_prefix(&prefix).map(str::to_owned));
        assert!(n > 20, "{version}/{archive}: {n} cases");
        assert!(
            failures.is_empty(),
            "{version}/{archive}: {} failed:\n{}",
            failures.len(),
            failures.join("\n")
        );
        total += n;
    }
    assert!(total > 150);
}

/// Archives Python's zipfile wrote: deflated metadata and stored chunks, and every entry
/// compressed with bzip2, and with LZMA (the methods zarr-python's ZipStore can write).
#[tokio::test]
async fn our_zips_serve_keys_slices_and_zom() {
    for archive in ["fixtures.zip", "fixtures_bzip2.zip", "fixtures_lzma.zip"] {
        our_zip_serves_keys_slices_and_zom(archive).await;
    }
}

async fn our_zip_serves_keys_slices_and_zom(archive: &str) {
    let zip = repo().join("tests/fixtures/zips").join(archive);
    let app = app_for(&[("z", &zip), ("fx", &fixtures())]);
    // Raw keys equal the files they were zipped from: deflated metadata and stored chunks.
    for key in [
        "v3/sharding_start_i4/zarr.json",
        "v3/sharding_start_i4/c/0/1",
        "v2/compressor_zstd_i4/.zarray",
        "v2/compressor_zstd_i4/1.1",
    ] {
        let want = std::fs::read(fixtures().join(key)).unwrap();
        let r = get(&app, &format!("/zarr/z/{key}"), &[]).await;
        assert_eq!(r.status, 200, "{archive} {key}: {:?}", r.body);
        assert_eq!(&r.body[..], &want[..], "{archive} {key}");
        let r = crate::common::request(&app, "HEAD", &format!("/zarr/z/{key}"), &[]).await;
        assert_eq!(r.header("content-length"), Some(want.len().to_string().as_str()));
        let r = get(&app, &format!("/zarr/z/{key}"), &[("range", "bytes=3-9")]).await;
        assert_eq!(&r.body[..], &want[3..10], "{archive} {key}");
        let r = get(&app, &format!("/zarr/z/{key}"), &[("range", "bytes=-5")]).await;
        assert_eq!(r.status, 206);
        assert_eq!(&r.body[..], &want[want.len() - 5..], "{archive} {key}");
        assert_eq!(
            r.header("content-range"),
            Some(format!("bytes {}-{}/{}", want.len() - 5, want.len() - 1, want.len()).as_str())
        );
    }
    assert_eq!(get(&app, "/zarr/z/v3/nothing/zarr.json", &[]).await.status, 404);
    assert_eq!(get(&app, "/zarr/z/v3", &[]).await.status, 404);
    // Slices and ZOM equal those of the unzipped fixtures.
    for uri in [
        "slice/{}/v3/sharding_start_i4?select=1:,::2",
        "slice/{}/v3/vlen_utf8",
        "zom/{}/v3/group_nested",
        "zom/{}/v2/group_nested",
    ] {
        let from_zip = get(&app, &format!("/api/v1/{}", uri.replace("{}", "z")), &[]).await;
        let from_dir = get(&app, &format!("/api/v1/{}", uri.replace("{}", "fx")), &[]).await;
        assert_eq!(from_zip.status, 200, "{archive} {uri}: {:?}", from_zip.body);
        assert_eq!(from_zip.json(), from_dir.json(), "{archive} {uri}");
    }
    let mounts = get(&app, "/api/v1/mounts", &[]).await.json();
    assert_eq!(
        mounts["mounts"][1],
        json!({"name": "z", "kind": "zip", "consolidated": true})
    );
}

#[tokio::test]
async fn a_file_that_is_not_a_zip_is_corrupt_data_not_a_crash() {
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(dir.path().join("bad.zip"), b"this is not a zip archive").unwrap();
    let app = app_for(&[("b", &dir.path().join("bad.zip"))]);
    let r = get(&app, "/zarr/b/zarr.json", &[]).await;
    assert_eq!((r.status.as_u16(), r.error_code().as_str()), (500, "corrupt_data"));
    // It names the key asked for, and nothing of the server's files.
    assert_eq!(
        r.json()["error"]["message"],
        "stored data at 'zarr.json' could not be decoded"
    );
    // The slice API and ZOM say the same of the node's metadata.
    for url in ["/api/v1/slice/b/?select=0", "/api/v1/zom/b"] {
        let r = get(&app, url, &[]).await;
        assert_eq!(
            (r.status.as_u16(), r.error_code().as_str()),
            (500, "corrupt_data"),
            "{url}"
        );
    }
    assert_eq!(get(&app, "/healthz", &[]).await.status, 200);
}

/// A zip of one deflated entry, written by hand.
fn deflated_zip(name: &str, data: &[u8]) -> Vec<u8> {
    zip_of(&[(name, data)])
}

/// A zip of deflated entries, written by hand.
fn zip_of(files: &[(&str, &[u8])]) -> Vec<u8> {
    zip_with_crc(files, crc32fast::hash)
}

/// A zip of deflated entries, written by hand, with the CRC-32 `crc` gives each.
fn zip_with_crc(files: &[(&str, &[u8])], crc: impl Fn(&[u8]) -> u32) -> Vec<u8> {
    zip_written(files, crc, 8)
}

/// A zip of entries compressed with `method` (0 stored, 8 deflated, 93 zstd), written by hand, with the
/// CRC-32 `crc` gives each.
fn zip_written(files: &[(&str, &[u8])], crc: impl Fn(&[u8]) -> u32, method: u8) -> Vec<u8> {
    use std::io::Write;
    let (u16le, u32le) = (|v: u16| v.to_le_bytes(), |v: u32| v.to_le_bytes());
    let mut zip = Vec::new();
    let mut cd = Vec::new();
    for (name, data) in files {
        let packed = match method {
            8 => {
                let mut gz = flate2::write::DeflateEncoder::new(Vec::new(), flate2::Compression::fast());
                gz.write_all(data).unwrap();
                gz.finish().unwrap()
            }
            93 => zstd::encode_all(*data, 3).unwrap(),
            _ => data.to_vec(),
        };
        let sizes = |out: &mut Vec<u8>| {
            out.extend(u32le(crc(data)));
            out.extend(u32le(packed.len() as u32));
            out.extend(u32le(data.len() as u32));
            out.extend(u16le(name.len() as u16));
            out.extend(u16le(0)); // extra
        };
        let offset = zip.len() as u32;
        zip.extend(u32le(0x0403_4b50));
        zip.extend([20, 0, 0, 0, method, 0, 0, 0, 0, 0]); // version, flags, method, time, date
        sizes(&mut zip);
        zip.extend(name.as_bytes());
        zip.extend(&packed);
        cd.extend(u32le(0x0201_4b50));
        cd.extend([20, 0, 20, 0, 0, 0, method, 0, 0, 0, 0, 0]); // made by, needed, flags, method, time, date
        sizes(&mut cd);
        cd.extend([0, 0, 0, 0, 0, 0, 0, 0, 0, 0]); // comment, disk, internal, external attributes
        cd.extend(u32le(offset)); // local header offset
        cd.extend(name.as_bytes());
    }
    let cd_offset = zip.len() as u32;
    zip.extend(&cd);
    zip.extend(u32le(0x0605_4b50));
    zip.extend([0, 0, 0, 0]);
    zip.extend(u16le(files.len() as u16));
    zip.extend(u16le(files.len() as u16));
    zip.extend(u32le(cd.len() as u32));
    zip.extend(u32le(cd_offset));
    zip.extend(u16le(0));
    zip
}

/// `zip` (one end record, no comment) as ZIP64, with a comment of `comment` bytes: the
/// 32-bit sizes of its end record all ones, the real ones in a ZIP64 end record and locator.
fn as_zip64_with_comment(zip: Vec<u8>, comment: usize) -> Vec<u8> {
    as_zip64(zip, comment, true)
}

/// `zip` with ZIP64 records, as [`as_zip64_with_comment`]; `all_ones`: its end record's sizes
/// all ones, or (as Python's zipfile writes an archive of more than 65,535 entries) only its
/// counts, the directory's size and offset left as they are.
fn as_zip64(mut zip: Vec<u8>, comment: usize, all_ones: bool) -> Vec<u8> {
    let end = zip.split_off(zip.len() - 22);
    let u16_at = |at: usize| u16::from_le_bytes([end[at], end[at + 1]]);
    let u32_at = |at: usize| u32::from_le_bytes(end[at..at + 4].try_into().unwrap());
    let (count, cd_size, cd_offset) = (u64::from(u16_at(10)), u64::from(u32_at(12)), u64::from(u32_at(16)));
    let record = zip.len() as u64;
    zip.extend(0x0606_4b50u32.to_le_bytes());
    zip.extend(44u64.to_le_bytes());
    zip.extend([45, 0, 45, 0, 0, 0, 0, 0, 0, 0, 0, 0]); // made by, needed, disk, disk of the directory
    for v in [count, count, cd_size, cd_offset] {
        zip.extend(v.to_le_bytes());
    }
    zip.extend(0x0706_4b50u32.to_le_bytes());
    zip.extend(0u32.to_le_bytes());
    zip.extend(record.to_le_bytes());
    zip.extend(1u32.to_le_bytes());
    zip.extend(0x0605_4b50u32.to_le_bytes());
    zip.extend([0, 0, 0, 0]);
    zip.extend(0xFFFFu16.to_le_bytes());
    zip.extend(0xFFFFu16.to_le_bytes());
    if all_ones {
        zip.extend(u32::MAX.to_le_bytes());
        zip.extend(u32::MAX.to_le_bytes());
    } else {
        zip.extend((cd_size as u32).to_le_bytes());
        zip.extend((cd_offset as u32).to_le_bytes());
    }
    zip.extend((comment as u16).to_le_bytes());
    zip.extend(std::iter::repeat_n(b'c', comment));
    zip
}

/// A ZIP64 archive is read whatever its comment: its locator and end record lie before an end
/// record with a comment of up to 65535 bytes; and whichever fields of its end record overflow
/// (only the count, as Python writes more than 65,535 entries, was read 76 bytes off).
#[tokio::test]
async fn zip64_archives_with_the_longest_comment() {
    let dir = tempfile::tempdir().unwrap();
    for (comment, all_ones) in [(0, true), (1000, true), (65_535, true), (0, false), (70, false)] {
        let path = dir.path().join(format!("c{comment}-{all_ones}.zip"));
        std::fs::write(
            &path,
            as_zip64(zip_of(&[("a", b"aaa"), ("b/c", b"the c")]), comment, all_ones),
        )
        .unwrap();
        let app = app_for(&[("z", &path)]);
        let r = get(&app, "/zarr/z/b/c", &[]).await;
        assert_eq!(
            (r.status.as_u16(), &r.body[..]),
            (200, &b"the c"[..]),
            "comment of {comment}"
        );
        assert_eq!(&get(&app, "/zarr/z/a", &[]).await.body[..], b"aaa");
    }
}

/// An archive replaced in place is read through its new directory: the first read of an entry
/// sees that the archive is another object and reads the directory again.
#[tokio::test]
async fn a_replaced_archive_is_read_through_its_new_directory() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("data.zip");
    std::fs::write(&path, zip_of(&[("a", b"old a")])).unwrap();
    let app = app_for(&[("z", &path)]);
    let r = get(&app, "/zarr/z/a", &[]).await;
    assert_eq!(&r.body[..], b"old a");
    // Another layout: "a" moves behind a new entry.
    std::fs::write(&path, zip_of(&[("pad", &[1u8; 5000]), ("a", b"the new a, longer")])).unwrap();
    let r = get(&app, "/zarr/z/a", &[]).await;
    assert_eq!((r.status.as_u16(), &r.body[..]), (200, &b"the new a, longer"[..]));
    let r = get(&app, "/zarr/z/pad", &[("range", "bytes=-3")]).await;
    assert_eq!((r.status.as_u16(), &r.body[..]), (206, &[1u8, 1, 1][..]));
}

/// Requests that read no entry (a conditional GET answered from the directory, a HEAD) see a
/// replaced archive within `cache.ttl_seconds`, the server's bound on staleness: not a 304 for
/// changed bytes for a minute.
#[tokio::test]
async fn conditional_requests_see_a_replaced_archive_within_the_ttl() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("data.zip");
    std::fs::write(&path, zip_of(&[("a", b"old a")])).unwrap();
    let mut config = crate::common::config_with(&[("z", &path)]);
    config.cache.ttl_seconds = 1;
    let app = zarrgate::app(zarrgate::AppState::from_config(config).unwrap());
    let r = get(&app, "/zarr/z/a", &[]).await;
    let etag = r.headers["etag"].to_str().unwrap().to_owned();
    assert_eq!(get(&app, "/zarr/z/a", &[("if-none-match", &etag)]).await.status, 304);
    std::fs::write(&path, zip_of(&[("a", b"new a!")])).unwrap();
    tokio::time::sleep(std::time::Duration::from_millis(1100)).await;
    let head = request(&app, "HEAD", "/zarr/z/a", &[("if-none-match", &etag)]).await;
    assert_eq!(
        (head.status.as_u16(), head.headers["content-length"].to_str().unwrap()),
        (200, "6")
    );
    let r = get(&app, "/zarr/z/a", &[("if-none-match", &etag)]).await;
    assert_eq!((r.status.as_u16(), &r.body[..]), (200, &b"new a!"[..]));
}

/// The check of an archive once its interval has passed is made by one request, without the
/// others waiting for it (they use the directory kept), and a failed check is not repeated by
/// each request after it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_slow_or_failing_archive_check_holds_up_no_other_request() {
    use std::sync::Arc;
    use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering::SeqCst};
    use std::time::{Duration, Instant};
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(dir.path().join("data.zip"), zip_of(&[("a", b"the a"), ("b", b"the b")])).unwrap();
    let (slow, failing) = (Arc::new(AtomicBool::new(false)), Arc::new(AtomicBool::new(false)));
    let heads = Arc::new(AtomicUsize::new(0));
    // A container whose HEADs take 800 ms once `slow` is set, and fail once `failing` is.
    let container = ReadHook {
        inner: Store::new(zarrgate::store::open_local(dir.path()).unwrap()),
        read: Box::new(|inner, key, range| Box::pin(async move { inner.get(&key, range).await })),
        head: Some({
            let (slow, failing, heads) = (slow.clone(), failing.clone(), Arc::clone(&heads));
            Box::new(move |inner, key| {
                let (slow, failing, heads) = (slow.clone(), failing.clone(), heads.clone());
                Box::pin(async move {
                    heads.fetch_add(1, SeqCst);
                    if slow.load(SeqCst) {
                        tokio::time::sleep(Duration::from_millis(800)).await;
                    }
                    if failing.load(SeqCst) {
                        return Err(zarrgate::store::StoreError::Io("upstream down".into()));
                    }
                    inner.head(&key).await
                })
            })
        }),
    };
    let zip = zarrgate::store::zip::ZipBackend::new(
        Store::new(container),
        zarrgate::store::StoreKey::new("data.zip").unwrap(),
    )
    .checked_every(Duration::from_millis(200));
    let store = Store::new(zip);
    let key = |k: &str| zarrgate::store::StoreKey::new(k).unwrap();
    assert_eq!(store.head(&key("a")).await.unwrap().unwrap().size, 5);
    // Past the interval, with HEADs taking 800 ms: one request checks, the others answer from
    // the directory kept in the meantime.
    slow.store(true, SeqCst);
    tokio::time::sleep(Duration::from_millis(250)).await;
    let checking = {
        let store = store.clone();
        tokio::spawn(async move { store.head(&key("a")).await })
    };
    tokio::time::sleep(Duration::from_millis(50)).await;
    let start = Instant::now();
    for _ in 0..4 {
        assert_eq!(store.head(&key("b")).await.unwrap().unwrap().size, 5);
    }
    assert!(
        start.elapsed() < Duration::from_millis(400),
        "waited {:?}",
        start.elapsed()
    );
    assert_eq!(checking.await.unwrap().unwrap().unwrap().size, 5);
    // A failed check fails the request that made it, and is not repeated before the interval
    // has passed again.
    slow.store(false, SeqCst);
    failing.store(true, SeqCst);
    tokio::time::sleep(Duration::from_millis(250)).await;
    let before = heads.load(SeqCst);
    assert!(store.head(&key("a")).await.is_err());
    for _ in 0..8 {
        assert_eq!(store.head(&key("b")).await.unwrap().unwrap().size, 5);
    }
    assert_eq!(heads.load(SeqCst) - before, 1);
}

/// A deflated entry inflates as it streams, in pieces: whole, ranged across pieces, suffix.
#[tokio::test]
async fn deflated_entries_stream_whole_and_in_ranges() {
    let dir = tempfile::tempdir().unwrap();
    let data: Vec<u8> = (0..3_000_000u32).map(|i| (i * 7 % 251) as u8).collect();
    let path = dir.path().join("big.zip");
    std::fs::write(&path, deflated_zip("blob", &data)).unwrap();
    let app = app_for(&[("z", &path)]);
    let r = get(&app, "/zarr/z/blob", &[]).await;
    assert_eq!(r.status, 200);
    assert_eq!(r.header("content-length"), Some("3000000"));
    assert!(r.body[..] == data[..], "whole entry");
    for (range, want) in [
        ("bytes=262140-262150", &data[262_140..262_151]),
        ("bytes=1000000-2600000", &data[1_000_000..2_600_001]),
        ("bytes=-7", &data[data.len() - 7..]),
        ("bytes=2999999-", &data[2_999_999..]),
    ] {
        let r = get(&app, "/zarr/z/blob", &[("range", range)]).await;
        assert_eq!(r.status, 206, "{range}");
        assert!(r.body[..] == want[..], "{range}");
    }
}

/// Archives whose directory lies are corrupt data (500, naming the key), not bad client ranges
/// (416), upstream failures (502) or short bodies.
#[tokio::test]
async fn archives_that_lie_are_corrupt_data() {
    let dir = tempfile::tempdir().unwrap();
    let good = deflated_zip("blob", &[7u8; 1000]);
    // The central directory starts after the local header (30 + 4 bytes) and the data; its
    // local header offset is at 42, its compressed size at 20.
    let cd = good.len() - 22 - (46 + 4);
    let mut past_end = good.clone();
    past_end[cd + 42..cd + 46].copy_from_slice(&1_000_000u32.to_le_bytes());
    let mut too_long = good.clone();
    too_long[cd + 20..cd + 24].copy_from_slice(&1_000_000u32.to_le_bytes());
    for (name, bytes) in [
        ("empty.zip", Vec::new()),
        ("past_end.zip", past_end),
        ("too_long.zip", too_long),
    ] {
        let path = dir.path().join(name);
        std::fs::write(&path, bytes).unwrap();
        let app = app_for(&[("z", &path)]);
        for range in [None, Some("bytes=0-9")] {
            let headers: Vec<(&str, &str)> = range.map(|r| ("range", r)).into_iter().collect();
            let r = get(&app, "/zarr/z/blob", &headers).await;
            assert_eq!(
                (r.status.as_u16(), r.error_code().as_str()),
                (500, "corrupt_data"),
                "{name} {range:?}"
            );
            assert_eq!(
                r.json()["error"]["message"],
                "stored data at 'blob' could not be decoded",
                "{name} {range:?}"
            );
        }
    }
    // The archive they were made from reads.
    let path = dir.path().join("good.zip");
    std::fs::write(&path, good).unwrap();
    let r = get(&app_for(&[("z", &path)]), "/zarr/z/blob", &[]).await;
    assert_eq!((r.status.as_u16(), r.body.len()), (200, 1000));
}

/// The bytes a body yields before it ends, and whether it ends with an error. An HTTP client
/// reads up to Content-Length and no further: a check that comes after the last byte is lost.
async fn frames_until_error(body: axum::body::Body) -> (usize, bool) {
    use http_body_util::BodyExt;
    let mut body = body;
    let mut got = 0;
    while let Some(frame) = body.frame().await {
        match frame {
            Ok(f) => got += f.data_ref().map_or(0, |d| d.len()),
            Err(_) => return (got, true),
        }
    }
    (got, false)
}

/// An entry, stored or deflated, that does not match its CRC-32: a whole read of one piece
/// (a small entry) is a 500 corrupt_data naming it; one of several pieces ends its body with an
/// error in place of its last bytes (its headers are sent before the last byte is read), so
/// that neither a client nor a slice takes it for whole; a range is served as read.
#[tokio::test]
async fn a_whole_entry_that_fails_its_crc_ends_with_an_error() {
    use tower::ServiceExt;
    let dir = tempfile::tempdir().unwrap();
    // (compression method, bytes, whether the entry is read in one piece)
    for (method, len, one_piece) in [
        (8u8, 3_000_000u32, false),
        (8, 600_000, false),
        (8, 1000, true),
        (0, 3_000_000, false),
        (0, 600_000, true),
        (0, 1000, true),
    ] {
        let data: Vec<u8> = (0..len).map(|i| (i % 251) as u8).collect();
        let path = dir.path().join(format!("bad{method}-{len}.zip"));
        std::fs::write(
            &path,
            zip_written(&[("blob", &data)], |d| crc32fast::hash(d) ^ 1, method),
        )
        .unwrap();
        let app = app_for(&[("z", &path)]);
        let request = axum::http::Request::get("/zarr/z/blob")
            .body(axum::body::Body::empty())
            .unwrap();
        let response = app.clone().oneshot(request).await.unwrap();
        if one_piece {
            let r = get(&app, "/zarr/z/blob", &[]).await;
            assert_eq!((r.status.as_u16(), r.error_code().as_str()), (500, "corrupt_data"));
            let message = r.json()["error"]["message"].as_str().unwrap().to_owned();
            assert!(message.contains("'blob'"), "{message}");
        } else {
            assert_eq!(response.status(), 200);
            let (got, failed) = frames_until_error(response.into_body()).await;
            assert!(failed && got < data.len(), "method {method}, {len} bytes: {got} read");
        }
        // Read into memory (as a chunk is): an error, not the bytes.
        let store = zip_store(&path);
        let key = zarrgate::store::StoreKey::new("blob").unwrap();
        let whole = store.get(&key, None).await.unwrap().unwrap().bytes().await;
        assert!(whole.is_err(), "method {method}, {len} bytes");
        let r = get(&app, "/zarr/z/blob", &[("range", "bytes=10-19")]).await;
        assert_eq!((r.status.as_u16(), &r.body[..]), (206, &data[10..20]));
        // The same archive with the right CRC reads whole.
        std::fs::write(&path, zip_written(&[("blob", &data)], crc32fast::hash, method)).unwrap();
        let r = get(&app_for(&[("z", &path)]), "/zarr/z/blob", &[]).await;
        assert!(
            r.status == 200 && r.body[..] == data[..],
            "method {method}, {len} bytes"
        );
    }
}

/// The app over `zip` (as "z") with the entry whose local header is at `local` and directory
/// record at `record` marked encrypted (general purpose flag bit 0, at 6 and 8 in them).
fn encrypted_app(dir: &std::path::Path, mut zip: Vec<u8>, local: usize, record: usize) -> zarrgate::App {
    zip[local + 6] |= 1;
    zip[record + 8] |= 1;
    let path = dir.join("enc.zip");
    std::fs::write(&path, zip).unwrap();
    app_for(&[("z", &path)])
}

/// An entry refused as a whole: 422 on HEAD as on GET.
async fn refused_on_head_and_get(app: &zarrgate::App, uri: &str) {
    for method in ["HEAD", "GET"] {
        let r = crate::common::request(app, method, uri, &[]).await;
        assert_eq!(r.status, 422, "{method} {uri}");
    }
}

/// An encrypted entry is refused (422), on HEAD as on GET, and in a slice: it is not missing,
/// which would read a chunk as fill values.
#[tokio::test]
async fn encrypted_entries_are_refused_not_missing() {
    let dir = tempfile::tempdir().unwrap();
    let meta = br#"{"zarr_format":2,"shape":[4],"chunks":[2],"dtype":"|u1","compressor":null,"fill_value":0,"order":"C","filters":null}"#;
    let zip = zip_written(
        &[
            (".zgroup", br#"{"zarr_format":2}"#),
            ("a/.zarray", meta),
            ("a/0", &[1, 2]),
            ("a/1", &[3, 4]),
        ],
        crc32fast::hash,
        0,
    );
    // The flags of "a/1": at 6 in its local header and 8 in its directory record (the last).
    let local = zip.len() - 22 - (46 + 3) - (46 + 3) - (46 + 9) - (46 + 7) - (30 + 3 + 2);
    let record = zip.len() - 22 - (46 + 3);
    let app = encrypted_app(dir.path(), zip, local, record);
    refused_on_head_and_get(&app, "/zarr/z/a/1").await;
    assert_eq!(&get(&app, "/zarr/z/a/0", &[]).await.body[..], &[1, 2]);
    let r = get(&app, "/api/v1/slice/z/a?select=0:2", &[]).await;
    assert_eq!(r.json()["data"], json!([1, 2]), "{:?}", r.body);
    let r = get(&app, "/api/v1/slice/z/a?select=2:4", &[]).await;
    assert_eq!((r.status.as_u16(), r.error_code().as_str()), (422, "unsupported"));
}

/// A chunk entry that does not match its CRC-32 is corrupt data naming that chunk's key (500
/// corrupt_data), in a slice as in a raw read, stored or deflated; the other chunk still reads.
#[tokio::test]
async fn a_chunk_with_a_bad_crc_is_corrupt_data_naming_it() {
    let dir = tempfile::tempdir().unwrap();
    let meta = br#"{"zarr_format":2,"shape":[4],"chunks":[2],"dtype":"|u1","compressor":null,"fill_value":0,"order":"C","filters":null}"#;
    let files: &[(&str, &[u8])] = &[
        (".zgroup", br#"{"zarr_format":2}"#),
        ("a/.zarray", meta),
        ("a/0", &[1, 2]),
        ("a/1", &[3, 4]),
    ];
    for method in [0, 8] {
        let zip = zip_written(
            files,
            |d| {
                if d == [3, 4] {
                    crc32fast::hash(d) ^ 1
                } else {
                    crc32fast::hash(d)
                }
            },
            method,
        );
        let path = dir.path().join(format!("m{method}.zip"));
        std::fs::write(&path, zip).unwrap();
        let app = app_for(&[("z", &path)]);
        let r = get(&app, "/api/v1/slice/z/a?select=0:2", &[]).await;
        assert_eq!(r.json()["data"], json!([1, 2]), "{method}");
        let r = get(&app, "/api/v1/slice/z/a?select=1:3", &[]).await;
        assert_eq!(
            (r.status.as_u16(), r.error_code().as_str()),
            (500, "corrupt_data"),
            "{method}"
        );
        assert_eq!(
            r.json()["error"]["message"],
            "stored data at 'a/1' could not be decoded",
            "{method}"
        );
        assert_eq!(get(&app, "/healthz", &[]).await.status, 200);
    }
}

/// Data before the archive (a self-extracting stub) moves every offset, as Python's zipfile
/// reads it; ZIP64 records are then found beside the end record.
#[tokio::test]
async fn archives_with_data_before_them_are_read() {
    let dir = tempfile::tempdir().unwrap();
    let files: &[(&str, &[u8])] = &[("a", b"aaa"), ("b/c", b"the c")];
    for (name, zip) in [
        ("sfx.zip", zip_of(files)),
        ("sfx64.zip", as_zip64_with_comment(zip_of(files), 10)),
    ] {
        let mut bytes = vec![0x7fu8; 2048];
        bytes.extend(zip);
        let path = dir.path().join(name);
        std::fs::write(&path, bytes).unwrap();
        let app = app_for(&[("z", &path)]);
        let r = get(&app, "/zarr/z/b/c", &[]).await;
        assert_eq!((r.status.as_u16(), &r.body[..]), (200, &b"the c"[..]), "{name}");
        assert_eq!(&get(&app, "/zarr/z/a", &[]).await.body[..], b"aaa", "{name}");
    }
    // A directory of other bytes than records is an error, not an empty archive.
    let mut zip = zip_of(files);
    let cd = zip.len() - 22 - (46 + 1) - (46 + 3);
    zip[cd] = b'X';
    let path = dir.path().join("garbage.zip");
    std::fs::write(&path, zip).unwrap();
    let r = get(&app_for(&[("z", &path)]), "/zarr/z/a", &[]).await;
    assert_eq!((r.status.as_u16(), r.error_code().as_str()), (500, "corrupt_data"));
}

/// Bytes that do not compress (xorshift), so that a deflated entry of them is as large.
fn noise(n: usize) -> Vec<u8> {
    let mut x = 0x9E37_79B9_7F4A_7C15u64;
    (0..n)
        .map(|_| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            (x >> 24) as u8
        })
        .collect()
}

/// A client that stops reading a deflated entry holds no thread of the blocking pool: with a
/// pool of one thread, other reads go on while its response waits. Its compressed bytes are
/// more than one read of the archive (3 MiB), read by the inflating steps themselves: a step
/// that waited for a file read of its own on the pool had no thread left to run it.
#[test]
fn a_stalled_inflating_read_holds_no_thread() {
    use http_body_util::BodyExt;
    use tower::ServiceExt;
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .max_blocking_threads(1)
        .enable_all()
        .build()
        .unwrap();
    runtime.block_on(async {
        let dir = tempfile::tempdir().unwrap();
        let big = noise(3 << 20);
        let path = dir.path().join("big.zip");
        std::fs::write(&path, zip_of(&[("big", &big), ("small", b"small")])).unwrap();
        let app = app_for(&[("z", &path)]);
        // Whole, as it inflates.
        let whole = tokio::time::timeout(std::time::Duration::from_secs(20), get(&app, "/zarr/z/big", &[]))
            .await
            .expect("an entry larger than one read of the archive inflates");
        assert!(whole.status == 200 && whole.body[..] == big[..]);
        let request = axum::http::Request::get("/zarr/z/big")
            .body(axum::body::Body::empty())
            .unwrap();
        let mut stalled = app.clone().oneshot(request).await.unwrap().into_body();
        let first = stalled.frame().await.unwrap().unwrap();
        assert!(first.data_ref().is_some_and(|d| d[..] == big[..d.len()]));
        // The stalled body is kept, unread.
        let small = tokio::time::timeout(std::time::Duration::from_secs(20), get(&app, "/zarr/z/small", &[]))
            .await
            .expect("a read while another waits for its client");
        assert_eq!(&small.body[..], b"small");
        drop(stalled);
    });
}

/// Zstandard entries (method 93, which Python 3.14's zipfile writes) stream whole and in ranges.
#[tokio::test]
async fn zstd_entries_are_read() {
    let dir = tempfile::tempdir().unwrap();
    let data: Vec<u8> = (0..300_000u32).map(|i| (i * 13 % 241) as u8).collect();
    let path = dir.path().join("zstd.zip");
    std::fs::write(&path, zip_written(&[("blob", &data)], crc32fast::hash, 93)).unwrap();
    let app = app_for(&[("z", &path)]);
    let r = get(&app, "/zarr/z/blob", &[]).await;
    assert_eq!(r.status, 200, "{:?}", &r.body[..r.body.len().min(200)]);
    assert!(r.body[..] == data[..]);
    let r = get(&app, "/zarr/z/blob", &[("range", "bytes=100000-100009")]).await;
    assert_eq!(&r.body[..], &data[100_000..100_010]);
}

/// An entry compressed with a method zarrgate does not read (PPMd, 98) is 422 on HEAD as on
/// GET.
#[tokio::test]
async fn an_unsupported_method_is_422_on_head_and_get() {
    let dir = tempfile::tempdir().unwrap();
    let mut zip = deflated_zip("blob", &[7u8; 100]);
    // The method fields: at 8 in the local header, at 10 in the directory record.
    let cd = zip.len() - 22 - (46 + 4);
    zip[8] = 98;
    zip[cd + 10] = 98;
    let path = dir.path().join("ppmd.zip");
    std::fs::write(&path, zip).unwrap();
    let app = app_for(&[("z", &path)]);
    for method in ["HEAD", "GET"] {
        let r = crate::common::request(&app, method, "/zarr/z/blob", &[]).await;
        assert_eq!(r.status, 422, "{method}");
    }
}

/// An empty entry is refused as any other when encrypted (422 on GET as on HEAD), and checked
/// against its CRC-32 (that of nothing is 0).
#[tokio::test]
async fn empty_entries_are_refused_and_checked_as_others() {
    let dir = tempfile::tempdir().unwrap();
    let cases = [
        ("good.zip", zip_written(&[("e", b"")], crc32fast::hash, 0), 200),
        (
            "badcrc.zip",
            zip_written(&[("e", b"")], |d| crc32fast::hash(d) ^ 1, 0),
            500,
        ),
    ];
    for (name, zip, status) in cases {
        let path = dir.path().join(name);
        std::fs::write(&path, zip).unwrap();
        let app = app_for(&[("z", &path)]);
        let r = get(&app, "/zarr/z/e", &[]).await;
        assert_eq!(r.status.as_u16(), status, "{name}");
        let head = crate::common::request(&app, "HEAD", "/zarr/z/e", &[]).await;
        assert_eq!(head.status.as_u16(), status, "{name}: HEAD as GET");
        if status == 200 {
            assert!(r.body.is_empty());
        }
    }
    let zip = zip_written(&[("e", b"")], crc32fast::hash, 0);
    let record = zip.len() - 22 - (46 + 1);
    let app = encrypted_app(dir.path(), zip, 0, record);
    refused_on_head_and_get(&app, "/zarr/z/e").await;
}

/// An archive replaced by a smaller one, whose entries the old directory places past its end,
/// is read through its new directory at once (it was 502 until the directory was checked
/// again): on a local disk (the read past the end is a range error), and in a bucket, which
/// answers it with an error of its own (here an I/O error, as object_store reports a 416).
#[tokio::test]
async fn archives_replaced_by_smaller_ones_are_read_at_once() {
    use zarrgate::store::{StoreError, StoreKey, zip::ZipBackend};
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("s.zip");
    let bucket = zarrgate::store::Store::new(crate::common::ReadHook {
        inner: zarrgate::store::Store::new(zarrgate::store::open_local(dir.path()).unwrap()),
        head: None,
        read: Box::new(|inner, key, range| {
            Box::pin(async move {
                match inner.get(&key, range).await {
                    Err(StoreError::Range { .. }) => Err(StoreError::Io("416 Range Not Satisfiable".into())),
                    read => read,
                }
            })
        }),
    });
    let in_bucket = zarrgate::store::Store::new(ZipBackend::new(bucket, StoreKey::new("s.zip").unwrap()));
    let a = StoreKey::new("a").unwrap();
    for (kind, make_zip) in [("local", true), ("bucket", false)] {
        std::fs::write(
            &path,
            zip_written(&[("pad", &[9u8; 100_000]), ("a", b"old a")], crc32fast::hash, 0),
        )
        .unwrap();
        let zip = if make_zip { zip_store(&path) } else { in_bucket.clone() };
        let read = || async { zip.get(&a, None).await.unwrap().unwrap().bytes().await.unwrap() };
        assert_eq!(&read().await[..], b"old a", "{kind}");
        std::fs::write(&path, zip_written(&[("a", b"new a")], crc32fast::hash, 0)).unwrap();
        assert_eq!(&read().await[..], b"new a", "{kind}");
    }
}

/// A deflated entry being sent when its archive is replaced (renamed over) is read to its end
/// from the archive it started in, as stored entries are.
#[tokio::test]
async fn an_entry_being_sent_is_read_from_the_archive_it_started_in() {
    use http_body_util::BodyExt;
    use tower::ServiceExt;
    let dir = tempfile::tempdir().unwrap();
    let big = noise(3 << 20);
    let path = dir.path().join("big.zip");
    std::fs::write(&path, zip_of(&[("big", &big)])).unwrap();
    let app = app_for(&[("z", &path)]);
    let request = axum::http::Request::get("/zarr/z/big")
        .body(axum::body::Body::empty())
        .unwrap();
    let mut body = app.oneshot(request).await.unwrap().into_body();
    let mut got = body.frame().await.unwrap().unwrap().into_data().unwrap().to_vec();
    let next = dir.path().join("next.zip");
    std::fs::write(&next, zip_of(&[("big", &noise(1000))])).unwrap();
    std::fs::rename(&next, &path).unwrap();
    got.extend(body.collect().await.expect("the rest of the entry").to_bytes());
    assert!(got == big, "{} bytes of {}", got.len(), big.len());
}

#[tokio::test]
async fn names_in_code_page_437_stay_apart() {
    // Two arrays whose names differ only in a byte above 0x7F, stored without the UTF-8 flag
    // as Windows' zip and Info-ZIP write them: CP437 "café" and "cafü". Python's zipfile (and
    // so zarr-python) reads them as those names; replacing the invalid UTF-8 byte made them one
    // array, "caf\u{FFFD}", serving the chunks of both.
    let array = br#"{"zarr_format": 3, "node_type": "array", "shape": [4], "data_type": "int32",
        "chunk_grid": {"name": "regular", "configuration": {"chunk_shape": [2]}},
        "chunk_key_encoding": {"name": "default", "configuration": {"separator": "/"}},
        "fill_value": 0, "codecs": [{"name": "bytes", "configuration": {"endian": "little"}}]}"#;
    let group = br#"{"zarr_format": 3, "node_type": "group", "attributes": {}}"#;
    let le = |v: &[i32]| v.iter().flat_map(|x| x.to_le_bytes()).collect::<Vec<u8>>();
    let (first, second) = (le(&[7, 8]), le(&[1, 2]));
    // Written with placeholders of the same length, then given the CP437 bytes.
    let mut zip = zip_written(
        &[
            ("zarr.json", group),
            ("cafA/zarr.json", array),
            ("cafA/c/0", &first),
            ("cafB/zarr.json", array),
            ("cafB/c/1", &second),
        ],
        crc32fast::hash,
        0,
    );
    for (placeholder, cp437) in [(b"cafA", b"caf\x82"), (b"cafB", b"caf\x81")] {
        while let Some(at) = zip.windows(4).position(|w| w == placeholder) {
            zip[at..at + 4].copy_from_slice(cp437);
        }
    }
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(dir.path().join("cp437.zip"), &zip).unwrap();
    let app = app_for(&[("c", &dir.path().join("cp437.zip"))]);
    for (name, want) in [("caf%C3%A9", json!([7, 8, 0, 0])), ("caf%C3%BC", json!([0, 0, 1, 2]))] {
        let r = get(&app, &format!("/api/v1/slice/c/{name}"), &[]).await;
        assert_eq!(r.status, 200, "{name}: {:?}", r.body);
        assert_eq!(r.json()["data"], want, "{name}");
    }
    assert_eq!(&get(&app, "/zarr/c/caf%C3%A9/c/0", &[]).await.body[..], &first[..]);
    let zom = get(&app, "/api/v1/zom/c", &[]).await.json();
    let members: Vec<&String> = zom["members"].as_object().unwrap().keys().collect();
    assert_eq!(members, ["café", "cafü"]);
}
