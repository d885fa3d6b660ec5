//! Permits to decode, handed out in the order a response needs the units.
//!
//! A streamed slice loads a few bands of units at once, each in a task of its own, and the
//! tasks run in whatever order the runtime polls them: tokio runs the task spawned last first.
//! With permits handed out first come, first served, the third band's units took the permits
//! before the first band's, and the first byte of a cold 64 MiB slice waited for three bands
//! to be read (bench/JOURNAL.md). Here a waiter of a lower rank (an earlier band) is served
//! before any of a higher one, and waiters of one rank in the order they came.

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex, MutexGuard};

use tokio::sync::oneshot;

/// A fixed number of permits, handed out by rank (see the module documentation).
#[derive(Debug)]
pub struct PrioritySemaphore {
    state: Mutex<State>,
}

#[derive(Debug)]
struct State {
    /// Permits no one holds or has been handed.
    free: usize,
    /// Waiters by (rank, arrival).
    waiting: BTreeMap<(u64, u64), oneshot::Sender<PriorityPermit>>,
    arrivals: u64,
}

/// A permit: handed on to the first waiter (or freed) when dropped.
#[derive(Debug)]
pub struct PriorityPermit {
    permits: Option<Arc<PrioritySemaphore>>,
}

impl PrioritySemaphore {
    /// `count` permits (at least one).
    pub fn new(count: usize) -> Arc<Self> {
        Arc::new(Self {
            state: Mutex::new(State {
                free: count.max(1),
                waiting: BTreeMap::new(),
                arrivals: 0,
            }),
        })
    }

    fn state(&self) -> MutexGuard<'_, State> {
        // The state is consistent whenever the lock is released: no code under it panics
        // midway (a poisoned lock is taken over as is).
        self.state.lock().unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    /// Waits for a permit: at once if one is free and no one waits, else after every waiter of a
    /// lower rank, and every earlier one of the same rank, has had one. Dropping the future
    /// gives up the place (or the permit, if it was already handed over).
    pub async fn take(self: &Arc<Self>, rank: u64) -> PriorityPermit {
        let handed = {
            let mut state = self.state();
            if state.free > 0 && state.waiting.is_empty() {
                state.free -= 1;
                return PriorityPermit {
                    permits: Some(self.clone()),
                };
            }
            let (tx, rx) = oneshot::channel();
            let arrival = state.arrivals;
            state.arrivals += 1;
            state.waiting.insert((rank, arrival), tx);
            rx
        };
        match handed.await {
            Ok(permit) => permit,
            // The sender is dropped only with the queue, which `self` keeps alive: not reached.
            // A permit of no queue is still a correct (if unlimited) answer.
            Err(_) => PriorityPermit { permits: None },
        }
    }

    /// Permits free now.
    #[cfg(test)]
    fn free(&self) -> usize {
        self.state().free
    }
}

impl Drop for PriorityPermit {
    fn drop(&mut self) {
        let Some(permits) = self.permits.take() else {
            return;
        };
        loop {
            // The first waiter, or the permit freed, in one hold of the lock: a waiter that came
            // between the two would wait with a permit free. The lock is not held while handing
            // over: a permit dropped inside the channel (its waiter gone at that moment) comes
            // back here, and takes the lock itself.
            let waiter = {
                let mut state = permits.state();
                match state.waiting.pop_first() {
                    Some((_, waiter)) => waiter,
                    None => {
                        state.free += 1;
                        return;
                    }
                }
            };
            match waiter.send(PriorityPermit {
                permits: Some(permits.clone()),
            }) {
                Ok(()) => return,
                // The waiter gave up its place: the next one.
                Err(mut unsent) => unsent.permits = None,
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use std::sync::atomic::{AtomicUsize, Ordering};
    use std::time::Duration;

    use super::*;

    /// Lets spawned tasks run until they wait.
    async fn settle() {
        for _ in 0..20 {
            tokio::task::yield_now().await;
        }
    }

    #[tokio::test]
    async fn permits_go_by_rank_then_arrival_and_never_exceed_the_count() {
        let permits = PrioritySemaphore::new(2);
        let a = permits.take(9).await;
        let b = permits.take(9).await;
        assert_eq!(permits.free(), 0);
        let (tx, mut order) = tokio::sync::mpsc::unbounded_channel();
        // Permits held by the tasks at once, and the most ever.
        let (holding, most) = (Arc::new(AtomicUsize::new(0)), Arc::new(AtomicUsize::new(0)));
        let mut tasks = Vec::new();
        for (name, rank) in [("r5", 5), ("r1", 1), ("r3 first", 3), ("r3 second", 3), ("r0", 0)] {
            let (permits, tx, holding, most) = (permits.clone(), tx.clone(), holding.clone(), most.clone());
            tasks.push(tokio::spawn(async move {
                let permit = permits.take(rank).await;
                most.fetch_max(holding.fetch_add(1, Ordering::SeqCst) + 1, Ordering::SeqCst);
                tx.send(name).unwrap();
                // Held a while, so that the others wait.
                tokio::time::sleep(Duration::from_millis(20)).await;
                holding.fetch_sub(1, Ordering::SeqCst);
                drop(permit);
            }));
            settle().await;
        }
        assert!(order.try_recv().is_err(), "no permit is free");
        drop(a);
        drop(b);
        let mut got = Vec::new();
        for _ in 0..5 {
            got.push(order.recv().await.unwrap());
        }
        // Two at a time: r0 and r1 first, the rest as permits come back.
        assert_eq!(got, ["r0", "r1", "r3 first", "r3 second", "r5"]);
        for t in tasks {
            t.await.unwrap();
        }
        assert_eq!(permits.free(), 2);
        assert_eq!(
            most.load(Ordering::SeqCst),
            2,
            "two permits, held by two at once at most"
        );
    }

    #[tokio::test]
    async fn a_waiter_that_gives_up_loses_no_permit() {
        let permits = PrioritySemaphore::new(1);
        let held = permits.take(0).await;
        // One waiter gives up before the permit comes back, and one is handed the permit but gone
        // before it looks: neither keeps it.
        let gone = {
            let permits = permits.clone();
            tokio::spawn(async move { permits.take(0).await })
        };
        let late = {
            let permits = permits.clone();
            tokio::spawn(async move { permits.take(1).await })
        };
        settle().await;
        gone.abort();
        assert!(gone.await.unwrap_err().is_cancelled());
        drop(held);
        settle().await;
        let late = late.await.unwrap();
        assert_eq!(permits.free(), 0);
        drop(late);
        assert_eq!(permits.free(), 1);
        // A take dropped after the permit was handed to it releases the permit.
        let held = permits.take(0).await;
        let mut waiting = Box::pin(permits.take(0));
        assert!(futures::poll!(waiting.as_mut()).is_pending());
        drop(held);
        drop(waiting);
        assert_eq!(permits.free(), 1);
        let _again = tokio::time::timeout(Duration::from_secs(5), permits.take(3))
            .await
            .unwrap();
    }
}
