//! Watching a connection for its client hanging up while a request waits for its answer.

/// Not unix: hyper's own check for a client hanging up is on, and this is never ready.
#[cfg(not(unix))]
pub(super) struct HangUpWatch;

#[cfg(not(unix))]
impl HangUpWatch {
    pub(super) fn new(_: &tokio::net::TcpStream) -> Self {
        Self
    }

    pub(super) fn poll(&mut self, _: &mut std::task::Context<'_>, _: bool) -> std::task::Poll<()> {
        std::task::Poll::Pending
    }
}

/// Watches a connection's socket for its client hanging up (or shutting its sending side, which
/// hyper took for the same), while a request waits for its answer: through a second descriptor
/// of the socket, registered with the runtime for that time only (a request answered at its
/// first poll, a cached tile, costs nothing). A request whose head is answered and whose body
/// is under way finds a hang-up when its body is next written.
#[cfg(unix)]
pub(super) struct HangUpWatch {
    /// The connection's socket, owned by hyper's connection.
    pub(super) socket: std::os::fd::RawFd,
    pub(super) watch: Option<tokio::io::unix::AsyncFd<std::os::fd::OwnedFd>>,
    /// The socket could not be watched for the request waiting now (out of descriptors, say):
    /// not tried again until no request waits.
    pub(super) unwatchable: bool,
}

#[cfg(unix)]
impl HangUpWatch {
    pub(super) fn new(tcp: &tokio::net::TcpStream) -> Self {
        Self {
            socket: std::os::fd::AsRawFd::as_raw_fd(tcp),
            watch: None,
            unwatchable: false,
        }
    }

    /// Ready once the client has hung up while a request is `waiting`. Polled only while the
    /// connection (and so its socket) is open: after the connection's own poll said so.
    pub(super) fn poll(&mut self, cx: &mut std::task::Context<'_>, waiting: bool) -> std::task::Poll<()> {
        use std::task::Poll;
        if !waiting {
            (self.watch, self.unwatchable) = (None, false);
            return Poll::Pending;
        }
        if self.unwatchable {
            return Poll::Pending;
        }
        let watch = match &mut self.watch {
            Some(watch) => watch,
            None => {
                // SAFETY: `socket` is the descriptor of the connection's TcpStream, which
                // hyper's connection owns and keeps open while it is pending, as it is whenever
                // this is polled; it is only duplicated here, never closed.
                let socket = unsafe { std::os::fd::BorrowedFd::borrow_raw(self.socket) };
                let watch = socket.try_clone_to_owned().and_then(|fd| {
                    // SAFETY: the OwnedFd, which the AsyncFd owns, keeps its descriptor open.
                    unsafe { tokio::io::unix::AsyncFd::register_with_interest(fd, tokio::io::Interest::READABLE) }
                        .map_err(std::io::Error::from)
                });
                match watch {
                    Ok(watch) => self.watch.insert(watch),
                    Err(e) => {
                        tracing::debug!(error = %e, "cannot watch a connection for its client hanging up");
                        self.unwatchable = true;
                        return Poll::Pending;
                    }
                }
            }
        };
        // Bytes that arrive (an HTTP/2 frame, a pipelined request) are no hang-up: their
        // readiness is cleared, and the next event waited for.
        while let Poll::Ready(ready) = watch.poll_read_ready(cx) {
            let Ok(mut guard) = ready else {
                self.unwatchable = true;
                return Poll::Pending;
            };
            if guard.ready().is_read_closed() || guard.ready().is_error() {
                return Poll::Ready(());
            }
            guard.clear_ready();
        }
        Poll::Pending
    }
}
