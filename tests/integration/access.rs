//! Real deployments' access and operations: bearer JWTs against a JWKS, signed URLs, config
//! reloads (SIGHUP's work) and readiness.

use crate::common::*;
use aws_lc_rs::signature::{ECDSA_P256_SHA256_FIXED_SIGNING, EcdsaKeyPair, KeyPair};
use base64::Engine;
use base64::engine::general_purpose::URL_SAFE_NO_PAD;
use zarrgate::config::{Config, JwtConfig};

/// An EC P-256 signing key made by the test, with its public half as a JWK.
struct TestKey {
    kid: &'static str,
    pkcs8: Vec<u8>,
    jwk: serde_json::Value,
}

fn test_key(kid: &'static str) -> TestKey {
    let rng = aws_lc_rs::rand::SystemRandom::new();
    let pkcs8 = EcdsaKeyPair::generate_pkcs8(&ECDSA_P256_SHA256_FIXED_SIGNING, &rng).unwrap();
    let pair = EcdsaKeyPair::from_pkcs8(&ECDSA_P256_SHA256_FIXED_SIGNING, pkcs8.as_ref()).unwrap();
    // An uncompressed point: 0x04, x, y.
    let point = pair.public_key().as_ref();
    let (x, y) = point[1..].split_at(32);
    let jwk = serde_json::json!({
        "kty": "EC", "crv": "P-256", "use": "sig", "alg": "ES256", "kid": kid,
        "x": URL_SAFE_NO_PAD.encode(x), "y": URL_SAFE_NO_PAD.encode(y),
    });
    TestKey {
        kid,
        pkcs8: pkcs8.as_ref().to_vec(),
        jwk,
    }
}

fn now() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_secs()
}

/// A token signed by `key`, with these claims.
fn token(key: &TestKey, claims: serde_json::Value) -> String {
    let mut header = jsonwebtoken::Header::new(jsonwebtoken::Algorithm::ES256);
    header.kid = Some(key.kid.into());
    jsonwebtoken::encode(&header, &claims, &jsonwebtoken::EncodingKey::from_ec_der(&key.pkcs8)).unwrap()
}

fn claims(scope: &str, exp: u64) -> serde_json::Value {
    serde_json::json!({"iss": "https://issuer.test", "aud": "zarrgate", "exp": exp, "sub": "u", "scope": scope})
}

/// Mounts `open` (public) and `private` (scope `read:private`, and a static token) of the
/// fixtures, with the key set `jwks` written to a file.
fn jwt_config(dir: &std::path::Path, jwks: &serde_json::Value) -> Config {
    std::fs::write(dir.join("jwks.json"), jwks.to_string()).unwrap();
    let mut config = config_with(&[("open", &fixtures()), ("private", &fixtures())]);
    config.auth.jwt = Some(JwtConfig {
        jwks: "jwks.json".into(),
        issuer: "https://issuer.test".into(),
        audience: "zarrgate".into(),
        refresh_seconds: 300,
        base_dir: dir.to_owned(),
    });
    config.mounts.get_mut("private").unwrap().jwt_scope = Some("read:private".into());
    config
}

const KEY: &str = "/zarr/private/v3/zstd_i4/zarr.json";

#[tokio::test]
async fn jwts_of_the_key_set_with_the_mount_s_scope_read_it_and_others_are_refused() {
    let dir = tempfile::tempdir().unwrap();
    let (signer, stranger) = (test_key("k1"), test_key("k1"));
    let config = jwt_config(dir.path(), &serde_json::json!({"keys": [signer.jwk]}));
    config.validate().unwrap();
    let state = zarrgate::AppState::from_config(config).unwrap();
    let app = zarrgate::app(state.clone());
    // Not ready, and no JWT accepted, until the key set has been read.
    let r = get(&app, "/readyz", &[]).await;
    assert_eq!((r.status.as_u16(), r.error_code().as_str()), (503, "not_ready"));
    let good = token(&signer, claims("read:other read:private", now() + 600));
    let bearer = format!("Bearer {good}");
    assert_eq!(get(&app, KEY, &[("authorization", &bearer)]).await.status, 401);
    assert_eq!(state.auth.jwt.as_ref().unwrap().refresh().await, Ok(1));
    assert_eq!(get(&app, "/readyz", &[]).await.json()["status"], "ready");

    let want = std::fs::read(fixtures().join("v3/zstd_i4/zarr.json")).unwrap();
    let r = get(&app, KEY, &[("authorization", &bearer)]).await;
    assert_eq!(r.status, 200);
    assert_eq!(&r.body[..], &want[..]);
    let listed = get(&app, "/api/v1/mounts", &[("authorization", &bearer)]).await.json();
    let names: Vec<&str> = listed["mounts"]
        .as_array()
        .unwrap()
        .iter()
        .map(|m| m["name"].as_str().unwrap())
        .collect();
    assert_eq!(names, ["open", "private"]);
    let anonymous = get(&app, "/api/v1/mounts", &[]).await.json();
    assert_eq!(anonymous["mounts"].as_array().unwrap().len(), 1);
    // A list of scopes (`scp`) is read too.
    let listed_scopes = serde_json::json!({"iss": "https://issuer.test", "aud": "zarrgate", "exp": now() + 60, "scp": ["read:private"]});
    let r = get(
        &app,
        KEY,
        &[("authorization", &format!("Bearer {}", token(&signer, listed_scopes)))],
    )
    .await;
    assert_eq!(r.status, 200);

    // Valid, without the scope: 403 naming it.
    let r = get(
        &app,
        KEY,
        &[(
            "authorization",
            &format!("Bearer {}", token(&signer, claims("read:other", now() + 600))),
        )],
    )
    .await;
    assert_eq!(
        (r.status.as_u16(), r.error_code().as_str()),
        (403, "insufficient_scope")
    );
    assert_eq!(
        r.header("www-authenticate"),
        Some("Bearer error=\"insufficient_scope\", scope=\"read:private\"")
    );
    // Refused as invalid: expired, another issuer or audience, another key under the same
    // id, an unknown key id, a changed payload, no signature, a symmetric algorithm.
    let mut foreign_issuer = claims("read:private", now() + 600);
    foreign_issuer["iss"] = "https://other.test".into();
    let mut foreign_audience = claims("read:private", now() + 600);
    foreign_audience["aud"] = "someone-else".into();
    let mut unknown_kid = jsonwebtoken::Header::new(jsonwebtoken::Algorithm::ES256);
    unknown_kid.kid = Some("k9".into());
    let unknown = jsonwebtoken::encode(
        &unknown_kid,
        &claims("read:private", now() + 600),
        &jsonwebtoken::EncodingKey::from_ec_der(&stranger.pkcs8),
    )
    .unwrap();
    let parts: Vec<&str> = good.split('.').collect();
    let other_payload = URL_SAFE_NO_PAD.encode(claims("read:private", now() + 7200).to_string());
    let hs256 = jsonwebtoken::encode(
        &jsonwebtoken::Header::new(jsonwebtoken::Algorithm::HS256),
        &claims("read:private", now() + 600),
        &jsonwebtoken::EncodingKey::from_secret(signer.jwk.to_string().as_bytes()).unwrap(),
    )
    .unwrap();
    let none = format!(
        "{}.{}.",
        URL_SAFE_NO_PAD.encode(r#"{"alg":"none","typ":"JWT"}"#),
        parts[1]
    );
    for (what, bad, says) in [
        (
            "expired",
            token(&signer, claims("read:private", now() - 120)),
            "the token has expired",
        ),
        (
            "issuer",
            token(&signer, foreign_issuer),
            "the token's issuer is not accepted",
        ),
        (
            "audience",
            token(&signer, foreign_audience),
            "the token's audience is not accepted",
        ),
        (
            "another key",
            token(&stranger, claims("read:private", now() + 600)),
            "the signature does not verify",
        ),
        ("unknown key", unknown, "the token's key is not in the key set"),
        (
            "payload",
            format!("{}.{other_payload}.{}", parts[0], parts[2]),
            "the signature does not verify",
        ),
        ("hs256", hs256, "no key of the set verifies the token's algorithm"),
        ("none", none, "not a JWT"),
        ("garbage", "abc".into(), "not a JWT"),
    ] {
        let r = get(&app, KEY, &[("authorization", &format!("Bearer {bad}"))]).await;
        assert_eq!(
            (r.status.as_u16(), r.error_code().as_str()),
            (401, "invalid_token"),
            "{what}"
        );
        assert_eq!(
            r.header("www-authenticate").unwrap(),
            format!("Bearer error=\"invalid_token\", error_description=\"{says}\""),
            "{what}"
        );
    }
    // Not valid yet (nbf an hour ahead): refused, as RFC 7519 says.
    let mut early = claims("read:private", now() + 7200);
    early["nbf"] = (now() + 3600).into();
    let r = get(
        &app,
        KEY,
        &[("authorization", &format!("Bearer {}", token(&signer, early)))],
    )
    .await;
    assert_eq!(
        r.header("www-authenticate"),
        Some("Bearer error=\"invalid_token\", error_description=\"the token is not valid yet\"")
    );
    // No token: told the scheme only. The public mount needs none.
    let r = get(&app, KEY, &[]).await;
    assert_eq!((r.status.as_u16(), r.header("www-authenticate")), (401, Some("Bearer")));
    assert_eq!(get(&app, &KEY.replace("/private/", "/open/"), &[]).await.status, 200);
    // A rotated key set is read on its next refresh: the old key's tokens are then refused.
    let rotated = test_key("k2");
    std::fs::write(
        dir.path().join("jwks.json"),
        serde_json::json!({"keys": [rotated.jwk]}).to_string(),
    )
    .unwrap();
    assert_eq!(state.auth.jwt.as_ref().unwrap().refresh().await, Ok(1));
    assert_eq!(get(&app, KEY, &[("authorization", &bearer)]).await.status, 401);
    let fresh = format!("Bearer {}", token(&rotated, claims("read:private", now() + 60)));
    assert_eq!(get(&app, KEY, &[("authorization", &fresh)]).await.status, 200);
    // A key set that no longer parses keeps the keys in use.
    std::fs::write(dir.path().join("jwks.json"), "{not json").unwrap();
    assert!(state.auth.jwt.as_ref().unwrap().refresh().await.is_err());
    assert_eq!(get(&app, KEY, &[("authorization", &fresh)]).await.status, 200);
}

/// A token that names no key is tried with every key of its algorithm.
#[tokio::test]
async fn a_token_without_a_key_id_is_tried_with_each_key() {
    let dir = tempfile::tempdir().unwrap();
    let (one, two) = (test_key("a"), test_key("b"));
    let config = jwt_config(dir.path(), &serde_json::json!({"keys": [one.jwk, two.jwk]}));
    let state = zarrgate::AppState::from_config(config).unwrap();
    assert_eq!(state.auth.jwt.as_ref().unwrap().refresh().await, Ok(2));
    let app = zarrgate::app(state);
    let header = jsonwebtoken::Header::new(jsonwebtoken::Algorithm::ES256);
    let signed = jsonwebtoken::encode(
        &header,
        &claims("read:private", now() + 60),
        &jsonwebtoken::EncodingKey::from_ec_der(&two.pkcs8),
    )
    .unwrap();
    assert_eq!(
        get(&app, KEY, &[("authorization", &format!("Bearer {signed}"))])
            .await
            .status,
        200
    );
}

#[test]
fn jwt_settings_are_checked() {
    let dir = tempfile::tempdir().unwrap();
    let mut config = jwt_config(dir.path(), &serde_json::json!({"keys": []}));
    config.validate().unwrap();
    let jwt = config.auth.jwt.clone().unwrap();
    for (bad, says) in [
        (
            JwtConfig {
                jwks: "http://example.com/jwks.json".into(),
                ..jwt.clone()
            },
            "https",
        ),
        (
            JwtConfig {
                jwks: "ftp://x/jwks.json".into(),
                ..jwt.clone()
            },
            "https",
        ),
        (
            JwtConfig {
                audience: " ".into(),
                ..jwt.clone()
            },
            "audience",
        ),
        (
            JwtConfig {
                refresh_seconds: 0,
                ..jwt.clone()
            },
            "refresh_seconds",
        ),
    ] {
        config.auth.jwt = Some(bad);
        let e = config.validate().unwrap_err().to_string();
        assert!(e.contains(says), "{e}");
    }
    config.auth.jwt = None;
    let e = config.validate().unwrap_err().to_string();
    assert!(e.contains("jwt_scope") && e.contains("[auth.jwt]"), "{e}");
}

/// Sets the signing key's variable (unique to these tests) and answers a config reading it.
fn signing_config(mounts: &[(&str, &std::path::Path)]) -> Config {
    // SAFETY: a variable unique to these tests, set to the same value by each, before
    // anything reads it.
    unsafe { std::env::set_var("ZG_TEST_SIGNING_KEY", "signing-secret") };
    let mut config = config_with(mounts);
    config.auth.url_signing_key = Some("env:ZG_TEST_SIGNING_KEY".into());
    config
}

fn sign(config: &Config, mount: &str, prefix: &str, expires: &str) -> String {
    let args = zarrgate::config::SignArgs {
        mount: mount.into(),
        prefix: prefix.into(),
        expires: expires.into(),
        config: None,
        base_url: Some("http://gate.test:81".into()),
    };
    zarrgate::auth::signed_url::for_config(config, &args, std::time::SystemTime::now()).unwrap()
}

#[tokio::test]
async fn signed_urls_read_their_prefix_until_they_expire() {
    let mut config = signing_config(&[("secret", &fixtures())]);
    // SAFETY: as above; a variable unique to this test.
    unsafe { std::env::set_var("ZG_TEST_SIGNED_MOUNT_TOKEN", "mount-token") };
    config.mounts.get_mut("secret").unwrap().tokens = vec!["env:ZG_TEST_SIGNED_MOUNT_TOKEN".into()];
    config.mounts.get_mut("secret").unwrap().cache_control = Some("public, max-age=3600".into());
    config.validate().unwrap();
    let app = zarrgate::app(zarrgate::AppState::from_config(config.clone()).unwrap());
    let url = sign(&config, "secret", "v3/zstd_i4", "1h");
    let path = url.strip_prefix("http://gate.test:81").unwrap();
    assert!(
        path.starts_with("/signed/") && path.ends_with("/zarr/secret/v3/zstd_i4/"),
        "{url}"
    );
    // Keys below the prefix, as a viewer appends them: the stored bytes, with no token.
    for key in ["zarr.json", "c/0/0"] {
        let r = get(&app, &format!("{path}{key}"), &[]).await;
        assert_eq!(r.status, 200, "{key}");
        assert_eq!(
            &r.body[..],
            &std::fs::read(fixtures().join("v3/zstd_i4").join(key)).unwrap()[..]
        );
    }
    // The same signature covers the other route families' paths below the prefix.
    let token = path.trim_start_matches("/signed/").split('/').next().unwrap();
    let slice = get(
        &app,
        &format!("/signed/{token}/api/v1/slice/secret/v3/zstd_i4?format=json"),
        &[],
    )
    .await;
    let plain = get(
        &app,
        "/api/v1/slice/secret/v3/zstd_i4?format=json",
        &[("authorization", "Bearer mount-token")],
    )
    .await;
    assert_eq!((slice.status.as_u16(), &slice.body), (200, &plain.body));
    // A signed answer is not the mount's to keep publicly: a cache would keep it past the
    // URL's expiry.
    assert_eq!(
        (plain.header("cache-control"), slice.header("cache-control")),
        (Some("public, max-age=3600"), Some("no-cache"))
    );
    // Outside the prefix, another mount, a changed signature or expiry: 403.
    let sibling = path.replace("/v3/zstd_i4/", "/v3/zstd_i4x/");
    let (expires, signature) = token.split_once('.').unwrap();
    for (what, bad) in [
        ("parent", path.replace("/v3/zstd_i4/", "/v3/") + "zarr.json"),
        ("sibling", sibling + "zarr.json"),
        ("escape", format!("{path}..%2F..%2Fv2/zarr.json")),
        (
            "expiry",
            path.replace(expires, &(expires.parse::<u64>().unwrap() + 1).to_string()) + "zarr.json",
        ),
        (
            "signature",
            path.replace(signature, &signature.replace(&signature[..2], "AA")) + "zarr.json",
        ),
        ("no token", "/signed/zarr/secret/v3/zstd_i4/zarr.json".to_owned()),
    ] {
        let r = get(&app, &bad, &[]).await;
        assert!(matches!(r.status.as_u16(), 403 | 400), "{what}: {}", r.status);
        if r.status == 403 {
            assert_eq!(r.error_code(), "invalid_signature", "{what}");
        }
    }
    // Expired: said so.
    let expired = zarrgate::auth::signed_url::signed_url(
        &zarrgate::auth::SigningKey::new(b"signing-secret"),
        "",
        "secret",
        "v3/zstd_i4",
        now() - 1,
    );
    let r = get(&app, &format!("{expired}zarr.json"), &[]).await;
    assert_eq!((r.status.as_u16(), r.error_code().as_str()), (403, "signature_expired"));
    // A server with no signing key refuses every signed URL.
    let mut unsigned = config.clone();
    unsigned.auth.url_signing_key = None;
    let app = zarrgate::app(zarrgate::AppState::from_config(unsigned).unwrap());
    let r = get(&app, &format!("{path}zarr.json"), &[]).await;
    assert_eq!((r.status.as_u16(), r.error_code().as_str()), (403, "invalid_signature"));
}

#[test]
fn sign_refuses_what_it_cannot_sign() {
    let config = signing_config(&[("m", &fixtures())]);
    let args = |mount: &str, expires: &str| zarrgate::config::SignArgs {
        mount: mount.into(),
        prefix: String::new(),
        expires: expires.into(),
        ..Default::default()
    };
    let at = std::time::UNIX_EPOCH + std::time::Duration::from_secs(1000);
    let url = zarrgate::auth::signed_url::for_config(&config, &args("m", "1h"), at).unwrap();
    assert!(url.starts_with("http://127.0.0.1:8080/signed/4600."), "{url}");
    for (mount, expires, says) in [("nope", "1h", "no mount"), ("m", "soon", "duration")] {
        let e = zarrgate::auth::signed_url::for_config(&config, &args(mount, expires), at).unwrap_err();
        assert!(e.contains(says), "{e}");
    }
    let mut keyless = config.clone();
    keyless.auth.url_signing_key = None;
    assert!(
        zarrgate::auth::signed_url::for_config(&keyless, &args("m", "1h"), at)
            .unwrap_err()
            .contains("url_signing_key")
    );
}

/// A reload adds, removes and changes mounts: a mount whose directory changed under the same
/// name answers from the new one (nothing cached of the old is read), an unchanged one keeps
/// its cache, and an invalid config changes nothing.
#[tokio::test]
async fn a_reload_changes_mounts_without_mixing_their_caches() {
    let (one, two) = (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
    let codecs = serde_json::json!([{"name": "bytes", "configuration": {"endian": "little"}}]);
    for (dir, value) in [(&one, 1u8), (&two, 2u8)] {
        write_v3_array(&dir.path().join("a"), &[4], &[4], "uint8", 0.into(), codecs.clone());
        std::fs::create_dir_all(dir.path().join("a/c")).unwrap();
        std::fs::write(dir.path().join("a/c/0"), [value; 4]).unwrap();
    }
    let config = config_with(&[("m", one.path()), ("fx", &fixtures())]);
    let app = zarrgate::app(zarrgate::AppState::from_config(config.clone()).unwrap());
    let health = zarrgate::server::health_app(app.state());
    let slice = "/api/v1/slice/m/a?format=json";
    assert_eq!(
        get(&app, slice, &[]).await.json()["data"],
        serde_json::json!([1, 1, 1, 1])
    );
    let fx_key = "/zarr/fx/v3/zstd_i4/zarr.json";
    assert_eq!(get(&app, fx_key, &[]).await.status, 200);
    let before = app.state();

    let mut changed = config_with(&[("m", two.path()), ("added", &fixtures()), ("fx", &fixtures())]);
    changed.server.cors_origins = vec!["https://viewer.test".into()];
    let state = zarrgate::server::reload(&[&app, &health], changed).await.unwrap();
    assert_eq!(
        get(&app, slice, &[]).await.json()["data"],
        serde_json::json!([2, 2, 2, 2])
    );
    assert_eq!(get(&app, "/zarr/added/v3/zstd_i4/zarr.json", &[]).await.status, 200);
    assert_eq!(
        get(&app, fx_key, &[("origin", "https://viewer.test")])
            .await
            .header("access-control-allow-origin"),
        Some("https://viewer.test")
    );
    // The unchanged mount kept its store and cache entries' name; the changed one has a new one.
    assert_eq!(state.mounts["fx"].cache_id, before.mounts["fx"].cache_id);
    assert_ne!(state.mounts["m"].cache_id, before.mounts["m"].cache_id);
    assert!(std::sync::Arc::ptr_eq(&state.caches, &before.caches));
    // Both listeners serve the new state; the old state's metrics carry on.
    assert!(health.state().mounts.contains_key("added"));
    assert!(std::sync::Arc::ptr_eq(&state.metrics, &before.metrics));

    let removed = config_with(&[("fx", &fixtures())]);
    zarrgate::server::reload(&[&app, &health], removed).await.unwrap();
    let r = get(&app, slice, &[]).await;
    assert_eq!((r.status.as_u16(), r.error_code().as_str()), (404, "unknown_mount"));
    let mounts = get(&app, "/api/v1/mounts", &[]).await.json();
    assert_eq!(mounts["mounts"].as_array().unwrap().len(), 1);

    // A mount that cannot be opened: an error, and the state in use stays.
    let broken = config_with(&[
        ("fx", &fixtures()),
        ("gone", std::path::Path::new("/nonexistent/zarrgate")),
    ]);
    assert!(zarrgate::server::reload(&[&app, &health], broken).await.is_err());
    assert_eq!(get(&app, fx_key, &[]).await.status, 200);
    assert_eq!(get(&app, "/zarr/gone/x", &[]).await.status, 404);
}

/// While the server drains, `/readyz` is 503 (on both listeners) and every HTTP/1 answer
/// closes its connection, so that clients connect anew, elsewhere; requests are still served.
#[tokio::test]
async fn draining_is_not_ready_and_closes_connections() {
    let app = zarrgate::app(zarrgate::AppState::from_config(config_with(&[("fx", &fixtures())])).unwrap());
    let health = zarrgate::server::health_app(app.state());
    let r = get(&app, "/readyz", &[]).await;
    assert_eq!((r.status.as_u16(), r.json()["status"].as_str()), (200, Some("ready")));
    assert_eq!(r.header("connection"), None);
    app.state().lifecycle.start_draining();
    for service in [&app, &health] {
        let r = get(service, "/readyz", &[]).await;
        assert_eq!((r.status.as_u16(), r.error_code().as_str()), (503, "not_ready"));
    }
    let r = get(&app, "/zarr/fx/v3/zstd_i4/zarr.json", &[]).await;
    assert_eq!((r.status.as_u16(), r.header("connection")), (200, Some("close")));
    assert_eq!(get(&app, "/healthz", &[]).await.status, 200);
}

/// A key set at a URL is fetched over HTTP (here from a zarrgate serving it as a raw key, on
/// loopback, where `http://` is allowed), and again when a token names a key it does not hold.
#[tokio::test]
async fn a_key_set_at_a_url_is_fetched_and_fetched_again_for_an_unknown_key() {
    let keys_dir = tempfile::tempdir().unwrap();
    let (first, second) = (test_key("k1"), test_key("k2"));
    std::fs::write(
        keys_dir.path().join("jwks.json"),
        serde_json::json!({"keys": [first.jwk]}).to_string(),
    )
    .unwrap();
    let origin = zarrgate::AppState::from_config(config_with(&[("keys", keys_dir.path())])).unwrap();
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let url = format!("http://{}/zarr/keys/jwks.json", listener.local_addr().unwrap());
    let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
    let served = tokio::spawn(zarrgate::run(listener, zarrgate::app(origin), async {
        let _ = stopped.await;
    }));

    let dir = tempfile::tempdir().unwrap();
    let mut config = jwt_config(dir.path(), &serde_json::json!({"keys": []}));
    config.auth.jwt.as_mut().unwrap().jwks = url;
    // The shortest refresh: a fetch for an unknown key may follow a second after the last.
    config.auth.jwt.as_mut().unwrap().refresh_seconds = 10;
    config.validate().unwrap();
    let state = zarrgate::AppState::from_config(config).unwrap();
    zarrgate::server::start_background(&state);
    let app = zarrgate::app(state.clone());
    let ready = async {
        while get(&app, "/readyz", &[]).await.status != 200 {
            tokio::time::sleep(std::time::Duration::from_millis(20)).await;
        }
    };
    tokio::time::timeout(std::time::Duration::from_secs(10), ready)
        .await
        .expect("the key set is fetched");
    let bearer = |key: &TestKey| format!("Bearer {}", token(key, claims("read:private", now() + 60)));
    assert_eq!(get(&app, KEY, &[("authorization", &bearer(&first))]).await.status, 200);
    // A rotation at the origin: the first token naming the new key is refused and asks for a
    // fetch, after which it is accepted.
    std::fs::write(
        keys_dir.path().join("jwks.json"),
        serde_json::json!({"keys": [first.jwk, second.jwk]}).to_string(),
    )
    .unwrap();
    tokio::time::sleep(std::time::Duration::from_millis(1100)).await;
    assert_eq!(get(&app, KEY, &[("authorization", &bearer(&second))]).await.status, 401);
    let accepted = async {
        while get(&app, KEY, &[("authorization", &bearer(&second))]).await.status != 200 {
            tokio::time::sleep(std::time::Duration::from_millis(20)).await;
        }
    };
    tokio::time::timeout(std::time::Duration::from_secs(10), accepted)
        .await
        .expect("a token of an unknown key fetches the set again");
    let _ = stop.send(());
    served.await.unwrap().unwrap();
}
