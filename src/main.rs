use std::io::IsTerminal;
use std::process::ExitCode;

use clap::Parser;
use tracing_subscriber::EnvFilter;
use zarrgate::config::{Cli, Command, Config, ServeArgs};
use zarrgate::{AppState, server};

#[tokio::main]
async fn main() -> ExitCode {
    let cli = Cli::parse();
    let args = match cli.command {
        Some(Command::Serve(args)) => args,
        None => ServeArgs::default(),
    };
    let filter = std::env::var("ZARRGATE_LOG").unwrap_or_else(|_| "info".into());
    tracing_subscriber::fmt()
        .with_env_filter(EnvFilter::try_new(&filter).unwrap_or_else(|_| EnvFilter::new("info")))
        .with_writer(std::io::stderr)
        .with_ansi(std::io::stderr().is_terminal())
        .init();

    let config = match Config::load(&args, |k| std::env::var(k).ok()) {
        Ok(c) => c,
        Err(e) => {
            eprintln!("zarrgate: {e}");
            return ExitCode::FAILURE;
        }
    };
    let addr = match config.bind_addr() {
        Ok(a) => a,
        Err(e) => {
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
    let listener = match tokio::net::TcpListener::bind(addr).await {
        Ok(l) => l,
        Err(e) => {
            eprintln!("zarrgate: cannot listen on {addr}: {e}");
            return ExitCode::FAILURE;
        }
    };
    let base = format!("http://{}", listener.local_addr().unwrap_or(addr));
    println!("zarrgate listening on {base}/");
    for mount in state.mounts.values() {
        println!(
            "  {:<12} {base}/zarr/{}/   ({} {})",
            mount.name, mount.name, mount.kind, mount.url
        );
    }
    if let Err(e) = server::run(listener, state, server::shutdown_signal()).await {
        eprintln!("zarrgate: {e}");
        return ExitCode::FAILURE;
    }
    ExitCode::SUCCESS
}
