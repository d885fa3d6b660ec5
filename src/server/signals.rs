//! SIGTERM and SIGINT as a count that every part of the server can wait on.

/// SIGTERM and SIGINT (Ctrl-C) as a count that goes up with each: listened for from when this
/// is called (on a runtime), so that a signal arriving before anything waits for it is not lost,
/// and seen by every receiver (the server, its health listener, the second signal's watch).
pub fn shutdown_signals() -> tokio::sync::watch::Receiver<u32> {
    let (count, counted) = tokio::sync::watch::channel(0u32);
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
                    _ = term.recv() => {},
                    _ = int.recv() => {},
                }
                count.send_modify(|n| *n += 1);
            }
        });
    }
    #[cfg(not(unix))]
    tokio::spawn(async move {
        while tokio::signal::ctrl_c().await.is_ok() {
            count.send_modify(|n| *n += 1);
        }
        std::future::pending::<()>().await
    });
    counted
}

/// Resolves once `signals` ([`shutdown_signals`]) has counted `n` of them.
pub async fn signalled(mut signals: tokio::sync::watch::Receiver<u32>, n: u32) {
    if signals.wait_for(|&count| count >= n).await.is_err() {
        std::future::pending::<()>().await;
    }
}
