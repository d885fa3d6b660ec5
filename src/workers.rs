//! The threads that serve connections (`server.workers`, one a core by default): each runs a
//! single-threaded tokio runtime of its own, and a connection stays on the worker it was given,
//! as the workers of nginx or actix-web keep theirs.
//!
//! On the runtime every thread shares, a connection's task moved between threads as they stole
//! work from each other, and its hyper state, buffers and request futures with it; workers woke
//! each other and parked. With a runtime per thread, a warm tile took 4-11% less CPU a request
//! at 64 connections, and was served 8-15% more times a second (bench/JOURNAL.md).
//!
//! What a worker does not share: a request's async work runs on its connection's worker (the
//! streams of an HTTP/2 connection too), where a long poll holds up the worker's other
//! connections rather than being stolen by an idle thread. The heavy work is not done there:
//! decoding, copying, encoding and opening local files go to one blocking pool shared by every
//! worker ([`spawn_blocking`]: the runtime that started them, with `server.blocking_threads`), and
//! a request's loads (a chunk's read and decode, a band of a large region, a hierarchy walk) are
//! tasks of that runtime, whose threads steal work from each other ([`spawn`]): one large
//! request still uses every core. A worker's own blocking pool only runs what
//! tokio and the crates below do there themselves (streamed reads of large local files, name
//! lookups). A new connection goes to the worker with the fewest open.

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

/// Threads of a worker's own blocking pool, at least: streamed reads of large local files (one
/// 256 KiB buffer each) run there, as tokio runs a file's reads.
const OWN_BLOCKING_THREADS: usize = 8;

thread_local! {
    /// In a worker's thread, the runtime the workers share: its blocking pool, and its threads
    /// for loads ([`spawn`]).
    static SHARED: std::cell::OnceCell<tokio::runtime::Handle> = const { std::cell::OnceCell::new() };
}

/// Runs `work` as a task of its own on the runtime the workers share when called on a worker
/// (the runtime that started them, whose threads steal work from each other), else on the
/// current runtime, as `tokio::spawn` does. For a request's loads (a chunk's read and decode, a
/// band of a large region, a walk of a hierarchy): the many loads of one large request then run
/// on every core, not on its connection's worker alone.
pub fn spawn<F>(work: F) -> tokio::task::JoinHandle<F::Output>
where
    F: Future + Send + 'static,
    F::Output: Send + 'static,
{
    match SHARED.with(|shared| shared.get().cloned()) {
        Some(shared) => shared.spawn(work),
        None => tokio::spawn(work),
    }
}

/// Runs `work` on the blocking pool: the one the workers share when called on a worker (the
/// pool of the runtime that started them, `server.blocking_threads`), else the current
/// runtime's, as `tokio::task::spawn_blocking` does.
pub fn spawn_blocking<F, R>(work: F) -> tokio::task::JoinHandle<R>
where
    F: FnOnce() -> R + Send + 'static,
    R: Send + 'static,
{
    match SHARED.with(|pool| pool.get().cloned()) {
        Some(pool) => pool.spawn_blocking(work),
        None => tokio::task::spawn_blocking(work),
    }
}

/// Running workers; they stop when this is dropped, ending the tasks still on them (their
/// blocking work gets a second to finish, as `main` gives its own runtime's).
pub struct Workers {
    workers: Vec<Worker>,
    /// Where the search for the least busy worker starts: the one after the last chosen, so
    /// that ties go round.
    next: usize,
    /// Closed when dropped: every worker's runtime then stops.
    _stop: tokio::sync::watch::Sender<()>,
}

struct Worker {
    handle: tokio::runtime::Handle,
    /// Its tasks running.
    open: Arc<AtomicUsize>,
}

/// A worker's count of the tasks it runs, less one when the task ends (or is dropped).
struct Open(Arc<AtomicUsize>);

impl Drop for Open {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::Relaxed);
    }
}

impl Workers {
    /// Starts `count` workers (at least one) sharing the current runtime's blocking pool; their
    /// own pools have `blocking_threads` shared out among them (at least
    /// [`OWN_BLOCKING_THREADS`] each).
    pub async fn start(count: usize, blocking_threads: usize) -> std::io::Result<Self> {
        let count = count.max(1);
        let blocking = blocking_threads.div_ceil(count).max(OWN_BLOCKING_THREADS);
        let shared = tokio::runtime::Handle::current();
        let (stop, stopped) = tokio::sync::watch::channel(());
        let mut workers = Vec::with_capacity(count);
        for i in 0..count {
            let (started, handle) = tokio::sync::oneshot::channel();
            let (mut stopped, shared) = (stopped.clone(), shared.clone());
            std::thread::Builder::new()
                .name(format!("zarrgate-worker-{i}"))
                .spawn(move || {
                    SHARED.with(|pool| {
                        let _ = pool.set(shared);
                    });
                    let runtime = tokio::runtime::Builder::new_current_thread()
                        .enable_all()
                        .max_blocking_threads(blocking)
                        .thread_name(format!("zarrgate-worker-{i}-blocking"))
                        .build();
                    let runtime = match runtime {
                        Ok(runtime) => runtime,
                        Err(e) => {
                            let _ = started.send(Err(e));
                            return;
                        }
                    };
                    if started.send(Ok(runtime.handle().clone())).is_err() {
                        return;
                    }
                    // Until the sender is dropped (an error, then).
                    runtime.block_on(async {
                        let _ = stopped.changed().await;
                    });
                    runtime.shutdown_timeout(Duration::from_secs(1));
                })?;
            let handle = handle
                .await
                .map_err(|_| std::io::Error::other("a worker thread ended as it started"))??;
            workers.push(Worker {
                handle,
                open: Arc::default(),
            });
        }
        Ok(Self {
            workers,
            next: 0,
            _stop: stop,
        })
    }

    /// Runs `task` on the worker running the fewest tasks (of those tied, the first after the
    /// last chosen).
    pub fn spawn<F>(&mut self, task: F)
    where
        F: Future<Output = ()> + Send + 'static,
    {
        let n = self.workers.len();
        let load = |i: usize| self.workers[i % n].open.load(Ordering::Relaxed);
        let chosen = (self.next..self.next + n).min_by_key(|&i| load(i)).unwrap_or(0) % n;
        self.next = chosen + 1;
        let worker = &self.workers[chosen];
        worker.open.fetch_add(1, Ordering::Relaxed);
        let open = Open(worker.open.clone());
        worker.handle.spawn(async move {
            let _open = open;
            task.await;
        });
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The name of the thread a task spawned on `workers` runs on; the task then holds its
    /// worker until `hold` closes.
    async fn runs_on(workers: &mut Workers, hold: &tokio::sync::watch::Receiver<()>) -> String {
        let (tx, rx) = tokio::sync::oneshot::channel();
        let mut hold = hold.clone();
        workers.spawn(async move {
            let _ = tx.send(std::thread::current().name().unwrap_or("").to_owned());
            let _ = hold.changed().await;
        });
        rx.await.unwrap()
    }

    /// Tasks go to the worker running the fewest, ties in turn, each on its worker's thread;
    /// a worker whose tasks ended gets the next ones. Blocking work runs on the worker's own
    /// pool.
    #[tokio::test]
    async fn tasks_go_to_the_least_busy_worker_and_stay_on_its_thread() {
        let mut workers = Workers::start(3, 5).await.unwrap();
        assert_eq!(workers.workers.len(), 3);
        let (release_first, first) = tokio::sync::watch::channel(());
        let (release_rest, rest) = tokio::sync::watch::channel(());
        let mut names = Vec::new();
        for _ in 0..3 {
            names.push(runs_on(&mut workers, &first).await);
        }
        assert_eq!(names, ["zarrgate-worker-0", "zarrgate-worker-1", "zarrgate-worker-2"]);
        names.clear();
        for _ in 0..2 {
            names.push(runs_on(&mut workers, &rest).await);
        }
        assert_eq!(names, ["zarrgate-worker-0", "zarrgate-worker-1"]);
        // The first three end: worker 2 runs none now, the others one each.
        drop(release_first);
        while workers
            .workers
            .iter()
            .map(|w| w.open.load(Ordering::Relaxed))
            .sum::<usize>()
            != 2
        {
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
        assert_eq!(runs_on(&mut workers, &rest).await, "zarrgate-worker-2");
        assert_eq!(runs_on(&mut workers, &rest).await, "zarrgate-worker-0");
        // Blocking work of a worker's task runs on the shared pool (this test's runtime's), and
        // what tokio runs there itself on the worker's own.
        let (tx, rx) = tokio::sync::oneshot::channel();
        workers.spawn(async move {
            let name = || std::thread::current().name().unwrap_or("").to_owned();
            let shared = spawn_blocking(name).await.unwrap();
            let own = tokio::task::spawn_blocking(name).await.unwrap();
            // A load runs on the shared runtime too.
            let loaded = spawn(async move { name() }).await.unwrap();
            let _ = tx.send((shared, own, loaded));
        });
        let (shared, own, loaded) = rx.await.unwrap();
        assert!(!shared.starts_with("zarrgate-worker-"), "{shared}");
        assert!(!loaded.starts_with("zarrgate-worker-"), "{loaded}");
        assert!(
            own.starts_with("zarrgate-worker-") && own.ends_with("-blocking"),
            "{own}"
        );
        // Off the workers, it is the current runtime's pool.
        let here = spawn_blocking(|| std::thread::current().name().unwrap_or("").to_owned());
        assert!(!here.await.unwrap().starts_with("zarrgate-worker-"));
        drop(release_rest);
    }

    /// Dropped, the workers stop, and with them the tasks still on them.
    #[tokio::test]
    async fn dropped_workers_end_their_tasks() {
        let mut workers = Workers::start(2, 2).await.unwrap();
        let (tx, mut rx) = tokio::sync::mpsc::channel::<()>(1);
        workers.spawn(async move {
            let _held = tx;
            std::future::pending::<()>().await;
        });
        drop(workers);
        let ended = tokio::time::timeout(Duration::from_secs(5), rx.recv()).await;
        assert_eq!(ended, Ok(None), "the task's sender is dropped with its worker");
    }
}
