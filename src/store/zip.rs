//! Zip archives as stores. The central directory is read once (a suffix range for the end
//! record, then one range for the directory) and kept while the archive stays the same object:
//! every read of an entry checks the archive's size and version, and a request that only needs
//! the directory checks them with a HEAD once [`DIRECTORY_CHECK`] has passed. Stored entries
//! are served with byte ranges straight from the archive, deflated entries by inflating the
//! entry. The archive may live in any store (a local directory, a bucket), so a remote zip costs
//! ranged reads only.
//!
//! Two layouts are accepted: the hierarchy at the archive root, or inside one top-level folder,
//! which then becomes the mount root.
//! Spec: <https://pkware.cachefly.net/webdocs/casestudies/APPNOTE.TXT>

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::io::Read;
use std::ops::Range;
use std::sync::{Arc, OnceLock};
use std::time::{Duration, Instant};

use async_trait::async_trait;
use bytes::Bytes;
use futures::TryStreamExt;
use futures::stream;
use futures::stream::BoxStream;

use super::{
    Backend, ByteRange, GetObject, Listing, ObjectMeta, Store, StoreError, StoreKey, body_stream, resolve_range,
};

const EOCD_SIG: u32 = 0x0605_4b50;
const EOCD64_LOCATOR_SIG: u32 = 0x0706_4b50;
const EOCD64_SIG: u32 = 0x0606_4b50;
const CENTRAL_SIG: u32 = 0x0201_4b50;
const LOCAL_SIG: u32 = 0x0403_4b50;
/// The end record is 22 bytes plus a comment of up to 65535 bytes. Before it, a ZIP64 archive
/// has its 20-byte locator and its 56-byte end record: all three are in the tail read,
/// whatever the comment.
const EOCD_SEARCH: u64 = 22 + 65_535 + 20 + 56;

fn u16_at(b: &[u8], at: usize) -> Option<u16> {
    b.get(at..at.checked_add(2)?).map(|s| u16::from_le_bytes([s[0], s[1]]))
}

fn u32_at(b: &[u8], at: usize) -> Option<u32> {
    b.get(at..at.checked_add(4)?)
        .map(|s| u32::from_le_bytes([s[0], s[1], s[2], s[3]]))
}

fn u64_at(b: &[u8], at: usize) -> Option<u64> {
    b.get(at..at.checked_add(8)?)
        .map(|s| u64::from_le_bytes([s[0], s[1], s[2], s[3], s[4], s[5], s[6], s[7]]))
}

/// The most a central directory record takes: 46 bytes and a name, extra field and comment of
/// up to 65535 bytes each.
const MAX_RECORD: u64 = 46 + 3 * 65_535;

fn corrupt(msg: impl Into<String>) -> StoreError {
    StoreError::Io(format!("zip: {}", msg.into()))
}

/// A read of the archive at offsets its directory gave: a range past its end means the
/// directory lies (an error of the archive), not that the client asked for a bad range.
fn in_archive(e: StoreError) -> StoreError {
    match e {
        StoreError::Range { .. } => corrupt("an entry lies outside the archive"),
        e => e,
    }
}

/// One file in the archive.
#[derive(Debug)]
struct Entry {
    header_offset: u64,
    compressed: u64,
    size: u64,
    method: u16,
    crc: u32,
    /// Where the data starts, learned from the local header on first use.
    data_offset: OnceLock<u64>,
}

/// The parsed central directory.
#[derive(Debug)]
struct Directory {
    /// Files by path below the mount root.
    entries: HashMap<String, Entry>,
    /// The directories: `tree[0]` is the root, each names its children by index, so that a
    /// name of many levels costs its length and not a copy of every prefix of it.
    tree: Vec<Folder>,
    /// The archive's metadata.
    archive: ObjectMeta,
}

/// One directory of the archive.
#[derive(Debug, Default)]
struct Folder {
    /// Sub-directories by name, as indices into [`Directory::tree`].
    folders: BTreeMap<String, usize>,
    /// Files by name.
    files: BTreeSet<String>,
}

/// Parses the end record(s) and central directory; `tail` is the end of the archive.
fn parse_end(tail: &[u8], archive_size: u64) -> Result<(u64, u64), StoreError> {
    // The end record is the first signature whose comment runs to the end of the archive (a
    // comment may hold the same bytes, even a whole record); failing that, the last signature.
    let candidates = || (0..=tail.len().saturating_sub(22)).filter(|&i| u32_at(tail, i) == Some(EOCD_SIG));
    let pos = candidates()
        .find(|&i| u16_at(tail, i + 20).is_some_and(|n| i + 22 + n as usize == tail.len()))
        .or_else(|| candidates().next_back())
        .ok_or_else(|| corrupt("no end of central directory record (not a zip file?)"))?;
    let eocd = &tail[pos..];
    let mut count = u64::from(u16_at(eocd, 10).ok_or_else(|| corrupt("short end record"))?);
    let mut cd_size = u32_at(eocd, 12).ok_or_else(|| corrupt("short end record"))? as u64;
    let mut cd_offset = u32_at(eocd, 16).ok_or_else(|| corrupt("short end record"))? as u64;
    if cd_size == 0xFFFF_FFFF || cd_offset == 0xFFFF_FFFF {
        // ZIP64: the locator sits right before the end record and points to the 64-bit record,
        // which must also be in the tail we read.
        let loc = pos.checked_sub(20).ok_or_else(|| corrupt("no zip64 locator"))?;
        if u32_at(tail, loc) != Some(EOCD64_LOCATOR_SIG) {
            return Err(corrupt("no zip64 locator"));
        }
        let rec_abs = u64_at(tail, loc + 8).ok_or_else(|| corrupt("short zip64 locator"))?;
        let tail_start = archive_size - tail.len() as u64;
        let rec = rec_abs
            .checked_sub(tail_start)
            .map(|r| r as usize)
            .ok_or_else(|| corrupt("zip64 record outside the tail"))?;
        if u32_at(tail, rec) != Some(EOCD64_SIG) {
            return Err(corrupt("bad zip64 end record"));
        }
        count = u64_at(tail, rec + 32).ok_or_else(|| corrupt("short zip64 end record"))?;
        cd_size = u64_at(tail, rec + 40).ok_or_else(|| corrupt("short zip64 end record"))?;
        cd_offset = u64_at(tail, rec + 48).ok_or_else(|| corrupt("short zip64 end record"))?;
    }
    if cd_offset.checked_add(cd_size).is_none_or(|end| end > archive_size) {
        return Err(corrupt("central directory outside the archive"));
    }
    // The directory is read into memory: no larger than its records can be.
    if cd_size > count.saturating_mul(MAX_RECORD) {
        return Err(corrupt(format!(
            "a central directory of {cd_size} bytes for {count} entries"
        )));
    }
    Ok((cd_offset, cd_size))
}

/// Parses central directory records into (name, entry) pairs.
fn parse_central(cd: &[u8]) -> Result<Vec<(String, Entry)>, StoreError> {
    let mut out = Vec::new();
    let mut at = 0usize;
    while at + 46 <= cd.len() && u32_at(cd, at) == Some(CENTRAL_SIG) {
        let short = || corrupt("truncated central directory");
        let flags = u16_at(cd, at + 8).ok_or_else(short)?;
        let method = u16_at(cd, at + 10).ok_or_else(short)?;
        let crc = u32_at(cd, at + 16).ok_or_else(short)?;
        let mut compressed = u32_at(cd, at + 20).ok_or_else(short)? as u64;
        let mut size = u32_at(cd, at + 24).ok_or_else(short)? as u64;
        let name_len = u16_at(cd, at + 28).ok_or_else(short)? as usize;
        let extra_len = u16_at(cd, at + 30).ok_or_else(short)? as usize;
        let comment_len = u16_at(cd, at + 32).ok_or_else(short)? as usize;
        let mut header_offset = u32_at(cd, at + 42).ok_or_else(short)? as u64;
        let name = cd.get(at + 46..at + 46 + name_len).ok_or_else(short)?;
        let extra = cd
            .get(at + 46 + name_len..at + 46 + name_len + extra_len)
            .ok_or_else(short)?;
        // ZIP64 extra field: the 64-bit values present are those whose 32-bit field is all ones.
        let mut e = 0;
        while e + 4 <= extra.len() {
            let (id, len) = (
                u16_at(extra, e).unwrap_or(0),
                u16_at(extra, e + 2).unwrap_or(0) as usize,
            );
            if id == 0x0001 {
                let field_data = extra
                    .get(e + 4..e + 4 + len)
                    .ok_or_else(|| corrupt("short zip64 extra field"))?;
                let mut f = 0;
                for field in [&mut size, &mut compressed, &mut header_offset] {
                    if *field == 0xFFFF_FFFF {
                        *field = u64_at(field_data, f).ok_or_else(|| corrupt("short zip64 extra field"))?;
                        f += 8;
                    }
                }
            }
            e += 4 + len;
        }
        let name = String::from_utf8_lossy(name).replace('\\', "/");
        if flags & 1 == 0 && !name.ends_with('/') {
            out.push((
                name,
                Entry {
                    header_offset,
                    compressed,
                    size,
                    method,
                    crc,
                    data_offset: OnceLock::new(),
                },
            ));
        }
        at += 46 + name_len + extra_len + comment_len;
    }
    Ok(out)
}

/// The shared top-level folder of all names, when there is exactly one and the root itself
/// holds no files. The `__MACOSX/` folder of resource forks that macOS adds is not counted (its
/// files are then not served).
fn single_top_folder(names: &[&str]) -> Option<String> {
    let mut top: Option<&str> = None;
    for n in names.iter().filter(|n| !n.starts_with("__MACOSX/")) {
        let (first, rest) = n.split_once('/')?;
        if rest.is_empty() || top.is_some_and(|t| t != first) {
            return None;
        }
        top = Some(first);
    }
    top.map(|t| format!("{t}/"))
}

impl Directory {
    fn build(entries: Vec<(String, Entry)>, archive: ObjectMeta) -> Self {
        let names: Vec<&str> = entries.iter().map(|(n, _)| n.as_str()).collect();
        let strip = single_top_folder(&names).unwrap_or_default();
        let mut map = HashMap::new();
        let mut tree = vec![Folder::default()];
        for (name, entry) in entries {
            let Some(path) = name.strip_prefix(&strip) else {
                continue;
            };
            // Names that could escape, or are empty, are never served.
            if path.is_empty() || StoreKey::new(path).is_err() {
                continue;
            }
            let (folders, file) = path.rsplit_once('/').unwrap_or(("", path));
            let mut at = 0;
            for part in folders.split('/').filter(|p| !p.is_empty()) {
                at = match tree[at].folders.get(part) {
                    Some(&i) => i,
                    None => {
                        tree.push(Folder::default());
                        let i = tree.len() - 1;
                        tree[at].folders.insert(part.to_owned(), i);
                        i
                    }
                };
            }
            tree[at].files.insert(file.to_owned());
            map.insert(path.to_owned(), entry);
        }
        Directory {
            entries: map,
            tree,
            archive,
        }
    }
}

/// How long a directory is used by requests that read no entry (HEAD, listings) before the
/// archive is checked again.
pub const DIRECTORY_CHECK: Duration = Duration::from_secs(60);

/// A directory and when the archive was last seen to be the one it was read from.
#[derive(Debug)]
struct Current {
    directory: Arc<Directory>,
    checked: Instant,
}

/// What a read of an entry found.
enum EntryRead<T> {
    Read(T),
    /// The archive is another object than the directory was read from.
    ArchiveChanged,
}

/// A zip archive in another store.
#[derive(Debug)]
pub struct ZipBackend {
    container: Store,
    key: StoreKey,
    current: tokio::sync::Mutex<Option<Current>>,
}

impl ZipBackend {
    /// The archive `key` in `container`; nothing is read until the first request.
    pub fn new(container: Store, key: StoreKey) -> Self {
        Self {
            container,
            key,
            current: tokio::sync::Mutex::new(None),
        }
    }

    /// The directory: the one kept, checked against the archive with a HEAD once
    /// [`DIRECTORY_CHECK`] has passed, or read anew.
    async fn directory(&self) -> Result<Arc<Directory>, StoreError> {
        let mut current = self.current.lock().await;
        if let Some(c) = current.as_mut() {
            if c.checked.elapsed() < DIRECTORY_CHECK {
                return Ok(c.directory.clone());
            }
            if let Some(now) = self.container.head(&self.key).await? {
                if now.same_object(&c.directory.archive) {
                    c.checked = Instant::now();
                    return Ok(c.directory.clone());
                }
            }
        }
        let directory = self.read_directory().await?;
        *current = Some(Current {
            directory: directory.clone(),
            checked: Instant::now(),
        });
        Ok(directory)
    }

    /// Drops `stale` if it is still the directory kept.
    async fn forget(&self, stale: &Arc<Directory>) {
        let mut current = self.current.lock().await;
        if current.as_ref().is_some_and(|c| Arc::ptr_eq(&c.directory, stale)) {
            *current = None;
        }
    }

    async fn read_directory(&self) -> Result<Arc<Directory>, StoreError> {
        let missing = || StoreError::Io(format!("zip archive '{}' does not exist", self.key));
        let archive = self.container.head(&self.key).await?.ok_or_else(missing)?;
        // The directory belongs to the object its bytes come from: the one the tail was read of.
        let (tail, archive) = self
            .container
            .get_range_bytes(&self.key, ByteRange::Suffix(EOCD_SEARCH.min(archive.size)))
            .await
            .map_err(in_archive)?
            .ok_or_else(missing)?;
        let size = archive.size;
        let (cd_offset, cd_size) = parse_end(&tail, size)?;
        // The directory is usually inside the tail already.
        let tail_start = size - tail.len() as u64;
        let cd = if cd_offset >= tail_start {
            tail.slice((cd_offset - tail_start) as usize..(cd_offset - tail_start + cd_size) as usize)
        } else {
            let (cd, read) = self
                .container
                .get_range_bytes(&self.key, ByteRange::Bounded(cd_offset, cd_offset + cd_size))
                .await
                .map_err(in_archive)?
                .ok_or_else(missing)?;
            if !read.same_object(&archive) {
                return Err(corrupt("the archive changed while its directory was read"));
            }
            cd
        };
        Ok(Arc::new(Directory::build(parse_central(&cd)?, archive)))
    }

    async fn data_offset(&self, entry: &Entry, archive: &ObjectMeta) -> Result<EntryRead<u64>, StoreError> {
        if let Some(o) = entry.data_offset.get() {
            return Ok(EntryRead::Read(*o));
        }
        let (header, read) = self
            .container
            .get_range_bytes(
                &self.key,
                ByteRange::Bounded(entry.header_offset, entry.header_offset.saturating_add(30)),
            )
            .await
            .map_err(in_archive)?
            .ok_or_else(|| corrupt("archive vanished"))?;
        if !read.same_object(archive) {
            return Ok(EntryRead::ArchiveChanged);
        }
        if u32_at(&header, 0) != Some(LOCAL_SIG) {
            return Err(corrupt("bad local header"));
        }
        let name_len = u16_at(&header, 26).unwrap_or(0) as u64;
        let extra_len = u16_at(&header, 28).unwrap_or(0) as u64;
        let offset = entry.header_offset + 30 + name_len + extra_len;
        if offset
            .checked_add(entry.compressed)
            .is_none_or(|end| end > archive.size)
        {
            return Err(corrupt("an entry runs past the end of the archive"));
        }
        let _ = entry.data_offset.set(offset);
        Ok(EntryRead::Read(offset))
    }

    fn meta(dir: &Directory, entry: &Entry) -> ObjectMeta {
        ObjectMeta {
            size: entry.size,
            last_modified: dir.archive.last_modified,
            // Changes whenever the archive or the entry changes. An upstream ETag comes quoted,
            // perhaps weak: only its opaque part goes inside this tag.
            version: Some(format!(
                "{}-{:08x}",
                dir.archive.version.as_deref().map_or_else(
                    || dir.archive.size.to_string(),
                    |v| v.trim_start_matches("W/").trim_matches('"').to_owned()
                ),
                entry.crc
            )),
        }
    }
}

fn unsupported_method(method: u16) -> StoreError {
    StoreError::NotSupported(format!("zip compression method {method}"))
}

/// Bytes of one piece of an inflated entry's body.
const INFLATE_PIECE: u64 = 256 << 10;

/// Streams `range` of a deflated entry as it inflates, on the blocking pool, a few pieces
/// ahead of the client: memory stays at a few pieces, however large the entry and however far
/// it inflates (the compressed bytes stream in as they are needed). The bytes before the range
/// are inflated and dropped, a piece at a time, and not at all once the client has gone. A
/// whole entry is checked against its CRC-32 and its size; an entry that does not inflate as
/// the directory says ends the body with an error.
fn inflate_range(
    compressed: impl Read + Send + 'static,
    range: Range<u64>,
    whole: Option<u32>,
) -> BoxStream<'static, Result<Bytes, StoreError>> {
    let (tx, rx) = tokio::sync::mpsc::channel::<Result<Bytes, StoreError>>(2);
    tokio::task::spawn_blocking(move || {
        let mut decoder = flate2::read::DeflateDecoder::new(compressed);
        let mut skip = range.start;
        while skip > 0 {
            if tx.is_closed() {
                return; // the client went away
            }
            let step = skip.min(INFLATE_PIECE);
            match std::io::copy(&mut (&mut decoder).take(step), &mut std::io::sink()) {
                Ok(n) if n == step => skip -= step,
                _ => {
                    let _ = tx.blocking_send(Err(corrupt("inflate: the entry ends before the range")));
                    return;
                }
            }
        }
        let mut crc = crc32fast::Hasher::new();
        let mut left = range.end - range.start;
        while left > 0 {
            let mut piece = vec![0u8; left.min(INFLATE_PIECE) as usize];
            if let Err(e) = decoder.read_exact(&mut piece) {
                let _ = tx.blocking_send(Err(corrupt(format!("inflate: {e}"))));
                return;
            }
            left -= piece.len() as u64;
            if whole.is_some() {
                crc.update(&piece);
            }
            if tx.blocking_send(Ok(Bytes::from(piece))).is_err() {
                return; // the client went away
            }
        }
        if let Some(expected) = whole {
            let longer = decoder.read(&mut [0u8; 1]).map_or(true, |n| n > 0);
            let computed = crc.finalize();
            if longer || computed != expected {
                let _ = tx.blocking_send(Err(corrupt(format!(
                    "inflate: the entry does not match its directory record (crc {computed:08x}, expected {expected:08x}{})",
                    if longer { ", or it is longer" } else { "" }
                ))));
            }
        }
    });
    body_stream(stream::unfold(rx, |mut rx| async move {
        rx.recv().await.map(|item| (item, rx))
    }))
}

#[async_trait]
impl Backend for ZipBackend {
    async fn head(&self, key: &StoreKey) -> Result<Option<ObjectMeta>, StoreError> {
        let dir = self.directory().await?;
        match dir.entries.get(key.as_str()) {
            // As a GET of it would answer.
            Some(e) if !matches!(e.method, 0 | 8) => Err(unsupported_method(e.method)),
            found => Ok(found.map(|e| Self::meta(&dir, e))),
        }
    }

    fn resolves_ranges(&self) -> bool {
        true
    }

    async fn get(&self, key: &StoreKey, range: Option<ByteRange>) -> Result<Option<GetObject>, StoreError> {
        let dir = self.directory().await?;
        if let EntryRead::Read(got) = self.get_entry(&dir, key, range).await? {
            return Ok(got);
        }
        // The archive was replaced since its directory was read: read it again, once.
        self.forget(&dir).await;
        let dir = self.directory().await?;
        match self.get_entry(&dir, key, range).await? {
            EntryRead::Read(got) => Ok(got),
            EntryRead::ArchiveChanged => Err(corrupt("the archive keeps changing while it is read")),
        }
    }

    async fn list(&self, prefix: &StoreKey) -> Result<Listing, StoreError> {
        let dir = self.directory().await?;
        let mut at = Some(0);
        for part in prefix.segments() {
            at = at.and_then(|i| dir.tree[i].folders.get(part).copied());
        }
        Ok(at
            .map(|i| Listing {
                prefixes: dir.tree[i].folders.keys().cloned().collect(),
                objects: dir.tree[i].files.iter().cloned().collect(),
            })
            .unwrap_or_default())
    }
}

impl ZipBackend {
    /// Reads `range` of the entry `key` as `dir` locates it.
    async fn get_entry(
        &self,
        dir: &Directory,
        key: &StoreKey,
        range: Option<ByteRange>,
    ) -> Result<EntryRead<Option<GetObject>>, StoreError> {
        let Some(entry) = dir.entries.get(key.as_str()) else {
            return Ok(EntryRead::Read(None));
        };
        let meta = Self::meta(dir, entry);
        let range = resolve_range(range, entry.size)?;
        if range.is_empty() {
            return Ok(EntryRead::Read(Some(GetObject {
                meta,
                range,
                body: body_stream(stream::empty::<Result<Bytes, StoreError>>()),
            })));
        }
        let EntryRead::Read(data) = self.data_offset(entry, &dir.archive).await? else {
            return Ok(EntryRead::ArchiveChanged);
        };
        let body = match entry.method {
            0 => {
                if entry.compressed != entry.size {
                    return Err(corrupt("a stored entry's sizes differ"));
                }
                let obj = self
                    .container
                    .get(
                        &self.key,
                        Some(ByteRange::Bounded(data + range.start, data + range.end)),
                    )
                    .await
                    .map_err(in_archive)?
                    .ok_or_else(|| corrupt("archive vanished"))?;
                if !obj.meta.same_object(&dir.archive) {
                    return Ok(EntryRead::ArchiveChanged);
                }
                obj.body
            }
            8 => {
                let obj = self
                    .container
                    .get(&self.key, Some(ByteRange::Bounded(data, data + entry.compressed)))
                    .await
                    .map_err(in_archive)?
                    .ok_or_else(|| corrupt("archive vanished"))?;
                if !obj.meta.same_object(&dir.archive) {
                    return Ok(EntryRead::ArchiveChanged);
                }
                let whole = (range == (0..entry.size)).then_some(entry.crc);
                let compressed = tokio_util::io::StreamReader::new(obj.body.map_err(std::io::Error::other));
                inflate_range(tokio_util::io::SyncIoBridge::new(compressed), range.clone(), whole)
            }
            m => return Err(unsupported_method(m)),
        };
        Ok(EntryRead::Read(Some(GetObject { meta, range, body })))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn top_folder_detection() {
        assert_eq!(single_top_folder(&["d/a", "d/b/c"]), Some("d/".into()));
        assert_eq!(single_top_folder(&["d/a", "e/b"]), None);
        assert_eq!(single_top_folder(&["zarr.json", "d/a"]), None);
        assert_eq!(single_top_folder(&[]), None);
    }

    #[test]
    fn top_folder_detection_ignores_resource_forks() {
        assert_eq!(single_top_folder(&["d/a", "__MACOSX/d/._a", "d/b"]), Some("d/".into()));
    }

    fn entry() -> Entry {
        Entry {
            header_offset: 0,
            compressed: 0,
            size: 0,
            method: 0,
            crc: 0xabcd,
            data_offset: OnceLock::new(),
        }
    }

    fn archive(version: Option<&str>) -> ObjectMeta {
        ObjectMeta {
            size: 100,
            last_modified: None,
            version: version.map(str::to_owned),
        }
    }

    /// A name of many levels costs its length: one folder per level, not a copy of every
    /// prefix (a 64 KiB name of 32k levels was a GiB of keys). Empty names are not served.
    #[test]
    fn deep_names_cost_their_length() {
        let deep = format!("{}x", "a/".repeat(30_000));
        let dir = Directory::build(
            vec![
                (deep.clone(), entry()),
                ("b/c".into(), entry()),
                (String::new(), entry()),
            ],
            archive(None),
        );
        assert_eq!(dir.tree.len(), 1 + 30_000 + 1);
        assert_eq!(dir.entries.len(), 2);
        assert!(dir.entries.contains_key(deep.as_str()) && !dir.entries.contains_key(""));
        assert_eq!(dir.tree[0].folders.keys().collect::<Vec<_>>(), ["a", "b"]);
        assert!(dir.tree[0].files.is_empty());
        let last = dir.tree.iter().filter(|f| f.files.contains("x")).count();
        assert_eq!(last, 1);
    }

    /// An upstream ETag comes quoted and maybe weak; an entry's version holds its opaque part
    /// only, so that the entry's ETag is one well-formed quoted string.
    #[test]
    fn entry_versions_hold_the_opaque_part_of_the_archive_tag() {
        for (archive_version, want) in [
            (Some("\"abc\""), "abc-0000abcd"),
            (Some("W/\"abc\""), "abc-0000abcd"),
            (Some("1f-2"), "1f-2-0000abcd"),
            (None, "100-0000abcd"),
        ] {
            let dir = Directory::build(vec![], archive(archive_version));
            let meta = ZipBackend::meta(&dir, &entry());
            assert_eq!(meta.version.as_deref(), Some(want), "{archive_version:?}");
            assert_eq!(crate::http::raw::etag_of(&meta), format!("\"{want}\""));
        }
    }

    #[test]
    fn reads_past_the_end_of_a_buffer_are_none() {
        assert_eq!(u16_at(&[1, 2], usize::MAX), None);
        assert_eq!(u32_at(&[1, 2, 3, 4], usize::MAX - 1), None);
        assert_eq!(u64_at(&[0; 8], usize::MAX - 3), None);
        assert_eq!(u32_at(&[1, 0, 0, 0], 0), Some(1));
    }

    /// An end record: `count` entries, a directory of `cd_size` bytes at `cd_offset`, `comment`.
    fn eocd(count: u16, cd_size: u32, cd_offset: u32, comment: &[u8]) -> Vec<u8> {
        let mut e = EOCD_SIG.to_le_bytes().to_vec();
        e.extend([0, 0, 0, 0]);
        e.extend(count.to_le_bytes());
        e.extend(count.to_le_bytes());
        e.extend(cd_size.to_le_bytes());
        e.extend(cd_offset.to_le_bytes());
        e.extend((comment.len() as u16).to_le_bytes());
        e.extend(comment);
        e
    }

    #[test]
    fn the_end_record_is_the_one_whose_comment_ends_the_archive() {
        // A comment that holds an end record of its own (pointing elsewhere).
        let fake = eocd(1, 46, 0, b"");
        let mut tail = vec![0u8; 1000];
        tail.extend(eocd(2, 100, 500, &fake));
        let size = tail.len() as u64;
        assert_eq!(parse_end(&tail, size).unwrap(), (500, 100));
        // A directory larger than its entries can be is refused before it is read.
        let mut tail = vec![0u8; 1_000_000];
        tail.extend(eocd(1, 900_000, 0, b""));
        let size = tail.len() as u64;
        assert!(parse_end(&tail, size).is_err());
    }

    #[test]
    fn garbage_is_not_a_zip() {
        assert!(parse_end(b"definitely not a zip archive at all", 35).is_err());
        let mut eocd = vec![0u8; 22];
        eocd[..4].copy_from_slice(&EOCD_SIG.to_le_bytes());
        eocd[12..16].copy_from_slice(&100u32.to_le_bytes());
        eocd[16..20].copy_from_slice(&50u32.to_le_bytes());
        assert!(parse_end(&eocd, 22).is_err(), "directory past the end");
        assert!(parse_central(&[0x50, 0x4b, 0x01, 0x02, 0, 0]).unwrap().is_empty());
    }
}
