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

/// The archive or one of its entries is broken. The key is filled in by the [`Backend`]
/// methods, which know what was asked for ([`StoreError::naming`]).
fn corrupt(msg: impl Into<String>) -> StoreError {
    StoreError::Corrupt {
        key: String::new(),
        message: format!("zip: {}", msg.into()),
    }
}

/// A read of the archive at offsets its directory gave: a range past its end means the
/// directory lies (an error of the archive), not that the client asked for a bad range.
fn in_archive(e: StoreError) -> StoreError {
    match e {
        StoreError::Range { .. } => corrupt("an entry lies outside the archive"),
        e => e,
    }
}

/// Compression methods read here: those Python's zipfile writes (and so zarr-python's
/// ZipStore, whose `compression` takes any of them), Zstandard from Python 3.14 on.
const STORED: u16 = 0;
const DEFLATED: u16 = 8;
const BZIP2: u16 = 12;
const LZMA: u16 = 14;
const ZSTD: u16 = 93;

/// Why an entry cannot be read at all, on HEAD as on GET: encrypted, compressed with a method
/// not read here, or empty with another CRC-32 than that of nothing (0).
fn refused(entry: &Entry) -> Option<StoreError> {
    if entry.size == 0 && entry.crc != 0 {
        Some(corrupt("the entry does not match its CRC-32 (empty, expected another)"))
    } else if entry.encrypted {
        Some(StoreError::NotSupported("encrypted zip entries".into()))
    } else if !matches!(entry.method, STORED | DEFLATED | BZIP2 | LZMA | ZSTD) {
        Some(StoreError::NotSupported(format!(
            "zip compression method {}",
            entry.method
        )))
    } else {
        None
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
    /// Encrypted (general purpose flag bit 0): kept, to be refused as such rather than be
    /// missing (a missing chunk would read as fill values).
    encrypted: bool,
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

/// Where the central directory is, from the end record(s); `tail` is the end of the archive.
#[derive(Debug, PartialEq, Eq)]
struct End {
    /// Offset and size of the central directory in the archive.
    cd_offset: u64,
    cd_size: u64,
    /// Bytes before the archive proper (a self-extracting stub): the offsets the records give
    /// count from its start, this much into the file.
    prepended: u64,
}

/// The largest central directory read into memory: about a million entries of short names.
const MAX_DIRECTORY_BYTES: u64 = 64 << 20;

fn parse_end(tail: &[u8], archive_size: u64) -> Result<End, StoreError> {
    // The end record is the first signature whose comment runs to the end of the archive (a
    // comment may hold the same bytes, even a whole record); failing that, the last signature.
    let candidates = || (0..=tail.len().saturating_sub(22)).filter(|&i| u32_at(tail, i) == Some(EOCD_SIG));
    let pos = candidates()
        .find(|&i| u16_at(tail, i + 20).is_some_and(|n| i + 22 + n as usize == tail.len()))
        .or_else(|| candidates().next_back())
        .ok_or_else(|| corrupt("no end of central directory record (not a zip file?)"))?;
    let tail_start = archive_size - tail.len() as u64;
    let eocd = &tail[pos..];
    let mut cd_size = u32_at(eocd, 12).ok_or_else(|| corrupt("short end record"))? as u64;
    let mut cd_offset = u32_at(eocd, 16).ok_or_else(|| corrupt("short end record"))? as u64;
    // Where the directory ends: right before the end record, or before the ZIP64 records.
    let mut cd_end = tail_start + pos as u64;
    // ZIP64: a locator right before the end record points to the 64-bit record, which must
    // also be in the tail we read. Writers add them when any field overflows, the entry count
    // too (Python's zipfile past 65,535 entries, with the other fields left as they are), so
    // they are looked for whatever the end record holds, as zipfile does. With data prepended
    // to the archive the pointer is off by its length: the record is then the one right
    // before the locator.
    let locator = pos
        .checked_sub(20)
        .filter(|&loc| u32_at(tail, loc) == Some(EOCD64_LOCATOR_SIG));
    let saturated = cd_size == 0xFFFF_FFFF || cd_offset == 0xFFFF_FFFF;
    if saturated || locator.is_some() {
        let loc = locator.ok_or_else(|| corrupt("no zip64 locator"))?;
        let pointed = u64_at(tail, loc + 8)
            .and_then(|abs| abs.checked_sub(tail_start))
            .and_then(|r| usize::try_from(r).ok());
        let rec = [pointed, loc.checked_sub(56)]
            .into_iter()
            .flatten()
            .find(|&r| u32_at(tail, r) == Some(EOCD64_SIG));
        match rec {
            Some(rec) => {
                cd_size = u64_at(tail, rec + 40).ok_or_else(|| corrupt("short zip64 end record"))?;
                cd_offset = u64_at(tail, rec + 48).ok_or_else(|| corrupt("short zip64 end record"))?;
                cd_end = tail_start + rec as u64;
            }
            // A locator's bytes with no ZIP64 record where it points (the last entry's comment
            // may hold them): the end record's own values stand, as zipfile reads them, unless
            // they say that only the ZIP64 record has the real ones.
            None if !saturated => {}
            None => return Err(corrupt("bad zip64 end record")),
        }
    }
    // As Python's zipfile: what lies between where the directory should end and where it does
    // is data prepended to the archive.
    let prepended = cd_end
        .checked_sub(cd_size)
        .and_then(|start| start.checked_sub(cd_offset))
        .ok_or_else(|| corrupt("central directory outside the archive"))?;
    let cd_offset = cd_offset + prepended;
    if cd_offset.checked_add(cd_size).is_none_or(|end| end > archive_size) {
        return Err(corrupt("central directory outside the archive"));
    }
    if cd_size > MAX_DIRECTORY_BYTES {
        return Err(StoreError::NotSupported(format!(
            "a zip central directory of {cd_size} bytes (at most {MAX_DIRECTORY_BYTES} are read)"
        )));
    }
    Ok(End {
        cd_offset,
        cd_size,
        prepended,
    })
}

/// Parses central directory records into (name, entry) pairs; header offsets are moved by
/// `prepended`. Every byte of the directory is a record, as Python's zipfile requires.
fn parse_central(cd: &[u8], prepended: u64) -> Result<Vec<(String, Entry)>, StoreError> {
    // Names with the UTF-8 flag (bit 11), and the others, as bytes until all are read.
    let mut out: Vec<(&[u8], bool, Entry)> = Vec::new();
    let mut at = 0usize;
    while at < cd.len() {
        if u32_at(cd, at) != Some(CENTRAL_SIG) {
            return Err(corrupt("bad central directory record"));
        }
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
        // Info-ZIP's Unicode Path field (0x7075): the name in UTF-8, for the one in the record
        // (in a code page) whose CRC-32 it holds, as Python's zipfile reads it (3.12 on).
        let (raw, mut utf8) = (name, flags & (1 << 11) != 0);
        // A name ends at its first NUL byte, as zipfile reads it.
        let mut name = until_nul(raw);
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
            } else if id == 0x7075
                && let Some(field_data) = extra.get(e + 4..e + 4 + len)
                && field_data.first() == Some(&1)
                && u32_at(field_data, 1) == Some(crc32fast::hash(raw))
                && field_data.len() > 5
                && std::str::from_utf8(&field_data[5..]).is_ok()
            {
                (name, utf8) = (until_nul(&field_data[5..]), true);
            }
            e += 4 + len;
        }
        if !name.ends_with(b"/") && !name.ends_with(b"\\") {
            out.push((
                name,
                utf8,
                Entry {
                    header_offset: header_offset
                        .checked_add(prepended)
                        .ok_or_else(|| corrupt("an entry lies outside the archive"))?,
                    compressed,
                    size,
                    method,
                    crc,
                    encrypted: flags & 1 != 0,
                    data_offset: OnceLock::new(),
                },
            ));
        }
        at += 46 + name_len + extra_len + comment_len;
        if at > cd.len() {
            return Err(short());
        }
    }
    let unflagged_utf8 = out
        .iter()
        .all(|(name, flagged, _)| *flagged || std::str::from_utf8(name).is_ok());
    Ok(out
        .into_iter()
        .map(|(name, flagged, entry)| (entry_name(name, flagged || unflagged_utf8).replace('\\', "/"), entry))
        .collect())
}

/// `name` up to its first NUL byte, if it has one.
fn until_nul(name: &[u8]) -> &[u8] {
    name.split(|&b| b == 0).next().unwrap_or(name)
}

/// An entry's name as text, read as UTF-8 when `utf8` or else as code page 437.
///
/// Names the writer flags as UTF-8 are UTF-8. Names without the flag are CP437 by the zip
/// specification, as Python's zipfile (and so zarr-python's ZipStore) reads them, but
/// Info-ZIP's `zip` and macOS write UTF-8 there without the flag, as `unzip` reads them. So an
/// archive's unflagged names are read as UTF-8 when every one of them is valid UTF-8, and as
/// CP437 (a character for each byte) otherwise: one decoding for all, so that two names are
/// never read as one (as replacing invalid bytes with U+FFFD did, serving one array's chunks
/// under another's name, and as mixing the two decodings would).
fn entry_name(raw: &[u8], utf8: bool) -> String {
    match std::str::from_utf8(raw) {
        Ok(name) if utf8 => name.to_owned(),
        _ => raw
            .iter()
            .map(|&b| {
                if b < 0x80 {
                    char::from(b)
                } else {
                    CP437_HIGH[usize::from(b - 0x80)]
                }
            })
            .collect(),
    }
}

/// Code page 437's characters for bytes 0x80-0xFF (below 0x80 it is ASCII, as Python reads it).
#[rustfmt::skip]
const CP437_HIGH: [char; 128] = [
    'Ç', 'ü', 'é', 'â', 'ä', 'à', 'å', 'ç', 'ê', 'ë', 'è', 'ï', 'î', 'ì', 'Ä', 'Å',
    'É', 'æ', 'Æ', 'ô', 'ö', 'ò', 'û', 'ù', 'ÿ', 'Ö', 'Ü', '¢', '£', '¥', '₧', 'ƒ',
    'á', 'í', 'ó', 'ú', 'ñ', 'Ñ', 'ª', 'º', '¿', '⌐', '¬', '½', '¼', '¡', '«', '»',
    '░', '▒', '▓', '│', '┤', '╡', '╢', '╖', '╕', '╣', '║', '╗', '╝', '╜', '╛', '┐',
    '└', '┴', '┬', '├', '─', '┼', '╞', '╟', '╚', '╔', '╩', '╦', '╠', '═', '╬', '╧',
    '╨', '╤', '╥', '╙', '╘', '╒', '╓', '╫', '╪', '┘', '┌', '█', '▄', '▌', '▐', '▀',
    'α', 'ß', 'Γ', 'π', 'Σ', 'σ', 'µ', 'τ', 'Φ', 'Θ', 'Ω', 'δ', '∞', 'φ', 'ε', '∩',
    '≡', '±', '≥', '≤', '⌠', '⌡', '÷', '≈', '°', '∙', '·', '√', 'ⁿ', '²', '■', '\u{a0}',
];

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

/// How long a directory is used by requests that read no entry (HEAD, listings, conditional
/// requests answered 304) before the archive is checked again, unless the mount says otherwise
/// ([`ZipBackend::checked_every`]; the server uses `cache.ttl_seconds`).
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
    /// Held only to look at or replace the directory, never across a request upstream.
    current: tokio::sync::Mutex<Option<Current>>,
    /// Held by the one request that checks the archive or reads its directory: the others go
    /// on with the kept directory meanwhile (or, with none kept yet, wait for it).
    checking: tokio::sync::Mutex<()>,
    check: Duration,
}

impl ZipBackend {
    /// The archive `key` in `container`; nothing is read until the first request.
    pub fn new(container: Store, key: StoreKey) -> Self {
        Self {
            container,
            key,
            current: tokio::sync::Mutex::new(None),
            checking: tokio::sync::Mutex::new(()),
            check: DIRECTORY_CHECK,
        }
    }

    /// Checks the archive again after `check` for requests that read no entry.
    pub fn checked_every(self, check: Duration) -> Self {
        Self { check, ..self }
    }

    /// The directory: the one kept, checked against the archive with a HEAD once its check
    /// interval has passed, or read anew. One request checks (or reads) at a time; while it
    /// does, the others use the kept directory, so a slow or failing upstream does not queue
    /// every request of the mount behind it (entry reads check the archive themselves). A
    /// failed check is not repeated by the requests after it until the interval has passed
    /// again.
    async fn directory(&self) -> Result<Arc<Directory>, StoreError> {
        let kept = self.kept().await;
        let _checking = match &kept {
            Some((dir, true)) => return Ok(dir.clone()),
            Some((dir, false)) => match self.checking.try_lock() {
                Ok(guard) => guard,
                Err(_) => return Ok(dir.clone()),
            },
            None => self.checking.lock().await,
        };
        // Another request may have checked or read it while this one waited.
        match (self.kept().await, kept.is_some()) {
            (Some((dir, true)), _) | (Some((dir, false)), false) => return Ok(dir),
            (Some((dir, false)), true) => match self.container.head(&self.key).await {
                Ok(Some(now)) if now.same_object(&dir.archive) => {
                    self.mark_checked(&dir).await;
                    return Ok(dir);
                }
                Ok(_) => {}
                Err(e) => {
                    self.mark_checked(&dir).await;
                    return Err(e);
                }
            },
            (None, _) => {}
        }
        let directory = self.read_directory().await?;
        *self.current.lock().await = Some(Current {
            directory: directory.clone(),
            checked: Instant::now(),
        });
        Ok(directory)
    }

    /// The directory kept, if any, and whether it was checked within the interval.
    async fn kept(&self) -> Option<(Arc<Directory>, bool)> {
        let current = self.current.lock().await;
        current
            .as_ref()
            .map(|c| (c.directory.clone(), c.checked.elapsed() < self.check))
    }

    /// Restarts the interval of `dir`, if it is still the directory kept.
    async fn mark_checked(&self, dir: &Arc<Directory>) {
        let mut current = self.current.lock().await;
        if let Some(c) = current.as_mut().filter(|c| Arc::ptr_eq(&c.directory, dir)) {
            c.checked = Instant::now();
        }
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
        let End {
            cd_offset,
            cd_size,
            prepended,
        } = parse_end(&tail, size)?;
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
                return Err(StoreError::Io(
                    "zip: the archive changed while its directory was read".into(),
                ));
            }
            cd
        };
        Ok(Arc::new(Directory::build(parse_central(&cd, prepended)?, archive)))
    }

    async fn data_offset(&self, entry: &Entry, archive: &ObjectMeta) -> Result<EntryRead<u64>, StoreError> {
        if let Some(o) = entry.data_offset.get() {
            return Ok(EntryRead::Read(*o));
        }
        let range = entry.header_offset..entry.header_offset.saturating_add(30);
        let EntryRead::Read(read) = self.read_at(archive, range).await? else {
            return Ok(EntryRead::ArchiveChanged);
        };
        let header = read.bytes().await?;
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

    /// Reads `range` of the archive, at offsets its directory (of `archive`) gave.
    async fn read_at(&self, archive: &ObjectMeta, range: Range<u64>) -> Result<EntryRead<GetObject>, StoreError> {
        match self
            .container
            .get(&self.key, Some(ByteRange::Bounded(range.start, range.end)))
            .await
        {
            Ok(Some(read)) if read.meta.same_object(archive) => Ok(EntryRead::Read(read)),
            // Replaced (by a smaller archive, when the range is past its end), or gone.
            Ok(_) => Ok(EntryRead::ArchiveChanged),
            Err(StoreError::Range { size, .. }) if size != archive.size => Ok(EntryRead::ArchiveChanged),
            // A bucket or an origin answers a range past the end of a smaller archive with an
            // error of its own (416): whether the archive was replaced, a HEAD tells.
            Err(e @ StoreError::Io(_)) => match self.container.head(&self.key).await {
                Ok(now) if !now.as_ref().is_some_and(|now| now.same_object(archive)) => Ok(EntryRead::ArchiveChanged),
                _ => Err(e),
            },
            Err(e) => Err(in_archive(e)),
        }
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

/// Bytes of one piece of an inflated entry's body.
const INFLATE_PIECE: u64 = 256 << 10;

/// Most bytes before a range inflated and dropped in one trip to the blocking pool.
const SKIP_PER_TRIP: u64 = 32 * INFLATE_PIECE;

/// A compressed entry being decompressed: what is left to skip before the range and to deliver
/// of it.
struct Inflating<R: Read> {
    /// The compressed bytes, until the first step makes the decoder of them (on the blocking
    /// pool: an LZMA entry's header is read first).
    compressed: Option<(R, u16, u64)>,
    decoder: Option<Box<dyn Read + Send>>,
    skip: u64,
    left: u64,
    /// The whole entry is read: after it, the stream must end.
    whole: bool,
}

/// The decoder of an entry compressed with `method` (deflate, bzip2, LZMA or Zstandard) whose data is
/// `compressed`, `size` bytes once decompressed.
fn decoder(
    mut compressed: impl Read + Send + 'static,
    method: u16,
    size: u64,
) -> Result<Box<dyn Read + Send>, StoreError> {
    match method {
        BZIP2 => Ok(Box::new(bzip2::read::BzDecoder::new(compressed))),
        ZSTD => match zstd::stream::read::Decoder::new(compressed) {
            Ok(decoder) => Ok(Box::new(decoder)),
            Err(e) => Err(corrupt(format!("zstd: {e}"))),
        },
        LZMA => {
            // The zip LZMA header (APPNOTE 5.8.8): a version (2 bytes), the size of the
            // properties that follow (2 bytes, 5 for LZMA1), then the raw stream. liblzma reads
            // it as a .lzma file: the properties and the decompressed size (which also
            // decides where a stream without an end marker ends).
            let mut head = [0u8; 4];
            compressed
                .read_exact(&mut head)
                .map_err(|_| corrupt("lzma: the entry is shorter than its header"))?;
            if u16::from_le_bytes([head[2], head[3]]) != 5 {
                return Err(corrupt("lzma: properties of another size than LZMA1's 5 bytes"));
            }
            let mut alone = [0u8; 13];
            compressed
                .read_exact(&mut alone[..5])
                .map_err(|_| corrupt("lzma: the entry is shorter than its header"))?;
            alone[5..].copy_from_slice(&size.to_le_bytes());
            let stream = liblzma::stream::Stream::new_lzma_decoder(crate::codec::lzma::MEMLIMIT)
                .map_err(|e| corrupt(format!("lzma: {e}")))?;
            Ok(Box::new(liblzma::read::XzDecoder::new_stream(
                std::io::Read::chain(std::io::Cursor::new(alone), compressed),
                stream,
            )))
        }
        _ => Ok(Box::new(flate2::read::DeflateDecoder::new(compressed))),
    }
}

/// What one step of [`Inflating`] gave.
enum Inflated {
    Piece(Bytes),
    Skipped,
    End,
}

impl<R: Read + Send + 'static> Inflating<R> {
    fn step(&mut self) -> Result<Inflated, StoreError> {
        let decoder = match (&mut self.decoder, self.compressed.take()) {
            (Some(decoder), _) => decoder,
            (None, Some((compressed, method, size))) => self.decoder.insert(decoder(compressed, method, size)?),
            (None, None) => return Err(corrupt("the entry's decoder failed")),
        };
        if self.skip > 0 {
            let step = self.skip.min(SKIP_PER_TRIP);
            return match std::io::copy(&mut decoder.take(step), &mut std::io::sink()) {
                Ok(n) if n == step => {
                    self.skip -= step;
                    Ok(Inflated::Skipped)
                }
                _ => Err(corrupt("inflate: the entry ends before the range")),
            };
        }
        if self.left > 0 {
            let mut piece = vec![0u8; self.left.min(INFLATE_PIECE) as usize];
            decoder
                .read_exact(&mut piece)
                .map_err(|e| corrupt(format!("inflate: {e}")))?;
            self.left -= piece.len() as u64;
            return Ok(Inflated::Piece(Bytes::from(piece)));
        }
        if self.whole && decoder.read(&mut [0u8; 1]).map_or(true, |n| n > 0) {
            return Err(corrupt("inflate: the entry is longer than its directory record says"));
        }
        Ok(Inflated::End)
    }
}

/// Streams `range` of a deflated entry as it inflates, a piece per trip to the blocking pool:
/// memory stays at a piece, however large the entry and however far it inflates (the
/// compressed bytes stream in as they are needed), and no thread waits for a slow client
/// between pieces. The bytes before the range are inflated and dropped, and not at all once the
/// client has gone. A `whole` entry must end where its directory record says.
fn inflate_range(
    compressed: impl Read + Send + 'static,
    entry: &Entry,
    range: Range<u64>,
    whole: bool,
) -> BoxStream<'static, Result<Bytes, StoreError>> {
    let inflating = Inflating {
        compressed: Some((compressed, entry.method, entry.size)),
        decoder: None,
        skip: range.start,
        left: range.end - range.start,
        whole,
    };
    body_stream(stream::unfold(Some(inflating), |state| async move {
        let mut inflating = state?;
        loop {
            let stepped = crate::workers::spawn_blocking(move || {
                let step = inflating.step();
                (inflating, step)
            })
            .await;
            match stepped {
                Ok((back, Ok(Inflated::Skipped))) => inflating = back,
                Ok((back, Ok(Inflated::Piece(piece)))) => return Some((Ok(piece), Some(back))),
                Ok((_, Ok(Inflated::End))) => return None,
                Ok((_, Err(e))) => return Some((Err(e), None)),
                Err(e) => return Some((Err(super::joined(e)), None)),
            }
        }
    }))
}

/// `body`, a whole entry, checked against its CRC-32 as it passes. Its last piece is held back
/// until the CRC is known, and an entry that does not match ends with an error in its place:
/// neither an HTTP client (which stops reading at Content-Length) nor
/// [`GetObject::bytes`](super::GetObject::bytes) takes a corrupt entry for a whole one.
fn crc_checked(
    body: BoxStream<'static, Result<Bytes, StoreError>>,
    expected: u32,
) -> BoxStream<'static, Result<Bytes, StoreError>> {
    struct Checking {
        body: BoxStream<'static, Result<Bytes, StoreError>>,
        crc: crc32fast::Hasher,
        held: Option<Bytes>,
    }
    let checking = Checking {
        body,
        crc: crc32fast::Hasher::new(),
        held: None,
    };
    body_stream(stream::unfold(Some(checking), move |state| async move {
        let mut c = state?;
        loop {
            match c.body.try_next().await {
                Ok(Some(piece)) if piece.is_empty() => {}
                Ok(Some(piece)) => {
                    c.crc.update(&piece);
                    if let Some(previous) = c.held.replace(piece) {
                        return Some((Ok(previous), Some(c)));
                    }
                }
                Ok(None) => {
                    let computed = c.crc.clone().finalize();
                    if computed != expected {
                        let e = corrupt(format!(
                            "the entry does not match its CRC-32 (crc {computed:08x}, expected {expected:08x})"
                        ));
                        return Some((Err(e), None));
                    }
                    return c.held.take().map(|last| (Ok(last), None));
                }
                Err(e) => return Some((Err(e), None)),
            }
        }
    }))
}

#[async_trait]
impl Backend for ZipBackend {
    async fn head(&self, key: &StoreKey) -> Result<Option<ObjectMeta>, StoreError> {
        self.head_entry(key).await.map_err(|e| e.naming(key.as_str()))
    }

    fn resolves_ranges(&self) -> bool {
        true
    }

    async fn get(&self, key: &StoreKey, range: Option<ByteRange>) -> Result<Option<GetObject>, StoreError> {
        let got = self.get_object(key, range).await.map_err(|e| e.naming(key.as_str()))?;
        Ok(got.map(|got| {
            let key = key.as_str().to_string();
            GetObject {
                body: body_stream(got.body.map_err(move |e| e.naming(&key))),
                ..got
            }
        }))
    }

    async fn list(&self, prefix: &StoreKey) -> Result<Listing, StoreError> {
        let dir = self.directory().await.map_err(|e| e.naming(prefix.as_str()))?;
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
    async fn head_entry(&self, key: &StoreKey) -> Result<Option<ObjectMeta>, StoreError> {
        let dir = self.directory().await?;
        match dir.entries.get(key.as_str()) {
            // As a GET of it would answer.
            Some(e) => match refused(e) {
                Some(error) => Err(error),
                None => Ok(Some(Self::meta(&dir, e))),
            },
            None => Ok(None),
        }
    }

    async fn get_object(&self, key: &StoreKey, range: Option<ByteRange>) -> Result<Option<GetObject>, StoreError> {
        let dir = self.directory().await?;
        if let EntryRead::Read(got) = self.get_entry(&dir, key, range).await? {
            return Ok(got);
        }
        // The archive was replaced since its directory was read: read it again, once.
        self.forget(&dir).await;
        let dir = self.directory().await?;
        match self.get_entry(&dir, key, range).await? {
            EntryRead::Read(got) => Ok(got),
            EntryRead::ArchiveChanged => Err(StoreError::Io(
                "zip: the archive keeps changing while it is read".into(),
            )),
        }
    }

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
        if let Some(error) = refused(entry) {
            return Err(error);
        }
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
        // A whole entry is checked against its CRC-32 as it streams.
        let whole = range == (0..entry.size);
        let body = if entry.method == STORED {
            if entry.compressed != entry.size {
                return Err(corrupt("a stored entry's sizes differ"));
            }
            let EntryRead::Read(read) = self.read_at(&dir.archive, data + range.start..data + range.end).await? else {
                return Ok(EntryRead::ArchiveChanged);
            };
            read.body
        } else {
            let span = data..data + entry.compressed;
            match self.container.blocking_reader() {
                // A local archive is read in the inflating steps themselves: a step that waited
                // for an async file read would need a second thread of the blocking pool, and
                // steps holding every thread would wait for ever.
                Some(reader) => {
                    // Opened once, here: read from that file to its end, whatever happens to
                    // the path meanwhile; replaced since the directory was read, it is read
                    // through its new directory (as read_at finds).
                    let key = self.key.clone();
                    let opened = crate::workers::spawn_blocking(move || reader.open_range(&key, span))
                        .await
                        .map_err(super::joined)?;
                    match opened {
                        Ok(Some((now, file))) if now.same_object(&dir.archive) => {
                            inflate_range(file, entry, range.clone(), whole)
                        }
                        Ok(_) => return Ok(EntryRead::ArchiveChanged),
                        Err(StoreError::Range { size, .. }) if size != dir.archive.size => {
                            return Ok(EntryRead::ArchiveChanged);
                        }
                        Err(e) => return Err(in_archive(e)),
                    }
                }
                None => {
                    let EntryRead::Read(read) = self.read_at(&dir.archive, span).await? else {
                        return Ok(EntryRead::ArchiveChanged);
                    };
                    let compressed = tokio_util::io::StreamReader::new(read.body.map_err(std::io::Error::other));
                    inflate_range(
                        tokio_util::io::SyncIoBridge::new(compressed),
                        entry,
                        range.clone(),
                        whole,
                    )
                }
            }
        };
        let body = if whole { crc_checked(body, entry.crc) } else { body };
        Ok(EntryRead::Read(Some(GetObject { meta, range, body })))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_are_utf8_when_they_can_be_and_code_page_437_otherwise() {
        assert_eq!(entry_name("ünï%20/zarr.json".as_bytes(), true), "ünï%20/zarr.json");
        // As Python's zipfile reads names without the UTF-8 flag.
        assert_eq!(entry_name("é".as_bytes(), false), "├⌐");
        assert_eq!(entry_name(b"caf\x82/c/0", false), "café/c/0");
        assert_eq!(
            entry_name(b"caf\x81/c/0", true),
            "cafü/c/0",
            "not UTF-8 even if flagged"
        );
        let all: Vec<u8> = (0x80..=0xFF).collect();
        let read = entry_name(&all, false);
        let distinct: std::collections::BTreeSet<char> = read.chars().collect();
        assert_eq!(distinct.len(), 128, "a character of its own for each byte: {read}");
        assert!(distinct.iter().all(|c| !c.is_ascii()));
        assert!(read.starts_with("ÇüéâäàåçêëèïîìÄÅ") && read.ends_with("²■\u{a0}"));
    }

    /// A central directory record of an empty stored entry named `name` with `flags`.
    fn central_record(name: &[u8], flags: u16) -> Vec<u8> {
        let mut r = CENTRAL_SIG.to_le_bytes().to_vec();
        r.extend([20, 0, 20, 0]); // made by, needed
        r.extend(flags.to_le_bytes());
        r.extend([0u8; 18]); // method, time, date, crc, sizes
        r.extend((name.len() as u16).to_le_bytes());
        r.extend([0u8; 16]); // extra, comment, disk, attributes, offset
        r.extend(name);
        r
    }

    #[test]
    fn an_archive_reads_all_its_unflagged_names_one_way() {
        let names = |records: &[(&[u8], u16)]| -> Vec<String> {
            let cd: Vec<u8> = records.iter().flat_map(|(n, f)| central_record(n, *f)).collect();
            parse_central(&cd, 0).unwrap().into_iter().map(|(n, _)| n).collect()
        };
        // All valid UTF-8: UTF-8, flagged or not.
        assert_eq!(names(&[("café".as_bytes(), 0), (b"x", 0)]), ["café", "x"]);
        // One is not: every unflagged name is CP437, as zipfile reads them, so "café" in UTF-8
        // and in CP437 stay two names; a flagged name stays UTF-8.
        assert_eq!(
            names(&[("café".as_bytes(), 0), (b"caf\x82", 0), ("ü".as_bytes(), 1 << 11)]),
            ["caf├⌐", "café", "ü"]
        );
        // Directory records are no entries.
        assert_eq!(names(&[(b"d/", 0), (b"d\\", 0), (b"d/a", 0)]), ["d/a"]);
    }

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
            encrypted: false,
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
        tail.extend(eocd(2, 100, 900, &fake));
        let size = tail.len() as u64;
        let end = |cd_offset, cd_size, prepended| End {
            cd_offset,
            cd_size,
            prepended,
        };
        assert_eq!(parse_end(&tail, size).unwrap(), end(900, 100, 0));
        // Data prepended to the archive (a self-extracting stub) moves every offset.
        let mut tail = vec![0u8; 1000];
        tail.extend(eocd(2, 100, 500, b""));
        assert_eq!(parse_end(&tail, 1022).unwrap(), end(900, 100, 400));
        // A directory larger than is read into memory is refused before it is read.
        let mut tail = vec![0u8; 1000];
        tail.extend(eocd(1, u32::MAX - 1, 0, b""));
        let size = MAX_DIRECTORY_BYTES * 100;
        assert!(matches!(parse_end(&tail, size), Err(StoreError::NotSupported(_))));
    }

    /// Bytes of a ZIP64 locator right before the end record (the last entry's comment may end
    /// with them) with no ZIP64 record where they point: the end record's values stand, as
    /// zipfile reads them; unless those say the real ones are in a ZIP64 record.
    #[test]
    fn a_locator_without_its_record_leaves_the_end_record_standing() {
        let mut tail = vec![0u8; 1000];
        tail.extend(EOCD64_LOCATOR_SIG.to_le_bytes());
        tail.extend([0u8; 12]);
        tail.extend(1u32.to_le_bytes());
        tail.extend(eocd(2, 100, 920, b""));
        let size = tail.len() as u64;
        let end = parse_end(&tail, size).unwrap();
        assert_eq!((end.cd_offset, end.cd_size, end.prepended), (920, 100, 0));
        let mut saturated = tail[..1020].to_vec();
        saturated.extend(eocd(2, 100, u32::MAX, b""));
        assert!(parse_end(&saturated, size).is_err());
    }

    /// Info-ZIP's Unicode Path field gives the name in UTF-8 for the record's own (here CP866)
    /// when it holds that name's CRC-32; a field for another name, or of another version, is
    /// ignored.
    #[test]
    fn unicode_path_fields_name_their_entry() {
        let cp866 = b"\xa4\xa0\xad\xad\xeb\xa5"; // "данные"
        let record = |field_crc: u32, version: u8| {
            let mut r = central_record(cp866, 0);
            let mut field = vec![version];
            field.extend(field_crc.to_le_bytes());
            field.extend("данные".as_bytes());
            let mut extra = 0x7075u16.to_le_bytes().to_vec();
            extra.extend((field.len() as u16).to_le_bytes());
            extra.extend(field);
            r[30..32].copy_from_slice(&(extra.len() as u16).to_le_bytes());
            r.extend(extra);
            r
        };
        let names = |cd: &[u8]| -> Vec<String> { parse_central(cd, 0).unwrap().into_iter().map(|(n, _)| n).collect() };
        assert_eq!(names(&record(crc32fast::hash(cp866), 1)), ["данные"]);
        assert_eq!(names(&record(crc32fast::hash(cp866), 2)), ["ñá¡¡δÑ"]);
        assert_eq!(names(&record(7, 1)), ["ñá¡¡δÑ"]);
        // A name ends at a NUL byte, as zipfile reads it.
        assert_eq!(names(&central_record(b"zarr.json\0junk", 0)), ["zarr.json"]);
    }

    #[test]
    fn garbage_is_not_a_zip() {
        assert!(parse_end(b"definitely not a zip archive at all", 35).is_err());
        let mut eocd = vec![0u8; 22];
        eocd[..4].copy_from_slice(&EOCD_SIG.to_le_bytes());
        eocd[12..16].copy_from_slice(&100u32.to_le_bytes());
        eocd[16..20].copy_from_slice(&50u32.to_le_bytes());
        assert!(parse_end(&eocd, 22).is_err(), "directory past the end");
        assert!(parse_central(&[0x50, 0x4b, 0x01, 0x02, 0, 0], 0).is_err(), "truncated");
        assert!(
            parse_central(&[0x50, 0x4b, 0x05, 0x06, 0, 0], 0).is_err(),
            "not a record"
        );
        assert!(parse_central(&[], 0).unwrap().is_empty());
    }
}
