//! Reference mounts: a kerchunk reference file served as the Zarr store it describes.

use crate::common::*;
use zarrgate::config::{Config, MountConfig, MountFormat};

/// A mount `r` of `dir/refs.json` as a reference file.
fn references_config(dir: &std::path::Path, prefixes: &[String]) -> Config {
    let mut mount = MountConfig::new(dir.join("refs.json").display().to_string(), dir);
    mount.format = MountFormat::References;
    mount.virtual_prefixes = prefixes.to_vec();
    let mut config = Config::default();
    config.mounts.insert("r".into(), mount);
    config
}

/// `grid.bin`: a 4x6 int32 array as 2x3 chunks laid end to end (chunk (i, j) at
/// `(i * 2 + j) * 24`), each holding `100 * chunk + element`. Answers the array, row by row.
fn write_grid(dir: &std::path::Path) -> Vec<i32> {
    let mut file = Vec::new();
    for chunk in 0..4i32 {
        for e in 0..6i32 {
            file.extend_from_slice(&(100 * chunk + e).to_le_bytes());
        }
    }
    std::fs::write(dir.join("grid.bin"), &file).unwrap();
    // The array, row by row.
    let mut values = vec![0; 24];
    for (ci, cj) in [(0, 0), (0, 1), (1, 0), (1, 1)] {
        let chunk = ci * 2 + cj;
        for e in 0..6 {
            let (i, j) = (ci * 2 + e / 3, cj * 3 + e % 3);
            values[(i * 6 + j) as usize] = 100 * chunk + e;
        }
    }
    values
}

fn refs_v1() -> serde_json::Value {
    use base64::Engine;
    let inline: Vec<u8> = (0..6i32).flat_map(|e| (1300 + e).to_le_bytes()).collect();
    serde_json::json!({
        "version": 1,
        "templates": {"u": "grid.bin"},
        "refs": {
            ".zgroup": "{\"zarr_format\": 2}",
            ".zattrs": {"title": "by reference"},
            "grid/.zarray": serde_json::json!({
                "zarr_format": 2, "shape": [4, 6], "chunks": [2, 3], "dtype": "<i4",
                "compressor": null, "filters": null, "fill_value": 0, "order": "C"
            }).to_string(),
            "grid/.zattrs": "{\"units\": \"K\"}",
            "grid/0.1": ["{{u}}", 24, 24],
            "grid/1.1": format!("base64:{}", base64::engine::general_purpose::STANDARD.encode(inline)),
        },
        "gen": [{
            "key": "grid/{{i}}.{{j}}", "url": "{{u}}", "offset": "{{ (i * 2 + j) * 24 }}", "length": "24",
            "dimensions": {"i": {"stop": 2}, "j": [0]}
        }]
    })
}

#[tokio::test]
async fn a_reference_file_is_served_as_the_store_it_describes() {
    let dir = tempfile::tempdir().unwrap();
    let values = write_grid(dir.path());
    std::fs::write(dir.path().join("refs.json"), refs_v1().to_string()).unwrap();
    let config = references_config(dir.path(), &[]);
    config.validate().unwrap();
    let app = zarrgate::app(zarrgate::AppState::from_config(config).unwrap());
    let slice = get(&app, "/api/v1/slice/r/grid?format=json", &[]).await;
    assert_eq!(slice.status, 200, "{:?}", slice.body);
    let got: Vec<i64> = slice.json()["data"]
        .as_array()
        .unwrap()
        .iter()
        .flat_map(|row| row.as_array().unwrap().iter().map(|v| v.as_i64().unwrap()))
        .collect();
    let mut want: Vec<i64> = values.iter().map(|&v| i64::from(v)).collect();
    // grid/1.1 is inline (1300 + e), not the file's chunk (300 + e).
    for (i, w) in want.iter_mut().enumerate() {
        let (r, c) = (i / 6, i % 6);
        if r >= 2 && c >= 3 {
            *w = 1300 + ((r - 2) * 3 + (c - 3)) as i64;
        }
    }
    assert_eq!(got, want);
    // Raw keys as if stored: documents, a ranged chunk, HEAD, ranges, ETags.
    let zarray = get(&app, "/zarr/r/grid/.zarray", &[]).await;
    assert_eq!(zarray.json()["shape"], serde_json::json!([4, 6]));
    assert_eq!(get(&app, "/zarr/r/.zattrs", &[]).await.json()["title"], "by reference");
    let chunk = get(&app, "/zarr/r/grid/0.1", &[]).await;
    let file = std::fs::read(dir.path().join("grid.bin")).unwrap();
    assert_eq!(&chunk.body[..], &file[24..48]);
    let etag = chunk.header("etag").unwrap().to_owned();
    let head = request(&app, "HEAD", "/zarr/r/grid/0.1", &[]).await;
    assert_eq!(
        (head.header("content-length"), head.header("etag")),
        (Some("24"), Some(etag.as_str()))
    );
    let part = get(&app, "/zarr/r/grid/0.1", &[("range", "bytes=4-7")]).await;
    assert_eq!((part.status.as_u16(), &part.body[..]), (206, &file[28..32]));
    assert_eq!(
        get(&app, "/zarr/r/grid/0.1", &[("if-none-match", &etag)]).await.status,
        304
    );
    assert_eq!(get(&app, "/zarr/r/grid/9.9", &[]).await.status, 404);
    // Listed as a store is, and consolidated metadata synthesized.
    let zmetadata = get(&app, "/zarr/r/.zmetadata", &[]).await.json();
    assert_eq!(zmetadata["metadata"]["grid/.zattrs"]["units"], "K");
    let zom = get(&app, "/api/v1/zom/r", &[]).await.json();
    assert_eq!(zom["members"]["grid"]["shape"], serde_json::json!([4, 6]));
}

#[tokio::test]
async fn references_outside_their_prefixes_or_past_their_files_are_errors_naming_them() {
    let dir = tempfile::tempdir().unwrap();
    write_grid(dir.path());
    let elsewhere = tempfile::tempdir().unwrap();
    std::fs::write(elsewhere.path().join("other.bin"), vec![7u8; 24]).unwrap();
    let other = elsewhere.path().join("other.bin").display().to_string();
    let mut refs = refs_v1();
    refs["refs"]["grid/0.0"] = serde_json::json!([other, 0, 24]);
    refs["refs"]["grid/0.1"] = serde_json::json!(["s3://private-bucket/secret.bin", 0, 24]);
    refs["refs"]["grid/1.0"] = serde_json::json!(["grid.bin", 90, 24]);
    refs["refs"]["missing"] = serde_json::json!(["nothere.bin"]);
    refs["gen"] = serde_json::json!([]);
    std::fs::write(dir.path().join("refs.json"), refs.to_string()).unwrap();
    // No prefix allows the other directory.
    let app = zarrgate::app(zarrgate::AppState::from_config(references_config(dir.path(), &[])).unwrap());
    for (key, status, code, says) in [
        ("grid/0.0", 502, "reference_not_allowed", "'file:///"),
        (
            "grid/0.1",
            502,
            "reference_not_allowed",
            "'s3://private-bucket/' is outside the mount's virtual_prefixes",
        ),
        ("grid/1.0", 500, "corrupt_data", "grid/1.0"),
        ("missing", 500, "corrupt_data", "missing"),
    ] {
        let r = get(&app, &format!("/zarr/r/{key}"), &[]).await;
        assert_eq!((r.status.as_u16(), r.error_code().as_str()), (status, code), "{key}");
        let message = r.json()["error"]["message"].as_str().unwrap().to_owned();
        assert!(message.contains(says), "{key}: {message}");
        assert!(!message.contains("secret.bin"), "{key}: {message}");
    }
    // Allowed by a prefix, it is read.
    let prefix = format!("file://{}/", elsewhere.path().display());
    let app = zarrgate::app(zarrgate::AppState::from_config(references_config(dir.path(), &[prefix])).unwrap());
    let r = get(&app, "/zarr/r/grid/0.0", &[]).await;
    assert_eq!((r.status.as_u16(), &r.body[..]), (200, &[7u8; 24][..]));
    // The server keeps serving the rest.
    assert_eq!(get(&app, "/zarr/r/grid/.zarray", &[]).await.status, 200);
}

#[tokio::test]
async fn a_changed_reference_file_is_read_again_and_its_keys_get_new_etags() {
    let dir = tempfile::tempdir().unwrap();
    write_grid(dir.path());
    std::fs::write(dir.path().join("refs.json"), refs_v1().to_string()).unwrap();
    let mut config = references_config(dir.path(), &[]);
    config.cache.ttl_seconds = 1;
    let app = zarrgate::app(zarrgate::AppState::from_config(config).unwrap());
    let before = get(&app, "/zarr/r/grid/0.1", &[]).await;
    let mut refs = refs_v1();
    refs["refs"]["grid/0.1"] = serde_json::json!(["grid.bin", 72, 24]);
    std::fs::write(dir.path().join("refs.json"), refs.to_string()).unwrap();
    tokio::time::sleep(std::time::Duration::from_millis(1100)).await;
    let after = get(&app, "/zarr/r/grid/0.1", &[]).await;
    let file = std::fs::read(dir.path().join("grid.bin")).unwrap();
    assert_eq!((&before.body[..], &after.body[..]), (&file[24..48], &file[72..96]));
    assert_ne!(before.header("etag"), after.header("etag"));
    // A reference file that no longer parses: 500 naming it, until it is fixed.
    std::fs::write(dir.path().join("refs.json"), "{\"version\": 1, \"refs\": [").unwrap();
    tokio::time::sleep(std::time::Duration::from_millis(1100)).await;
    let r = get(&app, "/zarr/r/grid/0.0", &[]).await;
    assert_eq!((r.status.as_u16(), r.error_code().as_str()), (500, "corrupt_data"));
    assert!(r.json()["error"]["message"].as_str().unwrap().contains("refs.json"));
}

#[test]
fn reference_mount_settings_are_checked() {
    let dir = tempfile::tempdir().unwrap();
    let mut config = references_config(dir.path(), &["relative/dir".into()]);
    let e = config.validate().unwrap_err().to_string();
    assert!(e.contains("virtual_prefixes"), "{e}");
    config.mounts.get_mut("r").unwrap().virtual_prefixes.clear();
    config.mounts.get_mut("r").unwrap().format = MountFormat::Icechunk;
    std::fs::write(dir.path().join("repo.zip"), b"").unwrap();
    config.mounts.get_mut("r").unwrap().url = dir.path().join("repo.zip").display().to_string();
    let e = config.validate().unwrap_err().to_string();
    assert!(e.contains("Icechunk") && e.contains("zip"), "{e}");
    let mut zarr = config_with(&[("z", dir.path())]);
    zarr.mounts.get_mut("z").unwrap().virtual_prefixes = vec!["s3://b/".into()];
    assert!(zarr.validate().unwrap_err().to_string().contains("references"));
}

/// Numbers of a JSON value, nested lists flattened in order (a 0-d array is one number).
fn flat_numbers(v: &serde_json::Value, out: &mut Vec<f64>) {
    match v {
        serde_json::Value::Array(items) => items.iter().for_each(|i| flat_numbers(i, out)),
        other => out.push(other.as_f64().unwrap_or_else(|| panic!("not a number: {other}"))),
    }
}

/// Mounts the reference set `set` of tests/fixtures/references (a file, or a parquet
/// directory) as `r`, and checks that `array` (an entry of its expected*.json) decodes to the
/// values and shape its original readers read; answers the app.
async fn decodes_as_expected(set: &str, array: &serde_json::Value) -> zarrgate::App {
    let dir = repo().join("tests/fixtures/references");
    let mut mount = MountConfig::new(dir.join(set).display().to_string(), &dir);
    mount.format = MountFormat::References;
    let mut config = Config::default();
    config.mounts.insert("r".into(), mount);
    config.validate().unwrap();
    let app = zarrgate::app(zarrgate::AppState::from_config(config).unwrap());
    let path = array["path"].as_str().unwrap();
    let r = get(&app, &format!("/api/v1/slice/r/{path}?format=json"), &[]).await;
    assert_eq!(r.status, 200, "{set} {path}: {}", String::from_utf8_lossy(&r.body));
    let (mut got, mut want) = (Vec::new(), Vec::new());
    flat_numbers(&r.json()["data"], &mut got);
    flat_numbers(&array["values"], &mut want);
    let float32 = array["dtype"] == "<f4";
    assert_eq!(got.len(), want.len(), "{set} {path}");
    for (n, (g, w)) in got.iter().zip(&want).enumerate() {
        let same = match float32 {
            true => (*g as f32) == (*w as f32),
            false => g == w,
        };
        assert!(same, "{set} {path}[{n}]: {g} != {w}");
    }
    assert_eq!(r.json()["shape"], array["shape"], "{set} {path}");
    app
}

fn expected_of(file: &str) -> serde_json::Value {
    let path = repo().join("tests/fixtures/references").join(file);
    serde_json::from_slice(&std::fs::read(path).unwrap()).unwrap()
}

/// The reference sets kerchunk wrote of NetCDF4 and HDF5 files (tests/fixtures/references,
/// made by its script) decode to what xarray, h5py and numpy read from the original files.
#[tokio::test]
async fn kerchunk_references_decode_to_what_the_original_readers_read() {
    let expected = expected_of("expected.json");
    let mut checked = 0;
    for array in expected["arrays"].as_array().unwrap() {
        for refs in array["refs"].as_array().unwrap() {
            decodes_as_expected(refs.as_str().unwrap(), array).await;
            checked += 1;
        }
    }
    // Five arrays of data.nc in two reference sets, three of data.h5, one made by gen.
    assert_eq!(checked, 14);
}

/// kerchunk's parquet form (a directory of `.zmetadata` and record files, written by
/// kerchunk and fastparquet; tests/fixtures/references/make_parquet.py) decodes to what the
/// original readers read: inline, range, whole-file and missing rows, record files of
/// `record_size` rows, dictionary-encoded paths.
#[tokio::test]
async fn parquet_references_decode_to_what_the_original_readers_read() {
    let expected = expected_of("expected_parquet.json");
    let mut checked = 0;
    for array in expected["arrays"].as_array().unwrap() {
        let set = array["refs"][0].as_str().unwrap();
        let app = decodes_as_expected(set, array).await;
        checked += 1;
        // The record files themselves are not keys of the store.
        let path = array["path"].as_str().unwrap();
        let record = get(&app, &format!("/zarr/r/{path}/refs.0.parq"), &[]).await;
        assert_eq!(record.status, 404, "{set} {path}");
    }
    assert_eq!(checked, expected["arrays"].as_array().unwrap().len());
    assert!(checked >= 7, "{checked}");
}

/// A parquet set whose record file is not parquet is 500 `corrupt_data`; the server goes on
/// serving, and reads the set again after the TTL. A record file that is not there holds
/// missing chunks (fsspec writes none for records with no chunk set).
#[tokio::test]
async fn broken_parquet_references_are_corrupt_data() {
    let source = repo().join("tests/fixtures/references");
    let dir = tempfile::tempdir().unwrap();
    std::fs::copy(source.join("data.nc"), dir.path().join("data.nc")).unwrap();
    let set = dir.path().join("refs_parquet");
    copy_dir(&source.join("refs_parquet"), &set);
    let good = std::fs::read(set.join("temperature/refs.1.parq")).unwrap();
    std::fs::write(set.join("temperature/refs.1.parq"), b"not parquet").unwrap();
    let mut mount = MountConfig::new(set.display().to_string(), dir.path());
    mount.format = MountFormat::References;
    let mut config = Config::default();
    config.mounts.insert("r".into(), mount);
    config.cache.ttl_seconds = 1;
    config.validate().unwrap();
    let app = zarrgate::app(zarrgate::AppState::from_config(config).unwrap());
    let r = get(&app, "/api/v1/slice/r/temperature", &[]).await;
    assert_eq!(
        (r.status.as_u16(), r.error_code()),
        (500, "corrupt_data".into()),
        "{:?}",
        r.body
    );
    std::fs::remove_file(set.join("temperature/refs.1.parq")).unwrap();
    tokio::time::sleep(std::time::Duration::from_millis(1100)).await;
    // Chunks 4..8 (time 2..4) are fill values now; the first two time steps are as stored.
    let r = get(&app, "/api/v1/slice/r/temperature?select=2:4&format=json", &[]).await;
    assert_eq!(r.status, 200, "{:?}", r.body);
    let mut values = Vec::new();
    flat_numbers(&r.json()["data"], &mut values);
    assert!(values.iter().all(|&v| v == -9999.0), "{values:?}");
    assert_eq!(get(&app, "/zarr/r/temperature/0.0.0", &[]).await.status, 200);
    assert_eq!(get(&app, "/zarr/r/temperature/2.0.0", &[]).await.status, 404);
    std::fs::write(set.join("temperature/refs.1.parq"), good).unwrap();
    // The set is read again after the TTL, as its .zmetadata is the same: the failed read is
    // not kept past it.
    tokio::time::sleep(std::time::Duration::from_millis(1100)).await;
    assert_eq!(get(&app, "/api/v1/slice/r/temperature", &[]).await.status, 200);
}
