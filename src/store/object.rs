//! The object_store adapter: local directories now, buckets and HTTP origins through the same
//! code. Local roots add one rule object_store does not enforce: a symlink whose target lies
//! outside the mount root is treated as missing.

use std::ops::Range;
use std::path::{Path as FsPath, PathBuf};
use std::sync::Arc;

use async_trait::async_trait;
use bytes::Bytes;
use object_store::local::LocalFileSystem;
use object_store::path::Path;
use object_store::{GetOptions, GetRange, GetResultPayload, ObjectStore, ObjectStoreExt};
use tokio::io::{AsyncReadExt, AsyncSeekExt};
use tokio_util::io::ReaderStream;

use super::Revalidated;
use super::local::{list_local, local_meta, names_nothing};
use super::nonblocking::{self, NonBlocking};
use super::{
    Backend, BlockingRead, ByteRange, GetObject, Listing, ObjectMeta, StoreError, StoreKey, body_stream, joined,
    resolve_range,
};

/// Buffer size for streaming local files: large enough that a big shard does not cost a
/// blocking-pool hop per few KiB, small enough to keep memory per response bounded.
const FILE_READ_CHUNK: usize = 256 * 1024;

/// Local ranges up to this size are read in the same blocking call that opens the file.
const SMALL_READ: u64 = 1 << 20;

/// Any object_store backend, rooted at a prefix.
#[derive(Debug)]
pub struct ObjectStoreBackend {
    store: Arc<dyn ObjectStore>,
    prefix: Vec<String>,
    /// For local directories: the files under the canonical root that every resolved file must
    /// stay under, read with blocking calls.
    local: Option<Arc<LocalFiles>>,
    /// Whether the store can list (HTTP origins cannot).
    can_list: bool,
    /// Whether the store takes suffix ranges (Azure does not: HEAD, then a bounded range).
    suffix_ranges: bool,
    /// When the upstream last answered a range of part of an object with the whole object (an
    /// HTTP origin that does not do ranges): for [`RANGES_REFUSED_FOR`] after that, ranges are
    /// cut out of whole-object reads; then a range is asked for again (an origin behind a CDN
    /// may answer so once, on a miss).
    ranges_refused: Arc<std::sync::Mutex<Option<std::time::Instant>>>,
    /// Whether a refusal of a single key (403) means the key is missing: public buckets
    /// answer so for keys that do not exist to callers who may not list them.
    denied_is_missing: bool,
    /// The mount's upstream requests in flight (`concurrency`), each held until its response
    /// head arrives: a body then streams without one, so clients reading bodies slowly do not
    /// hold the mount's requests (object_store's LimitStore keeps its permit in the body).
    permits: Option<Arc<tokio::sync::Semaphore>>,
}

/// How long ranges are cut out of whole-object reads after an upstream answered one with the
/// whole object, before a range is asked for again.
const RANGES_REFUSED_FOR: std::time::Duration = std::time::Duration::from_secs(60);

/// Opens a local directory as a store. The directory must exist.
pub fn open_local(dir: &FsPath) -> Result<ObjectStoreBackend, String> {
    let meta = std::fs::metadata(dir).map_err(|e| format!("{}: {e}", dir.display()))?;
    if !meta.is_dir() {
        return Err(format!("{} is not a directory", dir.display()));
    }
    let root = std::fs::canonicalize(dir).map_err(|e| format!("{}: {e}", dir.display()))?;
    let fs = LocalFileSystem::new_with_prefix(&root).map_err(|e| format!("{}: {e}", dir.display()))?;
    Ok(ObjectStoreBackend {
        store: Arc::new(fs),
        prefix: Vec::new(),
        local: Some(Arc::new(LocalFiles {
            nowait: nonblocking::Root::open(&root).map(Arc::new),
            root,
        })),
        can_list: true,
        suffix_ranges: true,
        ranges_refused: Arc::default(),
        denied_is_missing: false,
        permits: None,
    })
}

impl ObjectStoreBackend {
    /// Wraps a remote object store, rooted at `prefix` (`/`-separated, may be empty).
    pub fn new(store: Arc<dyn ObjectStore>, prefix: &str) -> Self {
        Self {
            store,
            prefix: prefix.split('/').filter(|s| !s.is_empty()).map(str::to_owned).collect(),
            local: None,
            can_list: true,
            suffix_ranges: true,
            ranges_refused: Arc::default(),
            denied_is_missing: false,
            permits: None,
        }
    }

    /// At most `n` upstream requests in flight, each until its response head (see `permits`).
    pub fn with_concurrency(mut self, n: usize) -> Self {
        self.permits = Some(Arc::new(tokio::sync::Semaphore::new(n)));
        self
    }

    /// Runs an upstream request in one of the mount's permits.
    async fn with_permit<T>(&self, request: impl std::future::Future<Output = T>) -> T {
        let _permit = match &self.permits {
            Some(permits) => permits.acquire().await.ok(),
            None => None,
        };
        request.await
    }

    /// Takes a 403 for a single key as "missing" (anonymous mounts of public buckets, which
    /// answer 403 for keys that do not exist to callers who may not list).
    pub fn denied_is_missing(mut self) -> Self {
        self.denied_is_missing = true;
        self
    }

    /// Marks the store as unable to list (HTTP origins).
    pub fn without_listing(mut self) -> Self {
        self.can_list = false;
        self
    }

    /// Marks the store as unable to serve suffix ranges (Azure).
    pub fn without_suffix_ranges(mut self) -> Self {
        self.suffix_ranges = false;
        self
    }

    /// The canonical root of a local directory.
    fn local_root(&self) -> Option<&PathBuf> {
        self.local.as_ref().map(|l| &l.root)
    }

    /// Whether a request for `path` fits in a URL (the `http` crate's limit,
    /// [`crate::config::MAX_URL_BYTES`]; object_store panics building a request past it): each
    /// byte may be percent-encoded, and 1 KiB is left for the endpoint, bucket and query. A key
    /// that cannot be asked for is missing.
    fn addressable(path: &Path) -> bool {
        path.as_ref().len().saturating_mul(3).saturating_add(1024) <= crate::config::MAX_URL_BYTES
    }

    fn path(&self, key: &StoreKey) -> Result<Path, StoreError> {
        let joined: Vec<&str> = self.prefix.iter().map(String::as_str).chain(key.segments()).collect();
        Path::parse(joined.join("/")).map_err(|e| StoreError::Io(format!("invalid key {key}: {e}")))
    }

    /// For local roots: whether `key` resolves (following symlinks) to a place inside the root.
    /// Missing files count as inside; object_store then reports them missing.
    async fn contained(&self, key: &StoreKey) -> bool {
        let Some(root) = self.local_root() else { return true };
        match tokio::fs::canonicalize(root.join(key.as_str())).await {
            Ok(real) => real.starts_with(root),
            Err(_) => true,
        }
    }
}

fn meta_from(m: &object_store::ObjectMeta) -> ObjectMeta {
    ObjectMeta {
        size: m.size,
        // object_store reads a missing Last-Modified (HTTP origins may send none) as the
        // epoch: that is no time at all, not a time to compare.
        last_modified: (m.last_modified.timestamp() != 0).then(|| m.last_modified.into()),
        version: m.e_tag.clone(),
    }
}

/// An opened local read: metadata, the range served, and either the bytes (small ranges) or
/// the open file to stream from.
type LocalRead = Option<(ObjectMeta, Range<u64>, Result<Bytes, std::fs::File>)>;

/// What one blocking call on a local file found.
enum LocalFile {
    Missing,
    Found(ObjectMeta, std::fs::File),
}

/// Opens `key` under `root` in one blocking step: resolves symlinks, refuses what leaves the
/// root, and skips directories.
fn open_local_file(root: &FsPath, key: &StoreKey) -> Result<LocalFile, StoreError> {
    let path = match std::fs::canonicalize(root.join(key.as_str())) {
        Ok(p) if p.starts_with(root) => p,
        Ok(_) => return Ok(LocalFile::Missing),
        Err(e) if names_nothing(&e) => return Ok(LocalFile::Missing),
        Err(e) => return Err(e.into()),
    };
    // Only regular files are keys, checked on the open file. Opening is non-blocking, so that
    // opening something else (a FIFO) does not wait for a writer; reads of a regular file are
    // not affected by the flag.
    let mut options = std::fs::OpenOptions::new();
    options.read(true);
    #[cfg(unix)]
    std::os::unix::fs::OpenOptionsExt::custom_flags(&mut options, libc::O_NONBLOCK);
    let file = match options.open(&path) {
        Ok(f) => f,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(LocalFile::Missing),
        Err(e) => return Err(e.into()),
    };
    let meta = file.metadata()?;
    if !meta.is_file() {
        return Ok(LocalFile::Missing);
    }
    Ok(LocalFile::Found(local_meta(&meta), file))
}

/// Opens `key` under `root`: resolved by the kernel below `beneath` (the root opened for
/// [`nonblocking`] reads) where it can decide, else by hand ([`open_local_file`]).
fn open_local_key(root: &FsPath, beneath: Option<&nonblocking::Root>, key: &StoreKey) -> Result<LocalFile, StoreError> {
    match beneath.map(|b| b.open_file_waiting(key)) {
        Some(NonBlocking::Done(Some((meta, file)))) => Ok(LocalFile::Found(meta, file)),
        Some(NonBlocking::Done(None)) => Ok(LocalFile::Missing),
        None | Some(NonBlocking::WouldBlock) => open_local_file(root, key),
    }
}

/// Opens `key` under `root` and resolves `range` against its size (all of it when `None`);
/// `None` when the file does not exist, [`StoreError::Range`] when the range is unsatisfiable.
fn open_local_range(
    root: &FsPath,
    beneath: Option<&nonblocking::Root>,
    key: &StoreKey,
    range: Option<ByteRange>,
) -> Result<Option<(ObjectMeta, Range<u64>, std::fs::File)>, StoreError> {
    let LocalFile::Found(meta, file) = open_local_key(root, beneath, key)? else {
        return Ok(None);
    };
    let range = resolve_range(range, meta.size)?;
    Ok(Some((meta, range, file)))
}

/// Reads `range` of the open `file` (of `key`) into `buf`, replacing what it held.
fn read_range(
    file: &mut std::fs::File,
    key: &StoreKey,
    range: &Range<u64>,
    buf: &mut Vec<u8>,
) -> Result<(), StoreError> {
    use std::io::{Read, Seek};
    buf.clear();
    file.seek(std::io::SeekFrom::Start(range.start))?;
    let want = range.end - range.start;
    let too_large = || StoreError::Io(format!("{key}: too large to read ({want} bytes)"));
    // A file may claim any size (a sparse file): an allocation that cannot be had is an error
    // of this read, not an abort of the server.
    buf.try_reserve(usize::try_from(want).map_err(|_| too_large())?)
        .map_err(|_| too_large())?;
    file.take(want).read_to_end(buf)?;
    if buf.len() as u64 != want {
        return Err(StoreError::Io(format!(
            "{key}: short read ({} of {want} bytes)",
            buf.len()
        )));
    }
    Ok(())
}

impl LocalFiles {
    async fn head(&self, key: &StoreKey) -> Result<Option<ObjectMeta>, StoreError> {
        if let Some(NonBlocking::Done(found)) = self.nowait.as_ref().map(|n| n.open_file(key)) {
            return Ok(found.map(|(meta, _)| meta));
        }
        let (root, beneath, key) = (self.root.clone(), self.nowait.clone(), key.clone());
        let found = crate::workers::spawn_blocking(move || open_local_key(&root, beneath.as_deref(), &key))
            .await
            .map_err(joined)??;
        Ok(match found {
            LocalFile::Missing => None,
            LocalFile::Found(meta, _) => Some(meta),
        })
    }

    /// Small ranges are read whole: from memory on the worker when they are there, otherwise
    /// in the blocking call that opens the file. Larger ones stream from the file.
    async fn get(&self, key: &StoreKey, range: Option<ByteRange>) -> Result<Option<GetObject>, StoreError> {
        if let NonBlocking::Done(read) = super::fetch_nowait(self, key, range) {
            return Ok(read?.map(|(bytes, meta, range)| GetObject {
                range,
                meta,
                body: super::one_piece(bytes),
            }));
        }
        let (root, beneath, key) = (self.root.clone(), self.nowait.clone(), key.clone());
        let opened = crate::workers::spawn_blocking(move || -> Result<LocalRead, StoreError> {
            let Some((meta, range, mut file)) = open_local_range(&root, beneath.as_deref(), &key, range)? else {
                return Ok(None);
            };
            if range.end - range.start <= SMALL_READ {
                let mut buf = super::SpareBuffer::take();
                read_range(&mut file, &key, &range, &mut buf.0)?;
                return Ok(Some((meta, range, Ok(Bytes::from_owner(buf)))));
            }
            Ok(Some((meta, range, Err(file))))
        })
        .await
        .map_err(joined)??;
        let Some((meta, range, content)) = opened else {
            return Ok(None);
        };
        let body = match content {
            Ok(bytes) => super::one_piece(bytes),
            Err(file) => {
                let mut file = tokio::fs::File::from_std(file);
                file.seek(std::io::SeekFrom::Start(range.start)).await?;
                body_stream(ReaderStream::with_capacity(
                    file.take(range.end - range.start),
                    FILE_READ_CHUNK,
                ))
            }
        };
        Ok(Some(GetObject { meta, range, body }))
    }
}

impl ObjectStoreBackend {
    /// [`Backend::get`], with `If-None-Match: version` when one is given: an object still of
    /// that version is [`Revalidated::Unchanged`] (the upstream's 304).
    async fn get_with(
        &self,
        key: &StoreKey,
        range: Option<ByteRange>,
        if_none_match: Option<&str>,
    ) -> Result<Revalidated<Option<GetObject>>, StoreError> {
        if key.is_root() {
            return Ok(Revalidated::Changed(None));
        }
        if let Some(local) = &self.local {
            return Ok(Revalidated::Changed(local.get(key, range).await?));
        }

        let range = match range {
            // The size tells the range, or that it has no bytes (a suffix of none, any suffix
            // of an empty object): that is the caller's to answer (416, or the whole empty
            // object), not a bounded range of no bytes, which object_store refuses (502).
            Some(ByteRange::Suffix(n)) if !self.suffix_ranges => match self.head(key).await? {
                Some(meta) => {
                    let r = super::resolve_range(Some(ByteRange::Suffix(n)), meta.size)?;
                    Some(ByteRange::Bounded(r.start, r.end))
                }
                None => return Ok(Revalidated::Changed(None)),
            },
            r => r,
        };
        let options = GetOptions {
            range: range.map(|r| match r {
                ByteRange::Bounded(a, b) => GetRange::Bounded(a..b),
                ByteRange::From(a) => GetRange::Offset(a),
                ByteRange::Suffix(n) => GetRange::Suffix(n),
            }),
            if_none_match: if_none_match.map(str::to_owned),
            ..Default::default()
        };
        let path = self.path(key)?;
        if !Self::addressable(&path) {
            return Ok(Revalidated::Changed(None));
        }
        // Whether this read asks for the whole object and cuts the range out itself: what it
        // sent decides, not the flag, which another read may set meanwhile.
        let mut cutting = range.is_some() && self.refusing_ranges();
        let whole = GetOptions {
            if_none_match: if_none_match.map(str::to_owned),
            ..Default::default()
        };
        let sent = if cutting { whole.clone() } else { options };
        let result = match self.with_permit(self.store.get_opts(&path, sent)).await {
            Ok(r) => r,
            // An origin that answered a range with the whole object: read it whole, and cut.
            // Only a range of part of a non-empty object shows that the origin serves no ranges
            // (of an empty object, or one the range covers whole, servers may answer 200).
            Err(object_store::Error::NotSupported { .. }) if range.is_some() && !cutting => {
                cutting = true;
                let whole = match self.with_permit(self.store.get_opts(&path, whole)).await {
                    Ok(r) => r,
                    Err(object_store::Error::NotModified { .. }) => return Ok(Revalidated::Unchanged),
                    Err(e) => return self.missing_or(e).map(Revalidated::Changed),
                };
                let size = whole.meta.size;
                if range
                    .and_then(|r| r.resolve(size))
                    .is_some_and(|part| part != (0..size))
                {
                    tracing::info!(%key, "the upstream does not serve ranges: whole objects are read and cut");
                    if let Ok(mut at) = self.ranges_refused.lock() {
                        *at = Some(std::time::Instant::now());
                    }
                }
                whole
            }
            // A range the object cannot satisfy: the upstream answers 416, which object_store
            // reports as a generic error. A HEAD, made only then (not after a timeout or a 5xx,
            // which it would only repeat), gives the size the client is told.
            Err(e) if range.is_some() && has_status(&e, "416") => {
                if let Ok(Some(meta)) = self.head(key).await {
                    super::resolve_range(range, meta.size)?;
                }
                return self.missing_or(e).map(Revalidated::Changed);
            }
            Err(object_store::Error::NotModified { .. }) => return Ok(Revalidated::Unchanged),
            Err(e) => return self.missing_or(e).map(Revalidated::Changed),
        };
        let meta = meta_from(&result.meta);
        if cutting {
            let wanted = super::resolve_range(range, meta.size)?;
            let GetResultPayload::Stream(whole) = result.payload else {
                return Err(StoreError::Io(
                    "a whole-object read of a remote store was a file".into(),
                ));
            };
            let body = cut(body_stream(whole), wanted.clone());
            return Ok(Revalidated::Changed(Some(GetObject {
                meta,
                range: wanted,
                body,
            })));
        }
        let range = result.range.clone();
        let body = match result.payload {
            GetResultPayload::File(file, _) => {
                let mut file = tokio::fs::File::from_std(file);
                file.seek(std::io::SeekFrom::Start(range.start)).await?;
                body_stream(ReaderStream::with_capacity(
                    file.take(range.end - range.start),
                    FILE_READ_CHUNK,
                ))
            }
            GetResultPayload::Stream(s) => body_stream(s),
        };
        Ok(Revalidated::Changed(Some(GetObject { meta, range, body })))
    }
    /// Whether the upstream refused a range recently (see `ranges_refused`).
    fn refusing_ranges(&self) -> bool {
        self.ranges_refused
            .lock()
            .is_ok_and(|at| at.is_some_and(|at| at.elapsed() < RANGES_REFUSED_FOR))
    }

    /// A read's error: `None` for a missing key (and for a refused one, where that means
    /// missing: [`Self::denied_is_missing`]).
    fn missing_or<T>(&self, e: object_store::Error) -> Result<Option<T>, StoreError> {
        match e {
            object_store::Error::NotFound { .. } => Ok(None),
            object_store::Error::PermissionDenied { .. } if self.denied_is_missing => {
                tracing::debug!(error = %e, "a refused key of an anonymous mount is missing");
                Ok(None)
            }
            e => Err(e.into()),
        }
    }
}

/// `range` of a stream of an object's bytes from its start: what comes before is dropped,
/// and the stream ends once the range is sent.
fn cut(
    body: futures::stream::BoxStream<'static, Result<Bytes, StoreError>>,
    range: Range<u64>,
) -> futures::stream::BoxStream<'static, Result<Bytes, StoreError>> {
    use futures::StreamExt;
    body.scan(0u64, move |at, piece| {
        let next = match piece {
            Err(e) => Some(Some(Err(e))),
            Ok(_) if *at >= range.end => None,
            Ok(bytes) => {
                let start = *at;
                *at += bytes.len() as u64;
                let lo = range.start.max(start) - start;
                let hi = range.end.min(*at).saturating_sub(start);
                Some((lo < hi).then(|| Ok(bytes.slice(lo as usize..hi as usize))))
            }
        };
        std::future::ready(next)
    })
    .filter_map(std::future::ready)
    .boxed()
}

impl From<object_store::Error> for StoreError {
    fn from(e: object_store::Error) -> Self {
        use object_store::Error as E;
        match e {
            E::PermissionDenied { .. } | E::Unauthenticated { .. } => StoreError::Denied(e.to_string()),
            // object_store's text names its internals (the client, the operation); it goes to
            // the log, and the client hears what it can act on.
            E::NotSupported { .. } | E::NotImplemented { .. } => {
                tracing::warn!(error = %e, "upstream store does not support a request");
                StoreError::NotSupported("the upstream store does not support this request".into())
            }
            other if timed_out(&other) => StoreError::Timeout(other.to_string()),
            // A 401/403 that object_store reports as a generic failure (a LIST that the
            // bucket's policy refuses, where GETs are allowed) is a refusal all the same.
            other if refused(&other) => StoreError::Denied(other.to_string()),
            other => StoreError::Io(other.to_string()),
        }
    }
}

/// Whether an error was caused by a timeout: an HTTP request object_store reports as timed
/// out, or an I/O timeout, anywhere in its chain of sources. (Its text is no guide: every
/// retried error names the `retry_timeout` setting.)
fn timed_out(e: &(dyn std::error::Error + 'static)) -> bool {
    in_chain(e, |err| {
        let http = err.downcast_ref::<object_store::client::HttpError>();
        http.is_some_and(|h| h.kind() == object_store::client::HttpErrorKind::Timeout)
            || err
                .downcast_ref::<std::io::Error>()
                .is_some_and(|io| io.kind() == std::io::ErrorKind::TimedOut)
    })
}

/// Whether `e` or any error in its chain of sources is one that `is` says.
fn in_chain(e: &(dyn std::error::Error + 'static), is: impl Fn(&(dyn std::error::Error + 'static)) -> bool) -> bool {
    std::iter::successors(Some(e), |err| err.source()).any(is)
}

/// Whether an error's chain holds an HTTP status of 401 or 403. object_store maps those to
/// `PermissionDenied` / `Unauthenticated` for object requests but not for listings, whose
/// errors are `Generic`, and its retry error type is private: its text is what tells
/// ("Server returned non-2xx status code: 403 Forbidden: ...").
fn refused(e: &(dyn std::error::Error + 'static)) -> bool {
    has_status(e, "401") || has_status(e, "403")
}

/// Whether an error's chain holds an HTTP response of status `code` (see [`refused`]).
fn has_status(e: &(dyn std::error::Error + 'static), code: &str) -> bool {
    let said = format!("Server returned non-2xx status code: {code} ");
    in_chain(e, |err| err.to_string().starts_with(&said))
}

impl From<std::io::Error> for StoreError {
    fn from(e: std::io::Error) -> Self {
        StoreError::Io(e.to_string())
    }
}

/// Blocking reads of the files under a local root.
#[derive(Debug)]
struct LocalFiles {
    root: PathBuf,
    /// The root opened for reads that do not wait, where the platform has them.
    nowait: Option<Arc<nonblocking::Root>>,
}

impl BlockingRead for LocalFiles {
    fn read_into(
        &self,
        key: &StoreKey,
        range: Option<ByteRange>,
        most: u64,
        buf: &mut Vec<u8>,
    ) -> Result<Option<ObjectMeta>, StoreError> {
        let Some((meta, range, mut file)) = open_local_range(&self.root, self.nowait.as_deref(), key, range)? else {
            return Ok(None);
        };
        if range.end - range.start > most {
            return Err(StoreError::TooLarge {
                key: key.to_string(),
                size: range.end - range.start,
                max: most,
            });
        }
        read_range(&mut file, key, &range, buf)?;
        Ok(Some(meta))
    }

    fn open_range(&self, key: &StoreKey, range: Range<u64>) -> Result<Option<super::OpenedRange>, StoreError> {
        use std::io::{Read, Seek};
        let Some((meta, range, mut file)) = open_local_range(
            &self.root,
            self.nowait.as_deref(),
            key,
            Some(ByteRange::Bounded(range.start, range.end)),
        )?
        else {
            return Ok(None);
        };
        file.seek(std::io::SeekFrom::Start(range.start))?;
        Ok(Some((meta, Box::new(file.take(range.end - range.start)))))
    }

    fn read_nowait(
        &self,
        key: &StoreKey,
        range: Option<ByteRange>,
        buf: &mut Vec<u8>,
    ) -> NonBlocking<Result<nonblocking::Read, StoreError>> {
        match self.nowait.as_ref() {
            Some(root) => root.read(key, range, SMALL_READ, buf),
            None => NonBlocking::WouldBlock,
        }
    }
}

#[async_trait]
impl Backend for ObjectStoreBackend {
    fn blocking_reader(&self) -> Option<Arc<dyn BlockingRead>> {
        self.local.clone().map(|l| l as Arc<dyn BlockingRead>)
    }

    async fn head(&self, key: &StoreKey) -> Result<Option<ObjectMeta>, StoreError> {
        if key.is_root() {
            return Ok(None);
        }
        if let Some(local) = &self.local {
            return local.head(key).await;
        }
        let path = self.path(key)?;
        if !Self::addressable(&path) {
            return Ok(None);
        }
        match self.with_permit(self.store.head(&path)).await {
            Ok(m) => Ok(Some(meta_from(&m))),
            Err(e) => self.missing_or(e),
        }
    }

    async fn get(&self, key: &StoreKey, range: Option<ByteRange>) -> Result<Option<GetObject>, StoreError> {
        match self.get_with(key, range, None).await? {
            Revalidated::Changed(found) => Ok(found),
            Revalidated::Unchanged => Err(StoreError::Io("an unconditional read was answered 304".into())),
        }
    }

    async fn get_unless(
        &self,
        key: &StoreKey,
        range: Option<ByteRange>,
        version: &str,
    ) -> Result<Revalidated<Option<GetObject>>, StoreError> {
        self.get_with(key, range, Some(version)).await
    }

    async fn head_unless(&self, key: &StoreKey, version: &str) -> Result<Revalidated<Option<ObjectMeta>>, StoreError> {
        if key.is_root() || self.local.is_some() {
            return Ok(Revalidated::Changed(self.head(key).await?));
        }
        let path = self.path(key)?;
        if !Self::addressable(&path) {
            return Ok(Revalidated::Changed(None));
        }
        let options = GetOptions {
            head: true,
            if_none_match: Some(version.to_owned()),
            ..Default::default()
        };
        match self.with_permit(self.store.get_opts(&path, options)).await {
            Ok(found) => Ok(Revalidated::Changed(Some(meta_from(&found.meta)))),
            Err(object_store::Error::NotModified { .. }) => Ok(Revalidated::Unchanged),
            Err(e) => self.missing_or(e).map(Revalidated::Changed),
        }
    }

    fn resolves_ranges(&self) -> bool {
        true
    }

    fn serves_ranges(&self) -> bool {
        !self.refusing_ranges()
    }

    async fn list(&self, prefix: &StoreKey) -> Result<Listing, StoreError> {
        if !self.can_list {
            return Err(StoreError::NotSupported("an HTTP origin cannot be listed".into()));
        }
        if !prefix.is_root() && !self.contained(prefix).await {
            return Ok(Listing::default());
        }
        if let Some(root) = self.local_root() {
            let (root, dir) = (root.to_owned(), root.join(prefix.as_str()));
            return crate::workers::spawn_blocking(move || list_local(&root, &dir))
                .await
                .map_err(joined)?;
        }
        let path = self.path(prefix)?;
        if !Self::addressable(&path) {
            return Ok(Listing::default());
        }
        let listing = self
            .store
            .list_with_delimiter(if path.as_ref().is_empty() { None } else { Some(&path) });
        let listed = match self.with_permit(listing).await {
            Ok(l) => l,
            Err(object_store::Error::NotFound { .. }) => return Ok(Listing::default()),
            Err(e) => return Err(e.into()),
        };
        // Bucket keys may hold what a key here cannot (a backslash, a control character):
        // those names are left out, as for local directories.
        let name = |p: &Path| p.filename().filter(|n| StoreKey::new(n).is_ok()).map(str::to_owned);
        let mut prefixes: Vec<String> = listed.common_prefixes.iter().filter_map(name).collect();
        let mut objects: Vec<String> = listed.objects.iter().filter_map(|m| name(&m.location)).collect();
        prefixes.sort();
        objects.sort();
        Ok(Listing { prefixes, objects })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A store without suffix ranges (Azure) reads one by its size and a bounded range; a
    /// suffix of no bytes, or of an empty object, is the same range error as on a local disk
    /// (416, or the whole empty object), not an upstream failure.
    #[tokio::test]
    async fn suffix_ranges_without_upstream_support() {
        let memory = Arc::new(object_store::memory::InMemory::new());
        memory
            .put(&Path::from("p/a"), b"0123456789".to_vec().into())
            .await
            .unwrap();
        memory.put(&Path::from("p/empty"), Vec::new().into()).await.unwrap();
        let store = ObjectStoreBackend::new(memory, "p").without_suffix_ranges();
        let key = |k: &str| StoreKey::new(k).unwrap();
        let read = |k: &'static str, n: u64| {
            let store = &store;
            async move {
                match store.get(&key(k), Some(ByteRange::Suffix(n))).await {
                    Ok(Some(o)) => Ok((o.range.clone(), o.bytes().await.unwrap().to_vec())),
                    Ok(None) => panic!("{k} missing"),
                    Err(e) => Err(e),
                }
            }
        };
        assert_eq!(read("a", 3).await.unwrap(), (7..10, b"789".to_vec()));
        assert_eq!(read("a", 30).await.unwrap(), (0..10, b"0123456789".to_vec()));
        assert!(matches!(read("a", 0).await, Err(StoreError::Range { size: 10, .. })));
        assert!(matches!(read("empty", 5).await, Err(StoreError::Range { size: 0, .. })));
        assert!(
            store
                .get(&key("nothing"), Some(ByteRange::Suffix(2)))
                .await
                .unwrap()
                .is_none()
        );
    }

    /// A listing refused by the bucket (object_store: a generic error whose cause is the 403
    /// response) is a refusal (502 upstream_denied), not a failure (502 upstream_error).
    #[test]
    fn refused_listings_are_denied() {
        #[derive(Debug)]
        struct Status(&'static str);
        impl std::fmt::Display for Status {
            fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
                write!(
                    f,
                    "Server returned non-2xx status code: {}: <Error>AccessDenied</Error>",
                    self.0
                )
            }
        }
        impl std::error::Error for Status {}
        #[derive(Debug)]
        struct Listing(Status);
        impl std::fmt::Display for Listing {
            fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
                write!(f, "Error performing list request")
            }
        }
        impl std::error::Error for Listing {
            fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
                Some(&self.0)
            }
        }
        let generic = |status| object_store::Error::Generic {
            store: "S3",
            source: Box::new(Listing(Status(status))),
        };
        assert!(matches!(
            StoreError::from(generic("403 Forbidden")),
            StoreError::Denied(_)
        ));
        assert!(matches!(
            StoreError::from(generic("401 Unauthorized")),
            StoreError::Denied(_)
        ));
        assert!(matches!(
            StoreError::from(generic("503 Service Unavailable")),
            StoreError::Io(_)
        ));
        assert!(matches!(StoreError::from(generic("4031 Odd")), StoreError::Io(_)));
    }

    #[test]
    fn only_timeouts_are_timeouts() {
        use object_store::client::{HttpError, HttpErrorKind};
        let generic =
            |source: Box<dyn std::error::Error + Send + Sync>| object_store::Error::Generic { store: "S3", source };
        let timeout = HttpError::new(HttpErrorKind::Timeout, std::io::Error::other("deadline"));
        assert!(matches!(
            StoreError::from(generic(Box::new(timeout))),
            StoreError::Timeout(_)
        ));
        let io = std::io::Error::new(std::io::ErrorKind::TimedOut, "read");
        assert!(matches!(
            StoreError::from(generic(Box::new(io))),
            StoreError::Timeout(_)
        ));
        // A refused connection after retries names retry_timeout in its text; it is no timeout.
        let refused = HttpError::new(
            HttpErrorKind::Connect,
            std::io::Error::other("after 3 retries, retry_timeout: 180s"),
        );
        assert!(matches!(
            StoreError::from(generic(Box::new(refused))),
            StoreError::Io(_)
        ));
        let slow_down = std::io::Error::other("503 SlowDown, retry_timeout: 180s");
        assert!(matches!(
            StoreError::from(generic(Box::new(slow_down))),
            StoreError::Io(_)
        ));
    }

    /// The blocking path decides symlinks as `realpath` does, with the root opened for the
    /// kernel's lookups or without: links that stay inside are followed (absolute ones by the
    /// fallback), links out of the root name nothing.
    #[cfg(unix)]
    #[test]
    fn blocking_opens_follow_links_only_inside_the_root() {
        let (_dir, root) = super::nonblocking::tests::link_tree();
        let beneath = super::nonblocking::Root::open(&root);
        if std::env::var_os("ZARRGATE_EXPECT_NOWAIT").is_some() {
            assert!(beneath.is_some(), "the kernel's lookups are not available here");
        }
        for with in [beneath.as_ref(), None] {
            for (name, want) in [
                ("sub/inside", Some(&b"inside"[..])),
                ("relative_in", Some(b"inside")),
                ("absolute_in", Some(b"inside")),
                ("sub/round_trip", Some(b"inside")),
                ("relative_out", None),
                ("absolute_out", None),
                ("proc", None),
                ("loop", None),
                ("missing", None),
                ("sub", None),
            ] {
                let key = StoreKey::new(name).unwrap();
                let found = open_local_range(&root, with, &key, None).unwrap();
                let got = found.map(|(_, range, file)| {
                    let mut buf = Vec::new();
                    read_range(&mut { file }, &key, &range, &mut buf).unwrap();
                    buf
                });
                assert_eq!(got.as_deref(), want, "{name}, kernel lookups: {}", with.is_some());
            }
        }
    }

    /// Without reads that do not wait (another platform or filesystem), every read takes the
    /// blocking path: small ranges whole into a spare buffer, larger ones streamed.
    #[tokio::test]
    async fn local_reads_on_the_blocking_path() {
        use futures::TryStreamExt;
        let dir = tempfile::tempdir().unwrap();
        let data: Vec<u8> = (0..SMALL_READ as usize + 5000).map(|i| (i % 251) as u8).collect();
        std::fs::write(dir.path().join("f"), &data).unwrap();
        let files = LocalFiles {
            root: std::fs::canonicalize(dir.path()).unwrap(),
            nowait: None,
        };
        let key = StoreKey::new("f").unwrap();
        let read = |range: Option<ByteRange>| {
            let (files, key) = (&files, &key);
            async move {
                let object = files.get(key, range).await.unwrap().unwrap();
                let chunks: Vec<Bytes> = object.body.try_collect().await.unwrap();
                (object.range, chunks)
            }
        };
        let (range, chunks) = read(Some(ByteRange::Bounded(10, 4106))).await;
        assert_eq!((range, chunks.len()), (10..4106, 1));
        assert_eq!(&chunks[0][..], &data[10..4106]);
        let (range, chunks) = read(Some(ByteRange::Suffix(7))).await;
        assert_eq!(range, data.len() as u64 - 7..data.len() as u64);
        assert_eq!(&chunks[0][..], &data[data.len() - 7..]);
        let (range, chunks) = read(None).await;
        assert_eq!(range, 0..data.len() as u64);
        assert!(chunks.len() > 1, "streamed");
        assert_eq!(chunks.concat(), data);
        assert!(
            files
                .get(&StoreKey::new("missing").unwrap(), None)
                .await
                .unwrap()
                .is_none()
        );
        let mut buf = vec![1, 2, 3];
        let meta = files
            .read_into(&key, Some(ByteRange::From(5)), u64::MAX, &mut buf)
            .unwrap()
            .unwrap();
        assert_eq!((meta.size, &buf[..]), (data.len() as u64, &data[5..]));
    }

    #[test]
    fn unsupported_requests_do_not_show_object_store_text() {
        let source: Box<dyn std::error::Error + Send + Sync> =
            Box::new(std::io::Error::other("S3Client::copy_if_not_exists"));
        for e in [
            object_store::Error::NotSupported { source },
            object_store::Error::NotImplemented {
                operation: "list_with_delimiter".into(),
                implementer: "HttpStore".into(),
            },
        ] {
            let StoreError::NotSupported(message) = StoreError::from(e) else {
                panic!("not NotSupported");
            };
            assert_eq!(message, "the upstream store does not support this request");
        }
    }
}
