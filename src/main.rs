use std::io::IsTerminal;
use std::process::ExitCode;

use clap::Parser;
use tracing_subscriber::EnvFilter;
use zarrgate::config::{Action, Cli, Config, LogFormat};
use zarrgate::{AppState, server};

/// Large Rust allocations (decoded chunks, read buffers, response pieces over 128 KiB) are
/// mappings of their own, returned to the system when freed, so RSS tracks the cache budget
/// (see [`zarrgate::alloc`]).
#[cfg(target_os = "linux")]
#[global_allocator]
static ALLOCATOR: zarrgate::alloc::MapLarge = zarrgate::alloc::MapLarge;

/// Pages faulted in ahead of need for large blocks, at most this many bytes, and no more than
/// the chunk cache has room for: they are the memory its next chunks take (see
/// [`zarrgate::alloc::start_reserve`]). A 64 MiB slice takes about 70 MiB of large blocks.
#[cfg(target_os = "linux")]
const RESERVE_BYTES: usize = 128 << 20;

#[cfg(target_os = "linux")]
fn start_reserve(caches: std::sync::Arc<zarrgate::cache::Caches>) {
    let room = move || usize::try_from(caches.chunk_room()).unwrap_or(usize::MAX);
    if let Err(e) = zarrgate::alloc::start_reserve(RESERVE_BYTES, room) {
        tracing::warn!("no reserve of faulted-in pages: {e}");
    }
}

#[cfg(not(target_os = "linux"))]
fn start_reserve(_: std::sync::Arc<zarrgate::cache::Caches>) {}

fn main() -> ExitCode {
    #[cfg(all(target_os = "linux", target_env = "gnu"))]
    zarrgate::alloc::tune_glibc_malloc();
    let (action, args) = Cli::parse().action();
    let env = |k: &str| std::env::var(k).ok();
    let loaded = match &action {
        Action::Healthcheck | Action::Sign(_) => Config::read(&args, env),
        Action::Serve => Config::load(&args, env),
    };
    let config = match loaded {
        Ok(c) => c,
        Err(e) => {
            eprintln!("zarrgate: {e}");
            return ExitCode::FAILURE;
        }
    };
    match action {
        Action::Sign(sign) => return sign_url(&config, &sign),
        Action::Healthcheck => return healthcheck(&config),
        Action::Serve => {}
    };
    init_logging(config.server.log_format);
    // The blocking pool runs local file reads and chunk decoding: its size bounds the memory of
    // that work in flight (tokio's default of 512 threads lets a burst hold hundreds of buffers).
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .max_blocking_threads(config.server.blocking_threads)
        .build();
    match runtime {
        Ok(rt) => {
            let code = rt.block_on(serve(config, args));
            // What the drain left (connections, blocking reads that do not return: a hung
            // network filesystem) does not keep the process: async tasks end with the runtime,
            // and blocking ones are given a moment, not forever.
            rt.shutdown_timeout(std::time::Duration::from_secs(1));
            code
        }
        Err(e) => {
            eprintln!("zarrgate: cannot start the runtime: {e}");
            ExitCode::FAILURE
        }
    }
}

/// Log lines to stderr, filtered by `ZARRGATE_LOG` (`info` when unset or not a filter), as text
/// or as one JSON object per line.
fn init_logging(format: LogFormat) {
    // Empty is unset, as `-e ZARRGATE_LOG=` in a container or compose file leaves it.
    let filter = std::env::var("ZARRGATE_LOG")
        .ok()
        .filter(|f| !f.trim().is_empty())
        .unwrap_or_else(|| "info".into());
    let (filter, refused) = match EnvFilter::try_new(&filter) {
        Ok(f) => (f, None),
        Err(e) => (EnvFilter::new("info"), Some(e)),
    };
    let logs = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr);
    match format {
        LogFormat::Text => logs.with_ansi(std::io::stderr().is_terminal()).init(),
        LogFormat::Json => logs.json().flatten_event(true).with_current_span(false).init(),
    }
    if let Some(e) = refused {
        tracing::warn!(error = %e, "ZARRGATE_LOG is not a log filter (such as warn or zarrgate=debug): logging at info");
    }
}

async fn serve(config: Config, args: zarrgate::config::ServeArgs) -> ExitCode {
    let (addr, health) = match (config.bind_addr(), config.health_addr()) {
        (Ok(a), Ok(h)) => (a, h),
        (Err(e), _) | (_, Err(e)) => {
            eprintln!("zarrgate: {e}");
            return ExitCode::FAILURE;
        }
    };
    let state = match AppState::from_config(config) {
        Ok(s) => s,
        Err(e) => {
            eprintln!("zarrgate: {e}");
            return ExitCode::FAILURE;
        }
    };
    // Signals from here on stop the server (or reload it), however soon they come.
    let signals = server::shutdown_signals();
    #[cfg(unix)]
    let hangups = server::reload_signals();
    let drain = server::drain_time(&state);
    server::start_background(&state);
    start_reserve(state.caches.clone());
    let listener = match tokio::net::TcpListener::bind(addr).await {
        Ok(l) => l,
        Err(e) => {
            eprintln!("zarrgate: cannot listen on {addr}: {e}");
            return ExitCode::FAILURE;
        }
    };
    let health = match health {
        Some(health) => match tokio::net::TcpListener::bind(health).await {
            Ok(l) => Some(l),
            Err(e) => {
                eprintln!("zarrgate: cannot listen on {health} (server.health_bind): {e}");
                return ExitCode::FAILURE;
            }
        },
        None => None,
    };
    let app = server::app(state.clone());
    let base = format!("http://{}", listener.local_addr().unwrap_or(addr));
    say(format_args!("zarrgate listening on {base}/"));
    let mut apps = vec![app.clone()];
    if let Some(health) = health {
        if let Ok(at) = health.local_addr() {
            say(format_args!(
                "  health and metrics also on http://{at}/healthz, /readyz, /metrics"
            ));
        }
        let health_app = server::health_app(state.clone());
        apps.push(health_app.clone());
        // It stops accepting when `bind` does: probes reach /readyz while the server drains.
        tokio::spawn(server::serve_health(
            health,
            health_app,
            server::stop_accepting(signals.clone(), app.clone(), drain),
        ));
    }
    for mount in state.mounts.values() {
        say(format_args!(
            "  {:<12} {base}/zarr/{}/   ({} {})",
            mount.name, mount.name, mount.kind, mount.url
        ));
    }
    // From here on the listeners' states are the only ones: a reload replaces them.
    drop(state);
    #[cfg(unix)]
    if let Some(hangups) = hangups {
        tokio::spawn(reload_on_hangup(hangups, apps, args));
    }
    #[cfg(not(unix))]
    let _ = (apps, args);
    // SIGTERM: not ready at once, serving on for `server.drain_seconds`; then (and at once on
    // SIGINT) nothing more is accepted and responses under way get as long again to finish.
    // A second signal ends them at once.
    let second_signal = async {
        server::signalled(signals.clone(), 2).await;
        tracing::warn!("a second signal: closing the connections still open");
    };
    let served = tokio::select! {
        served = server::run_draining(listener, app.clone(), server::stop_accepting(signals.clone(), app, drain), drain) => served,
        () = second_signal => Ok(()),
    };
    if let Err(e) = served {
        eprintln!("zarrgate: {e}");
        return ExitCode::FAILURE;
    }
    ExitCode::SUCCESS
}

/// Reads the config file again at each SIGHUP and puts it in use ([`server::reload`]); an
/// invalid one is logged and the old one kept.
#[cfg(unix)]
async fn reload_on_hangup(
    mut hangups: tokio::signal::unix::Signal,
    apps: Vec<zarrgate::App>,
    args: zarrgate::config::ServeArgs,
) {
    while hangups.recv().await.is_some() {
        let apps: Vec<&zarrgate::App> = apps.iter().collect();
        let reloaded = match Config::load(&args, |k| std::env::var(k).ok()) {
            Ok(config) => server::reload(&apps, config).await,
            Err(e) => Err(e),
        };
        match reloaded {
            Ok(state) => tracing::info!(mounts = state.mounts.len(), "SIGHUP: configuration reloaded"),
            Err(e) => tracing::error!(error = %e, "SIGHUP: the configuration is not valid; keeping the one in use"),
        }
    }
}

/// `zarrgate sign`: prints a signed URL of a mount's prefix.
fn sign_url(config: &Config, sign: &zarrgate::config::SignArgs) -> ExitCode {
    match zarrgate::auth::signed_url::for_config(config, sign, std::time::SystemTime::now()) {
        Ok(url) => {
            say(format_args!("{url}"));
            ExitCode::SUCCESS
        }
        Err(e) => {
            eprintln!("zarrgate: {e}");
            ExitCode::FAILURE
        }
    }
}

/// A line on standard output, which may be closed (`zarrgate serve | head -1`): what is not
/// written there is lost, and the server goes on (`println!` would panic).
fn say(line: std::fmt::Arguments) {
    use std::io::Write;
    let _ = writeln!(std::io::stdout(), "{line}");
}

/// `zarrgate healthcheck`: success when the server answers its health check
/// ([`server::healthcheck`]).
fn healthcheck(config: &Config) -> ExitCode {
    match server::healthcheck(config) {
        Ok(said) => {
            say(format_args!("zarrgate: healthy ({said})"));
            ExitCode::SUCCESS
        }
        Err(e) => {
            eprintln!("zarrgate: unhealthy: {e}");
            ExitCode::FAILURE
        }
    }
}
