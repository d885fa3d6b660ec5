//! Caches (moka), weighed in bytes: decoded chunks (and inner chunks of shards), shard
//! indexes, and parsed array metadata.
//!
//! Concurrent misses of one key load once (`try_get_with`); failed loads are not cached. A
//! missing chunk is cached as `None`, so sparse arrays cost no store reads when warm.
//! Staleness is bounded by a time-to-live (`cache.ttl_seconds`): entries are never served
//! longer than that after they were loaded, so changed data shows within that bound.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU8, AtomicU64, AtomicUsize, Ordering};
use std::time::Duration;

use moka::notification::RemovalCause;

use crate::buffers;
use crate::codec::sharding::ShardIndex;
use crate::config::CacheConfig;
use crate::dtype::elements::Elements;
use crate::store::{ObjectMeta, StoreError, StoreKey};
use crate::zarr::ArrayMeta;
use crate::zarr::hierarchy::{HierarchyError, Tree};

/// Identifies a stored object (or an inner chunk of a shard) across mounts.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct ChunkId {
    /// Mount name.
    pub mount: Arc<str>,
    /// Key in the mount.
    pub key: StoreKey,
    /// Inner chunk number within a shard.
    pub inner: Option<u64>,
    /// The [`ArrayMeta::fingerprint`] of the metadata it was decoded under.
    pub meta: u64,
    /// For inner chunks, a hash of the shard's size and version as its index was read: once a
    /// changed shard's index is read again, its old inner chunks are not used.
    pub object: u64,
}

/// Hit/miss/eviction counters of one cache.
#[derive(Debug, Default)]
pub struct CacheCounters {
    /// Lookups answered from the cache.
    pub hits: AtomicU64,
    /// Lookups that loaded.
    pub misses: AtomicU64,
    /// Entries evicted for capacity.
    pub evictions: Arc<AtomicU64>,
}

impl CacheCounters {
    /// Counts a lookup; returns the count of its kind, this one included.
    pub fn record(&self, loaded: bool) -> u64 {
        let c = if loaded { &self.misses } else { &self.hits };
        c.fetch_add(1, Ordering::Relaxed) + 1
    }
}

/// Looks `key` up in `cache`, loading it with the future `init` makes on a miss (concurrent
/// misses of one key load once), and counts the hit or miss. Failed loads are not cached.
///
/// A miss is awaited in a box of its own: a load's future (a store read and a decode) is
/// kilobytes, and as part of this future it made every lookup, hits too, that much larger to
/// move and to box (the slice handler's future was 8.7 KB).
pub async fn cached<K, V, E, F>(
    cache: &Cache<K, V>,
    counters: &CacheCounters,
    key: K,
    init: impl FnOnce() -> F,
) -> Result<V, Arc<E>>
where
    K: std::hash::Hash + Eq + Send + Sync + 'static,
    V: Clone + Send + Sync + 'static,
    E: Send + Sync + 'static,
    F: std::future::Future<Output = Result<V, E>>,
{
    if let Some(hit) = cache.get(&key).await {
        counters.record(false);
        return Ok(hit);
    }
    Box::pin(async move {
        let mut loaded = false;
        let got = cache
            .try_get_with(key, async {
                loaded = true;
                init().await
            })
            .await;
        let count = counters.record(loaded);
        // moka weighs new entries against its bound in batches (its write log holds up to 64):
        // until then they are resident but not counted, and 64 chunks of 8 MiB are 512 MiB past
        // the bound. The pending work is done every few loads instead.
        if loaded && count.is_multiple_of(SETTLE_EVERY) {
            cache.run_pending_tasks().await;
        }
        got
    })
    .await
}

/// Loads into a cache between two runs of its pending work ([`cached`]).
const SETTLE_EVERY: u64 = 8;

/// Loads that go on after the request that started them has gone (it timed out, or its client
/// hung up), so that what they load is cached for the next request rather than thrown away:
/// otherwise a chunk that takes longer to load than `limits.request_timeout_s` could never be
/// read, and a viewer that cancels requests as it pans would have each chunk decoded again. At
/// most `most` such loads run at once; a load left over that bound is stopped.
#[derive(Debug)]
pub struct DetachedLoads {
    running: AtomicUsize,
    stopped: AtomicU64,
    most: usize,
}

impl DetachedLoads {
    /// Room for `most` orphaned loads.
    pub const fn new(most: usize) -> Self {
        Self {
            running: AtomicUsize::new(0),
            stopped: AtomicU64::new(0),
            most,
        }
    }

    /// Orphaned loads running now.
    pub fn running(&self) -> usize {
        self.running.load(Ordering::Relaxed)
    }

    /// Loads stopped when their request went, for want of room.
    pub fn stopped(&self) -> u64 {
        self.stopped.load(Ordering::Relaxed)
    }
}

/// The orphaned loads of the server (chunks, shard indexes, renderings of consolidated
/// documents): a few, as decoding and rendering are CPU work no request is waiting for any more.
pub static DETACHED_LOADS: DetachedLoads = DetachedLoads::new(8);

const ATTACHED: u8 = 0;
const DETACHED: u8 = 1;
const FINISHED: u8 = 2;

/// Runs `work` in a task of its own and waits for it. If this future is dropped before the
/// task has finished, the task runs on as one of `orphans`' loads when there is room, and is
/// stopped when there is none.
pub fn detach<T: Send + 'static>(
    orphans: &'static DetachedLoads,
    work: impl std::future::Future<Output = T> + Send + 'static,
) -> Detached<T> {
    let state = Arc::new(AtomicU8::new(ATTACHED));
    let finish = Finish {
        state: state.clone(),
        orphans,
    };
    let handle = crate::workers::spawn(async move {
        let _finish = finish;
        work.await
    });
    Detached {
        handle,
        state,
        orphans,
        finished: false,
        working: None,
    }
}

/// Marks a detached task finished when it ends (completed, panicked or stopped), and gives back
/// its orphan's room if it was running as one.
struct Finish {
    state: Arc<AtomicU8>,
    orphans: &'static DetachedLoads,
}

impl Drop for Finish {
    fn drop(&mut self) {
        if self.state.swap(FINISHED, Ordering::AcqRel) == DETACHED {
            self.orphans.running.fetch_sub(1, Ordering::AcqRel);
        }
    }
}

/// [`detach`] for work that may only wait for another's (a load another request started,
/// which runs on by itself) before it does its own: `work` is given the [`Working`] mark to set
/// when it begins its own, and until then the task is stopped when dropped, taking no orphan's
/// room.
pub fn detach_working<T, F>(orphans: &'static DetachedLoads, work: impl FnOnce(Working) -> F) -> Detached<T>
where
    T: Send + 'static,
    F: std::future::Future<Output = T> + Send + 'static,
{
    let working = Working(Arc::new(AtomicBool::new(false)));
    let mut detached = detach(orphans, work(working.clone()));
    detached.working = Some(working.0);
    detached
}

/// The mark of [`detach_working`]'s work that it does work of its own.
#[derive(Debug, Clone)]
pub struct Working(Arc<AtomicBool>);

impl Working {
    /// The work is its own from now on: dropped, its task runs on as an orphan.
    pub fn begin(&self) {
        self.0.store(true, Ordering::Release);
    }
}

/// A task started by [`detach`], awaited.
#[derive(Debug)]
pub struct Detached<T> {
    handle: tokio::task::JoinHandle<T>,
    state: Arc<AtomicU8>,
    orphans: &'static DetachedLoads,
    finished: bool,
    /// Set once the task does work of its own ([`detach_working`]; `None`: it always does).
    working: Option<Arc<AtomicBool>>,
}

impl<T> std::future::Future for Detached<T> {
    type Output = Result<T, tokio::task::JoinError>;

    fn poll(mut self: std::pin::Pin<&mut Self>, cx: &mut std::task::Context<'_>) -> std::task::Poll<Self::Output> {
        let polled = std::pin::Pin::new(&mut self.handle).poll(cx);
        if polled.is_ready() {
            self.finished = true;
        }
        polled
    }
}

impl<T> Drop for Detached<T> {
    fn drop(&mut self) {
        if self.finished || self.state.load(Ordering::Acquire) == FINISHED {
            return;
        }
        if self.working.as_ref().is_some_and(|w| !w.load(Ordering::Acquire)) {
            self.handle.abort();
            return;
        }
        let orphans = self.orphans;
        let room = orphans
            .running
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, |n| {
                (n < orphans.most).then_some(n + 1)
            })
            .is_ok();
        if !room {
            self.handle.abort();
            orphans.stopped.fetch_add(1, Ordering::Relaxed);
            return;
        }
        let adopted = self
            .state
            .compare_exchange(ATTACHED, DETACHED, Ordering::AcqRel, Ordering::Acquire)
            .is_ok();
        if !adopted {
            // It finished meanwhile: nothing runs on.
            orphans.running.fetch_sub(1, Ordering::AcqRel);
        }
    }
}

/// A consolidated document rendered from a walked tree.
#[derive(Debug, Clone)]
pub struct Rendered {
    /// The tree (weakly: to tell whether it is still the one cached, without keeping an
    /// evicted tree alive).
    pub from: std::sync::Weak<Tree>,
    /// The group's own stored document it was rendered with (v3 `zarr.json`; `None` for a
    /// v2 `.zmetadata`, which is made of the walk alone).
    pub own: Option<Arc<serde_json::Map<String, serde_json::Value>>>,
    /// The document.
    pub bytes: bytes::Bytes,
}

/// A decoded chunk (`None`: the chunk does not exist and reads as fill).
pub type CachedChunk = Option<Arc<Decoded>>;

/// The elements of a decoded chunk (or inner chunk of a shard). When the last holder lets go
/// (the cache evicted it or never admitted it, and no response is still writing from it), a
/// fixed-size chunk's buffer goes back to [`buffers::DECODED`] for the next chunk decoded.
#[derive(Debug)]
pub struct Decoded(Elements);

impl Decoded {
    /// Wraps decoded elements.
    pub fn new(elements: Elements) -> Self {
        Self(elements)
    }

    /// The elements.
    pub fn elements(&self) -> &Elements {
        &self.0
    }
}

impl std::ops::Deref for Decoded {
    type Target = Elements;

    fn deref(&self) -> &Elements {
        self.elements()
    }
}

impl Drop for Decoded {
    fn drop(&mut self) {
        if let Elements::Fixed(bytes) = &mut self.0 {
            buffers::DECODED.give(std::mem::take(bytes));
        }
    }
}
/// The caches' map: moka's, hashing keys with foldhash (seeded per process) rather than std's
/// SipHash. A warm tile hashes its keys (mount, array path, chunk key: 60-100 bytes) about
/// ten times; with SipHash that was 4% of its user-space instructions.
pub type Cache<K, V> = moka::future::Cache<K, V, foldhash::fast::RandomState>;

/// A shard's index and the shard's length (`None`: the shard does not exist).
pub type CachedIndex = Option<Arc<(ShardIndex, ObjectMeta)>>;

/// All caches of a server.
#[derive(Debug)]
pub struct Caches {
    /// Decoded chunks and inner chunks.
    pub chunks: Cache<ChunkId, CachedChunk>,
    /// Shard indexes.
    pub shard_indexes: Cache<ChunkId, CachedIndex>,
    /// Array metadata by (mount, array path).
    pub metadata: Cache<(Arc<str>, StoreKey), Arc<ArrayMeta>>,
    /// Whole hierarchies below a node, for ZOM and consolidation: what a walk found (`None`:
    /// no node there), or why it stopped when it will stop there again (too large, a store
    /// that cannot list).
    pub hierarchies: Cache<WalkKey, Walked>,
    /// Permits to walk a hierarchy (whole, or to a ZOM request's depth), [`WALKS`] of them. A
    /// whole walk runs in a task of its own and ends even when its requests have gone (it is
    /// cached for the next one), so this, not the request limit, bounds the walks running and
    /// the trees being built.
    pub walks: tokio::sync::Semaphore,
    /// The walks under way or waiting for a permit, at most [`MAX_PENDING_WALKS`]; requests for
    /// the same hierarchy share one.
    pub walking: Walking,
    /// Documents rendered from a walked hierarchy (consolidated metadata synthesized for a
    /// group, a hierarchy's ZOM), with the walked tree each was rendered from.
    pub consolidated: Cache<ConsolidatedKey, Rendered>,
    /// The renderings of consolidated documents under way: requests for the same document
    /// wait for one rather than each rendering its own copy.
    pub rendering: Rendering,
    /// Counters of `chunks`.
    pub chunk_counters: CacheCounters,
    /// Counters of `shard_indexes`.
    pub index_counters: CacheCounters,
    /// Counters of `metadata`.
    pub metadata_counters: CacheCounters,
    /// Counters of `hierarchies`.
    pub hierarchy_counters: CacheCounters,
    /// Counters of `consolidated`.
    pub consolidated_counters: CacheCounters,
    /// Chunks (and inner chunks) decoded, cached or not.
    pub decodes: AtomicU64,
    /// Raw bytes of remote stores, shared by their mounts.
    pub raw: Arc<crate::store::cached::RawCache>,
}

/// What walking a whole hierarchy found: the tree (`None`: no node there), or why the walk
/// stopped.
pub type Walked = Result<Option<Arc<Tree>>, HierarchyError>;

/// Whether a walk's outcome is kept in [`Caches::hierarchies`]: what it found, and why it
/// stopped when that is a fact about the stored hierarchy (too large, a store that cannot
/// list, a document that does not parse or is too large to read), which a walk would find
/// again until the hierarchy changes. Failures of the store (I/O, timeouts) are not kept.
pub fn remembered(walked: &Walked) -> bool {
    match walked {
        Ok(_) => true,
        Err(HierarchyError::Store(e)) => matches!(e, StoreError::TooLarge { .. }),
        Err(HierarchyError::Busy(_)) => false,
        Err(_) => true,
    }
}

/// Whether an entry of about `bytes` fits in `cache` at all. One that does not is better not
/// inserted: moka admits it and lets it go only at its next maintenance, which may be long
/// in coming on a quiet cache, and its memory with it.
pub fn fits<K, V>(cache: &Cache<K, V>, bytes: usize) -> bool
where
    K: std::hash::Hash + Eq + Send + Sync + 'static,
    V: Clone + Send + Sync + 'static,
{
    cache.policy().max_capacity().is_none_or(|max| bytes as u64 <= max)
}

/// How many whole hierarchies are walked at once ([`Caches::walks`]).
pub const WALKS: usize = 4;

/// How many walks may be under way or waiting their permit at once ([`Caches::walking`]):
/// beyond, a request that needs another is refused (503) rather than queued without end.
pub const MAX_PENDING_WALKS: usize = 64;

/// A walk under way, shared by the requests that wait for it.
pub type PendingWalk = futures::future::Shared<futures::future::BoxFuture<'static, Walked>>;

/// The walks under way by (mount, path).
#[derive(Default)]
pub struct Walking(pub std::sync::Mutex<std::collections::HashMap<WalkKey, PendingWalk>>);

/// What a walk is of: a mount, a path in it, and the format its node is read as
/// ([`crate::zarr::hierarchy::walk`]).
pub type WalkKey = (Arc<str>, StoreKey, Option<u8>);

impl std::fmt::Debug for Walking {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let n = self.0.lock().map_or(0, |w| w.len());
        write!(f, "Walking({n})")
    }
}

/// A document rendered from a walked hierarchy: a v2 `.zmetadata`, a v3 `zarr.json` with
/// `consolidated_metadata`, or the hierarchy's Zarr Object Model.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Document {
    Zmetadata,
    ZarrJson,
    Zom,
}

/// A rendered document's key: (mount, node, which document).
pub type ConsolidatedKey = (Arc<str>, StoreKey, Document);

/// A place where the requests for one consolidated document take permits to render it; holds
/// the last one rendered while requests still wait there.
type RenderSlot = Arc<tokio::sync::Mutex<Option<Rendered>>>;

/// A document to render: its key, and the address of the walked tree it is rendered from
/// (requests holding different trees render different documents, and do not wait for each
/// other; a held tree's address is not reused).
pub type RenderKey = (ConsolidatedKey, usize);

/// The places of [`Caches::rendering`] by document, each while some request holds it.
#[derive(Debug, Default)]
pub struct Rendering(std::sync::Mutex<std::collections::HashMap<RenderKey, RenderSlot>>);

impl Rendering {
    fn slots(&self) -> std::sync::MutexGuard<'_, std::collections::HashMap<RenderKey, RenderSlot>> {
        self.0.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    /// The place for `key`, shared with the other requests for it until the last lets go.
    pub fn enter(&self, key: RenderKey) -> RenderPermit<'_> {
        let slot = self.slots().entry(key.clone()).or_default().clone();
        RenderPermit {
            rendering: self,
            key,
            slot: Some(slot),
        }
    }
}

/// A request's hold on a [`RenderSlot`]; the slot leaves the map with its last holder.
#[derive(Debug)]
pub struct RenderPermit<'a> {
    rendering: &'a Rendering,
    key: RenderKey,
    /// `None` only once let go.
    slot: Option<RenderSlot>,
}

impl RenderPermit<'_> {
    /// The slot (borrowed: its holders are counted by their permits).
    pub fn slot(&self) -> Option<&tokio::sync::Mutex<Option<Rendered>>> {
        self.slot.as_deref()
    }
}

impl Drop for RenderPermit<'_> {
    fn drop(&mut self) {
        // Permits take and let go of their slots under the map's lock only, so the count seen
        // here is every holder: this permit and the map when it is the last.
        let mut slots = self.rendering.slots();
        if let Some(slot) = self.slot.take() {
            if Arc::strong_count(&slot) == 2 && slots.get(&self.key).is_some_and(|s| Arc::ptr_eq(s, &slot)) {
                slots.remove(&self.key);
            }
            drop(slot);
        }
    }
}

/// Capacity of the cache of synthesized consolidated metadata documents.
const CONSOLIDATED_BYTES: u64 = 64 << 20;
/// Capacity of the metadata cache ([`ArrayMeta::heap_weight`]): ~25k arrays of 1 KB documents.
const METADATA_BYTES: u64 = 128 << 20;

/// What an entry costs besides the bytes its key and value hold: moka's entry (the key and
/// value handles, timestamps, its places in the policy's lists) and the key's own fields.
const ENTRY_BYTES: usize = 256;

/// The weight of an entry holding `bytes` (key and value) on the heap.
fn weight(bytes: usize) -> u32 {
    u32::try_from(bytes.saturating_add(ENTRY_BYTES)).unwrap_or(u32::MAX)
}

impl ChunkId {
    /// Bytes the id holds on the heap (its key; the mount name is shared).
    fn heap_size(&self) -> usize {
        self.key.as_str().len()
    }
}

fn evictions_listener<K, V>(counter: Arc<AtomicU64>) -> impl Fn(Arc<K>, V, RemovalCause) + Send + Sync + 'static {
    move |_, _, cause| {
        if cause == RemovalCause::Size {
            counter.fetch_add(1, Ordering::Relaxed);
        }
    }
}

impl Caches {
    /// Bytes of `cache.chunk_bytes` that neither decoded chunks in the cache nor spare buffers
    /// of [`buffers::DECODED`] take (as far as the cache has counted them), read without waiting.
    pub fn chunk_room(&self) -> u64 {
        let capacity = self.chunks.policy().max_capacity().unwrap_or(0);
        capacity.saturating_sub(self.chunks.weighted_size()) + buffers::DECODED.room() as u64
    }

    /// Applies the insertions and evictions every cache has pending, so that its entry count
    /// and weighted size are current.
    pub async fn settle(&self) {
        self.chunks.run_pending_tasks().await;
        self.shard_indexes.run_pending_tasks().await;
        self.metadata.run_pending_tasks().await;
        self.hierarchies.run_pending_tasks().await;
        self.consolidated.run_pending_tasks().await;
        self.raw.settle().await;
    }

    /// Caches sized by the configuration.
    pub fn new(config: &CacheConfig) -> Self {
        // Chunks leaving a full cache leave their buffers for the next ones decoded. An eighth of
        // the budget is theirs (it covers the batches moka evicts at once at the default size),
        // so that decoded chunks, cached or spare, stay within `chunk_bytes`.
        let spare = config.chunk_bytes / 8;
        buffers::DECODED.set_max_total(usize::try_from(spare).unwrap_or(usize::MAX));
        let ttl = Duration::from_secs(config.ttl_seconds.clamp(1, crate::config::MAX_TTL_SECONDS));
        let chunk_counters = CacheCounters::default();
        let index_counters = CacheCounters::default();
        let metadata_counters = CacheCounters::default();
        let hierarchy_counters = CacheCounters::default();
        let chunks = moka::future::Cache::builder()
            .max_capacity(config.chunk_bytes - spare)
            .weigher(|k: &ChunkId, v: &CachedChunk| weight(k.heap_size() + v.as_ref().map_or(0, |e| e.heap_size())))
            .time_to_live(ttl)
            .eviction_listener(evictions_listener(chunk_counters.evictions.clone()))
            .build_with_hasher(Default::default());
        let shard_indexes = moka::future::Cache::builder()
            .max_capacity(config.shard_index_bytes)
            .weigher(|k: &ChunkId, v: &CachedIndex| weight(k.heap_size() + v.as_ref().map_or(0, |i| i.0.heap_size())))
            .time_to_live(ttl)
            .eviction_listener(evictions_listener(index_counters.evictions.clone()))
            .build_with_hasher(Default::default());
        let metadata = moka::future::Cache::builder()
            .max_capacity(METADATA_BYTES)
            .weigher(|k: &(Arc<str>, StoreKey), v: &Arc<ArrayMeta>| weight(k.1.as_str().len() + v.heap_weight()))
            .time_to_live(ttl)
            .eviction_listener(evictions_listener(metadata_counters.evictions.clone()))
            .build_with_hasher(Default::default());
        let hierarchies = moka::future::Cache::builder()
            .max_capacity(config.hierarchy_bytes)
            .weigher(|k: &WalkKey, v: &Walked| match v {
                Ok(tree) => weight(k.1.as_str().len() + tree.as_ref().map_or(0, |t| t.heap_weight())),
                Err(e) => weight(k.1.as_str().len() + e.to_string().len()),
            })
            .time_to_live(ttl)
            .eviction_listener(evictions_listener(hierarchy_counters.evictions.clone()))
            .build_with_hasher(Default::default());
        let consolidated_counters = CacheCounters::default();
        let consolidated = moka::future::Cache::builder()
            .max_capacity(CONSOLIDATED_BYTES)
            .weigher(|k: &ConsolidatedKey, v: &Rendered| weight(k.1.as_str().len() + v.bytes.len()))
            .time_to_live(ttl)
            .eviction_listener(evictions_listener(consolidated_counters.evictions.clone()))
            .build_with_hasher(Default::default());
        Self {
            chunks,
            hierarchies,
            consolidated,
            consolidated_counters,
            shard_indexes,
            metadata,
            chunk_counters,
            index_counters,
            metadata_counters,
            hierarchy_counters,
            walks: tokio::sync::Semaphore::new(WALKS),
            walking: Walking::default(),
            rendering: Rendering::default(),
            decodes: AtomicU64::new(0),
            raw: Arc::new(crate::store::cached::RawCache::new(config)),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Requests for one document share its slot while any holds it; the last to let go takes
    /// it out of the map, and the next request finds a fresh one.
    #[test]
    fn render_slots_leave_with_their_last_holder() {
        let rendering = Rendering::default();
        let key: RenderKey = ((Arc::from("m"), StoreKey::root(), Document::Zmetadata), 1);
        let other: RenderKey = ((Arc::from("m"), StoreKey::root(), Document::Zmetadata), 2);
        let slots = |r: &Rendering| r.slots().len();
        let a = rendering.enter(key.clone());
        let b = rendering.enter(key.clone());
        let c = rendering.enter(other);
        let same = |x: &RenderPermit, y: &RenderPermit| std::ptr::eq(x.slot().unwrap(), y.slot().unwrap());
        assert!(same(&a, &b));
        assert!(!same(&a, &c));
        assert_eq!(slots(&rendering), 2);
        *a.slot().unwrap().try_lock().unwrap() = Some(Rendered {
            from: std::sync::Weak::new(),
            own: None,
            bytes: bytes::Bytes::from_static(b"{}"),
        });
        assert!(b.slot().unwrap().try_lock().unwrap().is_some());
        drop(a);
        assert_eq!(slots(&rendering), 2);
        drop(b);
        drop(c);
        assert_eq!(slots(&rendering), 0);
        let d = rendering.enter(key);
        assert!(d.slot().unwrap().try_lock().unwrap().is_none(), "a fresh slot");
    }

    /// Waits (up to a second) for the orphaned loads of `orphans` to end.
    async fn ended(orphans: &DetachedLoads) {
        for _ in 0..100 {
            if orphans.running() == 0 {
                break;
            }
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    }

    /// A detached load whose waiter is dropped runs on while there is room for orphans, and is
    /// stopped when there is none; one awaited to its end is never an orphan.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn detached_loads_run_on_within_their_bound() {
        static ONE: DetachedLoads = DetachedLoads::new(1);
        let done = Arc::new(AtomicUsize::new(0));
        // Each piece of work waits for a permit (permits added before it waits are kept).
        let release = Arc::new(tokio::sync::Semaphore::new(0));
        let work = |n: usize| {
            let (done, release) = (done.clone(), release.clone());
            async move {
                if let Ok(permit) = release.acquire().await {
                    permit.forget();
                }
                done.fetch_add(n, Ordering::SeqCst);
                n
            }
        };
        // Awaited to the end: its value, and no orphan.
        let waited = detach(&ONE, work(100));
        release.add_permits(1);
        assert_eq!(waited.await.unwrap(), 100);
        assert_eq!((done.load(Ordering::SeqCst), ONE.running()), (100, 0));
        // Two dropped while waiting: the first runs on, the second is stopped.
        let (a, b) = (detach(&ONE, work(1)), detach(&ONE, work(10)));
        tokio::time::sleep(Duration::from_millis(50)).await;
        drop(a);
        drop(b);
        assert_eq!((ONE.running(), ONE.stopped()), (1, 1));
        tokio::time::sleep(Duration::from_millis(50)).await;
        release.add_permits(1);
        ended(&ONE).await;
        assert_eq!((done.load(Ordering::SeqCst), ONE.running()), (101, 0));
        // One that only waits is stopped without taking room or counting as stopped; once it
        // works, it runs on.
        drop(detach_working(&ONE, |_| work(1000)));
        assert_eq!((ONE.running(), ONE.stopped()), (0, 1));
        let mut mark = None;
        let begun = detach_working(&ONE, |w| {
            mark = Some(w);
            work(10_000)
        });
        mark.expect("the work is given its mark").begin();
        drop(begun);
        assert_eq!(ONE.running(), 1);
        tokio::time::sleep(Duration::from_millis(50)).await;
        release.add_permits(1);
        ended(&ONE).await;
        assert_eq!((done.load(Ordering::SeqCst), ONE.running()), (10_101, 0));
        // Room again: the next one dropped runs on too.
        drop(detach(&ONE, async {
            tokio::time::sleep(Duration::from_millis(20)).await
        }));
        assert_eq!(ONE.running(), 1);
        ended(&ONE).await;
        assert_eq!(ONE.running(), 0);
    }

    /// Entries loaded into a cache too small for them are let go within a few loads, not after
    /// moka's batch of 64: of 64 loads of entries each near the whole bound, at most
    /// SETTLE_EVERY (and the last) are still held (all 64 before).
    #[tokio::test]
    async fn loads_past_the_bound_are_let_go_within_a_few_loads() {
        let cache: Cache<u32, Arc<Vec<u8>>> = moka::future::Cache::builder()
            .max_capacity(1000)
            .weigher(|_, v: &Arc<Vec<u8>>| v.len() as u32)
            .build_with_hasher(Default::default());
        let counters = CacheCounters::default();
        let mut loaded = Vec::new();
        for key in 0..64u32 {
            let value = cached(&cache, &counters, key, || async {
                Ok::<_, ()>(Arc::new(vec![0u8; 900]))
            })
            .await
            .unwrap();
            loaded.push(Arc::downgrade(&value));
        }
        let alive = loaded.iter().filter(|w| w.strong_count() > 0).count();
        assert!(alive <= 9, "{alive} of 64 entries still held");
    }

    /// Entries for chunks that do not exist hold no bytes of data, but each costs moka an
    /// entry and its key: a cache of them stays within its bytes by that count.
    #[tokio::test]
    async fn missing_chunks_weigh_what_their_entries_cost() {
        let config = CacheConfig {
            chunk_bytes: 1 << 20,
            ..CacheConfig::default()
        };
        let caches = Caches::new(&config);
        let mount: Arc<str> = Arc::from("m");
        for i in 0..20_000u64 {
            let id = ChunkId {
                mount: mount.clone(),
                key: StoreKey::new(&format!("array/c/{i}/0")).unwrap(),
                inner: None,
                meta: 1,
                object: 0,
            };
            caches.chunks.insert(id, None).await;
        }
        caches.settle().await;
        let capacity = config.chunk_bytes - config.chunk_bytes / 8;
        assert!(caches.chunks.weighted_size() <= capacity);
        // 256 bytes and a key of ~12 each: no more than ~3,400 of them in 896 KiB.
        let most = capacity / (ENTRY_BYTES as u64 + 11);
        assert!(
            caches.chunks.entry_count() <= most,
            "{} entries",
            caches.chunks.entry_count()
        );
        assert!(
            caches.chunks.entry_count() > most / 4,
            "{} entries",
            caches.chunks.entry_count()
        );
    }
}
