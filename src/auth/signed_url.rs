//! Signed URLs: a capability to read one prefix of one mount until a time, for clients that
//! cannot send headers (browser viewers). The signature sits in the path, before the route
//! (`/signed/{expires}.{signature}/zarr/{mount}/{prefix}/...`), not in the query string, which
//! clients drop when they build the URLs of child keys from a parent's.

use aws_lc_rs::hmac;
use base64::Engine;
use base64::engine::general_purpose::URL_SAFE_NO_PAD;

/// The path segment that starts a signed URL.
pub const SIGNED: &str = "/signed/";

/// The most segments below the mount a signed prefix is looked for in (one HMAC each).
const MAX_PREFIX_SEGMENTS: usize = 64;

/// The HMAC-SHA256 key of signed URLs (`auth.url_signing_key`).
pub struct SigningKey(hmac::Key);

impl std::fmt::Debug for SigningKey {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("SigningKey(..)")
    }
}

/// Why a signed URL is refused.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum SignedUrlError {
    /// The server has no signing key.
    Disabled,
    /// `/signed/` is not followed by `{expires}.{signature}` and a route naming a mount.
    Malformed,
    /// The signature does not match the mount and any prefix of the path.
    Invalid,
    /// A genuine signature whose time has passed.
    Expired,
}

impl std::fmt::Display for SignedUrlError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            SignedUrlError::Disabled => "this server does not accept signed URLs",
            SignedUrlError::Malformed => {
                "a signed URL is /signed/{expires}.{signature}/ followed by a route naming a mount"
            }
            SignedUrlError::Invalid => "the signature does not cover this mount and path",
            SignedUrlError::Expired => "the signed URL has expired",
        })
    }
}

/// A prefix as requests are checked against it: its segments that are not empty, joined by `/`.
fn normalized(prefix: &str) -> String {
    prefix
        .split('/')
        .filter(|s| !s.is_empty())
        .collect::<Vec<_>>()
        .join("/")
}

/// What is signed: the mount, the prefix (segments joined by `/`, no slash at either end) and
/// the expiry, in a form no two different triples share.
fn message(mount: &str, prefix: &str, expires: u64) -> String {
    format!("zarrgate signed URL v1\n{mount}\n{prefix}\n{expires}")
}

impl SigningKey {
    /// A key of these bytes.
    pub fn new(secret: &[u8]) -> Self {
        Self(hmac::Key::new(hmac::HMAC_SHA256, secret))
    }

    /// The signature (base64url, unpadded) of `prefix` of `mount` until `expires` (Unix seconds).
    pub fn sign(&self, mount: &str, prefix: &str, expires: u64) -> String {
        let prefix = normalized(prefix);
        URL_SAFE_NO_PAD.encode(hmac::sign(&self.0, message(mount, &prefix, expires).as_bytes()))
    }

    fn verifies(&self, mount: &str, prefix: &str, expires: u64, signature: &[u8]) -> bool {
        // In constant time (aws-lc's verify).
        hmac::verify(&self.0, message(mount, prefix, expires).as_bytes(), signature).is_ok()
    }

    /// Checks a signed request: `mount` (decoded) and the path below it (`rest`, as sent: its
    /// segments percent-encoded) against `token` (`{expires}.{signature}`) at time `now`.
    /// The signed prefix is any whole-segment prefix of `rest`, the empty one included.
    pub fn check(&self, token: &str, mount: &str, rest: &str, now: u64) -> Result<(), SignedUrlError> {
        let (expires, signature) = token.split_once('.').ok_or(SignedUrlError::Malformed)?;
        let expires: u64 = expires.parse().map_err(|_| SignedUrlError::Malformed)?;
        let signature = URL_SAFE_NO_PAD.decode(signature).map_err(|_| SignedUrlError::Invalid)?;
        let mut prefix = String::new();
        let mut segments = rest.split('/').filter(|s| !s.is_empty());
        for depth in 0..=MAX_PREFIX_SEGMENTS {
            if self.verifies(mount, &prefix, expires, &signature) {
                return match now <= expires {
                    true => Ok(()),
                    false => Err(SignedUrlError::Expired),
                };
            }
            let Some(segment) = segments.next() else { break };
            // A segment is compared decoded, as the handlers read it: `a%2Fb` is one segment
            // `a/b`, which no signed prefix's segment equals.
            let segment = percent_encoding::percent_decode_str(segment)
                .decode_utf8()
                .map_err(|_| SignedUrlError::Invalid)?;
            if segment.contains('/') {
                return Err(SignedUrlError::Invalid);
            }
            if depth > 0 {
                prefix.push('/');
            }
            prefix.push_str(&segment);
        }
        Err(SignedUrlError::Invalid)
    }
}

/// The characters a prefix's segment is percent-encoded with in a signed URL.
const SEGMENT: &percent_encoding::AsciiSet = &percent_encoding::NON_ALPHANUMERIC
    .remove(b'-')
    .remove(b'_')
    .remove(b'.')
    .remove(b'~');

/// The signed URL of `prefix` of `mount` until `expires` for a server at `base`
/// (`http://host:port`, no trailing slash): clients append keys below the prefix.
pub fn signed_url(key: &SigningKey, base: &str, mount: &str, prefix: &str, expires: u64) -> String {
    let prefix = normalized(prefix);
    let signature = key.sign(mount, &prefix, expires);
    let mut url = format!(
        "{}{SIGNED}{expires}.{signature}/zarr/{}/",
        base.trim_end_matches('/'),
        percent_encoding::utf8_percent_encode(mount, SEGMENT)
    );
    for segment in prefix.split('/').filter(|s| !s.is_empty()) {
        url.push_str(&percent_encoding::utf8_percent_encode(segment, SEGMENT).to_string());
        url.push('/');
    }
    url
}

/// The signed URL `zarrgate sign` prints for `args` at time `now`: the mount must be
/// configured and the key's variable set.
pub fn for_config(
    config: &crate::config::Config,
    args: &crate::config::SignArgs,
    now: std::time::SystemTime,
) -> Result<String, String> {
    let spec = config
        .auth
        .url_signing_key
        .as_deref()
        .ok_or("the config sets no auth.url_signing_key")?;
    let secret = crate::config::secret_from_env(spec, "auth.url_signing_key").map_err(|e| e.to_string())?;
    if !config.mounts.contains_key(&args.mount) {
        return Err(format!("the config has no mount '{}'", args.mount));
    }
    let prefix = normalized(&args.prefix);
    if !prefix.is_empty() {
        crate::store::StoreKey::new(&prefix).map_err(|e| format!("--prefix '{}': {e}", args.prefix))?;
    }
    let lasts = parse_duration(&args.expires).ok_or_else(|| {
        format!(
            "--expires '{}' is not a duration such as 3600, 30m, 1h or 7d",
            args.expires
        )
    })?;
    let now = now.duration_since(std::time::UNIX_EPOCH).map_or(0, |d| d.as_secs());
    let base = match &args.base_url {
        Some(base) => base.clone(),
        None => format!("http://{}", config.server.bind),
    };
    let key = SigningKey::new(secret.as_bytes());
    Ok(signed_url(&key, &base, &args.mount, &prefix, now.saturating_add(lasts)))
}

/// Reads a duration as `zarrgate sign --expires` takes it: a number with `s`, `m`, `h` or `d`
/// (seconds when bare).
pub fn parse_duration(text: &str) -> Option<u64> {
    let text = text.trim();
    let (number, unit) = match text.find(|c: char| !c.is_ascii_digit()) {
        Some(at) => text.split_at(at),
        None => (text, "s"),
    };
    let scale = match unit {
        "s" => 1,
        "m" => 60,
        "h" => 3600,
        "d" => 86_400,
        _ => return None,
    };
    number.parse::<u64>().ok()?.checked_mul(scale).filter(|&s| s > 0)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parts(url: &str) -> (String, String) {
        // `{base}/signed/{token}/zarr/{mount}/{rest}`
        let after = url.split_once(SIGNED).unwrap().1;
        let (token, route) = after.split_once('/').unwrap();
        (token.to_owned(), route.trim_start_matches("zarr/m/").to_owned())
    }

    #[test]
    fn a_signed_prefix_admits_what_lies_below_it_and_nothing_else() {
        let key = SigningKey::new(b"k");
        let url = signed_url(&key, "http://h:1/", "m", "/img/brain/", 1000);
        assert!(url.starts_with("http://h:1/signed/1000."), "{url}");
        assert!(url.ends_with("/zarr/m/img/brain/"), "{url}");
        let (token, _) = parts(&url);
        assert_eq!(key.check(&token, "m", "img/brain/zarr.json", 999), Ok(()));
        assert_eq!(key.check(&token, "m", "img/brain/c/0/0", 1000), Ok(()));
        assert_eq!(key.check(&token, "m", "img/brain", 5), Ok(()));
        assert_eq!(
            key.check(&token, "m", "img/brain/x", 1001),
            Err(SignedUrlError::Expired)
        );
        for (mount, rest) in [
            ("m", "img/other/zarr.json"),
            ("m", "img/brainy/zarr.json"),
            ("m", "img/zarr.json"),
            ("m", "zarr.json"),
            ("n", "img/brain/zarr.json"),
            ("m", "img%2Fbrain/zarr.json"),
        ] {
            assert_eq!(
                key.check(&token, mount, rest, 0),
                Err(SignedUrlError::Invalid),
                "{mount} {rest}"
            );
        }
        // Another key, another expiry, a changed signature.
        assert_eq!(
            SigningKey::new(b"other").check(&token, "m", "img/brain/a", 0),
            Err(SignedUrlError::Invalid)
        );
        let (_, signature) = token.split_once('.').unwrap();
        assert_eq!(
            key.check(&format!("2000.{signature}"), "m", "img/brain/a", 0),
            Err(SignedUrlError::Invalid)
        );
        let mut tampered = token.clone().into_bytes();
        let last = tampered.len() - 1;
        tampered[last] = if tampered[last] == b'A' { b'B' } else { b'A' };
        assert_eq!(
            key.check(std::str::from_utf8(&tampered).unwrap(), "m", "img/brain/a", 0),
            Err(SignedUrlError::Invalid)
        );
        assert_eq!(key.check("nodot", "m", "img", 0), Err(SignedUrlError::Malformed));
        assert_eq!(key.check("x.abc", "m", "img", 0), Err(SignedUrlError::Malformed));
    }

    #[test]
    fn the_whole_mount_and_encoded_segments() {
        let key = SigningKey::new(b"k");
        let url = signed_url(&key, "http://h", "m", "", 10);
        assert!(url.ends_with("/zarr/m/"), "{url}");
        let (token, _) = parts(&url);
        assert_eq!(key.check(&token, "m", "", 0), Ok(()));
        assert_eq!(key.check(&token, "m", "any/key", 0), Ok(()));
        let url = signed_url(&key, "http://h", "m", "a b/c", 10);
        assert!(url.ends_with("/zarr/m/a%20b/c/"), "{url}");
        let (token, _) = parts(&url);
        assert_eq!(key.check(&token, "m", "a%20b/c/zarr.json", 0), Ok(()));
    }

    #[test]
    fn durations() {
        assert_eq!(parse_duration("1h"), Some(3600));
        assert_eq!(parse_duration("90"), Some(90));
        assert_eq!(parse_duration("30m"), Some(1800));
        assert_eq!(parse_duration("7d"), Some(604_800));
        for bad in ["", "h", "1x", "-1h", "0s", "1.5h"] {
            assert_eq!(parse_duration(bad), None, "{bad}");
        }
    }
}
