//! The storage seam. Every mount is a [`Store`]: a shared handle to one [`Backend`].
//!
//! Backends are small adapters (object_store for directories and buckets, a zip reader, test
//! wrappers that count reads). The contract every backend keeps:
//! - a missing key is `Ok(None)`, never an error; a directory is not an object;
//! - ranges are resolved by the caller against the object size, so a backend only serves
//!   satisfiable ranges (unless it says it resolves them itself: local files and zip entries);
//! - bodies are streams, so a large object never has to sit in memory.

pub mod cached;
pub mod icechunk;
mod key;
mod local;
mod nonblocking;
mod object;
pub mod open;
mod origin;
pub mod references;
pub mod zip;

use std::fmt;
use std::ops::Range;
use std::sync::Arc;
use std::time::SystemTime;

use async_trait::async_trait;
use bytes::Bytes;
use futures::stream::BoxStream;
use futures::{StreamExt, TryStreamExt};

pub use key::{KeyError, StoreKey};
pub use nonblocking::NonBlocking;
pub use object::{ObjectStoreBackend, open_local};

/// Errors of the storage layer. A missing key is not one of them.
#[derive(Debug, Clone, thiserror::Error)]
pub enum StoreError {
    /// The upstream refused our credentials (401/403).
    #[error("upstream denied access: {0}")]
    Denied(String),
    /// The upstream did not answer in time.
    #[error("upstream timed out: {0}")]
    Timeout(String),
    /// Any other upstream or I/O failure.
    #[error("storage error: {0}")]
    Io(String),
    /// A requested byte range does not fit the object (the object changed under us).
    #[error("range {start}..{end} is not satisfiable for an object of {size} bytes")]
    Range { start: u64, end: u64, size: u64 },
    /// The backend cannot do this (e.g. listing an HTTP origin).
    #[error("not supported by this store: {0}")]
    NotSupported(String),
    /// An object (a metadata document, a chunk) is larger than zarrgate reads into memory for
    /// it; `size` is what was to be read.
    #[error("'{key}' is {size} bytes; at most {max} are read into memory for it")]
    TooLarge { key: String, size: u64, max: u64 },
    /// A metadata document holds more JSON values than are parsed
    /// ([`crate::json_text::MAX_DOCUMENT_VALUES`]): parsed, they would take gigabytes.
    #[error("'{key}' holds more than {max} JSON values; at most {max} are parsed")]
    TooManyValues { key: String, max: usize },
    /// A reference (of a reference mount) names an object the mount may not read: outside its
    /// `virtual_prefixes`. The message names the URL's origin, not its path.
    #[error("{0}")]
    NotAllowed(String),
    /// A version of an Icechunk mount that the repository does not hold (or that is no
    /// version: `branch.NAME`, `tag.NAME`, `snapshot.ID`).
    #[error("{0}")]
    UnknownVersion(String),
    /// The stored bytes are not what their container format says (a zip archive whose
    /// directory or entry is broken). `key` is the key that was asked for.
    #[error("'{key}' is corrupt: {message}")]
    Corrupt { key: String, message: String },
}

impl StoreError {
    /// A [`StoreError::Corrupt`] made where the key is not known names `key`; other errors are
    /// returned as they are.
    pub(crate) fn naming(self, key: &str) -> Self {
        match self {
            StoreError::Corrupt { key: k, message } if k.is_empty() => StoreError::Corrupt {
                key: key.to_string(),
                message,
            },
            e => e,
        }
    }
}

/// How much of a local metadata document the first read takes ([`Store::get_document`]).
const DOCUMENT_PROBE_BYTES: u64 = 64 << 10;

/// The largest metadata document read ([`Store::get_document`]). Consolidated metadata of
/// hierarchies of thousands of arrays is a few MiB; a walk reads up to 32 documents at once.
pub const MAX_DOCUMENT_BYTES: u64 = 64 << 20;

/// What is known about a stored object without reading it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ObjectMeta {
    /// Size in bytes.
    pub size: u64,
    /// Last modification time, where the backend knows it.
    pub last_modified: Option<SystemTime>,
    /// The backend's version tag (unquoted), where it has one.
    pub version: Option<String>,
}

impl ObjectMeta {
    /// Whether two reads saw the same object: the same size, and the same version where both
    /// tell one, or else the same modification time where both tell one (an HTTP origin may
    /// send no ETag). A shard or an archive replaced between two reads of it is another object.
    pub fn same_object(&self, other: &ObjectMeta) -> bool {
        fn agree<T: PartialEq>(a: &Option<T>, b: &Option<T>) -> Option<bool> {
            Some(a.as_ref()? == b.as_ref()?)
        }
        self.size == other.size
            && agree(&self.version, &other.version)
                .or_else(|| agree(&self.last_modified, &other.last_modified))
                .unwrap_or(true)
    }
}

/// A byte range as HTTP and object stores know it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ByteRange {
    /// `start..end`, end exclusive.
    Bounded(u64, u64),
    /// From `start` to the end.
    From(u64),
    /// The last `n` bytes.
    Suffix(u64),
}

/// Resolves an optional range (`None`: the whole object) against an object's size, for
/// backends that resolve ranges themselves; unsatisfiable is [`StoreError::Range`].
pub(crate) fn resolve_range(range: Option<ByteRange>, size: u64) -> Result<Range<u64>, StoreError> {
    match range {
        None => Ok(0..size),
        Some(r) => r.resolve(size).ok_or(StoreError::Range { start: 0, end: 0, size }),
    }
}

impl ByteRange {
    /// Resolves against an object size; `None` when unsatisfiable. An end past the object is
    /// clamped, as HTTP requires.
    pub fn resolve(self, size: u64) -> Option<Range<u64>> {
        match self {
            ByteRange::Bounded(start, end) if start < size && start < end => Some(start..end.min(size)),
            ByteRange::From(start) if start < size => Some(start..size),
            ByteRange::Suffix(n) if n > 0 && size > 0 => Some(size - n.min(size)..size),
            _ => None,
        }
    }
}

/// An object being read: its metadata, the range being delivered, and the body.
pub struct GetObject {
    /// Metadata of the whole object.
    pub meta: ObjectMeta,
    /// The byte range of the object that `body` yields.
    pub range: Range<u64>,
    /// The bytes, in order.
    pub body: BoxStream<'static, Result<Bytes, StoreError>>,
}

impl GetObject {
    /// Collects the body into one buffer.
    pub async fn bytes(self) -> Result<Bytes, StoreError> {
        let len = usize::try_from(self.range.end - self.range.start).unwrap_or(0);
        let mut body = self.body;
        let first = match body.try_next().await? {
            Some(b) => b,
            None => return Ok(Bytes::new()),
        };
        if first.len() == len {
            return Ok(first);
        }
        // The length comes from the store (an upstream's Content-Length): reserve it only as
        // far as memory allows, and let the buffer grow with what actually arrives otherwise.
        let mut buf: Vec<u8> = Vec::new();
        if buf.try_reserve(len.max(first.len())).is_err() {
            buf.reserve(first.len());
        }
        buf.extend_from_slice(&first);
        while let Some(b) = body.try_next().await? {
            buf.extend_from_slice(&b);
        }
        Ok(Bytes::from(buf))
    }
}

impl fmt::Debug for GetObject {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("GetObject")
            .field("meta", &self.meta)
            .field("range", &self.range)
            .finish_non_exhaustive()
    }
}

/// The children of a prefix: sub-prefixes ("directories") and objects, by name.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Listing {
    /// Names of child prefixes, sorted.
    pub prefixes: Vec<String>,
    /// Names of child objects, sorted.
    pub objects: Vec<String>,
}

/// A read made unless the object is still the version the caller holds.
#[derive(Debug)]
pub enum Revalidated<T> {
    /// The object is still that version: nothing was read.
    Unchanged,
    /// It is another version (or gone): what a plain read gives.
    Changed(T),
}

/// One storage backend. See the module docs for the contract.
#[async_trait]
pub trait Backend: Send + Sync + fmt::Debug + 'static {
    /// Metadata of an object, `None` when it does not exist (or names a directory).
    async fn head(&self, key: &StoreKey) -> Result<Option<ObjectMeta>, StoreError>;

    /// Reads an object or a satisfiable range of it; `None` when it does not exist.
    async fn get(&self, key: &StoreKey, range: Option<ByteRange>) -> Result<Option<GetObject>, StoreError>;

    /// Lists the direct children of a prefix (the empty key lists the root).
    async fn list(&self, prefix: &StoreKey) -> Result<Listing, StoreError>;

    /// [`Backend::get`], unless the object is still `version` (as [`ObjectMeta::version`]
    /// gave it): then [`Revalidated::Unchanged`] and no bytes (an HTTP 304). Backends without
    /// conditional reads read the object.
    async fn get_unless(
        &self,
        key: &StoreKey,
        range: Option<ByteRange>,
        version: &str,
    ) -> Result<Revalidated<Option<GetObject>>, StoreError> {
        let _ = version;
        Ok(Revalidated::Changed(self.get(key, range).await?))
    }

    /// [`Backend::head`], unless the object is still `version` (see [`Backend::get_unless`]).
    async fn head_unless(&self, key: &StoreKey, version: &str) -> Result<Revalidated<Option<ObjectMeta>>, StoreError> {
        let _ = version;
        Ok(Revalidated::Changed(self.head(key).await?))
    }

    /// Whether `get` resolves any range itself, answering an unsatisfiable one with
    /// [`StoreError::Range`] carrying the object's size. Then one `get` can serve an HTTP range
    /// request; otherwise callers `head` first and pass a satisfiable range.
    fn resolves_ranges(&self) -> bool {
        false
    }

    /// Whether the upstream serves byte ranges (an HTTP origin may answer them whole). A
    /// cache of blocks in front of one that does not would read the whole object per block.
    fn serves_ranges(&self) -> bool {
        true
    }

    /// For stores read by blocking calls (local files): a reader that [`Store::read_with`] runs
    /// on the blocking pool together with the work on the bytes. `None` (the default): bytes are
    /// fetched with [`Backend::get`] first.
    fn blocking_reader(&self) -> Option<Arc<dyn BlockingRead>> {
        None
    }
}

/// An object's metadata and a reader of a range of it ([`BlockingRead::open_range`]).
pub type OpenedRange = (ObjectMeta, Box<dyn std::io::Read + Send>);

/// Reads objects with blocking calls, into a buffer the caller provides.
pub trait BlockingRead: Send + Sync + fmt::Debug {
    /// Reads `range` of `key` (all of it when `None`) into `buf`, replacing its contents, and
    /// returns the whole object's metadata; `None` when it does not exist. More than `most`
    /// bytes to read is [`StoreError::TooLarge`], found out before any of them is read.
    fn read_into(
        &self,
        key: &StoreKey,
        range: Option<ByteRange>,
        most: u64,
        buf: &mut Vec<u8>,
    ) -> Result<Option<ObjectMeta>, StoreError>;

    /// Opens `range` of `key` to be read in the calling thread, from the file as it was
    /// opened, however long the reading takes: the whole object's metadata and a reader of the
    /// range; `None` when the object does not exist.
    fn open_range(&self, key: &StoreKey, range: Range<u64>) -> Result<Option<OpenedRange>, StoreError>;

    /// [`Self::read_into`] on the async worker, when it can be done without waiting (the
    /// object is in memory and small), with the range read; otherwise [`NonBlocking::WouldBlock`]
    /// and `buf` is left to be replaced. The default never reads.
    fn read_nowait(
        &self,
        _key: &StoreKey,
        _range: Option<ByteRange>,
        _buf: &mut Vec<u8>,
    ) -> NonBlocking<Result<nonblocking::Read, StoreError>> {
        NonBlocking::WouldBlock
    }
}

/// A read buffer taken from the spares that goes back to them when dropped (for `Bytes` made
/// from it: when the last one sharing it is dropped).
pub(crate) struct SpareBuffer(pub(crate) Vec<u8>);

impl SpareBuffer {
    /// An empty buffer taken from the spares.
    pub(crate) fn take() -> Self {
        Self(crate::buffers::READS.take_any())
    }

    /// Reads `range` of `key` (all of it when `None`) with `reader` into a spare buffer, with the
    /// object's metadata; `None` when the object does not exist. On `None` or an error the
    /// buffer goes straight back.
    fn read(
        reader: &dyn BlockingRead,
        key: &StoreKey,
        range: Option<ByteRange>,
        most: u64,
    ) -> Result<Option<(Self, ObjectMeta)>, StoreError> {
        let mut buf = Self::take();
        Ok(reader.read_into(key, range, most, &mut buf.0)?.map(|meta| (buf, meta)))
    }
}

impl AsRef<[u8]> for SpareBuffer {
    fn as_ref(&self) -> &[u8] {
        &self.0
    }
}

impl Drop for SpareBuffer {
    fn drop(&mut self) {
        crate::buffers::READS.give(std::mem::take(&mut self.0));
    }
}

/// Bytes read, the object's metadata and the range the bytes are; `None` when it does not exist.
type Fetched = Option<(Bytes, ObjectMeta, Range<u64>)>;

/// [`BlockingRead::read_nowait`] into a spare read buffer that returns to the spares when the
/// bytes are dropped: the bytes, the object's metadata and the range they are.
pub(crate) fn fetch_nowait(
    reader: &dyn BlockingRead,
    key: &StoreKey,
    range: Option<ByteRange>,
) -> NonBlocking<Result<Fetched, StoreError>> {
    let mut buf = SpareBuffer::take();
    match reader.read_nowait(key, range, &mut buf.0) {
        NonBlocking::Done(read) => {
            NonBlocking::Done(read.map(|found| found.map(|(meta, range)| (Bytes::from_owner(buf), meta, range))))
        }
        NonBlocking::WouldBlock => NonBlocking::WouldBlock,
    }
}

/// A blocking task that did not finish (it panicked or the runtime is shutting down).
pub(crate) fn joined(e: tokio::task::JoinError) -> StoreError {
    StoreError::Io(format!("blocking task: {e}"))
}

/// Reads `range` of an object (all of it when `None`) with a blocking reader in one call, into a
/// spare read buffer that returns to the spares when the bytes are dropped; `None` when the
/// object does not exist.
async fn read_blocking(
    reader: Arc<dyn BlockingRead>,
    key: &StoreKey,
    range: Option<ByteRange>,
) -> Result<Option<(Bytes, ObjectMeta)>, StoreError> {
    let key = key.clone();
    crate::workers::spawn_blocking(move || {
        Ok(SpareBuffer::read(&*reader, &key, range, u64::MAX)?.map(|(buf, meta)| (Bytes::from_owner(buf), meta)))
    })
    .await
    .map_err(joined)?
}

/// A cheap, clonable handle to a backend.
#[derive(Clone, Debug)]
pub struct Store(Arc<dyn Backend>);

impl Store {
    /// Wraps a backend.
    pub fn new(backend: impl Backend) -> Self {
        Self(Arc::new(backend))
    }

    /// See [`Backend::head`].
    pub async fn head(&self, key: &StoreKey) -> Result<Option<ObjectMeta>, StoreError> {
        self.0.head(key).await
    }

    /// See [`Backend::get`].
    pub async fn get(&self, key: &StoreKey, range: Option<ByteRange>) -> Result<Option<GetObject>, StoreError> {
        self.0.get(key, range).await
    }

    /// See [`Backend::get_unless`].
    pub async fn get_unless(
        &self,
        key: &StoreKey,
        range: Option<ByteRange>,
        version: &str,
    ) -> Result<Revalidated<Option<GetObject>>, StoreError> {
        self.0.get_unless(key, range, version).await
    }

    /// See [`Backend::head_unless`].
    pub async fn head_unless(
        &self,
        key: &StoreKey,
        version: &str,
    ) -> Result<Revalidated<Option<ObjectMeta>>, StoreError> {
        self.0.head_unless(key, version).await
    }

    /// See [`Backend::serves_ranges`].
    pub fn serves_ranges(&self) -> bool {
        self.0.serves_ranges()
    }

    /// See [`Backend::resolves_ranges`].
    pub fn resolves_ranges(&self) -> bool {
        self.0.resolves_ranges()
    }

    /// Whether objects are read by blocking calls into reused buffers (local files, zip
    /// entries), where a read costs no request: callers then read small ranges one by one
    /// rather than coalescing them.
    pub fn reads_locally(&self) -> bool {
        self.0.blocking_reader().is_some()
    }

    /// The store's reader for blocking calls (local files), if it has one.
    pub(crate) fn blocking_reader(&self) -> Option<Arc<dyn BlockingRead>> {
        self.0.blocking_reader()
    }

    /// See [`Backend::list`].
    pub async fn list(&self, prefix: &StoreKey) -> Result<Listing, StoreError> {
        self.0.list(prefix).await
    }

    /// Reads a metadata document (`zarr.json`, `.zarray`, `.zattrs`, `.zmetadata`, ...) into
    /// memory: at most [`MAX_DOCUMENT_BYTES`], [`StoreError::TooLarge`] beyond, found out
    /// before reading the rest (a stray large file under a metadata name costs nothing).
    pub async fn get_document(&self, key: &StoreKey) -> Result<Option<Bytes>, StoreError> {
        Ok(self
            .get_document_admitted(key, |_| true)
            .await?
            .map(|d| d.unwrap_or_default()))
    }

    /// [`Self::get_document`], asking `admit` whether a document of its size may be read
    /// before reading more than its first 64 KiB: `Err(size)` when it says no. A walk
    /// counts its documents so, and stops before it holds more than its bound.
    pub async fn get_document_admitted(
        &self,
        key: &StoreKey,
        admit: impl FnOnce(u64) -> bool,
    ) -> Result<Option<Result<Bytes, u64>>, StoreError> {
        let too_large = |size| StoreError::TooLarge {
            key: key.to_string(),
            size,
            max: MAX_DOCUMENT_BYTES,
        };
        // Counted before anything parses it.
        let whole =
            |bytes: Bytes| match crate::json_text::document_values(&bytes) > crate::json_text::MAX_DOCUMENT_VALUES {
                true => Err(StoreError::TooManyValues {
                    key: key.to_string(),
                    max: crate::json_text::MAX_DOCUMENT_VALUES,
                }),
                false => Ok(Some(Ok(bytes))),
            };
        if self.reads_locally() {
            // The first 64 KiB, and the object's size with them: most documents are whole in
            // one read, and one over the limit is known without reading more of it.
            let (bytes, meta) = match self.fetch(key, Some(ByteRange::Bounded(0, DOCUMENT_PROBE_BYTES))).await {
                Ok(Some(found)) => found,
                Ok(None) => return Ok(None),
                Err(StoreError::Range { size: 0, .. }) => {
                    return Ok(Some(if admit(0) { Ok(Bytes::new()) } else { Err(0) }));
                }
                Err(e) => return Err(e),
            };
            if meta.size > MAX_DOCUMENT_BYTES {
                return Err(too_large(meta.size));
            }
            if !admit(meta.size) {
                return Ok(Some(Err(meta.size)));
            }
            if bytes.len() as u64 == meta.size {
                return whole(bytes);
            }
            return match self.fetch(key, Some(ByteRange::Bounded(0, MAX_DOCUMENT_BYTES))).await {
                Ok(Some((_, now))) if now.size > MAX_DOCUMENT_BYTES => Err(too_large(now.size)),
                Ok(Some((bytes, now))) if bytes.len() as u64 == now.size && now.size <= meta.size => whole(bytes),
                // Not whole even within the limit, or larger than admitted (or gone): it changed
                // between the two reads.
                Ok(_) | Err(StoreError::Range { .. }) => {
                    Err(StoreError::Io(format!("{key} changed while it was read")))
                }
                Err(e) => Err(e),
            };
        }
        // Whole-object requests: an HTTP origin need not support ranges. The size comes with
        // the response, before its body is read.
        match self.get(key, None).await? {
            Some(object) if object.meta.size > MAX_DOCUMENT_BYTES => Err(too_large(object.meta.size)),
            Some(object) if !admit(object.meta.size) => Ok(Some(Err(object.meta.size))),
            Some(object) => whole(object.bytes().await?),
            None => Ok(None),
        }
    }

    /// Reads `range` of an object (all of it when `None`) into memory, with the whole object's
    /// metadata; `None` when it does not exist. Blocking readers read into a spare buffer.
    pub async fn fetch(
        &self,
        key: &StoreKey,
        range: Option<ByteRange>,
    ) -> Result<Option<(Bytes, ObjectMeta)>, StoreError> {
        if let Some(reader) = self.0.blocking_reader() {
            if let NonBlocking::Done(read) = fetch_nowait(&*reader, key, range) {
                return read.map(|found| found.map(|(bytes, meta, _)| (bytes, meta)));
            }
            return read_blocking(reader, key, range).await;
        }
        match self.get(key, range).await? {
            Some(obj) => {
                let meta = obj.meta.clone();
                Ok(Some((obj.bytes().await?, meta)))
            }
            None => Ok(None),
        }
    }

    /// Reads `range` of an object (all of it when `None`) and runs `work` on its bytes and the
    /// whole object's metadata on the blocking pool; `None` when the object does not exist. Local files
    /// are read in the same blocking call, into a reused buffer: one trip to the blocking pool
    /// and no fresh memory for bytes that only live until `work` is done with them. More than
    /// `most` bytes to read is [`StoreError::TooLarge`], before any of them is read.
    pub async fn read_with<R: Send + 'static>(
        &self,
        key: &StoreKey,
        range: Option<ByteRange>,
        most: u64,
        work: impl FnOnce(&[u8], &ObjectMeta) -> R + Send + 'static,
    ) -> Result<Option<R>, StoreError> {
        if let Some(reader) = self.0.blocking_reader() {
            let key = key.clone();
            return crate::workers::spawn_blocking(move || {
                Ok(SpareBuffer::read(&*reader, &key, range, most)?.map(|(buf, meta)| work(&buf.0, &meta)))
            })
            .await
            .map_err(joined)?;
        }
        let Some(object) = self.get_at_most(key, range, most).await? else {
            return Ok(None);
        };
        let meta = object.meta.clone();
        let bytes = object.bytes().await?;
        crate::workers::spawn_blocking(move || Some(work(&bytes, &meta)))
            .await
            .map_err(joined)
    }

    /// [`Store::get`] of at most `most` bytes: more is [`StoreError::TooLarge`], known from the
    /// response before any of its body is read.
    pub async fn get_at_most(
        &self,
        key: &StoreKey,
        range: Option<ByteRange>,
        most: u64,
    ) -> Result<Option<GetObject>, StoreError> {
        let Some(object) = self.get(key, range).await? else {
            return Ok(None);
        };
        let want = object.range.end - object.range.start;
        if want > most {
            return Err(StoreError::TooLarge {
                key: key.to_string(),
                size: want,
                max: most,
            });
        }
        Ok(Some(object))
    }

    /// Reads a range of an object into memory, with the whole object's metadata.
    pub async fn get_range_bytes(
        &self,
        key: &StoreKey,
        range: ByteRange,
    ) -> Result<Option<(Bytes, ObjectMeta)>, StoreError> {
        self.fetch(key, Some(range)).await
    }
}

/// A body of bytes already in memory, in one piece.
pub(crate) fn one_piece(bytes: Bytes) -> BoxStream<'static, Result<Bytes, StoreError>> {
    futures::stream::once(async move { Ok(bytes) }).boxed()
}

/// Turns a stream of `Bytes` from any source into the store's body type.
pub(crate) fn body_stream<S, E>(s: S) -> BoxStream<'static, Result<Bytes, StoreError>>
where
    S: futures::Stream<Item = Result<Bytes, E>> + Send + 'static,
    E: Into<StoreError>,
{
    s.map(|r| r.map_err(Into::into)).boxed()
}

#[cfg(test)]
mod tests {
    use super::{ByteRange, Store, StoreKey, open_local};

    /// Reads through reused buffers hand `work` exactly the bytes asked for, whatever an
    /// earlier, larger read left in the buffer, and the same bytes a plain `get` returns.
    #[tokio::test]
    async fn read_with_gives_exactly_the_bytes_of_the_range() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(dir.path().join("big"), vec![0xab; 300_000]).unwrap();
        std::fs::write(dir.path().join("small"), b"hello").unwrap();
        let store = Store::new(open_local(dir.path()).unwrap());
        let key = |k: &str| StoreKey::new(k).unwrap();
        let read = |k: &'static str, r: Option<ByteRange>| {
            let store = store.clone();
            async move {
                store
                    .read_with(&key(k), r, u64::MAX, |b, meta| (b.to_vec(), meta.size))
                    .await
                    .unwrap()
            }
        };
        for _ in 0..4 {
            let (big, size) = read("big", None).await.unwrap();
            assert_eq!((big.len(), size), (300_000, 300_000));
            assert!(big.iter().all(|&b| b == 0xab));
            assert_eq!(read("small", None).await, Some((b"hello".to_vec(), 5)));
            assert_eq!(
                read("small", Some(ByteRange::Bounded(1, 3))).await,
                Some((b"el".to_vec(), 5))
            );
            assert_eq!(
                read("small", Some(ByteRange::Suffix(2))).await,
                Some((b"lo".to_vec(), 5))
            );
            assert_eq!(read("missing", None).await, None);
        }
        let streamed = streamed(&store, &key("big"), ByteRange::From(299_990)).await;
        let via = read("big", Some(ByteRange::From(299_990))).await;
        assert_eq!(via, Some((streamed.to_vec(), 300_000)));
        let past_end = store
            .read_with(&key("small"), Some(ByteRange::From(9)), u64::MAX, |b, _| b.len())
            .await;
        assert!(past_end.is_err(), "an unsatisfiable range is an error, not bytes");
    }

    /// `range` of `key` as the streamed `get` (the raw-key path) delivers it.
    async fn streamed(store: &Store, key: &StoreKey, range: ByteRange) -> bytes::Bytes {
        store
            .get(key, Some(range))
            .await
            .unwrap()
            .unwrap()
            .bytes()
            .await
            .unwrap()
    }

    /// Bytes read into spare buffers stay intact while held, whatever is read after them into
    /// other (or returned) buffers, and equal what the streamed `get` delivers.
    #[tokio::test]
    async fn bytes_in_spare_buffers_are_not_reused_while_held() {
        let dir = tempfile::tempdir().unwrap();
        let files: Vec<(String, Vec<u8>)> = (0..6u8)
            .map(|i| {
                (
                    format!("f{i}"),
                    (0..200_000u32).map(|j| (j as u8) ^ i.wrapping_mul(37)).collect(),
                )
            })
            .collect();
        for (name, data) in &files {
            std::fs::write(dir.path().join(name), data).unwrap();
        }
        let store = Store::new(open_local(dir.path()).unwrap());
        let key = |k: &str| StoreKey::new(k).unwrap();
        let mut held = Vec::new();
        for round in 0..3 {
            for (i, (name, data)) in files.iter().enumerate() {
                let whole = store.get_document(&key(name)).await.unwrap().unwrap();
                assert_eq!(&whole[..], &data[..], "{name}");
                let (a, b) = (1000 * i as u64, 150_000 + 7 * i as u64);
                let (part, meta) = store
                    .get_range_bytes(&key(name), ByteRange::Bounded(a, b))
                    .await
                    .unwrap()
                    .unwrap();
                assert_eq!(meta.size, 200_000);
                assert_eq!(&part[..], &data[a as usize..b as usize], "{name}");
                assert_eq!(part, streamed(&store, &key(name), ByteRange::Bounded(a, b)).await);
                // Every other read is held to the end; the rest go back to the spares.
                if (round + i) % 2 == 0 {
                    held.push((name.clone(), a, part.slice(10..20_000), whole));
                }
            }
        }
        for (name, a, part, whole) in held {
            let data = &files.iter().find(|(n, _)| *n == name).unwrap().1;
            assert_eq!(&whole[..], &data[..], "{name} changed while held");
            assert_eq!(
                &part[..],
                &data[a as usize + 10..a as usize + 20_000],
                "{name} changed while held"
            );
        }
        assert_eq!(store.get_document(&key("missing")).await.unwrap(), None);
        assert_eq!(
            store
                .get_range_bytes(&key("missing"), ByteRange::Suffix(4))
                .await
                .unwrap(),
            None
        );
        assert!(
            store
                .get_range_bytes(&key("f0"), ByteRange::From(200_000))
                .await
                .is_err(),
            "an unsatisfiable range is an error"
        );
    }

    #[test]
    fn the_same_object_by_version_else_by_time() {
        let t = |s: u64| Some(std::time::UNIX_EPOCH + std::time::Duration::from_secs(s));
        let meta = |size, last_modified, version: Option<&str>| super::ObjectMeta {
            size,
            last_modified,
            version: version.map(str::to_owned),
        };
        assert!(meta(5, t(1), Some("a")).same_object(&meta(5, t(2), Some("a"))));
        assert!(!meta(5, t(1), Some("a")).same_object(&meta(5, t(1), Some("b"))));
        assert!(!meta(5, t(1), Some("a")).same_object(&meta(6, t(1), Some("a"))));
        // Without versions (an origin that sends no ETag), the times decide.
        assert!(!meta(5, t(1), None).same_object(&meta(5, t(2), None)));
        assert!(!meta(5, t(1), Some("a")).same_object(&meta(5, t(2), None)));
        assert!(meta(5, t(1), None).same_object(&meta(5, t(1), Some("a"))));
        assert!(meta(5, None, None).same_object(&meta(5, t(2), None)));
    }

    #[test]
    fn ranges_resolve_like_http() {
        assert_eq!(ByteRange::Bounded(0, 10).resolve(100), Some(0..10));
        assert_eq!(ByteRange::Bounded(90, 200).resolve(100), Some(90..100));
        assert_eq!(ByteRange::Bounded(100, 200).resolve(100), None);
        assert_eq!(ByteRange::From(99).resolve(100), Some(99..100));
        assert_eq!(ByteRange::From(100).resolve(100), None);
        assert_eq!(ByteRange::Suffix(10).resolve(100), Some(90..100));
        assert_eq!(ByteRange::Suffix(1000).resolve(100), Some(0..100));
        assert_eq!(ByteRange::Suffix(0).resolve(100), None);
        assert_eq!(ByteRange::Suffix(5).resolve(0), None);
    }
}
