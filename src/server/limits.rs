//! The limit of requests that read mounts at once.

/// Permits of a limit that is only ever tried, never waited for: a count, which is all a
/// semaphore would be here (tokio's takes its waiters' lock to release each permit, a lock
/// every request on every core then takes).
pub(super) struct ConcurrencyLimit {
    taken: std::sync::atomic::AtomicUsize,
    limit: usize,
}

/// A permit of [`ConcurrencyLimit`], released when dropped.
pub(super) struct ConcurrencyPermit<'a>(&'a std::sync::atomic::AtomicUsize);

impl ConcurrencyLimit {
    /// A limit of `limit` permits at once.
    pub(super) fn new(limit: usize) -> Self {
        Self { taken: 0.into(), limit }
    }

    /// How many permits it has.
    pub(super) fn limit(&self) -> usize {
        self.limit
    }

    /// A permit, if one is free.
    pub(super) fn try_acquire(&self) -> Option<ConcurrencyPermit<'_>> {
        use std::sync::atomic::Ordering::{AcqRel, Acquire};
        let free = |taken: usize| (taken < self.limit).then_some(taken + 1);
        self.taken.fetch_update(AcqRel, Acquire, free).ok()?;
        Some(ConcurrencyPermit(&self.taken))
    }
}

impl Drop for ConcurrencyPermit<'_> {
    fn drop(&mut self) {
        self.0.fetch_sub(1, std::sync::atomic::Ordering::AcqRel);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn permits_are_refused_past_the_limit_and_come_back_when_dropped() {
        let limit = ConcurrencyLimit::new(2);
        let (a, b) = (limit.try_acquire(), limit.try_acquire());
        assert!(a.is_some() && b.is_some());
        assert!(limit.try_acquire().is_none());
        drop(a);
        let c = limit.try_acquire();
        assert!(c.is_some());
        assert!(limit.try_acquire().is_none());
        drop((b, c));
        assert_eq!(limit.taken.load(std::sync::atomic::Ordering::Relaxed), 0);
        assert!(ConcurrencyLimit::new(0).try_acquire().is_none());
    }
}
