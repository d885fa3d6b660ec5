//! Reference mounts (`format = "references"`): a kerchunk reference file (JSON, versions 0 and
//! 1 alike) served as the Zarr store it describes. Each key is inline bytes of the file, or a
//! byte range (or the whole) of another object: relative URLs are read beside the reference
//! file, absolute ones only below the mount's `virtual_prefixes`, with the mount's credentials.
//!
//! The file is read at the first request and read again when it has changed, checked at most
//! once per `cache.ttl_seconds`. Spec: <https://fsspec.github.io/kerchunk/spec.html>

mod parquet;
mod parse;

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;
use std::time::{Duration, Instant};

use async_trait::async_trait;
use bytes::Bytes;
use futures::stream;

pub use parse::{Reference, parse};

use super::cached::{Freshness, RawCache};
use super::{Backend, ByteRange, GetObject, Listing, ObjectMeta, Store, StoreError, StoreKey, resolve_range};
use crate::config::{MountConfig, MountSource};

/// The largest reference file read (its table takes a few times this in memory).
pub const MAX_REFERENCE_BYTES: u64 = 256 << 20;

/// The stores references may point into: the directory of the reference file (relative
/// URLs), and one store per allowed prefix.
#[derive(Debug)]
pub struct Targets {
    /// The store of the reference file's directory (relative URLs are keys in it).
    pub own: Store,
    /// `(prefix, store)`: URLs starting with the prefix (which ends with `/`) are the rest of
    /// the URL in the store.
    pub prefixes: Vec<(String, Store)>,
}

/// A URL's scheme and authority, to name it without its path.
fn origin_of(url: &str) -> String {
    let url = crate::config::redact(url);
    match url.split_once("://") {
        Some((scheme, rest)) => format!("{scheme}://{}/", rest.split('/').next().unwrap_or("")),
        None => url.split('/').take(2).collect::<Vec<_>>().join("/") + "/",
    }
}

impl Targets {
    /// The store and key a reference's URL names.
    fn resolve(&self, url: &str) -> Result<(Store, StoreKey), StoreError> {
        let absolute;
        let url = match url.starts_with('/') {
            true => {
                absolute = format!("file://{url}");
                absolute.as_str()
            }
            false => url,
        };
        if !url.contains("://") {
            let key = StoreKey::new(url).map_err(|e| StoreError::NotAllowed(format!("reference to '{url}': {e}")))?;
            return Ok((self.own.clone(), key));
        }
        let (prefix, store) = self
            .prefixes
            .iter()
            .filter(|(prefix, _)| url.starts_with(prefix.as_str()))
            .max_by_key(|(prefix, _)| prefix.len())
            .ok_or_else(|| {
                StoreError::NotAllowed(format!(
                    "a reference into '{}' is outside the mount's virtual_prefixes",
                    origin_of(url)
                ))
            })?;
        let rest = &url[prefix.len()..];
        // An http(s) URL's path is percent-encoded, and the HTTP store encodes keys itself: it
        // is decoded once, as a request's path is (a trailing slash names no object), as
        // clients send such URLs as written.
        let key =
            match url.starts_with("http://") || url.starts_with("https://") {
                true => StoreKey::from_url_path(rest.split(['?', '#']).next().unwrap_or(rest)).and_then(
                    |(key, directory)| match directory {
                        true => Err(super::KeyError::EmptySegment),
                        false => Ok(key),
                    },
                ),
                false => StoreKey::new(rest),
            }
            .map_err(|e| StoreError::NotAllowed(format!("reference below '{prefix}': {e}")))?;
        Ok((store.clone(), key))
    }
}

/// The child prefixes and objects of each directory of a set of keys ("" is the root), for
/// listings of stores whose keys are a table.
#[derive(Debug, Default)]
pub(crate) struct Directories(BTreeMap<String, (BTreeSet<String>, BTreeSet<String>)>);

impl Directories {
    pub(crate) fn new<'a>(keys: impl Iterator<Item = &'a str>) -> Self {
        let mut directories: BTreeMap<String, (BTreeSet<String>, BTreeSet<String>)> = BTreeMap::new();
        directories.entry(String::new()).or_default();
        for key in keys {
            let mut dir = String::new();
            let mut segments = key.split('/').peekable();
            while let Some(segment) = segments.next() {
                let children = directories.entry(dir.clone()).or_default();
                if segments.peek().is_none() {
                    children.1.insert(segment.to_owned());
                } else {
                    children.0.insert(segment.to_owned());
                    if !dir.is_empty() {
                        dir.push('/');
                    }
                    dir.push_str(segment);
                }
            }
        }
        Self(directories)
    }

    /// The listing of the directory `prefix` (empty when there is none).
    pub(crate) fn list(&self, prefix: &StoreKey) -> Listing {
        self.0
            .get(prefix.as_str())
            .map(|(prefixes, objects)| Listing {
                prefixes: prefixes.iter().cloned().collect(),
                objects: objects.iter().cloned().collect(),
            })
            .unwrap_or_default()
    }
}

/// The keys of a reference file, and its directories for listings.
#[derive(Debug)]
struct Table {
    entries: BTreeMap<String, Reference>,
    directories: Directories,
    /// Names this state of the reference file in the versions of its keys.
    tag: u32,
}

impl Table {
    fn new(entries: BTreeMap<String, Reference>, meta: &ObjectMeta) -> Self {
        let directories = Directories::new(entries.keys().map(String::as_str));
        let tag = crc32c::crc32c(format!("{:?}/{}", meta.version, meta.size).as_bytes());
        Self {
            entries,
            directories,
            tag,
        }
    }
}

/// The reference file as last read, or why it could not be.
#[derive(Debug)]
enum Loaded {
    Table {
        table: Arc<Table>,
        /// The state of `watched`: the reference file, or the `.zmetadata` of a parquet set.
        meta: ObjectMeta,
        watched: StoreKey,
        checked: Instant,
    },
    /// Answered until the next check, rather than read again by every request.
    Failed { error: StoreError, at: Instant },
}

/// A reference file as a store.
#[derive(Debug)]
pub struct ReferenceBackend {
    file: StoreKey,
    targets: Targets,
    check_every: Duration,
    loaded: tokio::sync::Mutex<Option<Loaded>>,
}

impl ReferenceBackend {
    /// The store described by the reference file `file` of `targets.own`, checked for changes
    /// at most once per `check_every`.
    pub fn new(file: StoreKey, targets: Targets, check_every: Duration) -> Self {
        Self {
            file,
            targets,
            check_every,
            loaded: tokio::sync::Mutex::new(None),
        }
    }

    fn corrupt(&self, message: String) -> StoreError {
        StoreError::Corrupt {
            key: self.file.as_str().to_owned(),
            message,
        }
    }

    /// The table of the reference file as it is now: read again when it has changed, checked
    /// at most once per `check_every`. A check that fails keeps the table held (logged); a
    /// read that fails is the answer until the next check.
    async fn table(&self) -> Result<Arc<Table>, StoreError> {
        let mut loaded = self.loaded.lock().await;
        let store = &self.targets.own;
        match loaded.as_mut() {
            Some(Loaded::Table {
                table,
                meta,
                watched,
                checked,
            }) => {
                if checked.elapsed() < self.check_every {
                    return Ok(table.clone());
                }
                match store.head(watched).await {
                    Ok(Some(now)) if now.same_object(meta) => {
                        *checked = Instant::now();
                        return Ok(table.clone());
                    }
                    Ok(_) => {}
                    Err(e) => {
                        tracing::warn!(file = %self.file, error = %e, "cannot check the reference file: serving it as last read");
                        *checked = Instant::now();
                        return Ok(table.clone());
                    }
                }
            }
            Some(Loaded::Failed { error, at }) if at.elapsed() < self.check_every => return Err(error.clone()),
            _ => {}
        }
        let read = self.read_table().await;
        *loaded = Some(match &read {
            Ok((table, meta, watched)) => Loaded::Table {
                table: table.clone(),
                meta: meta.clone(),
                watched: watched.clone(),
                checked: Instant::now(),
            },
            Err(error) => Loaded::Failed {
                error: error.clone(),
                at: Instant::now(),
            },
        });
        read.map(|(table, _, _)| table)
    }

    /// Reads and parses the reference file (at most [`MAX_REFERENCE_BYTES`] of it), or, where
    /// `file` is a directory holding `.zmetadata`, the parquet reference set there (at most
    /// [`MAX_REFERENCE_BYTES`] of files together). Answers the table, and the key whose state
    /// tells when to read it again, with that state.
    async fn read_table(&self) -> Result<(Arc<Table>, ObjectMeta, StoreKey), StoreError> {
        let mut budget = MAX_REFERENCE_BYTES;
        let Some((text, meta)) = self.read_within(&self.file, &mut budget).await? else {
            let layout_key = self
                .file
                .join(parquet::ZMETADATA)
                .map_err(|e| self.corrupt(e.to_string()))?;
            let Some((text, meta)) = self.read_within(&layout_key, &mut budget).await? else {
                return Err(self.corrupt("the reference file does not exist".into()));
            };
            return self.read_parquet(layout_key, (text, meta), budget).await;
        };
        let table_meta = meta.clone();
        let table = tokio::task::spawn_blocking(move || parse(&text).map(|entries| Table::new(entries, &table_meta)))
            .await
            .map_err(|_| StoreError::Io("reading a reference file failed".into()))?
            .map_err(|e| self.corrupt(e))?;
        Ok((Arc::new(table), meta, self.file.clone()))
    }

    /// All of `key`, if it exists, within `budget` bytes (checked on the size its answer
    /// states, before its body is read), which it takes from.
    async fn read_within(&self, key: &StoreKey, budget: &mut u64) -> Result<Option<(Bytes, ObjectMeta)>, StoreError> {
        let Some(got) = self.targets.own.get(key, None).await? else {
            return Ok(None);
        };
        if got.meta.size > *budget {
            return Err(self.corrupt(format!(
                "the reference set is over {MAX_REFERENCE_BYTES} bytes, at most which are read ('{key}')"
            )));
        }
        *budget -= got.meta.size;
        let meta = got.meta.clone();
        Ok(Some((got.bytes().await?, meta)))
    }

    /// Reads the parquet reference set whose `.zmetadata` is `layout_key` (read: `text`, in the
    /// state `meta`): its record files one by one, within `budget` bytes, their rows parsed
    /// off the async workers.
    async fn read_parquet(
        &self,
        layout_key: StoreKey,
        (text, meta): (Bytes, ObjectMeta),
        mut budget: u64,
    ) -> Result<(Arc<Table>, ObjectMeta, StoreKey), StoreError> {
        let layout = parquet::layout(&text).map_err(|e| self.corrupt(e))?;
        let mut entries = layout.metadata;
        // What the rows may take decoded (keys, URLs, inline bytes): compressed record files
        // are bounded by `budget`, their contents by this.
        let mut decoded_budget = 4 * MAX_REFERENCE_BYTES;
        for array in &layout.arrays {
            for n in 0..array.files(layout.record_size) {
                let key = self
                    .file
                    .join(&array.file(n))
                    .map_err(|e| self.corrupt(format!("record file of '{}': {e}", array.path)))?;
                // A record file of chunks none of which were set is not written (fsspec):
                // those chunks are missing.
                let Some((bytes, _)) = self.read_within(&key, &mut budget).await? else {
                    continue;
                };
                let (array, record_size) = (array.clone(), layout.record_size);
                let mut taken = std::mem::take(&mut entries);
                let mut decoded = decoded_budget;
                let parsed = tokio::task::spawn_blocking(move || {
                    parquet::read_records(bytes, &array, n, record_size, &mut taken, &mut decoded)
                        .map(|()| (taken, decoded))
                })
                .await;
                (entries, decoded_budget) = match parsed {
                    Ok(parsed) => parsed.map_err(|e| self.corrupt(e))?,
                    // A panic of the parquet reader on bytes it cannot read.
                    Err(_) => return Err(self.corrupt(format!("'{key}' is not readable as parquet"))),
                };
            }
        }
        let table = Table::new(entries, &meta);
        Ok((Arc::new(table), meta, layout_key))
    }
}

/// The metadata a key read through `reference` shows: its size, and a version naming `state`
/// (the reference file's, or the snapshot's), the reference, and the state of the object it
/// reads.
fn reference_meta(state: u32, reference: &Reference, size: u64, source: Option<&ObjectMeta>) -> ObjectMeta {
    let (what, offset, length) = match reference {
        Reference::Inline(bytes) => (format!("{:08x}", crc32c::crc32c(bytes)), 0, 0),
        Reference::Whole { url } => (url.to_string(), 0, 0),
        Reference::Range { url, offset, length } => (url.to_string(), *offset, *length),
    };
    let reference = crc32c::crc32c(format!("{what}/{offset}/{length}").as_bytes());
    // The source's ETag, or else its size and time (an origin may send no ETag).
    let source = source.map(|m| {
        let source_state = match &m.version {
            Some(v) => v.clone(),
            None => format!("{}/{:?}", m.size, m.last_modified),
        };
        format!("-{:08x}", crc32c::crc32c(source_state.as_bytes()))
    });
    ObjectMeta {
        size,
        last_modified: None,
        version: Some(format!("{state:08x}{reference:08x}{}", source.unwrap_or_default())),
    }
}

/// What the object a reference reads must still be, as its writer saw it (an Icechunk virtual
/// chunk's checksum): else the bytes are not those the reference describes.
#[derive(Debug, Clone, PartialEq)]
pub(crate) enum Expected {
    /// The object's ETag (unquoted).
    ETag(String),
    /// Not modified after this time.
    UnmodifiedSince(std::time::SystemTime),
}

impl Expected {
    /// A corrupt-data error naming `key` when `source` is not what was expected; a source
    /// whose store tells neither its ETag nor its time is taken as it is, and so is the ETag
    /// of a local file (whose version here is no ETag a writer saw). Times in whole seconds,
    /// as checksums hold them.
    fn check(&self, key: &StoreKey, url: &str, source: &ObjectMeta, local: bool) -> Result<(), StoreError> {
        let seconds = |t: std::time::SystemTime| t.duration_since(std::time::UNIX_EPOCH).map_or(0, |d| d.as_secs());
        let changed = match self {
            Expected::ETag(_) if local => false,
            Expected::ETag(etag) => source
                .version
                .as_deref()
                .is_some_and(|v| v.trim_matches('"') != etag.trim_matches('"')),
            Expected::UnmodifiedSince(at) => source.last_modified.is_some_and(|m| seconds(m) > seconds(*at)),
        };
        match changed {
            true => Err(StoreError::Corrupt {
                key: key.as_str().to_owned(),
                message: format!("'{url}' changed after its reference was written"),
            }),
            false => Ok(()),
        }
    }
}

impl Targets {
    /// The object a reference reads: its store's metadata of it, or a corrupt-data error
    /// naming the key when it is missing, shorter than the reference says, or not what it
    /// is `expected` to be.
    async fn source_meta(
        &self,
        key: &StoreKey,
        url: &str,
        end: Option<u64>,
        expected: Option<&Expected>,
    ) -> Result<ObjectMeta, StoreError> {
        let (store, target) = self.resolve(url)?;
        let meta = store.head(&target).await?.ok_or_else(|| StoreError::Corrupt {
            key: key.as_str().to_owned(),
            message: format!("its reference names '{url}', which does not exist"),
        })?;
        if let Some(end) = end
            && meta.size < end
        {
            return Err(past_end(key, url, end, meta.size));
        }
        if let Some(expected) = expected {
            expected.check(key, url, &meta, store.reads_locally())?;
        }
        Ok(meta)
    }

    /// The metadata of `key`, read through `reference` in the store state `state` names, its
    /// source checked against what it is `expected` to be.
    pub(crate) async fn head(
        &self,
        key: &StoreKey,
        reference: &Reference,
        state: u32,
        expected: Option<&Expected>,
    ) -> Result<ObjectMeta, StoreError> {
        Ok(match reference {
            Reference::Inline(bytes) => reference_meta(state, reference, bytes.len() as u64, None),
            Reference::Whole { url } => {
                let source = self.source_meta(key, url, None, expected).await?;
                reference_meta(state, reference, source.size, Some(&source))
            }
            Reference::Range { url, offset, length } => {
                let source = self.source_meta(key, url, Some(offset + length), expected).await?;
                reference_meta(state, reference, *length, Some(&source))
            }
        })
    }

    /// `range` (or all) of `key`, read through `reference` in the store state `state` names,
    /// its source checked against what it is `expected` to be.
    pub(crate) async fn get(
        &self,
        key: &StoreKey,
        reference: &Reference,
        state: u32,
        expected: Option<&Expected>,
        range: Option<ByteRange>,
    ) -> Result<GetObject, StoreError> {
        let (url, offset, length) = match reference {
            Reference::Inline(bytes) => {
                let r = resolve_range(range, bytes.len() as u64)?;
                let part: Bytes = bytes.slice(r.start as usize..r.end as usize);
                return Ok(GetObject {
                    meta: reference_meta(state, reference, bytes.len() as u64, None),
                    range: r,
                    body: super::one_piece(part),
                });
            }
            Reference::Whole { url } => (url, 0, None),
            Reference::Range { url, offset, length } => (url, *offset, Some(*length)),
        };
        let (store, target) = self.resolve(url)?;
        let missing = || StoreError::Corrupt {
            key: key.as_str().to_owned(),
            message: format!("its reference names '{url}', which does not exist"),
        };
        let Some(length) = length else {
            // The whole object, as its store reads it.
            let got = store.get(&target, range).await?.ok_or_else(missing)?;
            if let Some(expected) = expected {
                expected.check(key, url, &got.meta, store.reads_locally())?;
            }
            let meta = reference_meta(state, reference, got.meta.size, Some(&got.meta));
            return Ok(GetObject { meta, ..got });
        };
        let r = resolve_range(range, length)?;
        if r.is_empty() {
            let source = self.source_meta(key, url, Some(offset + length), expected).await?;
            return Ok(GetObject {
                meta: reference_meta(state, reference, length, Some(&source)),
                range: r,
                body: Box::pin(stream::empty()),
            });
        }
        let wanted = ByteRange::Bounded(offset + r.start, offset + r.end);
        let got = match store.get(&target, Some(wanted)).await {
            Ok(got) => got.ok_or_else(missing)?,
            Err(StoreError::Range { size, .. }) => return Err(past_end(key, url, offset + length, size)),
            Err(e) => return Err(e),
        };
        if got.meta.size < offset + length {
            return Err(past_end(key, url, offset + length, got.meta.size));
        }
        if let Some(expected) = expected {
            expected.check(key, url, &got.meta, store.reads_locally())?;
        }
        Ok(GetObject {
            meta: reference_meta(state, reference, length, Some(&got.meta)),
            range: r,
            body: got.body,
        })
    }
}

fn past_end(key: &StoreKey, url: &str, end: u64, size: u64) -> StoreError {
    StoreError::Corrupt {
        key: key.as_str().to_owned(),
        message: format!("its reference reads to byte {end} of '{url}', which has {size}"),
    }
}

#[async_trait]
impl Backend for ReferenceBackend {
    async fn head(&self, key: &StoreKey) -> Result<Option<ObjectMeta>, StoreError> {
        let table = self.table().await?;
        match table.entries.get(key.as_str()) {
            Some(reference) => self.targets.head(key, reference, table.tag, None).await.map(Some),
            None => Ok(None),
        }
    }

    fn resolves_ranges(&self) -> bool {
        true
    }

    async fn get(&self, key: &StoreKey, range: Option<ByteRange>) -> Result<Option<GetObject>, StoreError> {
        let table = self.table().await?;
        match table.entries.get(key.as_str()) {
            Some(reference) => self.targets.get(key, reference, table.tag, None, range).await.map(Some),
            None => Ok(None),
        }
    }

    async fn list(&self, prefix: &StoreKey) -> Result<Listing, StoreError> {
        Ok(self.table().await?.directories.list(prefix))
    }
}

/// The store of `url` (a directory, not an archive), with the mount's other settings.
fn opened_at(
    name: &str,
    config: &MountConfig,
    url: &str,
    check_every: Duration,
    (raw, cache_id, freshness): (&Arc<RawCache>, &Arc<str>, Freshness),
) -> Result<Store, String> {
    let at = MountConfig {
        url: url.to_owned(),
        ..config.clone()
    };
    let source = at.source(name).map_err(|e| e.to_string())?;
    if matches!(source, MountSource::Zip(..)) {
        return Err(format!(
            "{} is a zip archive, not a directory",
            crate::config::redact(url)
        ));
    }
    super::open::open_cached(&source, &at, check_every, (raw, name, cache_id, freshness))
}

/// The stores of a mount's `virtual_prefixes` (each read where its URL says) and
/// `virtual_locations` (each read from its location), each keyed in the raw cache under a
/// cache id of its own.
pub(crate) fn prefix_stores(
    name: &str,
    config: &MountConfig,
    check_every: Duration,
    (raw, cache_id, freshness): (&Arc<RawCache>, &Arc<str>, Freshness),
) -> Result<Vec<(String, Store)>, String> {
    let read_at = config
        .virtual_prefixes
        .iter()
        .map(|p| (p, p))
        .chain(config.virtual_locations.iter());
    let mut prefixes = Vec::new();
    for (n, (prefix, location)) in read_at.enumerate() {
        let normalized = format!("{}/", prefix.trim_end_matches('/'));
        let id: Arc<str> = format!("{cache_id}~{n}").into();
        let location = match location == prefix {
            true => normalized.as_str(),
            false => location.as_str(),
        };
        let store = opened_at(name, config, location, check_every, (raw, &id, freshness))
            .map_err(|e| format!("virtual prefix {}: {e}", crate::config::redact(prefix)))?;
        prefixes.push((normalized, store));
    }
    Ok(prefixes)
}

/// Opens a reference mount: `config.url` is the reference file; its directory and each of
/// `config.virtual_prefixes` are opened as stores (remote ones read through `raw`, keyed
/// under `cache_id`), and the file is checked for changes at most once per `check_every`.
pub fn open(
    name: &str,
    config: &MountConfig,
    check_every: Duration,
    (raw, cache_id, freshness): (&Arc<RawCache>, &Arc<str>, Freshness),
) -> Result<Store, String> {
    let (directory, file) = config.reference_file()?;
    let file = StoreKey::new(&file).map_err(|e| format!("reference file '{file}': {e}"))?;
    let own = opened_at(name, config, &directory.url, check_every, (raw, cache_id, freshness))?;
    let prefixes = prefix_stores(name, config, check_every, (raw, cache_id, freshness))?;
    let targets = Targets { own, prefixes };
    Ok(Store::new(ReferenceBackend::new(file, targets, check_every)))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn local(dir: &std::path::Path) -> Store {
        Store::new(super::super::open_local(dir).unwrap())
    }

    /// References resolve beside the file or below a prefix, on segment boundaries, an
    /// absolute path as its `file://` URL; nothing else, and nothing above them.
    #[test]
    fn urls_resolve_below_their_prefixes_only() {
        let (own, allowed) = (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
        let prefix = format!("file://{}/", allowed.path().display());
        let targets = Targets {
            own: local(own.path()),
            prefixes: vec![(prefix.clone(), local(allowed.path()))],
        };
        let key = |url: &str| targets.resolve(url).map(|(_, key)| key.as_str().to_owned());
        assert_eq!(key("data.nc").unwrap(), "data.nc");
        assert_eq!(key("sub/data.nc").unwrap(), "sub/data.nc");
        assert_eq!(key(&format!("{prefix}x/y.nc")).unwrap(), "x/y.nc");
        assert_eq!(key(&format!("{}/x.nc", allowed.path().display())).unwrap(), "x.nc");
        // An http(s) path is decoded once; other URLs name keys as written.
        let web = Targets {
            own: local(own.path()),
            prefixes: vec![
                ("https://h.test/d/".into(), local(allowed.path())),
                ("s3://b/d/".into(), local(allowed.path())),
            ],
        };
        let key_of = |url: &str| web.resolve(url).map(|(_, key)| key.as_str().to_owned());
        assert_eq!(key_of("https://h.test/d/My%20Data.nc").unwrap(), "My Data.nc");
        assert_eq!(key_of("s3://b/d/My%20Data.nc").unwrap(), "My%20Data.nc");
        assert!(key_of("https://h.test/d/%2e%2e/x.nc").is_err());
        let sibling = format!("{}-other/x.nc", allowed.path().display());
        for refused in [
            "../data.nc",
            "sub/../../data.nc",
            &sibling,
            &format!("file://{sibling}"),
            &format!("{prefix}../x.nc"),
            "s3://bucket/x.nc",
            "https://user:secret@host/x.nc",
        ] {
            let e = key(refused).unwrap_err();
            assert!(matches!(e, StoreError::NotAllowed(_)), "{refused}: {e:?}");
            assert!(!e.to_string().contains("secret"), "{e}");
        }
    }
}
