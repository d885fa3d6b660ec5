//! What a connection has in flight: requests, and response bodies watched for a stalled client.

use std::time::Duration;

/// What a connection has under way: requests not yet answered to the end of their response
/// bodies, and when the last began or ended.
pub(super) struct ConnectionActivity {
    pub(super) born: tokio::time::Instant,
    pub(super) in_flight: std::sync::atomic::AtomicUsize,
    /// Of those, the requests whose response's head is not yet made.
    pub(super) unanswered: std::sync::atomic::AtomicUsize,
    /// Milliseconds from `born` to the last beginning or end of a request.
    pub(super) last_ms: std::sync::atomic::AtomicU64,
    /// The watched bodies under way ([`BodyProgress`], [`LoggedBody`]), each kept by its body and
    /// here (one kept here alone is over).
    pub(super) sending: std::sync::Mutex<Vec<std::sync::Arc<BodyProgress>>>,
}

/// Where a watched response body ([`LoggedBody`]) is: the milliseconds from its connection's
/// `born` to when the connection took its last frame and has not asked for the next since, or
/// [`BodyProgress::WAITING`] while the connection waits for the body.
pub(super) struct BodyProgress(std::sync::atomic::AtomicU64);

impl BodyProgress {
    /// The connection waits for the body.
    pub(super) const WAITING: u64 = u64::MAX;

    /// The connection asks for the body's next frame.
    pub(super) fn waiting(&self) {
        self.0.store(Self::WAITING, std::sync::atomic::Ordering::Relaxed);
    }

    /// The connection took a frame at `ms` (from its connection's birth).
    pub(super) fn taken_at(&self, ms: u64) {
        self.0.store(ms, std::sync::atomic::Ordering::Relaxed);
    }
}

/// Forgets the bodies that are over: kept by the list alone.
pub(super) fn forget_bodies_over(bodies: &mut Vec<std::sync::Arc<BodyProgress>>) {
    bodies.retain(|body| std::sync::Arc::strong_count(body) > 1);
}

/// A request under way on a connection ([`ConnectionActivity::begin`]), until it is dropped: with its
/// response's body ([`LoggedBody`]), when that is over (sent, or given up). A connection
/// sending a long body is not idle (asked to finish mid-body, it lost an HTTP/1 client's
/// pipelined request and made an HTTP/2 client open another connection).
pub(super) struct InFlightRequest {
    pub(super) activity: std::sync::Arc<ConnectionActivity>,
    /// Whether its response's head is made ([`InFlightRequest::answered`]).
    pub(super) answered: bool,
}

impl ConnectionActivity {
    pub(super) fn new() -> Self {
        Self {
            born: tokio::time::Instant::now(),
            in_flight: 0.into(),
            unanswered: 0.into(),
            last_ms: 0.into(),
            sending: std::sync::Mutex::new(Vec::new()),
        }
    }

    /// Milliseconds since `born` (below [`BodyProgress::WAITING`]).
    pub(super) fn now_ms(&self) -> u64 {
        u64::try_from(self.born.elapsed().as_millis()).unwrap_or(BodyProgress::WAITING - 1)
    }

    pub(super) fn touch(&self) {
        self.last_ms.store(self.now_ms(), std::sync::atomic::Ordering::Relaxed);
    }

    pub(super) fn bodies(&self) -> std::sync::MutexGuard<'_, Vec<std::sync::Arc<BodyProgress>>> {
        // A plain list: consistent whenever the lock is released (a poisoned lock is taken
        // over as is).
        self.sending.lock().unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    /// A body whose first frame was just taken, watched from now on ([`Self::stalled`]).
    pub(super) fn sending(&self) -> std::sync::Arc<BodyProgress> {
        let sending = std::sync::Arc::new(BodyProgress(self.now_ms().into()));
        let mut bodies = self.bodies();
        // Bodies that are over go when the list would grow, not only when it is checked: a busy
        // HTTP/2 connection begins many between two checks.
        if bodies.len() == bodies.capacity() {
            forget_bodies_over(&mut bodies);
        }
        bodies.push(sending.clone());
        drop(bodies);
        sending
    }

    /// Whether a body under way has waited `limit` or longer for the connection to ask for
    /// more of it: the client has not taken what it was sent (HTTP/1: the socket's buffers
    /// are full; HTTP/2: the stream's or the connection's window is closed). Bodies that are
    /// over are forgotten here.
    pub(super) fn stalled(&self, limit: Duration) -> bool {
        let limit = u64::try_from(limit.as_millis()).unwrap_or(u64::MAX);
        let now = self.now_ms();
        let mut bodies = self.bodies();
        forget_bodies_over(&mut bodies);
        bodies.iter().any(|body| {
            let taken = body.0.load(std::sync::atomic::Ordering::Relaxed);
            taken != BodyProgress::WAITING && now.saturating_sub(taken) >= limit
        })
    }

    pub(super) fn begin(this: &std::sync::Arc<Self>) -> InFlightRequest {
        this.in_flight.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        this.unanswered.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        this.touch();
        InFlightRequest {
            activity: this.clone(),
            answered: false,
        }
    }

    /// Whether a request waits for its response's head.
    pub(super) fn waiting(&self) -> bool {
        self.unanswered.load(std::sync::atomic::Ordering::Relaxed) > 0
    }

    /// Whether no request is under way.
    pub(super) fn nothing_under_way(&self) -> bool {
        self.in_flight.load(std::sync::atomic::Ordering::Relaxed) == 0
    }

    /// `None` when nothing has been under way for `idle`; else when to ask again: at most
    /// `check` (no more than `idle`) from now, so that a request begun meanwhile is checked on
    /// as often.
    pub(super) fn busy_until(&self, idle: Duration, check: Duration) -> Option<tokio::time::Instant> {
        let last = self.born + Duration::from_millis(self.last_ms.load(std::sync::atomic::Ordering::Relaxed));
        let until = last + idle;
        let now = tokio::time::Instant::now();
        match (self.nothing_under_way(), until > now) {
            (true, false) => None,
            (_, true) => Some(until.min(now + check)),
            (false, false) => Some(now + check),
        }
    }
}

impl InFlightRequest {
    /// Its response's head is made: the request no longer waits for its answer.
    pub(super) fn answered(&mut self) {
        if !std::mem::replace(&mut self.answered, true) {
            self.activity
                .unanswered
                .fetch_sub(1, std::sync::atomic::Ordering::Relaxed);
        }
    }
}

impl Drop for InFlightRequest {
    fn drop(&mut self) {
        self.answered();
        self.activity
            .in_flight
            .fetch_sub(1, std::sync::atomic::Ordering::Relaxed);
        self.activity.touch();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test(start_paused = true)]
    async fn a_body_left_unread_is_stalled_once_the_limit_has_passed() {
        let activity = std::sync::Arc::new(ConnectionActivity::new());
        let request = ConnectionActivity::begin(&activity);
        assert!(activity.waiting() && !activity.nothing_under_way());
        let body = activity.sending();
        tokio::time::advance(Duration::from_secs(5)).await;
        assert!(!activity.stalled(Duration::from_secs(10)));
        tokio::time::advance(Duration::from_secs(5)).await;
        assert!(activity.stalled(Duration::from_secs(10)));
        // Waiting for the body itself (its store) is no stall.
        body.waiting();
        assert!(!activity.stalled(Duration::from_secs(10)));
        drop((body, request));
        assert!(activity.nothing_under_way());
    }

    #[tokio::test(start_paused = true)]
    async fn a_connection_is_busy_until_idle_for_as_long_as_asked() {
        let activity = std::sync::Arc::new(ConnectionActivity::new());
        let (idle, check) = (Duration::from_secs(30), Duration::from_secs(5));
        let request = ConnectionActivity::begin(&activity);
        tokio::time::advance(Duration::from_secs(60)).await;
        // Under way: checked again in `check`, however long ago it began.
        assert_eq!(
            activity.busy_until(idle, check),
            Some(tokio::time::Instant::now() + check)
        );
        drop(request);
        assert!(activity.busy_until(idle, check).is_some());
        tokio::time::advance(idle).await;
        assert_eq!(activity.busy_until(idle, check), None);
    }
}
