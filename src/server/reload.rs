//! Reloading the configuration (SIGHUP): new mounts, tokens and auth without a restart.

use super::front::App;
use crate::config::{Config, ConfigError};
use crate::state::AppState;

/// Puts the state of `config` in use in every one of `apps` (the main listener's and the
/// health listener's), keeping what outlives a reload ([`AppState::reloaded`]). An invalid
/// config changes nothing, nor does one whose new JWT key set cannot be read: the key set is
/// read before the state is put in use. Answers the new state; the settings that changed and
/// take effect only on a restart are logged.
pub async fn reload(apps: &[&App], config: Config) -> Result<AppState, ConfigError> {
    let Some(first) = apps.first() else {
        return Err(ConfigError::Invalid("nothing to reload".into()));
    };
    let current = first.state();
    let restart = current.needs_restart(&config);
    let state = current.reloaded(config)?;
    if let Some(jwt) = state.auth.jwt.as_ref().filter(|v| !v.loaded()) {
        let wait = crate::auth::jwt::FETCH_TIMEOUT + std::time::Duration::from_secs(1);
        match tokio::time::timeout(wait, jwt.refresh()).await {
            Ok(Ok(_)) => {}
            Ok(Err(e)) => return Err(ConfigError::Invalid(format!("auth.jwt: cannot read the key set: {e}"))),
            Err(_) => {
                return Err(ConfigError::Invalid(
                    "auth.jwt: reading the key set took too long".into(),
                ));
            }
        }
    }
    start_background(&state);
    for app in apps {
        app.reload(state.clone());
    }
    if !restart.is_empty() {
        tracing::warn!(settings = %restart.join(", "), "these settings changed and take effect on a restart");
    }
    Ok(state)
}

/// Starts what a state runs in the background: the refresh of its JWT key set (once per
/// verifier: a reload that keeps it does not start a second).
pub fn start_background(state: &AppState) {
    if let Some(jwt) = &state.auth.jwt {
        jwt.spawn_refresh();
    }
}
