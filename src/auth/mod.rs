//! Who may read a mount: its static bearer tokens, bearer JWTs of a configured issuer holding
//! its scope, and signed URLs.

pub mod jwt;
pub mod signed_url;

use std::sync::Arc;

use crate::config::{AuthConfig, ConfigError, Secret, secret_from_env};
pub use jwt::{JwtRefusal, JwtVerifier};
pub use signed_url::{SignedUrlError, SigningKey};

/// The bearer token of a request (RFC 6750), if it presents one.
pub fn bearer(headers: &axum::http::HeaderMap) -> Option<&[u8]> {
    let value = headers.get(axum::http::header::AUTHORIZATION)?.as_bytes();
    let (scheme, token) = value.split_at(value.iter().position(|b| *b == b' ')?);
    scheme.eq_ignore_ascii_case(b"bearer").then(|| token.trim_ascii())
}

/// The server's verifiers of credentials.
#[derive(Debug, Default)]
pub struct Auth {
    /// Checks bearer JWTs (`[auth.jwt]`).
    pub jwt: Option<Arc<JwtVerifier>>,
    /// Checks signed URLs (`auth.url_signing_key`).
    pub signing_key: Option<SigningKey>,
}

impl Auth {
    /// The verifiers `config` asks for. A reload passes the `previous` ones: a JWT verifier
    /// of the same settings is kept, with the keys it has read.
    pub fn from_config(config: &AuthConfig, previous: Option<&Auth>) -> Result<Self, ConfigError> {
        let signing_key = config
            .url_signing_key
            .as_deref()
            .map(|spec| secret_from_env(spec, "auth.url_signing_key"))
            .transpose()?
            .map(|secret| SigningKey::new(secret.as_bytes()));
        let jwt = config.jwt.as_ref().map(|settings| {
            match previous.and_then(|p| p.jwt.as_ref()).filter(|v| v.is_for(settings)) {
                Some(kept) => kept.clone(),
                None => Arc::new(JwtVerifier::new(settings)),
            }
        });
        Ok(Self { jwt, signing_key })
    }

    /// Whether every key set needed has been read (for `/readyz`).
    pub fn ready(&self) -> bool {
        self.jwt.as_ref().is_none_or(|v| v.loaded())
    }
}

/// Why a request may not read a mount.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Refusal {
    /// It presents no bearer token.
    Missing,
    /// Its bearer token is none of the mount's and no valid JWT (RFC 6750 `invalid_token`).
    InvalidToken(&'static str),
    /// A valid JWT without the mount's scope, which is named (`insufficient_scope`).
    InsufficientScope(String),
}

/// Who may read one mount; with no tokens and no scope, everyone.
#[derive(Debug, Clone, Default)]
pub struct MountAccess {
    /// Static bearer tokens (`mounts.NAME.tokens`).
    pub tokens: Vec<Secret>,
    /// The scope a bearer JWT must hold (`mounts.NAME.jwt_scope`).
    pub jwt_scope: Option<String>,
}

impl MountAccess {
    /// Whether anyone may read the mount.
    pub fn is_public(&self) -> bool {
        self.tokens.is_empty() && self.jwt_scope.is_none()
    }

    /// Whether a request presenting `bearer` may read the mount, JWTs checked by `jwt`.
    pub fn check(&self, bearer: Option<&[u8]>, jwt: Option<&JwtVerifier>) -> Result<(), Refusal> {
        if self.is_public() {
            return Ok(());
        }
        let bearer = bearer.ok_or(Refusal::Missing)?;
        if self.tokens.iter().any(|t| t.matches(bearer)) {
            return Ok(());
        }
        match (&self.jwt_scope, jwt) {
            (Some(scope), Some(jwt)) => jwt.check(bearer, scope).map_err(|refusal| match refusal {
                JwtRefusal::Invalid(why) => Refusal::InvalidToken(why),
                JwtRefusal::InsufficientScope => Refusal::InsufficientScope(scope.clone()),
            }),
            _ => Err(Refusal::InvalidToken("the token is not one of this mount's")),
        }
    }
}
