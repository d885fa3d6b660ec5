//! Icechunk mounts: each version of a repository served as plain Zarr v3, compared with what
//! icechunk-python and zarr-python read from the same repository (tests/fixtures/icechunk,
//! made by its script).

use crate::common::*;
use zarrgate::config::{Config, MountConfig, MountFormat};

fn fixture() -> std::path::PathBuf {
    repo().join("tests/fixtures/icechunk")
}

pub fn expected() -> serde_json::Value {
    serde_json::from_slice(&std::fs::read(fixture().join("expected.json")).unwrap()).unwrap()
}

/// A mount `ice` of the repository at `dir`, its virtual chunks' prefix read from the
/// fixtures directory when `relocated`.
fn icechunk_config(dir: &std::path::Path, relocated: bool) -> Config {
    let mut mount = MountConfig::new(dir.display().to_string(), dir);
    mount.format = MountFormat::Icechunk;
    if relocated {
        let prefix = expected()["virtual"]["prefix"].as_str().unwrap().to_owned();
        mount
            .virtual_locations
            .insert(prefix, repo().join("tests/fixtures").display().to_string());
    }
    let mut config = Config::default();
    config.mounts.insert("ice".into(), mount);
    config.validate().unwrap();
    config
}

fn app_of(config: Config) -> zarrgate::App {
    zarrgate::app(zarrgate::AppState::from_config(config).unwrap())
}

/// Numbers and the strings `"NaN"`, `"Infinity"`, `"-Infinity"`, flattened.
pub fn flat(v: &serde_json::Value, out: &mut Vec<f64>) {
    match v {
        serde_json::Value::Array(items) => items.iter().for_each(|i| flat(i, out)),
        serde_json::Value::String(s) => out.push(s.parse::<f64>().unwrap_or_else(|_| panic!("not a number: {s}"))),
        other => out.push(other.as_f64().unwrap_or_else(|| panic!("not a number: {other}"))),
    }
}

pub fn same(got: f64, want: f64, float32: bool) -> bool {
    match float32 {
        true => (got as f32).to_bits() == (want as f32).to_bits() || (got.is_nan() && want.is_nan()),
        false => got == want || (got.is_nan() && want.is_nan()),
    }
}

/// Every array of every version (branches, the tag, each snapshot, and the default) reads
/// as icechunk-python + zarr-python read it: values, shape, stored metadata.
#[tokio::test]
async fn every_version_reads_as_icechunk_python_reads_it() {
    let expected = expected();
    let app = app_of(icechunk_config(&fixture().join("repo"), true));
    let mut versions: Vec<(String, String)> = expected["versions"]
        .as_object()
        .unwrap()
        .iter()
        .map(|(v, id)| (format!("@{v}"), id.as_str().unwrap().to_owned()))
        .collect();
    versions.push((String::new(), expected["branches"]["main"].as_str().unwrap().to_owned()));
    let mut checked = 0;
    for (version, snapshot) in &versions {
        checked += reads_as_expected(&app, version, snapshot).await;
    }
    // Six versions' arrays and the default's (main's).
    assert!(checked >= 20, "{checked}");
    let missing = get(&app, "/zarr/ice@tag.v1/temperature/c/1/1/1", &[]).await;
    assert_eq!(missing.status, 404);
}

/// Checks every array and group of the snapshot `snapshot` of expected.json read through
/// mount `ice` with `version` (`@branch.main`, or "" for the default): values, shape, stored
/// documents, and every key icechunk lists. Answers how many arrays it checked.
pub async fn reads_as_expected(app: &zarrgate::App, version: &str, snapshot: &str) -> usize {
    let expected = expected();
    let at = &expected["snapshots"][snapshot];
    let mut checked = 0;
    for (path, array) in at["arrays"].as_object().unwrap() {
        let url = format!("/api/v1/slice/ice{version}{path}?format=json");
        let r = get(app, &url, &[]).await;
        assert_eq!(r.status, 200, "{url}: {}", String::from_utf8_lossy(&r.body));
        assert_eq!(r.json()["shape"], array["shape"], "{url}");
        let (mut got, mut want) = (Vec::new(), Vec::new());
        flat(&r.json()["data"], &mut got);
        flat(&array["values"], &mut want);
        assert_eq!(got.len(), want.len(), "{url}");
        let float32 = array["dtype"] == "float32";
        for (n, (g, w)) in got.iter().zip(&want).enumerate() {
            assert!(same(*g, *w, float32), "{url}[{n}]: {g} != {w}");
        }
        // The stored document, with consolidated metadata only added to groups.
        let doc = get(app, &format!("/zarr/ice{version}{path}/zarr.json"), &[]).await;
        assert_eq!(doc.status, 200, "{url}");
        assert_eq!(doc.json(), array["zarr_json"], "{url}");
        checked += 1;
    }
    for (path, group) in at["groups"].as_object().unwrap() {
        let path = path.trim_end_matches('/');
        let doc = get(app, &format!("/zarr/ice{version}{path}/zarr.json"), &[]).await;
        assert_eq!(doc.status, 200, "{version}{path}");
        assert_eq!(doc.json()["attributes"], group["attributes"], "{version}{path}");
    }
    // Every key icechunk lists is served.
    for key in at["keys"].as_array().unwrap() {
        let r = get(app, &format!("/zarr/ice{version}/{}", key.as_str().unwrap()), &[]).await;
        assert_eq!(r.status, 200, "{version}/{key}");
    }
    checked
}

/// A snapshot's answers never change: strong ETags, `immutable` for caches downstream,
/// 304 on revalidation. A branch's follow its tip: `no-cache`.
#[tokio::test]
async fn snapshot_urls_are_immutable_and_branch_urls_are_not() {
    let expected = expected();
    let app = app_of(icechunk_config(&fixture().join("repo"), true));
    let tag = expected["tags"]["v1"].as_str().unwrap();
    for route in [
        "/zarr/ice@snapshot.{id}/temperature/c/0/0/0",
        "/api/v1/slice/ice@snapshot.{id}/temperature?select=0",
    ] {
        let url = route.replace("{id}", tag);
        let r = get(&app, &url, &[]).await;
        assert_eq!(r.status, 200, "{url}");
        assert_eq!(r.header("cache-control"), Some(zarrgate::state::IMMUTABLE), "{url}");
        if url.starts_with("/zarr/") {
            let etag = r.header("etag").unwrap_or_else(|| panic!("{url}: no ETag"));
            assert!(!etag.starts_with("W/"), "{url}: {etag}");
            let again = get(&app, &url, &[("if-none-match", etag)]).await;
            assert_eq!(again.status, 304, "{url}");
            let head = request(&app, "HEAD", &url, &[]).await;
            assert_eq!((head.status.as_u16(), head.header("etag")), (200, Some(etag)), "{url}");
        }
    }
    // A protected mount's snapshots are kept by their readers alone.
    let mut protected = icechunk_config(&fixture().join("repo"), true);
    // SAFETY: a variable unique to this test, set before the state reads it.
    unsafe { std::env::set_var("ZG_TEST_ICECHUNK_TOKEN", "ice-token") };
    protected.mounts.get_mut("ice").unwrap().tokens = vec!["env:ZG_TEST_ICECHUNK_TOKEN".into()];
    let protected = app_of(protected);
    let url = format!("/zarr/ice@snapshot.{tag}/small/zarr.json");
    let unauthorized = get(&protected, &url, &[]).await;
    assert_eq!(unauthorized.status, 401);
    // A version that is none is still behind the mount's credentials.
    assert_eq!(get(&protected, "/zarr/ice@nonsense/zarr.json", &[]).await.status, 401);
    let r = get(&protected, &url, &[("authorization", "Bearer ice-token")]).await;
    assert_eq!(r.status, 200);
    assert_eq!(r.header("cache-control"), Some(zarrgate::state::IMMUTABLE_PRIVATE));
    let branch = get(&app, "/zarr/ice@branch.main/temperature/c/0/0/0", &[]).await;
    assert_eq!(branch.header("cache-control"), Some("no-cache"));
    // The same chunk of two versions that wrote it differently: two ETags.
    let old = get(&app, &format!("/zarr/ice@snapshot.{tag}/temperature/c/0/0/0"), &[]).await;
    assert_ne!(old.header("etag"), branch.header("etag"));
    assert_ne!(old.body, branch.body);
}

/// Unknown versions, and versions of mounts that have none, are 404 `unknown_version`
/// naming them; the versions route lists what icechunk-python lists.
#[tokio::test]
async fn versions_are_listed_and_unknown_ones_are_named() {
    let expected = expected();
    let app = app_of(icechunk_config(&fixture().join("repo"), true));
    for (url, names) in [
        ("/zarr/ice@branch.nope/zarr.json", "branch.nope"),
        ("/api/v1/slice/ice@tag.v9/small", "tag.v9"),
        (
            "/api/v1/zom/ice@snapshot.AAAAAAAAAAAAAAAAAAAA",
            "snapshot.AAAAAAAAAAAAAAAAAAAA",
        ),
        ("/api/v1/list/ice@snapshot.not-an-id", "not-an-id"),
        ("/zarr/ice@main/zarr.json", "main"),
    ] {
        let r = get(&app, url, &[]).await;
        assert_eq!(r.status, 404, "{url}");
        assert_eq!(r.error_code(), "unknown_version", "{url}");
        assert!(
            r.json()["error"]["message"].as_str().unwrap().contains(names),
            "{url}: {:?}",
            r.body
        );
    }
    let r = get(&app, "/api/v1/versions/ice", &[]).await;
    assert_eq!(r.status, 200);
    let versions = r.json();
    assert_eq!(
        (&versions["default"], &versions["truncated"]),
        (&"branch.main".into(), &false.into())
    );
    for (kind, list) in [("branches", "branches"), ("tags", "tags")] {
        let got: serde_json::Map<String, serde_json::Value> = versions[list]
            .as_array()
            .unwrap()
            .iter()
            .map(|b| (b["name"].as_str().unwrap().to_owned(), b["snapshot"].clone()))
            .collect();
        assert_eq!(serde_json::Value::Object(got), expected[kind], "{kind}");
    }
    // Every commit, with its message and parent, newest first.
    let snapshots = versions["snapshots"].as_array().unwrap();
    assert_eq!(snapshots.len(), expected["snapshots"].as_object().unwrap().len());
    for s in snapshots {
        let want = &expected["snapshots"][s["id"].as_str().unwrap()];
        assert_eq!(s["message"], want["message"]);
        assert_eq!(s["parent"], want["parent_id"]);
    }
    assert_eq!(snapshots[0]["id"], expected["branches"]["main"]);
    // The ZOM and the listing of one version: dev deleted nested/counts and added extra.
    let zom = get(&app, "/api/v1/zom/ice@branch.dev", &[]).await.json();
    let members = zom["members"].as_object().unwrap();
    assert!(members.contains_key("extra"), "{zom}");
    assert!(
        zom["members"]["nested"]["members"].as_object().unwrap().is_empty(),
        "{zom}"
    );
    let zom_v1 = get(&app, "/api/v1/zom/ice@tag.v1", &[]).await.json();
    assert!(!zom_v1["members"].as_object().unwrap().contains_key("extra"));
    let zarr_mount = {
        let mut config = Config::default();
        config.mounts.insert(
            "z".into(),
            MountConfig::new(repo().join("tests/fixtures/data").display().to_string(), "/"),
        );
        app_of(config)
    };
    for url in ["/zarr/z@branch.main/zarr.json", "/api/v1/versions/z"] {
        let r = get(&zarr_mount, url, &[]).await;
        assert_eq!(
            (r.status.as_u16(), r.error_code()),
            (404, "unknown_version".into()),
            "{url}"
        );
    }
}

/// Virtual chunks are read below the mount's virtual prefixes only: else a 502 naming the
/// prefix, and the native chunks of the same version still read.
#[tokio::test]
async fn virtual_chunks_outside_the_mount_s_prefixes_are_refused() {
    let app = app_of(icechunk_config(&fixture().join("repo"), false));
    let r = get(&app, "/api/v1/slice/ice/virtual/temperature", &[]).await;
    assert_eq!(r.status, 502, "{:?}", r.body);
    assert_eq!(r.error_code(), "reference_not_allowed");
    assert!(
        r.json()["error"]["message"].as_str().unwrap().contains("file:///"),
        "{:?}",
        r.body
    );
    assert_eq!(get(&app, "/api/v1/slice/ice/small", &[]).await.status, 200);
}

/// A branch moved under a running server is seen within `cache.ttl_seconds`, and no answer
/// mixes the old tip with the new: each is one snapshot's, cached apart.
#[tokio::test]
async fn a_moved_branch_is_followed_within_the_ttl() {
    let expected = expected();
    let dir = tempfile::tempdir().unwrap();
    copy_dir(&fixture().join("repo"), dir.path());
    let mut config = icechunk_config(dir.path(), true);
    config.cache.ttl_seconds = 1;
    let app = app_of(config);
    let values = |snapshot: &str| {
        let mut want = Vec::new();
        flat(
            &expected["snapshots"][snapshot]["arrays"]["/temperature"]["values"],
            &mut want,
        );
        want
    };
    let read = || async {
        let r = get(&app, "/api/v1/slice/ice/temperature?format=json", &[]).await;
        assert_eq!(r.status, 200);
        let mut got = Vec::new();
        flat(&r.json()["data"], &mut got);
        got
    };
    let main = expected["branches"]["main"].as_str().unwrap();
    let v1 = expected["tags"]["v1"].as_str().unwrap();
    let matches =
        |got: &[f64], want: &[f64]| got.len() == want.len() && got.iter().zip(want).all(|(g, w)| same(*g, *w, true));
    assert!(matches(&read().await, &values(main)));
    // Move main back to the tag's snapshot, as `repo.reset_branch` does.
    let storage = ::icechunk::new_local_filesystem_storage(dir.path()).await.unwrap();
    let writer = ::icechunk::Repository::open(storage).execute().await.unwrap();
    let to = ::icechunk::format::SnapshotId::try_from(v1).unwrap();
    writer.reset_branch("main", &to, None).await.unwrap();
    tokio::time::sleep(std::time::Duration::from_millis(1200)).await;
    assert!(matches(&read().await, &values(v1)));
    assert_eq!(
        get(&app, "/api/v1/versions/ice", &[]).await.json()["branches"]
            .as_array()
            .unwrap()
            .iter()
            .find(|b| b["name"] == "main")
            .unwrap()["snapshot"],
        v1
    );
}

#[test]
fn icechunk_mount_settings_are_checked() {
    let mut mount = MountConfig::new("/tmp", "/");
    mount.format = MountFormat::Icechunk;
    mount.version = Some("main".into());
    let mut config = Config::default();
    config.mounts.insert("ice".into(), mount.clone());
    let e = config.validate().unwrap_err().to_string();
    assert!(e.contains("branch.NAME"), "{e}");
    mount.version = Some("snapshot.garbage".into());
    config.mounts.insert("ice".into(), mount.clone());
    let e = config.validate().unwrap_err().to_string();
    assert!(e.contains("snapshot id"), "{e}");
    mount.format = MountFormat::Zarr;
    mount.version = Some("branch.main".into());
    config.mounts.insert("ice".into(), mount);
    let e = config.validate().unwrap_err().to_string();
    assert!(e.contains("icechunk"), "{e}");
}

/// A snapshot or manifest that does not parse is 500 `corrupt_data`, for the versions that
/// read it alone; the server keeps serving the others, and nothing broken is cached.
#[tokio::test]
async fn corrupt_snapshots_and_manifests_are_corrupt_data() {
    let expected = expected();
    let dir = tempfile::tempdir().unwrap();
    copy_dir(&fixture().join("repo"), dir.path());
    let v1 = expected["tags"]["v1"].as_str().unwrap();
    // Every manifest cut short: the native chunks of every version are unreadable.
    for entry in std::fs::read_dir(dir.path().join("manifests")).unwrap() {
        let path = entry.unwrap().path();
        let bytes = std::fs::read(&path).unwrap();
        std::fs::write(&path, &bytes[..bytes.len() / 2]).unwrap();
    }
    // And the tag's snapshot overwritten with garbage.
    std::fs::write(dir.path().join("snapshots").join(v1), b"not a snapshot").unwrap();
    let app = app_of(icechunk_config(dir.path(), true));
    let chunk = get(&app, "/zarr/ice/temperature/c/0/0/0", &[]).await;
    assert_eq!(
        (chunk.status.as_u16(), chunk.error_code()),
        (500, "corrupt_data".into()),
        "{:?}",
        chunk.body
    );
    let tag = get(&app, "/zarr/ice@tag.v1/zarr.json", &[]).await;
    assert_eq!(
        (tag.status.as_u16(), tag.error_code()),
        (500, "corrupt_data".into()),
        "{:?}",
        tag.body
    );
    // Metadata of other snapshots, in the snapshot files themselves, still reads.
    let doc = get(&app, "/zarr/ice@branch.dev/extra/zarr.json", &[]).await;
    assert_eq!(doc.status, 200);
    assert_eq!(
        doc.json(),
        expected["snapshots"][expected["branches"]["dev"].as_str().unwrap()]["arrays"]["/extra"]["zarr_json"]
    );
}

/// A virtual chunk whose manifest records its source's state (Icechunk's checksum: an ETag
/// or a last-modified time) reads only while the source is still in that state: a source
/// replaced since is 500 `corrupt_data`, never served as the snapshot's bytes.
#[tokio::test]
async fn virtual_chunks_whose_source_changed_are_corrupt_data() {
    use ::icechunk::format::manifest::{
        Checksum, ChunkPayload, SecondsSinceEpoch, VirtualChunkLocation, VirtualChunkRef,
    };
    use ::icechunk::format::{ChunkIndices, Path};
    use ::icechunk::storage::ETag;
    let expected = expected();
    let dir = tempfile::tempdir().unwrap();
    copy_dir(&fixture().join("repo"), dir.path());
    let storage = ::icechunk::new_local_filesystem_storage(dir.path()).await.unwrap();
    let writer = ::icechunk::Repository::open(storage).execute().await.unwrap();
    let location = format!("{}references/data.nc", expected["virtual"]["prefix"].as_str().unwrap());
    let refs: serde_json::Value =
        serde_json::from_slice(&std::fs::read(repo().join("tests/fixtures/references/refs_v1.json")).unwrap()).unwrap();
    let chunk = refs["refs"]["temperature/0.0.0"].as_array().unwrap().clone();
    let (offset, length) = (chunk[1].as_u64().unwrap(), chunk[2].as_u64().unwrap());
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_secs() as u32;
    let mut session = writer.writable_session("main").await.unwrap();
    let path = Path::new("/virtual/temperature").unwrap();
    for (coords, checksum) in [
        // Written long before the file was: the file changed since.
        (vec![0, 0, 0], Some(Checksum::LastModified(SecondsSinceEpoch(1)))),
        (vec![0, 0, 1], Some(Checksum::ETag(ETag("\"not-the-file-s\"".into())))),
        // The file as it is now: read.
        (
            vec![0, 1, 0],
            Some(Checksum::LastModified(SecondsSinceEpoch(now + 3600))),
        ),
    ] {
        let payload = ChunkPayload::Virtual(VirtualChunkRef {
            location: VirtualChunkLocation::from_url(&location).unwrap(),
            offset,
            length,
            checksum,
        });
        session
            .set_chunk_ref(path.clone(), ChunkIndices(coords), Some(payload))
            .await
            .unwrap();
    }
    session.commit("checksums").execute().await.unwrap();
    let app = app_of(icechunk_config(dir.path(), true));
    for key in ["c/0/0/0"] {
        let r = get(&app, &format!("/zarr/ice/virtual/temperature/{key}"), &[]).await;
        assert_eq!(
            (r.status.as_u16(), r.error_code()),
            (500, "corrupt_data".into()),
            "{key}"
        );
        let head = request(&app, "HEAD", &format!("/zarr/ice/virtual/temperature/{key}"), &[]).await;
        assert_eq!(head.status, 500, "{key}");
    }
    let fresh = get(&app, "/zarr/ice/virtual/temperature/c/0/1/0", &[]).await;
    assert_eq!(fresh.status, 200);
    // A local file's version here is no ETag its writer saw: an ETag checksum is not held
    // against it (buckets' ETags are).
    assert_eq!(
        get(&app, "/zarr/ice/virtual/temperature/c/0/0/1", &[]).await.status,
        200
    );
    let source = std::fs::read(repo().join("tests/fixtures/references/data.nc")).unwrap();
    assert_eq!(&fresh.body[..], &source[offset as usize..(offset + length) as usize]);
}

/// A reload that changes an Icechunk mount's default version reads the new one at once; one
/// that changes nothing of the mount keeps it (and what its repository has read).
#[tokio::test]
async fn a_reload_changes_the_default_version() {
    let expected = expected();
    let config = icechunk_config(&fixture().join("repo"), true);
    let app = app_of(config.clone());
    let health = zarrgate::server::health_app(app.state());
    let first = |app: &zarrgate::App| {
        let app = app.clone();
        async move {
            let r = get(&app, "/api/v1/slice/ice/temperature?select=0,0,0&format=json", &[]).await;
            assert_eq!(r.status, 200);
            r.json()["data"].as_f64().unwrap()
        }
    };
    let value_at = |snapshot: &str| {
        expected["snapshots"][snapshot]["arrays"]["/temperature"]["values"][0]
            .as_f64()
            .unwrap()
    };
    let (main, v1) = (
        expected["branches"]["main"].as_str().unwrap(),
        expected["tags"]["v1"].as_str().unwrap(),
    );
    assert_ne!(value_at(main), value_at(v1));
    assert_eq!(first(&app).await, value_at(main));
    let mut tagged = config.clone();
    tagged.mounts.get_mut("ice").unwrap().version = Some("tag.v1".into());
    zarrgate::server::reload(&[&app, &health], tagged.clone())
        .await
        .unwrap();
    assert_eq!(first(&app).await, value_at(v1));
    let before = app.state().mounts["ice"].repository.clone().unwrap();
    zarrgate::server::reload(&[&app, &health], tagged).await.unwrap();
    assert!(std::sync::Arc::ptr_eq(
        &before,
        app.state().mounts["ice"].repository.as_ref().unwrap()
    ));
    assert_eq!(first(&app).await, value_at(v1));
}
