//! A cache of raw bytes in front of a remote store (buckets, HTTP origins, archives in them),
//! as nginx's `proxy_cache` with its `slice` module keeps one: objects up to
//! `cache.raw_object_max` whole, larger ones (shards, zip archives) in aligned blocks of
//! `cache.raw_block_bytes`, so that range reads of shards are served from memory. Raw-key
//! reads and slices share it: both read through this backend.
//!
//! - Freshness: within `cache.ttl_seconds` an object is answered from the cache; after it, it
//!   is revalidated with a conditional request (`If-None-Match`), which costs a 304 and no
//!   body when it has not changed. A mount marked `immutable` is never revalidated.
//! - Versions never mix: blocks are kept by the object's version (its ETag), so a body is
//!   always of the version its metadata names.
//! - One upstream request per miss: concurrent misses of one object or block wait for one
//!   fetch (nginx's `proxy_cache_lock`), which runs as a task of its own, so that a client that
//!   leaves does not cancel what others wait for, and what it fetched is still cached.
//! - Stale on error (RFC 5861 `stale-if-error`): while the upstream fails, an object is still
//!   served for the mount's `stale_if_error` seconds past its freshness.
//! - Missing objects are remembered for the TTL too: clients probe for `.zarray`, `zarr.json`
//!   and chunks that are not there.
//!
//! Spec of the behaviour: RFC 9111 (HTTP caching), RFC 5861.

use std::collections::{BTreeMap, HashMap};
use std::ops::Range;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use tokio::time::Instant;

use async_trait::async_trait;
use bytes::Bytes;
use futures::future::{BoxFuture, FutureExt, Shared};
use futures::{StreamExt, TryStreamExt};

use super::{Backend, ByteRange, GetObject, Listing, ObjectMeta, Revalidated, Store, StoreError, StoreKey};

/// How an answer was found in the raw cache, as nginx's `$upstream_cache_status` says it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub enum CacheStatus {
    /// From the cache, fresh.
    Hit,
    /// From a fetch another request had begun.
    Coalesced,
    /// From the cache, after the upstream said it had not changed (304).
    Revalidated,
    /// From the cache, past its freshness, because the upstream failed.
    Stale,
    /// Fetched from the upstream.
    Miss,
}

impl CacheStatus {
    /// The word the access log writes.
    pub fn as_str(self) -> &'static str {
        match self {
            CacheStatus::Hit => "HIT",
            CacheStatus::Coalesced => "COALESCED",
            CacheStatus::Revalidated => "REVALIDATED",
            CacheStatus::Stale => "STALE",
            CacheStatus::Miss => "MISS",
        }
    }
}

/// Where a request notes how the raw cache answered it: the least cached of its reads, those
/// made while its body streams included (the access log reads it when the body is over).
#[derive(Debug, Clone, Default)]
pub struct CacheStatusNote(Arc<std::sync::atomic::AtomicU8>);

impl CacheStatusNote {
    /// The least cached of the reads noted so far, if any.
    pub fn get(&self) -> Option<CacheStatus> {
        const ALL: [CacheStatus; 5] = [
            CacheStatus::Hit,
            CacheStatus::Coalesced,
            CacheStatus::Revalidated,
            CacheStatus::Stale,
            CacheStatus::Miss,
        ];
        ALL.get(usize::from(self.0.load(Ordering::Relaxed)).checked_sub(1)?)
            .copied()
    }

    fn note(&self, status: CacheStatus) {
        self.0.fetch_max(status as u8 + 1, Ordering::Relaxed);
    }
}

tokio::task_local! {
    /// The note of the request being served.
    static STATUS: CacheStatusNote;
}

/// Runs `work` noting how the raw cache answers what it reads, and what the bodies it makes
/// read later.
pub async fn noting_status<F: std::future::Future>(work: F) -> (F::Output, CacheStatusNote) {
    let noted = CacheStatusNote::default();
    (STATUS.scope(noted.clone(), work).await, noted)
}

fn note(status: CacheStatus) {
    let _ = STATUS.try_with(|noted| noted.note(status));
}

/// Counters of the raw cache.
#[derive(Debug, Default)]
pub struct RawCounters {
    /// Reads answered from the cache, fresh.
    pub hits: AtomicU64,
    /// Reads that fetched from the upstream.
    pub misses: AtomicU64,
    /// Revalidations the upstream answered "not modified".
    pub revalidated: AtomicU64,
    /// Reads that waited for a fetch another read had begun.
    pub coalesced: AtomicU64,
    /// Reads answered past freshness because the upstream failed.
    pub stale: AtomicU64,
    /// Entries evicted for capacity.
    pub evictions: Arc<AtomicU64>,
}

/// The requests one mount sends its upstream, by kind, and the bytes they brought.
#[derive(Debug, Default)]
pub struct UpstreamCounters {
    /// Whole-object GETs.
    pub gets: AtomicU64,
    /// Ranged GETs.
    pub ranges: AtomicU64,
    /// HEADs.
    pub heads: AtomicU64,
    /// Listings.
    pub lists: AtomicU64,
    /// Body bytes received.
    pub bytes: AtomicU64,
}

impl UpstreamCounters {
    /// Counts a GET: ranged or whole.
    fn count_get(&self, range: Option<ByteRange>) {
        let kind = if range.is_some() { &self.ranges } else { &self.gets };
        kind.fetch_add(1, Ordering::Relaxed);
    }
}

/// What a cache entry holds of an object.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
enum Part {
    /// Its metadata (or that it is missing); for small objects, the whole object.
    Object,
    /// Block `index` of the object of this version.
    Block(Arc<str>, u64),
    /// The revalidation under way of the object (a fill, never an entry).
    Revalidation,
}

#[derive(Debug, Clone, PartialEq, Eq, Hash)]
struct EntryKey {
    mount: Arc<str>,
    key: StoreKey,
    part: Part,
}

/// A cached object (its metadata, and all its bytes when `whole`) or block.
#[derive(Debug)]
struct Entry {
    /// `None`: the object is missing.
    meta: Option<ObjectMeta>,
    bytes: Bytes,
    /// Whether `bytes` is the whole object.
    whole: bool,
    /// When the upstream last confirmed it, in milliseconds of [`RawCache::epoch`].
    validated_ms: AtomicU64,
}

type Fill = Shared<BoxFuture<'static, Result<Arc<Entry>, StoreError>>>;

/// The raw-bytes cache of a server, shared by its remote mounts (one memory budget).
#[derive(Debug)]
pub struct RawCache {
    entries: moka::future::Cache<EntryKey, Arc<Entry>>,
    /// Fetches under way, by what they fill: later misses wait for them.
    fills: Mutex<HashMap<EntryKey, Fill>>,
    enabled: bool,
    object_max: u64,
    block: u64,
    ttl: Duration,
    epoch: Instant,
    /// The cache's counters.
    pub counters: RawCounters,
    /// MiB that fills under way may hold at once ([`FILL_BUDGET_MIB`]): fills go on after their
    /// readers leave, so the requests under way do not bound them.
    fill_bytes: tokio::sync::Semaphore,
    /// MiB of one fill, at most: its probe or block.
    fill_mib: u32,
    upstream: Mutex<BTreeMap<Arc<str>, Arc<UpstreamCounters>>>,
}

/// MiB of upstream bytes all fills under way may hold at once.
pub const FILL_BUDGET_MIB: u32 = 256;

/// How a mount's cached objects stay fresh.
#[derive(Debug, Clone, Copy, Default)]
pub struct Freshness {
    /// Never revalidated.
    pub immutable: bool,
    /// How long past its freshness an object is served while the upstream fails.
    pub stale_if_error: Duration,
}

impl RawCache {
    /// A cache of `config.raw_bytes` (none at 0: every read goes upstream, counted).
    pub fn new(config: &crate::config::CacheConfig) -> Self {
        let counters = RawCounters::default();
        let evictions = counters.evictions.clone();
        let entries = moka::future::Cache::builder()
            .max_capacity(config.raw_bytes.max(1))
            .weigher(|key: &EntryKey, entry: &Arc<Entry>| {
                let bytes = entry.bytes.len() + key.key.as_str().len() + 256;
                u32::try_from(bytes).unwrap_or(u32::MAX)
            })
            .eviction_listener(move |_, _, cause| {
                if cause == moka::notification::RemovalCause::Size {
                    evictions.fetch_add(1, Ordering::Relaxed);
                }
            })
            .build();
        Self {
            entries,
            fills: Mutex::new(HashMap::new()),
            enabled: config.raw_bytes > 0,
            object_max: config.raw_object_max,
            block: config.raw_block_bytes.max(1),
            ttl: Duration::from_secs(config.ttl_seconds),
            epoch: Instant::now(),
            counters,
            fill_bytes: tokio::sync::Semaphore::new(FILL_BUDGET_MIB as usize),
            fill_mib: u32::try_from(
                config
                    .raw_object_max
                    .max(config.raw_block_bytes)
                    .div_ceil(config.raw_block_bytes.max(1))
                    .saturating_mul(config.raw_block_bytes.max(1))
                    .div_ceil(1 << 20),
            )
            .unwrap_or(FILL_BUDGET_MIB)
            .clamp(1, FILL_BUDGET_MIB),
            upstream: Mutex::new(BTreeMap::new()),
        }
    }

    /// Bytes held now (as moka weighs them; it applies insertions in batches).
    pub fn weighted_size(&self) -> u64 {
        self.entries.weighted_size()
    }

    /// Entries held now.
    pub fn entry_count(&self) -> u64 {
        self.entries.entry_count()
    }

    /// Applies moka's pending insertions and evictions (for exact figures in metrics).
    pub async fn settle(&self) {
        self.entries.run_pending_tasks().await;
    }

    /// The upstream counters of every mount, by name.
    pub fn upstream(&self) -> Vec<(Arc<str>, Arc<UpstreamCounters>)> {
        let counters = self.upstream.lock().unwrap_or_else(PoisonError::into_inner);
        counters.iter().map(|(m, c)| (m.clone(), c.clone())).collect()
    }

    /// `inner`, the store of mount `mount`, with reads through this cache, its entries keyed
    /// by `cache_id` (the mount's name, or a name of its own for a mount a reload opened).
    pub fn wrap(self: &Arc<Self>, inner: Store, (mount, cache_id): (&str, Arc<str>), freshness: Freshness) -> Store {
        let mount: Arc<str> = mount.into();
        let upstream = self
            .upstream
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .entry(mount.clone())
            .or_default()
            .clone();
        Store::new(CachedStore(Arc::new(CachedBackend {
            inner,
            cache: self.clone(),
            mount,
            cache_id,
            freshness,
            upstream,
        })))
    }

    fn now_ms(&self) -> u64 {
        u64::try_from(self.epoch.elapsed().as_millis()).unwrap_or(u64::MAX)
    }

    fn entry(&self, meta: Option<ObjectMeta>, bytes: Bytes, whole: bool) -> Arc<Entry> {
        Arc::new(Entry {
            meta,
            bytes,
            whole,
            validated_ms: AtomicU64::new(self.now_ms()),
        })
    }

    /// How long ago the upstream last confirmed `entry`.
    fn age(&self, entry: &Entry) -> Duration {
        Duration::from_millis(self.now_ms().saturating_sub(entry.validated_ms.load(Ordering::Relaxed)))
    }

    /// The bytes a first read of an object asks for: enough for a whole object of
    /// `raw_object_max`, in whole blocks.
    fn probe_len(&self) -> u64 {
        self.object_max.max(self.block).div_ceil(self.block) * self.block
    }

    /// The result of the fetch `key` names under way, or of `fetch`, started now as a task of
    /// its own that caches what it brings as `into` (also when every reader waiting for it has
    /// gone), and whether another read had begun it.
    async fn fill(
        self: &Arc<Self>,
        key: EntryKey,
        into: EntryKey,
        fetch: impl FnOnce() -> BoxFuture<'static, Result<Arc<Entry>, StoreError>>,
    ) -> (Result<Arc<Entry>, StoreError>, bool) {
        let (fill, joined) = {
            let mut fills = self.fills.lock().unwrap_or_else(PoisonError::into_inner);
            match fills.get(&key) {
                Some(fill) => (fill.clone(), true),
                None => {
                    let (cache, done, work) = (self.clone(), key.clone(), fetch());
                    let task = tokio::spawn(async move {
                        /// Takes the fill out of those under way however its task ends (a
                        /// panic, a runtime shutting down): later misses then fetch anew.
                        struct Done(Arc<RawCache>, EntryKey);
                        impl Drop for Done {
                            fn drop(&mut self) {
                                self.0
                                    .fills
                                    .lock()
                                    .unwrap_or_else(PoisonError::into_inner)
                                    .remove(&self.1);
                            }
                        }
                        let done = Done(cache, done);
                        let _permit = done.0.fill_bytes.acquire_many(done.0.fill_mib).await;
                        let fetched = work.await;
                        if let Ok(entry) = &fetched {
                            done.0.entries.insert(into, entry.clone()).await;
                        }
                        fetched
                    });
                    let fill = async move {
                        task.await
                            .unwrap_or_else(|e| Err(StoreError::Io(format!("a cache fill failed: {e}"))))
                    }
                    .boxed()
                    .shared();
                    fills.insert(key, fill.clone());
                    (fill, false)
                }
            }
        };
        (fill.await, joined)
    }
}

/// A remote store read through a [`RawCache`]: the backend a mount's [`Store`] holds, sharing
/// its parts with the fills it starts.
#[derive(Debug)]
struct CachedStore(Arc<CachedBackend>);

/// What a [`CachedStore`] reads with.
#[derive(Debug)]
struct CachedBackend {
    inner: Store,
    cache: Arc<RawCache>,
    mount: Arc<str>,
    cache_id: Arc<str>,
    freshness: Freshness,
    upstream: Arc<UpstreamCounters>,
}

/// A version tag that names one state of an object: its ETag, or its size and time.
fn version_of(meta: &ObjectMeta) -> Arc<str> {
    match &meta.version {
        Some(v) => v.as_str().into(),
        None => {
            let nanos = meta
                .last_modified
                .and_then(|t| t.duration_since(std::time::UNIX_EPOCH).ok())
                .map_or(0, |d| d.as_nanos());
            format!("{}-{nanos}", meta.size).into()
        }
    }
}

/// Whether an upstream failure lets a stale object be served (RFC 5861: errors of the
/// upstream, not its refusals).
fn upstream_failed(e: &StoreError) -> bool {
    matches!(e, StoreError::Timeout(_) | StoreError::Io(_))
}

impl CachedBackend {
    fn key(&self, key: &StoreKey, part: Part) -> EntryKey {
        EntryKey {
            mount: self.cache_id.clone(),
            key: key.clone(),
            part,
        }
    }

    /// Reads `range` of `key` from the upstream into memory, counted.
    async fn fetch(
        &self,
        key: &StoreKey,
        range: Option<ByteRange>,
        version: Option<&str>,
    ) -> Result<Revalidated<Option<(ObjectMeta, Range<u64>, Bytes)>>, StoreError> {
        let (inner, upstream) = (&self.inner, &self.upstream);
        upstream.count_get(range);
        let got = match version {
            Some(v) => inner.get_unless(key, range, v).await?,
            None => Revalidated::Changed(inner.get(key, range).await?),
        };
        let Revalidated::Changed(found) = got else {
            return Ok(Revalidated::Unchanged);
        };
        let Some(object) = found else {
            return Ok(Revalidated::Changed(None));
        };
        let (meta, range) = (object.meta.clone(), object.range.clone());
        let bytes = object.bytes().await?;
        upstream.bytes.fetch_add(bytes.len() as u64, Ordering::Relaxed);
        if bytes.len() as u64 != range.end - range.start {
            return Err(StoreError::Io(format!("'{key}' ended before its length")));
        }
        Ok(Revalidated::Changed(Some((meta, range, bytes))))
    }

    /// The object entry of `key` made from a first read of its start (`bytes` of `range`): the
    /// whole object when it is all there and small, else its metadata, with the whole blocks
    /// the read brought cached beside it.
    async fn object_from(&self, key: &StoreKey, meta: ObjectMeta, range: Range<u64>, bytes: Bytes) -> Arc<Entry> {
        let cache = &self.cache;
        if range == (0..meta.size) && meta.size <= cache.object_max {
            return cache.entry(Some(meta), bytes, true);
        }
        let version = version_of(&meta);
        let mut at = range.start;
        while at < range.end && at.is_multiple_of(cache.block) {
            let end = (at + cache.block).min(meta.size);
            if end > range.end {
                break;
            }
            // A copy: a slice would keep the whole probe alive as long as any one block.
            let piece = Bytes::copy_from_slice(&bytes[(at - range.start) as usize..(end - range.start) as usize]);
            let block = self.key(key, Part::Block(version.clone(), at / cache.block));
            cache
                .entries
                .insert(block, cache.entry(Some(meta.clone()), piece, false))
                .await;
            at = end;
        }
        cache.entry(Some(meta), Bytes::new(), false)
    }

    /// The object entry of `key`: cached and fresh, revalidated, or read now (its start, as
    /// much as a whole small object). With `head_only`, a first read is a HEAD.
    async fn object(self: &Arc<Self>, key: &StoreKey, head_only: bool) -> Result<Arc<Entry>, StoreError> {
        let cache = &self.cache;
        let entry_key = self.key(key, Part::Object);
        if let Some(entry) = cache.entries.get(&entry_key).await {
            // A missing key of an immutable mount may still be written: it keeps the TTL.
            if (self.freshness.immutable && entry.meta.is_some()) || cache.age(&entry) < cache.ttl {
                cache.counters.hits.fetch_add(1, Ordering::Relaxed);
                note(CacheStatus::Hit);
                return Ok(entry);
            }
            return self.revalidate(key, entry).await;
        }
        let this = self.clone();
        let key_owned = key.clone();
        let (filled, joined) = cache
            .fill(entry_key.clone(), entry_key, move || {
                async move {
                    if head_only {
                        this.upstream.heads.fetch_add(1, Ordering::Relaxed);
                        let meta = this.inner.head(&key_owned).await?;
                        return Ok(this.cache.entry(meta, Bytes::new(), false));
                    }
                    let probe = ByteRange::Bounded(0, this.cache.probe_len());
                    match this.fetch(&key_owned, Some(probe), None).await {
                        Ok(Revalidated::Changed(Some((meta, range, bytes)))) => {
                            Ok(this.object_from(&key_owned, meta, range, bytes).await)
                        }
                        Ok(Revalidated::Changed(None)) => Ok(this.cache.entry(None, Bytes::new(), false)),
                        // An empty object has no range to read.
                        Err(StoreError::Range { size: 0, .. }) => match this.fetch(&key_owned, None, None).await? {
                            Revalidated::Changed(Some((meta, range, bytes))) => {
                                Ok(this.object_from(&key_owned, meta, range, bytes).await)
                            }
                            _ => Ok(this.cache.entry(None, Bytes::new(), false)),
                        },
                        Ok(Revalidated::Unchanged) => {
                            Err(StoreError::Io("an unconditional read was answered 304".into()))
                        }
                        Err(e) => Err(e),
                    }
                }
                .boxed()
            })
            .await;
        self.counted(joined);
        filled
    }

    fn counted(&self, joined: bool) {
        let counters = &self.cache.counters;
        if joined {
            counters.coalesced.fetch_add(1, Ordering::Relaxed);
            note(CacheStatus::Coalesced);
        } else {
            counters.misses.fetch_add(1, Ordering::Relaxed);
            note(CacheStatus::Miss);
        }
    }

    /// `stale`, the object entry of `key` past its freshness, confirmed by a conditional
    /// request (or replaced by what it brings), or served as it is while the upstream fails
    /// within `stale_if_error`.
    async fn revalidate(self: &Arc<Self>, key: &StoreKey, stale: Arc<Entry>) -> Result<Arc<Entry>, StoreError> {
        let cache = &self.cache;
        let this = self.clone();
        let (key_owned, old) = (key.clone(), stale.clone());
        let (fill_key, into) = (self.key(key, Part::Revalidation), self.key(key, Part::Object));
        let (revalidated, joined) = cache
            .fill(fill_key, into, move || {
                async move {
                    let version = old.meta.as_ref().and_then(|m| m.version.clone());
                    let unchanged = |this: &CachedBackend| {
                        this.cache.counters.revalidated.fetch_add(1, Ordering::Relaxed);
                        old.validated_ms.store(this.cache.now_ms(), Ordering::Relaxed);
                        old.clone()
                    };
                    let fresh = if old.whole {
                        let probe = Some(ByteRange::Bounded(0, this.cache.probe_len()));
                        match this.fetch(&key_owned, probe, version.as_deref()).await {
                            Ok(Revalidated::Unchanged) => return Ok(unchanged(&this)),
                            Ok(Revalidated::Changed(Some((meta, range, bytes)))) => {
                                if old
                                    .meta
                                    .as_ref()
                                    .is_some_and(|m| m.same_object(&meta) && m.version.is_some())
                                {
                                    return Ok(unchanged(&this));
                                }
                                this.object_from(&key_owned, meta, range, bytes).await
                            }
                            Ok(Revalidated::Changed(None)) => this.cache.entry(None, Bytes::new(), false),
                            // Still empty (an empty object has no range): as it was.
                            Err(StoreError::Range { size: 0, .. })
                                if old.meta.as_ref().is_some_and(|m| m.size == 0) =>
                            {
                                return Ok(unchanged(&this));
                            }
                            Err(StoreError::Range { size: 0, .. }) => this.cache.entry(
                                Some(ObjectMeta {
                                    size: 0,
                                    last_modified: None,
                                    version: None,
                                }),
                                Bytes::new(),
                                true,
                            ),
                            Err(e) => return Err(e),
                        }
                    } else {
                        this.upstream.heads.fetch_add(1, Ordering::Relaxed);
                        let head = match &version {
                            Some(v) => this.inner.head_unless(&key_owned, v).await?,
                            None => Revalidated::Changed(this.inner.head(&key_owned).await?),
                        };
                        match head {
                            Revalidated::Unchanged => return Ok(unchanged(&this)),
                            Revalidated::Changed(meta) => {
                                let same = match (&old.meta, &meta) {
                                    (Some(was), Some(now)) => was.same_object(now),
                                    (None, None) => true,
                                    _ => false,
                                };
                                if same {
                                    return Ok(unchanged(&this));
                                }
                                this.cache.entry(meta, Bytes::new(), false)
                            }
                        }
                    };
                    Ok(fresh)
                }
                .boxed()
            })
            .await;
        match revalidated {
            Ok(entry) => {
                if Arc::ptr_eq(&entry, &stale) {
                    note(if joined {
                        CacheStatus::Coalesced
                    } else {
                        CacheStatus::Revalidated
                    });
                } else {
                    self.counted(joined);
                }
                Ok(entry)
            }
            Err(e)
                if upstream_failed(&e)
                    && cache.age(&stale) < cache.ttl.saturating_add(self.freshness.stale_if_error) =>
            {
                tracing::warn!(mount = %self.mount, %key, error = %e, "upstream failed: serving a stale object");
                cache.counters.stale.fetch_add(1, Ordering::Relaxed);
                note(CacheStatus::Stale);
                Ok(stale)
            }
            Err(e) => Err(e),
        }
    }

    /// Block `index` of the object `meta` of `key`.
    async fn block(self: &Arc<Self>, key: &StoreKey, meta: &ObjectMeta, index: u64) -> Result<Bytes, StoreError> {
        let cache = &self.cache;
        let entry_key = self.key(key, Part::Block(version_of(meta), index));
        if let Some(entry) = cache.entries.get(&entry_key).await {
            cache.counters.hits.fetch_add(1, Ordering::Relaxed);
            note(CacheStatus::Hit);
            return Ok(entry.bytes.clone());
        }
        let (this, key_owned, expected) = (self.clone(), key.clone(), meta.clone());
        let (filled, joined) = cache
            .fill(entry_key.clone(), entry_key, move || {
                async move {
                    let start = index * this.cache.block;
                    let end = (start + this.cache.block).min(expected.size);
                    let range = Some(ByteRange::Bounded(start, end));
                    match this.fetch(&key_owned, range, None).await? {
                        Revalidated::Changed(Some((meta, got, bytes)))
                            if meta.same_object(&expected) && got == (start..end) =>
                        {
                            Ok(this.cache.entry(Some(meta), bytes, false))
                        }
                        _ => {
                            // Replaced (or gone) since its metadata was read: that is stale now.
                            this.cache.entries.invalidate(&this.key(&key_owned, Part::Object)).await;
                            Err(StoreError::Io(format!("'{key_owned}' changed while it was read")))
                        }
                    }
                }
                .boxed()
            })
            .await;
        self.counted(joined);
        Ok(filled?.bytes.clone())
    }

    /// The bytes `range` of the object of `entry`: from its whole bytes, or from its blocks,
    /// fetched in order as the body is read, two ahead.
    fn body(self: &Arc<Self>, key: &StoreKey, entry: &Arc<Entry>, meta: &ObjectMeta, range: Range<u64>) -> GetObject {
        if range.is_empty() {
            return GetObject {
                meta: meta.clone(),
                range,
                body: futures::stream::empty().boxed(),
            };
        }
        if entry.whole {
            let bytes = entry.bytes.slice(range.start as usize..range.end as usize);
            return GetObject {
                meta: meta.clone(),
                range,
                body: super::one_piece(bytes),
            };
        }
        let block = self.cache.block;
        let (first, last) = (range.start / block, (range.end.max(1) - 1) / block);
        // The blocks are read while the body streams, outside the request's handler: they are
        // noted where the request's other reads are.
        let noted = STATUS.try_with(Clone::clone).unwrap_or_default();
        let this = self.clone();
        let (key, object, wanted) = (key.clone(), meta.clone(), range.clone());
        let pieces = futures::stream::iter(first..=last)
            .map(move |index| {
                let (this, key, object, noted) = (this.clone(), key.clone(), object.clone(), noted.clone());
                async move {
                    let bytes = STATUS.scope(noted, this.block(&key, &object, index)).await?;
                    let at = index * block;
                    let from = wanted.start.saturating_sub(at) as usize;
                    let to = ((wanted.end - at) as usize).min(bytes.len());
                    Ok::<_, StoreError>(bytes.slice(from.min(to)..to))
                }
            })
            .buffered(3)
            .try_filter(|piece| std::future::ready(!piece.is_empty()));
        GetObject {
            meta: meta.clone(),
            range,
            body: pieces.boxed(),
        }
    }
}

#[async_trait]
impl Backend for CachedStore {
    async fn head(&self, key: &StoreKey) -> Result<Option<ObjectMeta>, StoreError> {
        if !self.0.cache.enabled {
            self.0.upstream.heads.fetch_add(1, Ordering::Relaxed);
            return self.0.inner.head(key).await;
        }
        Ok(self.0.object(key, true).await?.meta.clone())
    }

    async fn get(&self, key: &StoreKey, range: Option<ByteRange>) -> Result<Option<GetObject>, StoreError> {
        // An upstream answering ranges whole would be read whole for every block: read through.
        if !self.0.cache.enabled || !self.0.inner.serves_ranges() {
            self.0.upstream.count_get(range);
            return self.0.inner.get(key, range).await;
        }
        let entry = self.0.object(key, false).await?;
        let Some(meta) = entry.meta.clone() else {
            return Ok(None);
        };
        let wanted = super::resolve_range(range, meta.size)?;
        Ok(Some(self.0.body(key, &entry, &meta, wanted)))
    }

    async fn list(&self, prefix: &StoreKey) -> Result<Listing, StoreError> {
        self.0.upstream.lists.fetch_add(1, Ordering::Relaxed);
        self.0.inner.list(prefix).await
    }

    fn resolves_ranges(&self) -> bool {
        true
    }
}

#[cfg(test)]
mod tests {
    use std::sync::atomic::AtomicBool;

    use super::*;

    /// An upstream in memory: objects with versions, conditional reads, requests counted by
    /// kind, and an outage switch.
    #[derive(Debug, Default)]
    struct Upstream {
        objects: Mutex<HashMap<String, (Bytes, String)>>,
        requests: Mutex<Vec<String>>,
        down: AtomicBool,
        delay_ms: AtomicU64,
    }

    impl Upstream {
        fn put(&self, key: &str, bytes: Vec<u8>, version: &str) {
            let mut objects = self.objects.lock().unwrap();
            objects.insert(key.into(), (bytes.into(), format!("\"{version}\"")));
        }

        fn requests(&self) -> Vec<String> {
            self.requests.lock().unwrap().clone()
        }

        async fn answer(&self, what: String) -> Result<Option<(Bytes, String)>, StoreError> {
            let key = what.split(' ').nth(1).unwrap_or("").to_owned();
            self.requests.lock().unwrap().push(what);
            let delay = self.delay_ms.load(Ordering::Relaxed);
            if delay > 0 {
                tokio::time::sleep(Duration::from_millis(delay)).await;
            }
            if self.down.load(Ordering::Relaxed) {
                return Err(StoreError::Io("upstream down".into()));
            }
            Ok(self.objects.lock().unwrap().get(&key).cloned())
        }
    }

    fn meta(bytes: &Bytes, version: &str) -> ObjectMeta {
        ObjectMeta {
            size: bytes.len() as u64,
            last_modified: None,
            version: Some(version.into()),
        }
    }

    #[async_trait]
    impl Backend for Arc<Upstream> {
        async fn head(&self, key: &StoreKey) -> Result<Option<ObjectMeta>, StoreError> {
            Ok(self.answer(format!("HEAD {key}")).await?.map(|(b, v)| meta(&b, &v)))
        }

        async fn get(&self, key: &StoreKey, range: Option<ByteRange>) -> Result<Option<GetObject>, StoreError> {
            let what = format!("GET {key} {range:?}");
            let Some((bytes, version)) = self.answer(what).await? else {
                return Ok(None);
            };
            let range = super::super::resolve_range(range, bytes.len() as u64)?;
            let part = bytes.slice(range.start as usize..range.end as usize);
            Ok(Some(GetObject {
                meta: meta(&bytes, &version),
                range,
                body: super::super::one_piece(part),
            }))
        }

        async fn get_unless(
            &self,
            key: &StoreKey,
            range: Option<ByteRange>,
            version: &str,
        ) -> Result<Revalidated<Option<GetObject>>, StoreError> {
            let current = self.objects.lock().unwrap().get(key.as_str()).map(|(_, v)| v.clone());
            if current.as_deref() == Some(version) && !self.down.load(Ordering::Relaxed) {
                self.requests.lock().unwrap().push(format!("GET {key} {range:?} 304"));
                return Ok(Revalidated::Unchanged);
            }
            Ok(Revalidated::Changed(self.get(key, range).await?))
        }

        async fn head_unless(
            &self,
            key: &StoreKey,
            version: &str,
        ) -> Result<Revalidated<Option<ObjectMeta>>, StoreError> {
            let current = self.objects.lock().unwrap().get(key.as_str()).map(|(_, v)| v.clone());
            if current.as_deref() == Some(version) && !self.down.load(Ordering::Relaxed) {
                self.requests.lock().unwrap().push(format!("HEAD {key} 304"));
                return Ok(Revalidated::Unchanged);
            }
            Ok(Revalidated::Changed(self.head(key).await?))
        }

        async fn list(&self, _: &StoreKey) -> Result<Listing, StoreError> {
            Ok(Listing::default())
        }

        fn resolves_ranges(&self) -> bool {
            true
        }
    }

    fn config(ttl_seconds: u64) -> crate::config::CacheConfig {
        crate::config::CacheConfig {
            raw_bytes: 64 << 20,
            raw_object_max: 64 << 10,
            raw_block_bytes: 64 << 10,
            ttl_seconds,
            ..Default::default()
        }
    }

    fn cached(upstream: &Arc<Upstream>, cache: &Arc<RawCache>, freshness: Freshness) -> Store {
        cache.wrap(Store::new(upstream.clone()), ("m", "m".into()), freshness)
    }

    fn key(k: &str) -> StoreKey {
        StoreKey::new(k).unwrap()
    }

    async fn read(store: &Store, k: &str, range: Option<ByteRange>) -> Option<(Vec<u8>, Option<String>)> {
        let object = store.get(&key(k), range).await.unwrap()?;
        let version = object.meta.version.clone();
        Some((object.bytes().await.unwrap().to_vec(), version))
    }

    fn pattern(n: usize) -> Vec<u8> {
        (0..n).map(|i| (i * 7 % 251) as u8).collect()
    }

    #[tokio::test]
    async fn reads_within_the_ttl_fetch_once_and_heads_of_cached_objects_fetch_nothing() {
        let upstream = Arc::new(Upstream::default());
        upstream.put("a/c/0", pattern(1000), "v1");
        let cache = Arc::new(RawCache::new(&config(60)));
        let store = cached(&upstream, &cache, Freshness::default());
        for _ in 0..5 {
            assert_eq!(read(&store, "a/c/0", None).await.unwrap().0, pattern(1000));
        }
        let range = read(&store, "a/c/0", Some(ByteRange::Suffix(10))).await.unwrap();
        assert_eq!(range.0, pattern(1000)[990..]);
        assert_eq!(store.head(&key("a/c/0")).await.unwrap().unwrap().size, 1000);
        // A missing key is remembered too.
        for _ in 0..3 {
            assert!(read(&store, "a/missing", None).await.is_none());
            assert!(store.head(&key("a/missing")).await.unwrap().is_none());
        }
        assert_eq!(
            upstream.requests(),
            [
                "GET a/c/0 Some(Bounded(0, 65536))",
                "GET a/missing Some(Bounded(0, 65536))"
            ]
        );
        assert_eq!(cache.counters.misses.load(Ordering::Relaxed), 2);
    }

    #[tokio::test(start_paused = true)]
    async fn after_the_ttl_an_unchanged_object_costs_a_304_and_a_changed_one_is_fetched() {
        let upstream = Arc::new(Upstream::default());
        upstream.put("k", pattern(100), "v1");
        let cache = Arc::new(RawCache::new(&config(60)));
        let store = cached(&upstream, &cache, Freshness::default());
        assert_eq!(read(&store, "k", None).await.unwrap().0, pattern(100));
        tokio::time::advance(Duration::from_secs(30)).await;
        assert_eq!(read(&store, "k", None).await.unwrap().0, pattern(100));
        assert_eq!(upstream.requests().len(), 1);
        tokio::time::advance(Duration::from_secs(31)).await;
        let (bytes, version) = read(&store, "k", None).await.unwrap();
        assert_eq!((bytes, version.as_deref()), (pattern(100), Some("\"v1\"")));
        assert_eq!(upstream.requests()[1], "GET k Some(Bounded(0, 65536)) 304");
        assert_eq!(cache.counters.revalidated.load(Ordering::Relaxed), 1);
        // Fresh again for a TTL.
        read(&store, "k", None).await.unwrap();
        assert_eq!(upstream.requests().len(), 2);
        // Changed upstream: seen after the TTL, never before.
        upstream.put("k", pattern(120), "v2");
        assert_eq!(read(&store, "k", None).await.unwrap().0, pattern(100));
        tokio::time::advance(Duration::from_secs(61)).await;
        let (bytes, version) = read(&store, "k", None).await.unwrap();
        assert_eq!((bytes, version.as_deref()), (pattern(120), Some("\"v2\"")));
        // An immutable mount never asks again.
        let immutable = Freshness {
            immutable: true,
            ..Default::default()
        };
        let cache = Arc::new(RawCache::new(&config(60)));
        let store = cached(&upstream, &cache, immutable);
        let before = upstream.requests().len();
        read(&store, "k", None).await.unwrap();
        tokio::time::advance(Duration::from_secs(3600)).await;
        read(&store, "k", None).await.unwrap();
        assert_eq!(upstream.requests().len(), before + 1);
        // ... but a key missing there may be written: it is looked for again after the TTL.
        assert!(read(&store, "later", None).await.is_none());
        upstream.put("later", pattern(3), "v1");
        assert!(read(&store, "later", None).await.is_none());
        tokio::time::advance(Duration::from_secs(61)).await;
        assert_eq!(read(&store, "later", None).await.unwrap().0, pattern(3));
    }

    /// A large object is cached in aligned blocks: reads all over it fetch each block once,
    /// whole reads included, and a body is always of the version its metadata names.
    #[tokio::test]
    async fn large_objects_are_read_in_blocks_each_fetched_once() {
        let upstream = Arc::new(Upstream::default());
        let size = 300 << 10;
        upstream.put("shard", pattern(size), "v1");
        let cache = Arc::new(RawCache::new(&config(60)));
        let store = cached(&upstream, &cache, Freshness::default());
        let whole = pattern(size);
        for (a, b) in [
            (0, 10),
            (70_000, 140_000),
            (65_530, 65_540),
            (size - 5, size),
            (200_000, 262_144),
        ] {
            let got = read(&store, "shard", Some(ByteRange::Bounded(a as u64, b as u64)))
                .await
                .unwrap();
            assert_eq!(got.0, whole[a..b], "{a}..{b}");
        }
        let got = read(&store, "shard", Some(ByteRange::Suffix(132))).await.unwrap();
        assert_eq!(got.0, whole[size - 132..]);

        assert_eq!(read(&store, "shard", None).await.unwrap().0, whole);
        let requests = upstream.requests();
        // The first read's start (block 0), then each other block once: 5 blocks in all.
        assert_eq!(requests.len(), 5, "{requests:?}");
        let mut blocks: Vec<&String> = requests.iter().collect();
        blocks.sort();
        blocks.dedup();
        assert_eq!(blocks.len(), 5);
        // Replaced upstream: the cached metadata still names v1, and so do its blocks; a
        // block not cached is refused rather than mixed in from v2.
        upstream.put("shard", vec![9u8; size], "v2");
        cache
            .entries
            .invalidate(&EntryKey {
                mount: "m".into(),
                key: key("shard"),
                part: Part::Block("\"v1\"".into(), 2),
            })
            .await;
        let mixed = store.get(&key("shard"), None).await.unwrap().unwrap().bytes().await;
        assert!(
            matches!(&mixed, Err(StoreError::Io(m)) if m.contains("changed while it was read")),
            "{mixed:?}"
        );
        // The object's metadata was dropped: the next read sees v2 whole.
        let (bytes, version) = read(&store, "shard", None).await.unwrap();
        assert_eq!((bytes, version.as_deref()), (vec![9u8; size], Some("\"v2\"")));
        // A block read while the body streams, after the request's handler: noted all the same.
        upstream.put("other", pattern(size), "v1");
        assert_eq!(store.head(&key("other")).await.unwrap().unwrap().size, size as u64);
        let range = Some(ByteRange::Bounded(200_000, 200_010));
        let (object, noted) = noting_status(store.get(&key("other"), range)).await;
        assert_eq!(noted.get(), Some(CacheStatus::Hit));
        let bytes = object.unwrap().unwrap().bytes().await.unwrap();
        assert_eq!(bytes[..], whole[200_000..200_010]);
        assert_eq!(noted.get(), Some(CacheStatus::Miss));
    }

    /// Concurrent misses of one object wait for one fetch; a reader that leaves does not
    /// cancel it, and what it fetched is cached.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn concurrent_misses_make_one_upstream_request() {
        let upstream = Arc::new(Upstream::default());
        upstream.put("k", pattern(5000), "v1");
        upstream.delay_ms.store(200, Ordering::Relaxed);
        let cache = Arc::new(RawCache::new(&config(60)));
        let store = cached(&upstream, &cache, Freshness::default());
        let reads: Vec<_> = (0..64)
            .map(|_| {
                let store = store.clone();
                tokio::spawn(async move { read(&store, "k", None).await.unwrap().0 })
            })
            .collect();
        for r in reads {
            assert_eq!(r.await.unwrap(), pattern(5000));
        }
        assert_eq!(upstream.requests().len(), 1);
        assert_eq!(cache.counters.misses.load(Ordering::Relaxed), 1);
        assert_eq!(cache.counters.coalesced.load(Ordering::Relaxed), 63);
        // A reader that gives up: the fetch goes on, and lands.
        upstream.put("other", pattern(10), "v1");
        let gave_up = tokio::time::timeout(Duration::from_millis(20), read(&store, "other", None)).await;
        assert!(gave_up.is_err());
        tokio::time::sleep(Duration::from_millis(400)).await;
        assert_eq!(read(&store, "other", None).await.unwrap().0, pattern(10));
        assert_eq!(upstream.requests().len(), 2);
    }

    /// While the upstream fails, cached objects are served for `stale_if_error` past their
    /// TTL; other reads fail; and the failures are not cached.
    #[tokio::test(start_paused = true)]
    async fn stale_objects_are_served_while_the_upstream_fails() {
        let upstream = Arc::new(Upstream::default());
        upstream.put("k", pattern(10), "v1");
        upstream.put("j", pattern(20), "v1");
        let cache = Arc::new(RawCache::new(&config(60)));
        let freshness = Freshness {
            immutable: false,
            stale_if_error: Duration::from_secs(300),
        };
        let store = cached(&upstream, &cache, freshness);
        read(&store, "k", None).await.unwrap();
        upstream.down.store(true, Ordering::Relaxed);
        tokio::time::advance(Duration::from_secs(120)).await;
        let (status_read, status) = noting_status(read(&store, "k", None)).await;
        assert_eq!(status_read.unwrap().0, pattern(10));
        assert_eq!(status.get(), Some(CacheStatus::Stale));
        assert!(store.get(&key("j"), None).await.is_err());
        tokio::time::advance(Duration::from_secs(300)).await;
        assert!(store.get(&key("k"), None).await.is_err());
        // Back up: fresh data, without a restart.
        upstream.down.store(false, Ordering::Relaxed);
        upstream.put("k", pattern(11), "v2");
        assert_eq!(read(&store, "k", None).await.unwrap().0, pattern(11));
        assert_eq!(read(&store, "j", None).await.unwrap().0, pattern(20));
    }
}
