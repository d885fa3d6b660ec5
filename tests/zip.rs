//! Zip mounts: the zarrita archives (hierarchy at the root, or inside one top-level folder;
//! stored and deflated entries) read value for value, and an archive of our own fixtures
//! (ZIP64 records, deflated metadata, stored chunks) served through the HTTP routes.

mod common;

use common::cases::run_manifest_on;
use common::*;
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

#[tokio::test]
async fn our_zip_serves_keys_slices_and_zom() {
    let zip = repo().join("tests/fixtures/zips/fixtures.zip");
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
        assert_eq!(r.status, 200, "{key}");
        assert_eq!(&r.body[..], &want[..], "{key}");
        let r = get(&app, &format!("/zarr/z/{key}"), &[("range", "bytes=-5")]).await;
        assert_eq!(r.status, 206);
        assert_eq!(&r.body[..], &want[want.len() - 5..], "{key}");
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
        assert_eq!(from_zip.status, 200, "{uri}: {:?}", from_zip.body);
        assert_eq!(from_zip.json(), from_dir.json(), "{uri}");
    }
    let mounts = get(&app, "/api/v1/mounts", &[]).await.json();
    assert_eq!(
        mounts["mounts"][1],
        json!({"name": "z", "kind": "zip", "url": zip.display().to_string(), "consolidated": true})
    );
}

#[tokio::test]
async fn a_file_that_is_not_a_zip_is_an_upstream_error_not_a_crash() {
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(dir.path().join("bad.zip"), b"this is not a zip archive").unwrap();
    let app = app_for(&[("b", &dir.path().join("bad.zip"))]);
    let r = get(&app, "/zarr/b/zarr.json", &[]).await;
    assert_eq!((r.status.as_u16(), r.error_code().as_str()), (502, "upstream_error"));
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
    use std::io::Write;
    let (u16le, u32le) = (|v: u16| v.to_le_bytes(), |v: u32| v.to_le_bytes());
    let mut zip = Vec::new();
    let mut cd = Vec::new();
    for (name, data) in files {
        let mut gz = flate2::write::DeflateEncoder::new(Vec::new(), flate2::Compression::fast());
        gz.write_all(data).unwrap();
        let packed = gz.finish().unwrap();
        let sizes = |out: &mut Vec<u8>| {
            out.extend(u32le(crc(data)));
            out.extend(u32le(packed.len() as u32));
            out.extend(u32le(data.len() as u32));
            out.extend(u16le(name.len() as u16));
            out.extend(u16le(0)); // extra
        };
        let offset = zip.len() as u32;
        zip.extend(u32le(0x0403_4b50));
        zip.extend([20, 0, 0, 0, 8, 0, 0, 0, 0, 0]); // version, flags, method 8, time, date
        sizes(&mut zip);
        zip.extend(name.as_bytes());
        zip.extend(&packed);
        cd.extend(u32le(0x0201_4b50));
        cd.extend([20, 0, 20, 0, 0, 0, 8, 0, 0, 0, 0, 0]); // made by, needed, flags, method, time, date
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
fn as_zip64_with_comment(mut zip: Vec<u8>, comment: usize) -> Vec<u8> {
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
    zip.extend(u32::MAX.to_le_bytes());
    zip.extend(u32::MAX.to_le_bytes());
    zip.extend((comment as u16).to_le_bytes());
    zip.extend(std::iter::repeat_n(b'c', comment));
    zip
}

/// A ZIP64 archive is read whatever its comment: its locator and end record lie before an end
/// record with a comment of up to 65535 bytes.
#[tokio::test]
async fn zip64_archives_with_the_longest_comment() {
    let dir = tempfile::tempdir().unwrap();
    for comment in [0, 1000, 65_535] {
        let path = dir.path().join(format!("c{comment}.zip"));
        std::fs::write(
            &path,
            as_zip64_with_comment(zip_of(&[("a", b"aaa"), ("b/c", b"the c")]), comment),
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

/// Archives whose directory lies are errors of the archive (502), not bad client ranges (416)
/// or short bodies.
#[tokio::test]
async fn archives_that_lie_are_upstream_errors() {
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
                (502, "upstream_error"),
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

/// A deflated entry that does not match its CRC-32: a whole read ends its body with an error
/// (its headers are sent before the last byte is inflated), a range is served as it inflates.
#[tokio::test]
async fn a_whole_entry_that_fails_its_crc_ends_with_an_error() {
    use http_body_util::BodyExt;
    use tower::ServiceExt;
    let dir = tempfile::tempdir().unwrap();
    let data: Vec<u8> = (0..600_000u32).map(|i| (i % 251) as u8).collect();
    let path = dir.path().join("bad.zip");
    std::fs::write(&path, zip_with_crc(&[("blob", &data)], |d| crc32fast::hash(d) ^ 1)).unwrap();
    let app = app_for(&[("z", &path)]);
    let request = axum::http::Request::get("/zarr/z/blob")
        .body(axum::body::Body::empty())
        .unwrap();
    let response = app.clone().oneshot(request).await.unwrap();
    assert_eq!(response.status(), 200);
    assert!(
        response.into_body().collect().await.is_err(),
        "the body ends with an error"
    );
    let r = get(&app, "/zarr/z/blob", &[("range", "bytes=10-19")]).await;
    assert_eq!((r.status.as_u16(), &r.body[..]), (206, &data[10..20]));
    // The same archive with the right CRC reads whole.
    std::fs::write(&path, zip_of(&[("blob", &data)])).unwrap();
    let r = get(&app_for(&[("z", &path)]), "/zarr/z/blob", &[]).await;
    assert!(r.status == 200 && r.body[..] == data[..]);
}

/// An entry compressed with a method zarrgate does not inflate is 422 on HEAD as on GET.
#[tokio::test]
async fn an_unsupported_method_is_422_on_head_and_get() {
    let dir = tempfile::tempdir().unwrap();
    let mut zip = deflated_zip("blob", &[7u8; 100]);
    // The method fields: at 8 in the local header, at 10 in the directory record.
    let cd = zip.len() - 22 - (46 + 4);
    zip[8] = 12;
    zip[cd + 10] = 12;
    let path = dir.path().join("bzip2.zip");
    std::fs::write(&path, zip).unwrap();
    let app = app_for(&[("z", &path)]);
    for method in ["HEAD", "GET"] {
        let r = common::request(&app, method, "/zarr/z/blob", &[]).await;
        assert_eq!(r.status, 422, "{method}");
    }
}
