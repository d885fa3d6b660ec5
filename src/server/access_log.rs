//! The access log and the response-body metrics: one record per request, written when its
//! response body is over ([`LoggedBody`]).

use super::activity::BodyProgress;
use super::activity::InFlightRequest;
use crate::state::AppState;
use axum::extract::Request;
use axum::http::{HeaderValue, Method, header};
use axum::response::Response;
use std::time::{Duration, Instant};

/// The longest path the access log writes whole, in characters.
pub(super) const LOGGED_PATH_CHARS: usize = 1024;

/// One log line per request (method, path, Range, status, body bytes, milliseconds to the
/// response head and to its end) and the request metrics. Status and latency are counted at the
/// response head ([`AccessLogRecord::head`]); the line is written, and the body bytes and aborted
/// responses counted, when this is dropped: with the body, when it is over (sent to its end, or
/// given up: the client left, or the body failed). A request whose client leaves before the
/// head is logged with status 499 (nginx's "client closed request") and counted as aborted.
pub(super) struct AccessLogRecord {
    pub(super) state: AppState,
    pub(super) method: Method,
    /// The request's URI (its path is logged, up to [`LOGGED_PATH_CHARS`]).
    pub(super) uri: axum::http::Uri,
    pub(super) range: Option<HeaderValue>,
    /// The route family of its path ([`crate::metrics::route_index`]).
    pub(super) route: usize,
    pub(super) start: Instant,
    /// The response's status and the time to its head, once there is one.
    pub(super) head: Option<(u16, Duration)>,
    /// How the raw cache answered it (raw keys), as nginx's `$upstream_cache_status`.
    pub(super) cache: Option<crate::store::cached::CacheStatusNote>,
    /// The body's length, when known before it is sent.
    pub(super) length: Option<u64>,
    /// Body bytes handed to the connection.
    pub(super) bytes: u64,
    /// Whether the body reached its end.
    pub(super) ended: bool,
    /// Whether the request came over HTTP/2, where a body handed on whole waits in the
    /// connection, unsent, while its stream's window is closed: its body is watched however
    /// short ([`LoggedBody`]).
    http2: bool,
    /// The connection's mark of the request, held to the end of the body.
    pub(super) in_flight: Option<InFlightRequest>,
}

impl AccessLogRecord {
    pub(super) fn begin(state: &AppState, request: &Request, in_flight: Option<InFlightRequest>) -> Self {
        state.metrics.started();
        Self {
            state: state.clone(),
            method: request.method().clone(),
            uri: request.uri().clone(),
            range: request.headers().get(header::RANGE).cloned(),
            route: crate::metrics::route_index(request.uri().path()),
            start: Instant::now(),
            head: None,
            cache: None,
            length: None,
            bytes: 0,
            ended: false,
            http2: request.version() == axum::http::Version::HTTP_2,
            in_flight,
        }
    }

    /// The response's head is ready: its status and latency are counted.
    pub(super) fn head(&mut self, response: &Response) {
        let (status, head) = (response.status().as_u16(), self.start.elapsed());
        self.state.metrics.observe(self.route, status, head);
        self.head = Some((status, head));
        self.cache = response.extensions().get().cloned();
        if let Some(in_flight) = &mut self.in_flight {
            in_flight.answered();
        }
        // A streamed body has no exact size hint, but its Content-Length header.
        self.length = http_body::Body::size_hint(response.body()).exact().or_else(|| {
            response
                .headers()
                .get(header::CONTENT_LENGTH)
                .and_then(|v| v.to_str().ok())
                .and_then(|v| v.parse().ok())
        });
    }
}

impl Drop for AccessLogRecord {
    fn drop(&mut self) {
        // A body of known length is over once that much is handed on (hyper stops polling it
        // there); HEAD, 204 and 304 bodies send nothing.
        let complete = self.head.is_some()
            && (self.method == Method::HEAD
                || match self.length {
                    Some(n) => n == self.bytes,
                    None => self.ended,
                });
        if self.ended && !complete && self.head.is_some() {
            // The body ended short of its stated length (a file truncated while it was sent):
            // the client's connection is cut, and the response counts as aborted.
            tracing::warn!(
                path = %self.uri.path(),
                sent = self.bytes,
                length = self.length.unwrap_or_default(),
                "response body ended before its length"
            );
        }
        self.state.metrics.ended(self.route, self.bytes, complete);
        if !tracing::enabled!(target: "zarrgate::access", tracing::Level::INFO) {
            return;
        }
        let path = self.uri.path();
        let (status, head) = self.head.unwrap_or((499, self.start.elapsed()));
        // A path is logged up to 1 KiB: a request of a 64 KiB URL writes no 64 KiB line.
        let path: std::borrow::Cow<str> = match path.char_indices().nth(LOGGED_PATH_CHARS) {
            Some((cut, _)) => format!("{}...", &path[..cut]).into(),
            None => path.into(),
        };
        tracing::info!(
            target: "zarrgate::access",
            method = %self.method,
            // A string field: the text format quotes and escapes it.
            path = &*path,
            range = self.range.as_ref().and_then(|v| v.to_str().ok()).unwrap_or("-"),
            status,
            bytes = self.bytes,
            ms = millis(self.start.elapsed()),
            head_ms = millis(head),
            aborted = !complete,
            cache = self
                .cache
                .as_ref()
                .and_then(crate::store::cached::CacheStatusNote::get)
                .map_or("-", crate::store::cached::CacheStatus::as_str),
        );
    }
}

/// Milliseconds to the microsecond (`0.296`, not `0.29577899999999996`).
pub(super) fn millis(d: Duration) -> f64 {
    d.as_micros() as f64 / 1e3
}

/// A response body that counts what is handed on of it; the access log line is written when
/// it is dropped ([`AccessLogRecord`]), and its connection's mark of the request is released then.
/// It hands on frames of at most [`MAX_FRAME`], and tells its connection when it waits for the
/// client to take more ([`ConnectionActivity::stalled`]): one of more than a frame, and any over HTTP/2.
pub struct LoggedBody {
    pub(super) body: axum::body::Body,
    pub(super) done: AccessLogRecord,
    /// Made for a body that needs it (a tile over HTTP/1 does not): hyper moves the body
    /// several times a request.
    pub(super) more: Option<Box<MoreOfBody>>,
}

/// What a [`LoggedBody`] of more than one frame, or over HTTP/2, keeps.
#[derive(Default)]
pub(super) struct MoreOfBody {
    /// What is left of a frame of the body's over [`MAX_FRAME`].
    pub(super) rest: axum::body::Bytes,
    pub(super) sending: Option<std::sync::Arc<BodyProgress>>,
}

/// The largest frame a response body hands on ([`LoggedBody`]). A connection asks for the next
/// frame once it has sent most of the last: a stall is a client taking none of this in
/// `limits.send_timeout_s`, not none of a whole 8 MiB answer (a client reading 70 KB/s).
pub const MAX_FRAME: usize = 1 << 20;

impl LoggedBody {
    pub(super) fn rest(&self) -> Option<&axum::body::Bytes> {
        self.more
            .as_ref()
            .map(|more| &more.rest)
            .filter(|rest| !rest.is_empty())
    }
}

impl http_body::Body for LoggedBody {
    type Data = axum::body::Bytes;
    type Error = axum::Error;

    fn poll_frame(
        mut self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<Option<Result<http_body::Frame<Self::Data>, Self::Error>>> {
        let this = &mut *self;
        if let Some(sending) = this.more.as_ref().and_then(|more| more.sending.as_ref()) {
            sending.waiting();
        }
        let polled = match this.more.as_deref_mut() {
            Some(more) if !more.rest.is_empty() => {
                let piece = more.rest.split_to(more.rest.len().min(MAX_FRAME));
                std::task::Poll::Ready(Some(Ok(http_body::Frame::data(piece))))
            }
            _ => {
                let mut polled = std::pin::Pin::new(&mut this.body).poll_frame(cx);
                if let std::task::Poll::Ready(Some(Ok(frame))) = &mut polled
                    && let Some(data) = frame.data_mut()
                    && data.len() > MAX_FRAME
                {
                    this.more.get_or_insert_default().rest = data.split_off(MAX_FRAME);
                }
                polled
            }
        };
        match &polled {
            std::task::Poll::Ready(Some(Ok(frame))) => {
                if let Some(data) = frame.data_ref() {
                    this.done.bytes += data.len() as u64;
                }
                // Taken by the connection: from now on the body waits for it to ask again. A
                // body whose length is all handed on (a tile, in one frame) is over over
                // HTTP/1, and is not watched.
                if let Some(activity) = this.done.in_flight.as_ref().map(|u| &u.activity) {
                    match this.more.as_ref().and_then(|more| more.sending.as_ref()) {
                        Some(sending) => sending.taken_at(activity.now_ms()),
                        None if this.done.http2 || this.done.length != Some(this.done.bytes) => {
                            this.more.get_or_insert_default().sending = Some(activity.sending());
                        }
                        None => {}
                    }
                }
            }
            std::task::Poll::Ready(None) => this.done.ended = true,
            _ => {}
        }
        polled
    }

    fn is_end_stream(&self) -> bool {
        self.rest().is_none() && self.body.is_end_stream()
    }

    fn size_hint(&self) -> http_body::SizeHint {
        let inner = self.body.size_hint();
        let Some(rest) = self.rest() else {
            return inner;
        };
        let rest = rest.len() as u64;
        let mut hint = http_body::SizeHint::new();
        if let Some(upper) = inner.upper() {
            hint.set_upper(upper.saturating_add(rest));
        }
        // Still at most the upper bound: both grow by `rest`, and it saturates first.
        hint.set_lower(inner.lower().saturating_add(rest));
        hint
    }
}

impl Drop for LoggedBody {
    /// The body is over when hyper drops it: after its end, or before (the client left). An
    /// empty body (or one read to its end without a last poll) is at its end here.
    fn drop(&mut self) {
        if http_body::Body::is_end_stream(&self.body) {
            self.done.ended = true;
        }
    }
}
