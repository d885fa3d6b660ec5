//! SIGTERM, SIGINT and SIGHUP as values that every part of the server can wait on.

/// The stop signals received: how many, and whether the first was SIGTERM (a platform's stop,
/// which drains first: [`crate::server::drained`]) or SIGINT (Ctrl-C, which does not).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct StopSignals {
    /// How many SIGTERMs and SIGINTs have come.
    pub count: u32,
    /// Whether the first was SIGTERM.
    pub first_was_term: bool,
}

/// SIGTERM and SIGINT (Ctrl-C) as a count that goes up with each: listened for from when this
/// is called (on a runtime), so that a signal arriving before anything waits for it is not lost,
/// and seen by every receiver (the server, its health listener, the second signal's watch).
pub fn shutdown_signals() -> tokio::sync::watch::Receiver<StopSignals> {
    let (count, counted) = tokio::sync::watch::channel(StopSignals::default());
    let note = move |term: bool| {
        count.send_modify(|s| {
            s.first_was_term |= s.count == 0 && term;
            s.count += 1;
        })
    };
    #[cfg(unix)]
    {
        use tokio::signal::unix::{SignalKind, signal};
        // Registered here, not when first polled.
        let (term, int) = (signal(SignalKind::terminate()), signal(SignalKind::interrupt()));
        tokio::spawn(async move {
            let (mut term, mut int) = match (term, int) {
                (Ok(term), Ok(int)) => (term, int),
                _ => return std::future::pending().await,
            };
            loop {
                tokio::select! {
                    _ = term.recv() => note(true),
                    _ = int.recv() => note(false),
                }
            }
        });
    }
    #[cfg(not(unix))]
    tokio::spawn(async move {
        while tokio::signal::ctrl_c().await.is_ok() {
            note(false);
        }
        std::future::pending::<()>().await
    });
    counted
}

/// Resolves once `signals` ([`shutdown_signals`]) has counted `n` of them.
pub async fn signalled(mut signals: tokio::sync::watch::Receiver<StopSignals>, n: u32) {
    if signals.wait_for(|s| s.count >= n).await.is_err() {
        std::future::pending::<()>().await;
    }
}

/// SIGHUPs as a stream of wake-ups, listened for from when this is called; `None` where there
/// is no SIGHUP (or it cannot be listened for).
pub fn reload_signals() -> Option<tokio::signal::unix::Signal> {
    #[cfg(unix)]
    {
        tokio::signal::unix::signal(tokio::signal::unix::SignalKind::hangup()).ok()
    }
    #[cfg(not(unix))]
    None
}
