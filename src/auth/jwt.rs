//! Bearer JWTs checked against a JSON Web Key Set (`[auth.jwt]`), which is fetched at start,
//! every `refresh_seconds`, and when a token names a key it does not hold.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, PoisonError, RwLock};
use std::time::Duration;

use jsonwebtoken::jwk::{AlgorithmParameters, EllipticCurve, Jwk, JwkSet, KeyAlgorithm};
use jsonwebtoken::{Algorithm, DecodingKey, Validation};

use crate::config::JwtConfig;

/// The largest key set read.
const MAX_JWKS_BYTES: u64 = 1 << 20;

/// How long a fetch of the key set may take.
pub const FETCH_TIMEOUT: Duration = Duration::from_secs(10);

/// Seconds a token's times (`exp`, `nbf`) may be off, for clocks that differ.
const LEEWAY_SECONDS: u64 = 30;

/// Why a bearer JWT is refused.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum JwtRefusal {
    /// Not a valid token of the configured issuer and audience (RFC 6750 `invalid_token`).
    Invalid(&'static str),
    /// A valid token whose scopes do not include the mount's (`insufficient_scope`).
    InsufficientScope,
}

/// One key of the set, with the one algorithm it verifies.
struct VerifyingKey {
    kid: Option<String>,
    algorithm: Algorithm,
    key: DecodingKey,
}

/// Checks bearer JWTs against the configured key set.
pub struct JwtVerifier {
    config: JwtConfig,
    keys: RwLock<Arc<Vec<VerifyingKey>>>,
    /// Whether a fetch has succeeded (`/readyz` waits for one).
    loaded: AtomicBool,
    /// Milliseconds since `epoch` of the last fetch started by an unknown key id.
    last_unknown_fetch_ms: AtomicU64,
    /// Whether the refresh task has been started.
    refreshing: AtomicBool,
    /// Wakes the refresh task early (a token named an unknown key).
    wake: Arc<tokio::sync::Notify>,
    epoch: std::time::Instant,
}

impl std::fmt::Debug for JwtVerifier {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("JwtVerifier")
            .field("jwks", &crate::config::redact(&self.config.jwks))
            .finish_non_exhaustive()
    }
}

/// The `scope` claim: a space-separated string (RFC 8693) or a list; `scp` as some issuers
/// name it.
#[derive(serde::Deserialize)]
struct Claims {
    #[serde(default)]
    scope: Option<Scopes>,
    #[serde(default)]
    scp: Option<Scopes>,
}

#[derive(serde::Deserialize)]
#[serde(untagged)]
enum Scopes {
    Text(String),
    List(Vec<String>),
}

impl Scopes {
    fn holds(&self, scope: &str) -> bool {
        match self {
            Scopes::Text(text) => text.split_ascii_whitespace().any(|s| s == scope),
            Scopes::List(list) => list.iter().any(|s| s == scope),
        }
    }
}

/// The algorithm a key verifies: its `alg` when it states one, else the one its type and
/// curve imply. Symmetric keys (`oct`) are left out: a key set is public.
fn algorithm_of(jwk: &Jwk) -> Option<Algorithm> {
    let stated = jwk.common.key_algorithm.and_then(|a| match a {
        KeyAlgorithm::RS256 => Some(Algorithm::RS256),
        KeyAlgorithm::RS384 => Some(Algorithm::RS384),
        KeyAlgorithm::RS512 => Some(Algorithm::RS512),
        KeyAlgorithm::PS256 => Some(Algorithm::PS256),
        KeyAlgorithm::PS384 => Some(Algorithm::PS384),
        KeyAlgorithm::PS512 => Some(Algorithm::PS512),
        KeyAlgorithm::ES256 => Some(Algorithm::ES256),
        KeyAlgorithm::ES384 => Some(Algorithm::ES384),
        KeyAlgorithm::EdDSA => Some(Algorithm::EdDSA),
        _ => None,
    });
    let implied = match &jwk.algorithm {
        AlgorithmParameters::RSA(_) => Some(Algorithm::RS256),
        AlgorithmParameters::EllipticCurve(ec) => match ec.curve {
            EllipticCurve::P256 => Some(Algorithm::ES256),
            EllipticCurve::P384 => Some(Algorithm::ES384),
            _ => None,
        },
        AlgorithmParameters::OctetKeyPair(_) => Some(Algorithm::EdDSA),
        AlgorithmParameters::OctetKey(_) => return None,
        _ => None,
    };
    stated.or(implied)
}

/// The verifying keys of a key set's text; keys this server cannot use are skipped.
fn parse_key_set(bytes: &[u8]) -> Result<Vec<VerifyingKey>, String> {
    let set: JwkSet = serde_json::from_slice(bytes).map_err(|e| format!("not a JSON Web Key Set: {e}"))?;
    let keys: Vec<VerifyingKey> = set
        .keys
        .iter()
        .filter(|jwk| {
            jwk.common
                .public_key_use
                .as_ref()
                .is_none_or(|u| *u == jsonwebtoken::jwk::PublicKeyUse::Signature)
        })
        .filter_map(|jwk| {
            Some(VerifyingKey {
                kid: jwk.common.key_id.clone(),
                algorithm: algorithm_of(jwk)?,
                key: DecodingKey::from_jwk(jwk).ok()?,
            })
        })
        .collect();
    match keys.is_empty() {
        true => Err("the key set holds no key to verify signatures with".into()),
        false => Ok(keys),
    }
}

impl JwtVerifier {
    /// A verifier of `config`'s key set, holding no key until [`JwtVerifier::refresh`].
    pub fn new(config: &JwtConfig) -> Self {
        Self {
            config: config.clone(),
            keys: RwLock::new(Arc::new(Vec::new())),
            loaded: AtomicBool::new(false),
            last_unknown_fetch_ms: AtomicU64::new(0),
            refreshing: AtomicBool::new(false),
            wake: Arc::new(tokio::sync::Notify::new()),
            epoch: std::time::Instant::now(),
        }
    }

    /// Whether the configuration is `config` (a reload keeps the verifier, and its keys).
    pub fn is_for(&self, config: &JwtConfig) -> bool {
        self.config == *config
    }

    /// Whether the key set has been read once.
    pub fn loaded(&self) -> bool {
        self.loaded.load(Ordering::Acquire)
    }

    /// Checks `token`: signed by a key of the set with that key's algorithm, of the
    /// configured issuer and audience, not expired, and holding `scope`.
    pub fn check(&self, token: &[u8], scope: &str) -> Result<(), JwtRefusal> {
        let header = jsonwebtoken::decode_header(token).map_err(|_| JwtRefusal::Invalid("not a JWT"))?;
        let keys = self.keys.read().unwrap_or_else(PoisonError::into_inner).clone();
        let mut candidates = keys
            .iter()
            .filter(|k| header.kid.is_none() || k.kid == header.kid)
            .filter(|k| k.algorithm == header.alg)
            .peekable();
        if candidates.peek().is_none() {
            if header.kid.is_some() && !keys.iter().any(|k| k.kid == header.kid) {
                self.fetch_soon();
                return Err(JwtRefusal::Invalid("the token's key is not in the key set"));
            }
            return Err(JwtRefusal::Invalid("no key of the set verifies the token's algorithm"));
        }
        let mut validation = Validation::new(header.alg);
        validation.set_issuer(&[&self.config.issuer]);
        validation.set_audience(&[&self.config.audience]);
        validation.leeway = LEEWAY_SECONDS;
        validation.validate_nbf = true;
        validation.set_required_spec_claims(&["exp", "iss", "aud"]);
        let mut refusal = JwtRefusal::Invalid("the signature does not verify");
        for key in candidates {
            use jsonwebtoken::errors::ErrorKind;
            match jsonwebtoken::decode::<Claims>(token, &key.key, &validation) {
                Ok(data) => {
                    let claims = data.claims;
                    let holds = [&claims.scope, &claims.scp]
                        .into_iter()
                        .flatten()
                        .any(|s| s.holds(scope));
                    return if holds {
                        Ok(())
                    } else {
                        Err(JwtRefusal::InsufficientScope)
                    };
                }
                Err(e) => {
                    refusal = JwtRefusal::Invalid(match e.kind() {
                        // About this key, not the token: another key of the set may verify it.
                        ErrorKind::InvalidSignature
                        | ErrorKind::InvalidAlgorithm
                        | ErrorKind::InvalidKeyFormat
                        | ErrorKind::InvalidEcdsaKey
                        | ErrorKind::InvalidEddsaKey
                        | ErrorKind::InvalidRsaKey(_) => continue,
                        ErrorKind::ExpiredSignature => "the token has expired",
                        ErrorKind::ImmatureSignature => "the token is not valid yet",
                        ErrorKind::InvalidIssuer => "the token's issuer is not accepted",
                        ErrorKind::InvalidAudience => "the token's audience is not accepted",
                        ErrorKind::MissingRequiredClaim(_) => "the token lacks exp, iss or aud",
                        _ => "the token is not valid",
                    });
                    break;
                }
            }
        }
        Err(refusal)
    }

    /// Asks the refresh task for a fetch now, at most once per tenth of `refresh_seconds`.
    fn fetch_soon(&self) {
        let now = u64::try_from(self.epoch.elapsed().as_millis()).unwrap_or(u64::MAX);
        let gap = self.config.refresh_seconds.saturating_mul(100).max(1000);
        let last = self.last_unknown_fetch_ms.load(Ordering::Relaxed);
        if (last == 0 || now.saturating_sub(last) >= gap)
            && self
                .last_unknown_fetch_ms
                .compare_exchange(last, now.max(1), Ordering::Relaxed, Ordering::Relaxed)
                .is_ok()
        {
            self.wake.notify_one();
        }
    }

    /// Reads the key set and puts it in use; a failure keeps the keys held.
    pub async fn refresh(&self) -> Result<usize, String> {
        let bytes = self.fetch().await?;
        let keys = parse_key_set(&bytes)?;
        let count = keys.len();
        *self.keys.write().unwrap_or_else(PoisonError::into_inner) = Arc::new(keys);
        self.loaded.store(true, Ordering::Release);
        Ok(count)
    }

    async fn fetch(&self) -> Result<Vec<u8>, String> {
        let jwks = &self.config.jwks;
        let fetched = tokio::time::timeout(FETCH_TIMEOUT, async {
            match jwks.strip_prefix("https://").or_else(|| jwks.strip_prefix("http://")) {
                Some(_) => fetch_url(jwks).await,
                None => {
                    let path = self.config.base_dir.join(jwks);
                    let file = tokio::fs::File::open(&path)
                        .await
                        .map_err(|e| format!("{}: {e}", path.display()))?;
                    let mut bytes = Vec::new();
                    use tokio::io::AsyncReadExt;
                    file.take(MAX_JWKS_BYTES + 1)
                        .read_to_end(&mut bytes)
                        .await
                        .map_err(|e| format!("{}: {e}", path.display()))?;
                    Ok(bytes)
                }
            }
        })
        .await
        .map_err(|_| format!("reading {jwks} took over {} s", FETCH_TIMEOUT.as_secs()))??;
        match fetched.len() as u64 > MAX_JWKS_BYTES {
            true => Err(format!("{jwks} is larger than {MAX_JWKS_BYTES} bytes")),
            false => Ok(fetched),
        }
    }

    /// Refreshes the key set every `refresh_seconds` (and when a token names an unknown key)
    /// until the verifier is dropped: the task holds it weakly. Started once per verifier. Failures are logged and
    /// retried sooner while no set has been read.
    pub fn spawn_refresh(self: &Arc<Self>) {
        if self.refreshing.swap(true, Ordering::AcqRel) {
            return;
        }
        let verifier = Arc::downgrade(self);
        tokio::spawn(async move {
            loop {
                let Some(v) = verifier.upgrade() else { return };
                let every = Duration::from_secs(v.config.refresh_seconds.max(1));
                let wait = match v.refresh().await {
                    Ok(count) => {
                        tracing::debug!(jwks = %crate::config::redact(&v.config.jwks), keys = count, "JWT key set read");
                        every
                    }
                    Err(e) => {
                        tracing::warn!(jwks = %crate::config::redact(&v.config.jwks), error = %e, "cannot read the JWT key set");
                        match v.loaded() {
                            true => every,
                            false => every.min(Duration::from_secs(5)),
                        }
                    }
                };
                // Not holding the verifier while waiting: a reload that drops it ends the task.
                let wake = v.wake.clone();
                drop(v);
                tokio::select! {
                    () = wake.notified() => {},
                    () = tokio::time::sleep(wait) => {},
                }
            }
        });
    }
}

/// GETs a key set over HTTP(S), with object_store's client (the one bucket mounts use).
async fn fetch_url(url: &str) -> Result<Vec<u8>, String> {
    use object_store::ObjectStoreExt;
    let (base, name) = url
        .rsplit_once('/')
        .filter(|(base, name)| !name.is_empty() && base.contains("://") && !base.ends_with('/'))
        .ok_or_else(|| format!("{url} names no file"))?;
    let options = object_store::ClientOptions::new()
        .with_allow_http(url.starts_with("http://"))
        .with_timeout(FETCH_TIMEOUT);
    let store = object_store::http::HttpBuilder::new()
        .with_url(base)
        .with_client_options(options)
        .build()
        .map_err(|e| e.to_string())?;
    let got = store
        .get(&object_store::path::Path::from(name))
        .await
        .map_err(|e| e.to_string())?;
    if got.meta.size > MAX_JWKS_BYTES {
        return Err(format!("{url} is larger than {MAX_JWKS_BYTES} bytes"));
    }
    got.bytes().await.map(|b| b.to_vec()).map_err(|e| e.to_string())
}
