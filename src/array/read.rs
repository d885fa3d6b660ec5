//! Reads a selection of an array: plans the stored objects it touches, fetches them
//! concurrently (bounded), decodes on the blocking pool and copies the selected elements into
//! one C-order result.
//!
//! Sharded arrays are read with ranges: the shard index first (a suffix or prefix range), then
//! only the inner chunks the selection needs, with nearby ranges coalesced into one request
//! (remote stores; local files are read one inner chunk at a time, each read and decoded in one
//! blocking call).
//! With caches, decoded chunks, inner chunks and shard indexes are loaded once and reused.

use std::ops::Range;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

use bytes::Bytes;
use futures::{StreamExt, TryStreamExt, stream};

use super::priority_semaphore::{PriorityPermit, PrioritySemaphore};
use super::selection::{CellPart, DimSelection, Selection, cells};
use crate::cache::{
    CacheCounters, CachedChunk, CachedIndex, Caches, ChunkId, DETACHED_LOADS, Decoded, cached, detach, detach_working,
};
use crate::codec::CodecError;
use crate::codec::chain::CodecChain;
use crate::codec::sharding::{IndexLocation, ShardingCodec};
use crate::dtype::elements::{BlockCopy, Elements, STACK_DIMS, copy_fixed, fill_fixed, gather_fixed, scratch};
use crate::dtype::fill::FillValue;
use crate::store::{ByteRange, ObjectMeta, Store, StoreError, StoreKey};
use crate::zarr::ArrayMeta;

/// Errors of reading a region.
#[derive(Debug, Clone, thiserror::Error)]
pub enum ReadError {
    /// Stored bytes at `key` do not decode.
    #[error("corrupt data at '{key}': {message}")]
    Corrupt {
        /// The store key.
        key: String,
        /// What was wrong (for the log).
        message: String,
    },
    /// The array uses something this server cannot decode.
    #[error("unsupported: {0}")]
    Unsupported(String),
    /// The store failed.
    #[error(transparent)]
    Store(#[from] StoreError),
    /// A task failed (a bug).
    #[error("internal: {0}")]
    Internal(String),
    /// A shard changed between the read of its index and of its inner chunks, again after its
    /// index was read anew.
    #[error("'{0}' changed while it was read")]
    Changed(String),
    /// The result is larger than [`ReadOptions::max_result_bytes`] allows (known only once
    /// variable-length elements are read).
    #[error("too large: {0}")]
    TooLarge(String),
}

impl ReadError {
    fn codec(key: &StoreKey, e: CodecError) -> Self {
        match e {
            CodecError::Unsupported(m) => ReadError::Unsupported(m),
            CodecError::OverLimit(m) => ReadError::TooLarge(format!("a chunk of '{key}': {m}")),
            other => ReadError::Corrupt {
                key: key.to_string(),
                message: other.to_string(),
            },
        }
    }

    /// Asked for the fixed-size bytes of variable-length elements.
    fn not_fixed() -> Self {
        ReadError::Unsupported("variable-length elements have no fixed-size bytes".into())
    }

    fn copy(key: &StoreKey, message: String) -> Self {
        ReadError::Corrupt {
            key: key.to_string(),
            message,
        }
    }
}

impl From<Arc<ReadError>> for ReadError {
    fn from(e: Arc<ReadError>) -> Self {
        (*e).clone()
    }
}

/// Tuning of reads.
#[derive(Debug, Clone)]
pub struct ReadOptions {
    /// Stored objects fetched and decoded at once.
    pub concurrency: usize,
    /// Ranges of one shard closer than this are fetched as one request.
    pub coalesce_gap: u64,
    /// Decoded size limit of one chunk of variable-length elements.
    pub variable_chunk_limit: usize,
    /// Largest decoded chunk (or inner chunk) read; arrays with larger chunks are refused.
    pub max_chunk_bytes: u64,
    /// Decodes one request runs at once (see [`ReadContext::decoders`]).
    pub decode_permits: usize,
    /// Bytes a result of variable-length elements may hold in all (their contents and 24 bytes
    /// each), checked as its chunks are copied in.
    pub max_result_bytes: u64,
}

/// Decodes at once by default: twice the cores, and at least four.
fn default_decoders() -> usize {
    std::thread::available_parallelism().map_or(4, |n| (2 * n.get()).max(4))
}

impl Default for ReadOptions {
    fn default() -> Self {
        Self {
            concurrency: 16,
            coalesce_gap: 1 << 20,
            variable_chunk_limit: 256 << 20,
            max_chunk_bytes: 1 << 30,
            decode_permits: default_decoders(),
            max_result_bytes: 256 << 20,
        }
    }
}

/// What a read needs besides the array: the store, where its chunks are cached, and tuning.
#[derive(Debug)]
pub struct ReadContext {
    /// The mount's store.
    pub store: Store,
    /// The mount's name (part of cache keys).
    pub mount: Arc<str>,
    /// Caches, if any.
    pub caches: Option<Arc<Caches>>,
    /// Tuning.
    pub opts: ReadOptions,
    /// Permits to decode, `opts.decode_permits` of them, shared by the reads of this context (one
    /// request's). Decoding is CPU work: one request running more of it at once than the
    /// machine has cores only makes threads take permits and evict each other's caches (a cold
    /// 64 MiB slice on two cores took ~10% longer with 24-48 decodes in flight than with 4).
    /// Not shared across requests: a server-wide queue made cached slices whose few chunks
    /// were evicted wait behind bulk reads (load test p99 72 -> 617 ms). Handed out by
    /// [`Self::rank`]. Made at the first decode ([`Self::decoders`]): a read served from the
    /// cache needs none. A clone shares them (made then, if they were not yet).
    decoders: std::sync::OnceLock<Arc<PrioritySemaphore>>,
    /// The rank of this context's reads for decode permits: a streamed slice gives each band its
    /// own, in the order they are sent, so that the first band is decoded first
    /// ([`super::priority_semaphore`]).
    pub rank: u64,
}

impl Clone for ReadContext {
    /// The same context, sharing its decode permits.
    fn clone(&self) -> Self {
        Self {
            store: self.store.clone(),
            mount: self.mount.clone(),
            caches: self.caches.clone(),
            opts: self.opts.clone(),
            decoders: self.decoders().clone().into(),
            rank: self.rank,
        }
    }
}

impl ReadContext {
    /// A context for one request's reads.
    pub fn new(store: Store, mount: Arc<str>, caches: Option<Arc<Caches>>, opts: ReadOptions) -> Self {
        Self {
            store,
            mount,
            caches,
            opts,
            decoders: std::sync::OnceLock::new(),
            rank: 0,
        }
    }

    /// The decode permits of this context and of its clones.
    pub fn decoders(&self) -> &Arc<PrioritySemaphore> {
        self.decoders
            .get_or_init(|| PrioritySemaphore::new(self.opts.decode_permits))
    }

    /// The same context (sharing its decode permits) for reads of rank `rank`.
    pub fn ranked(&self, rank: u64) -> Self {
        Self { rank, ..self.clone() }
    }

    /// A context without caches.
    pub fn uncached(store: Store) -> Self {
        Self::new(store, Arc::from(""), None, ReadOptions::default())
    }

    fn id(&self, meta: &ArrayMeta, key: &StoreKey, inner: Option<u64>) -> ChunkId {
        ChunkId {
            mount: self.mount.clone(),
            key: key.clone(),
            inner,
            meta: meta.fingerprint,
            object: 0,
        }
    }

    /// The id of inner chunk `number` of the shard at `key`, as `shard` is now.
    fn inner_id(&self, meta: &ArrayMeta, key: &StoreKey, number: u64, shard: &ObjectMeta) -> ChunkId {
        use std::hash::BuildHasher;
        // All that tells one stored shard from another: origins with no ETag have only the
        // size and the modification time.
        let object =
            foldhash::quality::FixedState::default().hash_one((shard.size, &shard.version, shard.last_modified));
        ChunkId {
            object,
            ..self.id(meta, key, Some(number))
        }
    }

    /// Passes on a read's result, dropping the cached index of the shard at `key` when the
    /// read found the shard changed, so that the next read of it reads the index anew.
    async fn changed<T>(&self, meta: &ArrayMeta, key: &StoreKey, read: Result<T, ReadError>) -> Result<T, ReadError> {
        if let (Err(ReadError::Changed(_)), Some(c)) = (&read, &self.caches) {
            c.shard_indexes.invalidate(&self.id(meta, key, None)).await;
        }
        read
    }
}

/// Runs a read, and once more if a shard changed under the first (a writer replaced it after
/// its index was cached; whoever saw the change has dropped the index, see [`ReadContext::changed`]).
async fn again_if_changed<T, F, Fut>(read: F) -> Result<T, ReadError>
where
    F: Fn() -> Fut,
    Fut: std::future::Future<Output = Result<T, ReadError>>,
{
    match read().await {
        Err(ReadError::Changed(_)) => read().await,
        other => other,
    }
}

/// The cartesian product of per-dimension parts.
fn product(parts: &[Vec<CellPart>]) -> Vec<Vec<CellPart>> {
    let mut out: Vec<Vec<CellPart>> = vec![Vec::new()];
    for dim in parts {
        out = out
            .into_iter()
            .flat_map(|prefix| {
                dim.iter().map(move |p| {
                    let mut v = prefix.clone();
                    v.push(*p);
                    v
                })
            })
            .collect();
    }
    out
}

/// Decoded-size limit for one stored object of `elements` elements.
fn limit_for(meta: &ArrayMeta, elements: u64, opts: &ReadOptions) -> usize {
    match meta.dtype.item_size() {
        // Every intermediate of a real chain is at most the decoded size; leave room for
        // checksums, headers and shard indexes.
        Some(item) => {
            let exact = (elements as usize).saturating_mul(item.max(1));
            exact.saturating_add(exact / 8).saturating_add(1 << 16)
        }
        None => opts.variable_chunk_limit,
    }
}

/// Where the decoded units of a read go.
enum Sink {
    /// Copied into one result as they arrive.
    Assemble(Mutex<Elements>),
    /// Kept, to be copied out later a range of rows at a time ([`LoadedRegion`]).
    Collect(Mutex<Vec<Piece>>),
}

/// The result being read.
struct Output {
    sink: Sink,
    shape: Vec<u64>,
    item: usize,
    steps: Vec<u64>,
    /// A fixed-size fill value that is not all zero bytes: written into the parts of missing
    /// chunks (the output starts zeroed, so a zero fill needs no writing at all).
    fill: Option<Vec<u8>>,
    /// Variable-length results: the limit on the whole result, the most bytes their elements'
    /// contents may take in all (the limit less the elements themselves), and what those copied
    /// so far take.
    content_limit: Option<(u64, u64, AtomicU64)>,
}

impl Output {
    /// Writes the fill value into the parts of a missing chunk, where it is not already there.
    fn fill(&self, parts: &[CellPart]) -> Result<(), ReadError> {
        let poisoned = || ReadError::Internal("output lock poisoned".into());
        match &self.sink {
            Sink::Collect(pieces) => {
                pieces.lock().map_err(|_| poisoned())?.push(Piece {
                    block: None,
                    block_shape: Vec::new(),
                    parts: parts.to_vec(),
                });
                Ok(())
            }
            Sink::Assemble(elements) => {
                let Some(one) = &self.fill else {
                    return Ok(());
                };
                let dst_start: Vec<u64> = parts.iter().map(|p| p.dst_start).collect();
                let count: Vec<u64> = parts.iter().map(|p| p.count).collect();
                let mut out = elements.lock().map_err(|_| poisoned())?;
                out.fill_block(one, &self.shape, &dst_start, &count)
                    .map_err(|e| ReadError::Internal(e.to_string()))
            }
        }
    }

    /// Copies the parts of a decoded block (of `block_shape`, read from `key`) into the result,
    /// or keeps them.
    fn copy(
        &self,
        block: &Arc<Decoded>,
        block_shape: &[u64],
        parts: &[CellPart],
        key: &StoreKey,
    ) -> Result<(), ReadError> {
        let content = self
            .copy_parts(block, block_shape, parts)
            .map_err(|m| ReadError::copy(key, m))?;
        if let Some((limit, contents, used)) = &self.content_limit {
            let total = used
                .fetch_add(content as u64, Ordering::Relaxed)
                .saturating_add(content as u64);
            if total > *contents {
                return Err(ReadError::TooLarge(format!(
                    "the selection's variable-length elements take more than the limit of {limit} bytes \
                     (their contents more than the {contents} bytes the elements leave of it)"
                )));
            }
        }
        Ok(())
    }

    /// [`Self::copy`] without the check: the heap bytes of variable-length elements copied.
    fn copy_parts(&self, block: &Arc<Decoded>, block_shape: &[u64], parts: &[CellPart]) -> Result<usize, String> {
        let poisoned = || "output lock poisoned".to_string();
        let elements = match &self.sink {
            Sink::Collect(pieces) => {
                pieces.lock().map_err(|_| poisoned())?.push(Piece {
                    block: Some(block.clone()),
                    block_shape: block_shape.to_vec(),
                    parts: parts.to_vec(),
                });
                return Ok(0);
            }
            Sink::Assemble(elements) => elements,
        };
        let src_start: Vec<u64> = parts.iter().map(|p| p.src_start).collect();
        let dst_start: Vec<u64> = parts.iter().map(|p| p.dst_start).collect();
        let count: Vec<u64> = parts.iter().map(|p| p.count).collect();
        let mut out = elements.lock().map_err(|_| poisoned())?;
        out.copy_block(
            block,
            self.item,
            &BlockCopy {
                src_shape: block_shape,
                src_start: &src_start,
                src_step: &self.steps,
                dst_shape: &self.shape,
                dst_start: &dst_start,
                count: &count,
            },
        )
        .map_err(|e| e.to_string())
    }
}

/// One decoded unit's share of a region: which of its elements go where.
struct Piece {
    /// The decoded unit; `None` for a missing one (its share reads as fill).
    block: Option<Arc<Decoded>>,
    /// The unit's shape.
    block_shape: Vec<u64>,
    /// Per dimension, the unit's elements the region takes and where they go.
    parts: Vec<CellPart>,
}

/// The dimension a region is written out along, a range of "rows" at a time: the first one
/// whose length is not 1 (dimensions before it have length 1, so its rows are contiguous in C
/// order).
pub fn row_axis(full_shape: &[u64]) -> usize {
    full_shape.iter().position(|&n| n != 1).unwrap_or(0)
}

/// A region of fixed-size elements whose decoded units are loaded (and held) but not copied
/// together: its C-order little-endian bytes are written out a range of rows (indices of the
/// [`row_axis`]) at a time. A large response is streamed this way in small buffers that stay
/// in the CPU cache, instead of being assembled whole in fresh memory first.
pub struct LoadedRegion {
    /// The full shape (integer-indexed dimensions kept, with length 1).
    shape: Vec<u64>,
    item: usize,
    steps: Vec<u64>,
    /// The fill value; written where it is not all zero bytes.
    fill: Option<Vec<u8>>,
    pieces: Vec<Piece>,
    /// Where the pieces came from, for errors.
    path: StoreKey,
    /// The dimension rows run along: its own [`row_axis`], unless set ([`Self::along`]).
    axis: usize,
}

impl LoadedRegion {
    /// The same region written out in rows along `axis` (dimensions before it must have
    /// length 1): the row axis of the whole selection a band of it was cut from, which a band
    /// of a single row would otherwise not have as its own.
    pub fn along(mut self, axis: usize) -> Self {
        self.axis = axis.min(self.shape.len().saturating_sub(1));
        self
    }

    /// Rows (indices of the row axis; 1 for a 0-d result).
    pub fn rows(&self) -> u64 {
        self.shape.get(self.axis).copied().unwrap_or(1)
    }

    /// Bytes of one element.
    pub fn item(&self) -> usize {
        self.item
    }

    /// Bytes of one row.
    pub fn row_bytes(&self) -> u64 {
        self.shape
            .iter()
            .skip(self.axis + 1)
            .product::<u64>()
            .saturating_mul(self.item as u64)
    }

    /// The bytes of rows `rows` (a range within `0..self.rows()`).
    pub fn write_rows(&self, rows: Range<u64>) -> Result<Vec<u8>, ReadError> {
        self.write_part(&[(self.axis, rows)])
    }

    /// The band's shape.
    pub fn shape(&self) -> &[u64] {
        &self.shape
    }

    /// The row axis.
    pub fn axis(&self) -> usize {
        self.axis
    }

    /// The bytes of the block that `ranges` (dimension, indices) cut out of the band, the
    /// other dimensions whole: rows, or part of one row when dimensions after the row axis
    /// are cut too (the block is then a run of the row's elements, in order, when each
    /// dimension before the last cut one is cut to one index).
    pub fn write_part(&self, ranges: &[(usize, Range<u64>)]) -> Result<Vec<u8>, ReadError> {
        let mut dst_shape = self.shape.clone();
        let mut cut: Vec<(usize, Range<u64>)> = Vec::with_capacity(ranges.len());
        for (d, range) in ranges {
            let Some(len) = dst_shape.get_mut(*d) else { continue };
            let range = range.start.min(*len)..range.end.min(*len);
            *len = range.end.saturating_sub(range.start);
            cut.push((*d, range));
        }
        let ranges = cut;
        let total = dst_shape.iter().product::<u64>().saturating_mul(self.item as u64);
        let mut out = vec![0u8; usize::try_from(total).unwrap_or(0)];
        if out.is_empty() {
            return Ok(out);
        }
        'pieces: for piece in &self.pieces {
            // The piece's indices that fall in the ranges, moved to the output's coordinates.
            let mut parts = piece.parts.clone();
            for (d, range) in &ranges {
                let Some(p) = parts.get_mut(*d) else { continue };
                let (lo, hi) = (p.dst_start.max(range.start), (p.dst_start + p.count).min(range.end));
                if lo >= hi {
                    continue 'pieces;
                }
                p.src_start += (lo - p.dst_start) * self.steps[*d];
                p.dst_start = lo - range.start;
                p.count = hi - lo;
            }
            let dst_start: Vec<u64> = parts.iter().map(|p| p.dst_start).collect();
            let count: Vec<u64> = parts.iter().map(|p| p.count).collect();
            let result = match &piece.block {
                Some(block) => {
                    let Elements::Fixed(src) = block.elements() else {
                        return Err(ReadError::not_fixed());
                    };
                    let src_start: Vec<u64> = parts.iter().map(|p| p.src_start).collect();
                    copy_fixed(
                        &mut out,
                        src,
                        self.item,
                        &BlockCopy {
                            src_shape: &piece.block_shape,
                            src_start: &src_start,
                            src_step: &self.steps,
                            dst_shape: &dst_shape,
                            dst_start: &dst_start,
                            count: &count,
                        },
                    )
                }
                None => match &self.fill {
                    Some(one) => fill_fixed(&mut out, one, &dst_shape, &dst_start, &count),
                    None => Ok(()),
                },
            };
            result.map_err(|e| ReadError::copy(&self.path, e.to_string()))?;
        }
        Ok(out)
    }
}

/// Loads the decoded units that `sel` of an array of fixed-size elements touches, for writing
/// the region out later row by row ([`LoadedRegion::write_rows`]). Like [`read_region`], once
/// more if a shard was replaced during the load.
pub async fn load_region(
    ctx: &ReadContext,
    path: &StoreKey,
    meta: Arc<ArrayMeta>,
    sel: &Selection,
) -> Result<LoadedRegion, ReadError> {
    again_if_changed(|| load_region_once(ctx, path, meta.clone(), sel)).await
}

async fn load_region_once(
    ctx: &ReadContext,
    path: &StoreKey,
    meta: Arc<ArrayMeta>,
    sel: &Selection,
) -> Result<LoadedRegion, ReadError> {
    let FillValue::Fixed(one) = &meta.fill else {
        return Err(ReadError::not_fixed());
    };
    // A strided selection may take little of each of many units: holding them all until the
    // region is written out would cost many times the region (a row of a thousand 8 MiB
    // chunks for a few MB). Such a region is assembled as its units arrive instead, each
    // dropped once copied, and written out from that.
    let held = units_bytes(&meta, sel, None);
    let result = sel.len().saturating_mul(one.len() as u64);
    if held > SPARSE_HOLDING.saturating_mul(result).max(SPARSE_HOLDING_FLOOR) {
        let shape = sel.full_shape();
        let elements = read_region_once(ctx, path, meta.clone(), sel).await?;
        let parts = shape
            .iter()
            .map(|&count| CellPart {
                cell: 0,
                src_start: 0,
                count,
                dst_start: 0,
            })
            .collect();
        return Ok(LoadedRegion {
            axis: row_axis(&shape),
            item: one.len(),
            steps: vec![1; shape.len()],
            fill: None,
            pieces: vec![Piece {
                block: Some(Arc::new(Decoded::new(elements))),
                block_shape: shape.clone(),
                parts,
            }],
            shape,
            path: path.clone(),
        });
    }
    let output = Output {
        sink: Sink::Collect(Mutex::new(Vec::new())),
        shape: sel.full_shape(),
        item: one.len(),
        steps: sel.0.iter().map(|d| d.span().1).collect(),
        fill: one.iter().any(|&b| b != 0).then(|| one.clone()),
        content_limit: None,
    };
    let output = read_into(ctx, path, &meta, sel, output).await?;
    let Sink::Collect(pieces) = output.sink else {
        return Err(ReadError::Internal("loaded region without pieces".into()));
    };
    Ok(LoadedRegion {
        axis: row_axis(&output.shape),
        shape: output.shape,
        item: output.item,
        steps: output.steps,
        fill: output.fill,
        pieces: pieces
            .into_inner()
            .map_err(|_| ReadError::Internal("output lock poisoned".into()))?,
        path: path.clone(),
    })
}

/// A region whose units weigh more than this many times the region is assembled rather than
/// held ([`load_region`]).
const SPARSE_HOLDING: u64 = 4;

/// ... and more than this in all: below, holding the units costs little either way.
const SPARSE_HOLDING_FLOOR: u64 = 32 << 20;

/// The unit that is decoded whole: an inner chunk of a shard, or a chunk.
pub fn unit_shape(meta: &ArrayMeta) -> &[u64] {
    meta.chain.sharding().map_or(&meta.chunk_shape, |s| &s.inner_shape)
}

/// Bytes of one decode unit (chunk, or inner chunk of a shard), decoded; saturating.
fn unit_bytes(meta: &ArrayMeta) -> u64 {
    unit_shape(meta)
        .iter()
        .fold(meta.dtype.item_size().unwrap_or(1) as u64, |n, &c| n.saturating_mul(c))
}

/// Bytes of the decode units `sel` touches, whole, in all dimensions but `except`, however
/// little of each it takes (`::256` across 256-wide chunks takes one column of each).
pub fn units_bytes(meta: &ArrayMeta, sel: &Selection, except: Option<usize>) -> u64 {
    unit_bytes(meta).saturating_mul(sel.units_touched(unit_shape(meta), except))
}

/// Whether this server reads `meta`'s chunks at all: each decodes whole in memory, so one that
/// decodes to more than [`ReadOptions::max_chunk_bytes`] (or a shard index over that) is
/// refused whatever is selected of it.
pub fn check_unit(ctx: &ReadContext, meta: &ArrayMeta) -> Result<(), ReadError> {
    let unit_bytes = unit_bytes(meta);
    if unit_bytes > ctx.opts.max_chunk_bytes {
        return Err(ReadError::Unsupported(format!(
            "chunks of {unit_bytes} bytes decoded; this server reads chunks of at most {} bytes",
            ctx.opts.max_chunk_bytes
        )));
    }
    // A shard's index is read whole, and it grows with the inner chunks a shard holds.
    if let Some(codec) = meta.chain.sharding() {
        let n = codec.inner_count(&meta.chunk_shape);
        let index_bytes = codec.index_size(n);
        if index_bytes > ctx.opts.max_chunk_bytes {
            return Err(ReadError::Unsupported(format!(
                "shards of {n} inner chunks, with an index of {index_bytes} bytes; this server reads \
                 indexes of at most {} bytes",
                ctx.opts.max_chunk_bytes
            )));
        }
    }
    Ok(())
}

/// The decode unit (chunk, or inner chunk of a shard) that holds every element of a selection.
/// Whether a non-empty selection lies in one decode unit, whose grid coordinates (in units)
/// it writes to `coords` (one a dimension of the array): `Some(true)` when the selection is
/// exactly that whole unit, in the same order; `None` when it spans several.
fn one_unit(meta: &ArrayMeta, sel: &Selection, coords: &mut [u64]) -> Option<bool> {
    let unit = unit_shape(meta);
    if sel.0.len() != unit.len() || unit.len() != meta.shape.len() || coords.len() != unit.len() || sel.is_empty() {
        return None;
    }
    let mut whole = true;
    for ((d, (&u, &n)), coord) in sel.0.iter().zip(unit.iter().zip(&meta.shape)).zip(coords) {
        let (start, step, count) = d.span();
        let last = start.checked_add(count.checked_sub(1)?.checked_mul(step)?)?;
        let cell = start.checked_div(u)?;
        whole &= count == u && (step == 1 || u == 1) && start % u == 0 && start.checked_add(u)? <= n;
        if last / u != cell {
            return None;
        }
        *coord = cell;
    }
    Some(whole)
}

/// A decoded fixed-size chunk shared as bytes (its little-endian C-order elements).
struct SharedFixed(Arc<Decoded>);

impl AsRef<[u8]> for SharedFixed {
    fn as_ref(&self) -> &[u8] {
        match self.0.elements() {
            Elements::Fixed(b) => b,
            _ => &[],
        }
    }
}

/// Reads `sel` of an array of fixed-size elements as little-endian C-order bytes: what
/// [`read_region`] returns, as `Bytes`. A selection that is exactly one chunk (or inner chunk
/// of a shard) is answered from the decoded chunk itself, without copying it.
pub async fn read_region_bytes(
    ctx: &ReadContext,
    path: &StoreKey,
    meta: Arc<ArrayMeta>,
    sel: &Selection,
) -> Result<Bytes, ReadError> {
    // A selection inside one unit (a viewer's tile, a whole chunk) needs no assembly: it is
    // copied straight out of the decoded unit, or is the unit itself.
    // Its coordinates, on the stack for the usual few dimensions.
    let (mut stack, mut heap) = ([0u64; STACK_DIMS], Vec::new());
    let coords = scratch(&mut stack, &mut heap, sel.0.len());
    if let (Some(whole), FillValue::Fixed(fill)) = (one_unit(&meta, sel, coords), &meta.fill) {
        check_unit(ctx, &meta)?;
        let unit = unit_shape(&meta);
        match read_unit(ctx, path, &meta, coords).await? {
            Some(block) => match block.elements() {
                Elements::Fixed(_) if whole => return Ok(Bytes::from_owner(SharedFixed(block))),
                Elements::Fixed(src) => {
                    // Per dimension: the start in the unit, the step, the count, and a zero
                    // (where the block goes in the result), on the stack for the usual few
                    // dimensions.
                    let n = sel.0.len();
                    let (mut stack, mut heap) = ([0u64; 4 * STACK_DIMS], Vec::new());
                    let dims = scratch(&mut stack, &mut heap, 4 * n);
                    for (d, (s, u)) in sel.0.iter().zip(unit).enumerate() {
                        let (start, step, count) = s.span();
                        (dims[d], dims[n + d], dims[2 * n + d]) = (start % u, step, count);
                    }
                    let (src_start, rest) = dims.split_at(n);
                    let (src_step, rest) = rest.split_at(n);
                    let (count, zeros) = rest.split_at(n);
                    let out = gather_fixed(
                        src,
                        fill.len(),
                        &BlockCopy {
                            src_shape: unit,
                            src_start,
                            src_step,
                            dst_shape: count,
                            dst_start: zeros,
                            count,
                        },
                    )
                    .map_err(|e| ReadError::copy(path, e.to_string()))?;
                    return Ok(Bytes::from(out));
                }
                _ => {} // not fixed-size after all: the general path reports it
            },
            None => return Ok(Bytes::from(fill.repeat(sel.len() as usize))),
        }
    }
    match read_region(ctx, path, meta, sel).await? {
        Elements::Fixed(b) => Ok(Bytes::from(b)),
        _ => Err(ReadError::not_fixed()),
    }
}

/// The decoded unit at grid coordinates `coords` (in units: chunks, or inner chunks of shards);
/// `None` when it is missing.
async fn read_unit(
    ctx: &ReadContext,
    path: &StoreKey,
    meta: &Arc<ArrayMeta>,
    coords: &[u64],
) -> Result<CachedChunk, ReadError> {
    let chunk_key = |c: &[u64]| {
        meta.key_encoding
            .key_in(path, c)
            .map_err(|e| ReadError::Unsupported(format!("chunk key: {e}")))
    };
    let Some(codec) = meta.chain.sharding() else {
        return load_chunk(ctx, &chunk_key(coords)?, meta).await;
    };
    // The shard's coordinates, on the stack for the usual few dimensions.
    let (mut stack, mut heap) = ([0u64; STACK_DIMS], Vec::new());
    let shard = scratch(&mut stack, &mut heap, coords.len());
    let (mut number, mut rank) = (0u64, 0);
    for ((&c, per_shard), s) in coords
        .iter()
        .zip(codec.inner_per_dim(&meta.chunk_shape))
        .zip(shard.iter_mut())
    {
        let per_shard = per_shard.max(1);
        *s = c / per_shard;
        number = number * per_shard + c % per_shard;
        rank += 1;
    }
    let key = chunk_key(&shard[..rank])?;
    let n = codec.inner_count(&meta.chunk_shape);
    again_if_changed(|| async {
        let Some(index) = shard_index(ctx, meta, &key, codec, n).await? else {
            return Ok(None);
        };
        let Some(range) = index
            .0
            .range(number as usize, Some(index.1.size))
            .map_err(|e| ReadError::codec(&key, e))?
        else {
            return Ok(None);
        };
        ctx.changed(meta, &key, load_inner(ctx, meta, &key, number, range, &index.1).await)
            .await
    })
    .await
}

/// Inner chunk `number` of the shard at `key`, stored at `range` of it as it was when its index
/// was read (`shard`), decoded, through the cache; `None` if the shard vanished between
/// requests, [`ReadError::Changed`] if it is another object now.
async fn load_inner(
    ctx: &ReadContext,
    meta: &Arc<ArrayMeta>,
    key: &StoreKey,
    number: u64,
    range: Range<u64>,
    shard: &ObjectMeta,
) -> Result<CachedChunk, ReadError> {
    let stored = || Some((ByteRange::Bounded(range.start, range.end), shard.clone()));
    load_unit(ctx, meta, key, stored, || ctx.inner_id(meta, key, number, shard)).await
}

/// Reads `sel` of the array at `path`. The result has `sel.full_shape()` in C order. A shard
/// replaced during the read has its index read again and the region is read again, once.
pub async fn read_region(
    ctx: &ReadContext,
    path: &StoreKey,
    meta: Arc<ArrayMeta>,
    sel: &Selection,
) -> Result<Elements, ReadError> {
    again_if_changed(|| read_region_once(ctx, path, meta.clone(), sel)).await
}

async fn read_region_once(
    ctx: &ReadContext,
    path: &StoreKey,
    meta: Arc<ArrayMeta>,
    sel: &Selection,
) -> Result<Elements, ReadError> {
    let total = sel.len() as usize;
    // Fixed-size results start zeroed (fresh pages cost nothing until written) rather than
    // filled: every element is either copied from a chunk or, for missing chunks, filled.
    let (elements, fill) = match &meta.fill {
        FillValue::Fixed(one) if one.iter().any(|&b| b != 0) => {
            (Elements::Fixed(vec![0; one.len() * total]), Some(one.clone()))
        }
        other => (Elements::filled(other, total), None),
    };
    let content_limit = meta.dtype.item_size().is_none().then(|| {
        let base = Elements::filled_size(&meta.fill, total as u64);
        let limit = ctx.opts.max_result_bytes;
        (limit, limit.saturating_sub(base), AtomicU64::new(0))
    });
    let output = Output {
        sink: Sink::Assemble(Mutex::new(elements)),
        shape: sel.full_shape(),
        item: meta.dtype.item_size().unwrap_or(0),
        steps: sel.0.iter().map(|d| d.span().1).collect(),
        fill,
        content_limit,
    };
    match read_into(ctx, path, &meta, sel, output).await?.sink {
        Sink::Assemble(elements) => elements
            .into_inner()
            .map_err(|_| ReadError::Internal("output lock poisoned".into())),
        Sink::Collect(_) => Err(ReadError::Internal("read without a result".into())),
    }
}

/// Reads every stored object `sel` touches into `output`.
async fn read_into(
    ctx: &ReadContext,
    path: &StoreKey,
    meta: &Arc<ArrayMeta>,
    sel: &Selection,
    output: Output,
) -> Result<Output, ReadError> {
    // The unit that is decoded whole: an inner chunk of a shard, or a chunk.
    check_unit(ctx, meta)?;
    if sel.is_empty() {
        return Ok(output);
    }
    let output = Arc::new(output);
    let plan: Vec<Vec<CellPart>> = sel
        .0
        .iter()
        .zip(meta.chunk_shape.iter().zip(&meta.shape))
        .map(|(d, (&chunk, &n))| cells(*d, chunk, 0, 0, n))
        .collect();
    let mut reads = stream::iter(product(&plan))
        .map(|parts| {
            let (meta, output) = (meta.clone(), output.clone());
            async move {
                let coords: Vec<u64> = parts.iter().map(|p| p.cell).collect();
                let key = meta
                    .key_encoding
                    .key_in(path, &coords)
                    .map_err(|e| ReadError::Unsupported(format!("chunk key: {e}")))?;
                if meta.chain.sharding().is_some() {
                    read_shard(ctx, &key, &coords, &parts, meta, output).await
                } else {
                    read_chunk(ctx, &key, &parts, meta, output).await
                }
            }
        })
        .buffer_unordered(ctx.opts.concurrency.max(1));
    // A shard found changed has dropped its cached index; the others go on, so that every
    // shard rewritten since its index was cached is found (and dropped) in this pass, and the
    // one more pass of `again_if_changed` reads them all anew. Stopping at the first would
    // leave the next one to fail that pass ("changed twice" for shards changed once).
    let mut changed = None;
    while let Some(done) = reads.next().await {
        match done {
            Ok(()) => {}
            Err(e @ ReadError::Changed(_)) => {
                changed.get_or_insert(e);
            }
            Err(e) => return Err(e),
        }
    }
    if let Some(e) = changed {
        return Err(e);
    }
    drop(reads);
    Arc::try_unwrap(output).map_err(|_| ReadError::Internal("output still shared".into()))
}

/// Decodes `bytes` with the array's chain (or, `inner`, the shard's inner chain) on the
/// blocking pool.
async fn decode(
    ctx: &ReadContext,
    meta: &Arc<ArrayMeta>,
    key: &StoreKey,
    bytes: Bytes,
    inner: bool,
) -> Result<Arc<Decoded>, ReadError> {
    let decoder = Decoder::new(ctx, meta, key, inner);
    let _permit = decode_permit(ctx).await;
    crate::workers::spawn_blocking(move || {
        decoder.decode(|chain, shape, fill, limit| chain.decode_bytes(bytes, shape, fill, limit))
    })
    .await
    .map_err(|e| ReadError::Internal(format!("decode task failed: {e}")))?
}

/// Reads a stored unit (`inner`: a range of the shard at `key`, with the shard as its index
/// saw it; `None`: a whole chunk) and decodes it; `None` when it is missing. Local stores read
/// and decode in the same trip to the blocking pool, during a decode permit. Remote stores fetch
/// first, outside the permits (a fetch is waiting, not CPU work: up to `concurrency` of them run
/// at once, while only `decode_permits` decodes do).
async fn read_and_decode(
    ctx: &ReadContext,
    meta: &Arc<ArrayMeta>,
    key: &StoreKey,
    inner: Option<(ByteRange, ObjectMeta)>,
) -> Result<CachedChunk, ReadError> {
    let is_inner = inner.is_some();
    let (range, shard) = inner.unzip();
    // A stored unit is read into memory whole: no more than what it can decode from (and a
    // little more, for what encoding adds). A stray large file under a chunk key, or an index
    // naming a vast inner range, is refused by its size before any of it is read.
    let most = most_stored_of(ctx, meta, is_inner);
    let too_large = |size: u64| too_large_unit(key.as_str(), size, most);
    if let Some(ByteRange::Bounded(a, b)) = range
        && b.saturating_sub(a) > most
    {
        return Err(too_large(b - a));
    }
    let sized = |e: StoreError| match e {
        StoreError::TooLarge { size, .. } => too_large(size),
        e if is_inner => inner_read_error(key, e),
        e => e.into(),
    };
    if !ctx.store.reads_locally() {
        let Some(object) = ctx.store.get_at_most(key, range, most).await.map_err(sized)? else {
            return Ok(None);
        };
        if shard.is_some_and(|s| !object.meta.same_object(&s)) {
            return Err(ReadError::Changed(key.to_string()));
        }
        let bytes = object.bytes().await?;
        return decode(ctx, meta, key, bytes, is_inner).await.map(Some);
    }
    // Local: opened, refused by its size if need be, read and decoded in one blocking call.
    let decoder = Decoder::new(ctx, meta, key, is_inner);
    let _permit = decode_permit(ctx).await;
    let changed = key.to_string();
    let decoded = ctx
        .store
        .read_with(key, range, most, move |bytes, object| {
            if shard.is_some_and(|s| !object.same_object(&s)) {
                return Err(ReadError::Changed(changed));
            }
            decoder.decode(|chain, shape, fill, limit| chain.decode(bytes, shape, fill, limit))
        })
        .await
        .map_err(sized)?;
    decoded.transpose()
}

/// What a stored unit may take beyond the largest decoded chunk to be read: headers and what
/// incompressible data gains in encoding.
const UNIT_SLACK: u64 = 1 << 20;

/// The most bytes read into memory for one stored unit (a chunk, an inner chunk of a shard).
fn most_stored(ctx: &ReadContext) -> u64 {
    ctx.opts
        .max_chunk_bytes
        .max(ctx.opts.variable_chunk_limit as u64)
        .saturating_add(UNIT_SLACK)
}

/// The chain and chunk shape of a stored unit of `meta`: an inner chunk of a shard if `inner`.
fn unit_chain(meta: &ArrayMeta, inner: bool) -> (&crate::codec::chain::CodecChain, &[u64]) {
    match (inner, meta.chain.sharding()) {
        (true, Some(s)) => (&s.inner, &s.inner_shape),
        _ => (&meta.chain, &meta.chunk_shape),
    }
}

/// The most bytes read into memory for one stored unit of `meta` (an inner chunk of a shard if
/// `inner`): for elements of a fixed size, what the unit's chain can decode a chunk of its
/// shape from (the widest of its stages, and the slack of encoding), so that a stray file of a
/// gigabyte under the key of a 40-byte chunk is refused, not read; at most [`most_stored`].
fn most_stored_of(ctx: &ReadContext, meta: &ArrayMeta, inner: bool) -> u64 {
    let most = most_stored(ctx);
    if meta.dtype.item_size().is_none() {
        return most;
    }
    let (chain, shape) = unit_chain(meta, inner);
    let limit = limit_for(meta, shape.iter().product(), &ctx.opts);
    chain
        .bound(shape, limit)
        .map_or(most, |b| (b as u64).saturating_add(UNIT_SLACK).min(most))
}

/// The error of a read of inner chunks of the shard at `key`: a range its index gave that runs
/// past its end means the shard is another, shorter one now, and its index is read again.
fn inner_read_error(key: &StoreKey, e: StoreError) -> ReadError {
    match e {
        StoreError::Range { .. } => ReadError::Changed(key.to_string()),
        e => e.into(),
    }
}

fn too_large_unit(key: &str, size: u64, most: u64) -> ReadError {
    ReadError::TooLarge(format!(
        "'{key}' holds a stored chunk of {size} bytes; at most {most} are read for one"
    ))
}

/// Waits for a permit to decode (see [`ReadContext::decoders`]); the permit ends when it is
/// dropped.
async fn decode_permit(ctx: &ReadContext) -> PriorityPermit {
    ctx.decoders().take(ctx.rank).await
}

/// What decoding one stored unit of an array needs, owned, for the blocking pool.
struct Decoder {
    meta: Arc<ArrayMeta>,
    key: StoreKey,
    inner: bool,
    caches: Option<Arc<Caches>>,
    opts: ReadOptions,
}

impl Decoder {
    fn new(ctx: &ReadContext, meta: &Arc<ArrayMeta>, key: &StoreKey, inner: bool) -> Self {
        Self {
            meta: meta.clone(),
            key: key.clone(),
            inner,
            caches: ctx.caches.clone(),
            opts: ctx.opts.clone(),
        }
    }

    /// Runs `run` with the chain, shape, fill and size limit of the unit.
    fn decode(
        &self,
        run: impl FnOnce(&CodecChain, &[u64], &FillValue, usize) -> Result<Elements, CodecError>,
    ) -> Result<Arc<Decoded>, ReadError> {
        let meta = &self.meta;
        let (chain, shape) = unit_chain(meta, self.inner);
        let limit = limit_for(meta, shape.iter().product(), &self.opts);
        if let Some(c) = &self.caches {
            c.decodes.fetch_add(1, Ordering::Relaxed);
        }
        run(chain, shape, &meta.fill, limit)
            .map(|elements| Arc::new(Decoded::new(elements)))
            .map_err(|e| ReadError::codec(&self.key, e))
    }
}

/// Copies on the blocking pool when the block is large, inline when it is small.
async fn copy_out(
    output: &Arc<Output>,
    block: Arc<Decoded>,
    shape: Vec<u64>,
    parts: Vec<CellPart>,
    key: &StoreKey,
) -> Result<(), ReadError> {
    let n: u64 = parts.iter().map(|p| p.count).product();
    if n < 16 * 1024 || matches!(output.sink, Sink::Collect(_)) {
        return output.copy(&block, &shape, &parts, key);
    }
    let (output, key) = (output.clone(), key.clone());
    crate::workers::spawn_blocking(move || output.copy(&block, &shape, &parts, &key))
        .await
        .map_err(|e| ReadError::Internal(format!("copy task failed: {e}")))?
}

/// A whole decoded chunk of an unsharded array, through the cache.
async fn load_chunk(ctx: &ReadContext, key: &StoreKey, meta: &Arc<ArrayMeta>) -> Result<CachedChunk, ReadError> {
    load_unit(ctx, meta, key, || None, || ctx.id(meta, key, None)).await
}

/// A stored unit read and decoded ([`read_and_decode`]), through the chunk cache under the id
/// `id` gives when there is one. `stored` (where the unit lies, and the object it lies in) is
/// made only to read it: on a hit, a shard's metadata is not cloned.
async fn load_unit(
    ctx: &ReadContext,
    meta: &Arc<ArrayMeta>,
    key: &StoreKey,
    stored: impl FnOnce() -> Option<(ByteRange, ObjectMeta)>,
    id: impl FnOnce() -> ChunkId,
) -> Result<CachedChunk, ReadError> {
    let Some(c) = &ctx.caches else {
        return Box::pin(read_and_decode(ctx, meta, key, stored())).await;
    };
    let load = || {
        let (owned, meta_, key_, stored) = (ctx.clone(), meta.clone(), key.clone(), stored());
        async move { read_and_decode(&owned, &meta_, &key_, stored).await }
    };
    through_cache(c, chunks, id(), load).await
}

/// Looks a decoded chunk or a shard index up in `caches` (`pick` says which cache), loading it
/// on a miss in a task of its own ([`detach`]): a load the request no longer waits for (it
/// timed out, its client went) runs on, within [`DETACHED_LOADS`], and is cached for the next.
/// `load` makes the load's future only on a miss: that future (a store read and a decode) is
/// kilobytes, which every hit would otherwise move around, and owns clones of what it reads
/// (the context, the metadata, the key), which a hit need not make.
async fn through_cache<V, F>(
    caches: &Arc<Caches>,
    pick: fn(&Caches) -> (&crate::cache::Cache<ChunkId, V>, &CacheCounters),
    id: ChunkId,
    load: impl FnOnce() -> F,
) -> Result<V, ReadError>
where
    V: Clone + Send + Sync + 'static,
    F: std::future::Future<Output = Result<V, ReadError>> + Send + 'static,
{
    let (cache, counters) = pick(caches);
    if let Some(hit) = cache.get(&id).await {
        counters.record(false);
        return Ok(hit);
    }
    let (caches, load) = (caches.clone(), load());
    // Its own work once this request's task is the one loading (moka runs one caller's load
    // for a key; the others wait for it, and need not run on for it).
    let loaded = detach_working(&DETACHED_LOADS, |working| async move {
        let (cache, counters) = pick(&caches);
        let load = move || async move {
            working.begin();
            load.await
        };
        cached(cache, counters, id, load).await
    })
    .await
    .map_err(load_task_failed)?;
    Ok(loaded?)
}

/// The error of a detached load's task that did not end with a result (it panicked).
fn load_task_failed(e: tokio::task::JoinError) -> ReadError {
    ReadError::Internal(format!("load task failed: {e}"))
}

fn chunks(c: &Caches) -> (&crate::cache::Cache<ChunkId, CachedChunk>, &CacheCounters) {
    (&c.chunks, &c.chunk_counters)
}

fn indexes(c: &Caches) -> (&crate::cache::Cache<ChunkId, CachedIndex>, &CacheCounters) {
    (&c.shard_indexes, &c.index_counters)
}

async fn read_chunk(
    ctx: &ReadContext,
    key: &StoreKey,
    parts: &[CellPart],
    meta: Arc<ArrayMeta>,
    output: Arc<Output>,
) -> Result<(), ReadError> {
    match load_chunk(ctx, key, &meta).await? {
        Some(block) => copy_out(&output, block, meta.chunk_shape.clone(), parts.to_vec(), key).await,
        None => output.fill(parts), // missing chunk
    }
}

/// Reads the index of a shard; `None` when the shard does not exist.
async fn load_index(
    ctx: &ReadContext,
    key: &StoreKey,
    codec: &ShardingCodec,
    n: u64,
) -> Result<CachedIndex, ReadError> {
    let size = codec.index_size(n);
    let range = match codec.index_location {
        IndexLocation::End => ByteRange::Suffix(size),
        IndexLocation::Start => ByteRange::Bounded(0, size),
    };
    let smaller = |shard_len: u64| ReadError::Corrupt {
        key: key.to_string(),
        message: format!("shard of {shard_len} bytes is smaller than its {size}-byte index"),
    };
    let (bytes, shard) = match ctx.store.get_range_bytes(key, range).await {
        Ok(Some(found)) => found,
        Ok(None) => return Ok(None),
        // An empty shard has no bytes for any range to name.
        Err(StoreError::Range { size: shard_len, .. }) => return Err(smaller(shard_len)),
        Err(e) => return Err(e.into()),
    };
    let shard_len = shard.size;
    if shard_len < size || bytes.len() as u64 != size {
        return Err(smaller(shard_len));
    }
    let index = codec.decode_index(&bytes, n).map_err(|e| ReadError::codec(key, e))?;
    Ok(Some(Arc::new((index, shard))))
}

async fn shard_index(
    ctx: &ReadContext,
    meta: &Arc<ArrayMeta>,
    key: &StoreKey,
    codec: &ShardingCodec,
    n: u64,
) -> Result<CachedIndex, ReadError> {
    let Some(c) = &ctx.caches else {
        return Box::pin(load_index(ctx, key, codec, n)).await;
    };
    let load = || {
        let (owned, meta_, key_) = (ctx.clone(), meta.clone(), key.clone());
        async move {
            let codec = meta_
                .chain
                .sharding()
                .ok_or_else(|| ReadError::Internal("not sharded".into()))?;
            load_index(&owned, &key_, codec, n).await
        }
    };
    through_cache(c, indexes, ctx.id(meta, key, None), load).await
}

/// Byte ranges of one shard fetched as one request.
struct RangeGroup {
    /// What is fetched.
    span: Range<u64>,
    /// The ranges inside it, with the caller's numbers.
    members: Vec<(usize, Range<u64>)>,
}

/// The most bytes one fetch of coalesced ranges spans (a range larger than that is fetched
/// alone): up to `concurrency` fetches are in memory at once.
const MAX_COALESCED_SPAN: u64 = 8 << 20;

/// Groups byte ranges that lie within `gap` of each other, in spans of at most `max_span`
/// bytes (unless one range is larger).
fn coalesce(mut ranges: Vec<(usize, Range<u64>)>, gap: u64, max_span: u64) -> Vec<RangeGroup> {
    ranges.sort_by_key(|(_, r)| r.start);
    let mut groups: Vec<RangeGroup> = Vec::new();
    for (i, r) in ranges {
        match groups.last_mut() {
            Some(g)
                if r.start <= g.span.end.saturating_add(gap)
                    && r.end.max(g.span.end).saturating_sub(g.span.start) <= max_span =>
            {
                g.span.end = g.span.end.max(r.end);
                g.members.push((i, r));
            }
            _ => groups.push(RangeGroup {
                span: r.clone(),
                members: vec![(i, r)],
            }),
        }
    }
    groups
}

/// One inner chunk a shard read needs.
struct InnerWant {
    number: u64,
    range: Range<u64>,
    parts: Vec<CellPart>,
}

async fn read_shard(
    ctx: &ReadContext,
    key: &StoreKey,
    shard_coords: &[u64],
    parts: &[CellPart],
    meta: Arc<ArrayMeta>,
    output: Arc<Output>,
) -> Result<(), ReadError> {
    // No retry here: inner chunks of the old shard may already be in `output` (or on their way
    // there). The region is read again as a whole, into a fresh output ([`read_region`]).
    let read = read_shard_once(ctx, key, shard_coords, parts, meta.clone(), output).await;
    ctx.changed(&meta, key, read).await
}

/// [`read_shard`] with the shard's index as cached: [`ReadError::Changed`] when the shard is
/// another object now.
async fn read_shard_once(
    ctx: &ReadContext,
    key: &StoreKey,
    shard_coords: &[u64],
    parts: &[CellPart],
    meta: Arc<ArrayMeta>,
    output: Arc<Output>,
) -> Result<(), ReadError> {
    let Some(codec) = meta.chain.sharding() else {
        return Ok(());
    };
    let shard_shape = &meta.chunk_shape;
    let grid = codec.inner_grid(shard_shape);
    let n: u64 = grid.iter().product();
    let Some(cached_index) = shard_index(ctx, &meta, key, codec, n).await? else {
        return output.fill(parts); // missing shard
    };
    let (index, shard) = (&cached_index.0, &cached_index.1);
    let shard_len = shard.size;
    // The selection restricted to this shard, split over its inner chunks.
    let mut inner_dims = Vec::with_capacity(parts.len());
    for (d, part) in parts.iter().enumerate() {
        let origin = shard_coords[d] * shard_shape[d];
        let step = output.steps[d];
        let first = origin + part.src_start;
        let last = first + (part.count - 1) * step;
        let restricted = DimSelection::Slice {
            start: first,
            step,
            count: part.count,
        };
        let mut inner = cells(restricted, codec.inner_shape[d], origin, first, last + 1);
        for p in &mut inner {
            p.dst_start += part.dst_start;
        }
        inner_dims.push(inner);
    }
    let mut wanted = Vec::new();
    for inner_parts in product(&inner_dims) {
        let number = inner_parts.iter().zip(&grid).fold(0u64, |acc, (p, g)| acc * g + p.cell);
        let range = index
            .range(number as usize, Some(shard_len))
            .map_err(|e| ReadError::codec(key, e))?;
        match range {
            Some(range) => wanted.push(InnerWant {
                number,
                range,
                parts: inner_parts,
            }),
            None => output.fill(&inner_parts)?, // missing inner chunk
        }
    }
    if ctx.store.reads_locally() {
        // Local files: each inner chunk is read and decoded in one blocking call, into a reused
        // read buffer. Coalesced ranges would save no request here, only hold larger buffers
        // (fresh memory) while their inner chunks are decoded one after another.
        stream::iter(wanted)
            .map(|w| {
                let (meta, output) = (meta.clone(), output.clone());
                async move {
                    match load_inner(ctx, &meta, key, w.number, w.range, shard).await? {
                        Some(block) => copy_out(&output, block, unit_shape(&meta).to_vec(), w.parts, key).await,
                        None => output.fill(&w.parts), // the shard vanished: fill
                    }
                }
            })
            .buffer_unordered(ctx.opts.concurrency.max(1))
            .try_collect::<Vec<()>>()
            .await?;
        return Ok(());
    }
    // Inner chunks already decoded in the cache need no read.
    let mut missing = Vec::new();
    for (i, w) in wanted.iter().enumerate() {
        let hit = match &ctx.caches {
            Some(c) => c.chunks.get(&ctx.inner_id(&meta, key, w.number, shard)).await.flatten(),
            None => None,
        };
        match hit {
            Some(block) => {
                if let Some(c) = &ctx.caches {
                    c.chunk_counters.record(false);
                }
                copy_out(&output, block, codec.inner_shape.clone(), w.parts.clone(), key).await?;
            }
            None => missing.push((i, w.range.clone())),
        }
    }
    // An inner chunk is read into memory whole: no more than a chunk is (see read_and_decode).
    let most = most_stored_of(ctx, &meta, true);
    if let Some((_, r)) = missing.iter().find(|(_, r)| r.end - r.start > most) {
        return Err(too_large_unit(key.as_str(), r.end - r.start, most));
    }
    let groups = coalesce(missing, ctx.opts.coalesce_gap, MAX_COALESCED_SPAN);
    let (wanted, inner_shape) = (&wanted, &codec.inner_shape);
    stream::iter(groups)
        .map(|RangeGroup { span, members }| {
            let output = output.clone();
            let members = members.into_iter().map(|(i, r)| (i, wanted[i].number, r)).collect();
            // Decoded inner chunks come back as they are done, a few at most waiting to be
            // copied, and each is dropped once copied (the span's members may be thousands).
            let (sent, mut decoded) = tokio::sync::mpsc::channel(ctx.opts.decode_permits.max(1));
            let load = fetch_inner(
                ctx.clone(),
                meta.clone(),
                key.clone(),
                shard.clone(),
                span,
                members,
                sent,
            );
            async move {
                let copied = async {
                    while let Some((i, block)) = decoded.recv().await {
                        let parts = &wanted[i].parts;
                        match block {
                            Some(block) => copy_out(&output, block, inner_shape.clone(), parts.clone(), key).await?,
                            None => output.fill(parts)?, // the shard vanished: fill
                        }
                    }
                    Ok::<(), ReadError>(())
                };
                // With a cache, the fetch and its decodes go on if the request goes, and what
                // they decode is cached (see through_cache).
                let loaded = async {
                    match &ctx.caches {
                        Some(_) => detach(&DETACHED_LOADS, load).await.map_err(load_task_failed)?,
                        None => load.await,
                    }
                };
                futures::try_join!(loaded, copied).map(|_| ())
            }
        })
        .buffer_unordered(ctx.opts.concurrency.max(1))
        .try_collect::<Vec<()>>()
        .await?;
    Ok(())
}

/// Fetches `span` of the remote shard at `key` (as its index saw it: `shard`) and decodes the
/// inner chunks `members` (the caller's number, the inner chunk's number, its range) in it,
/// through the cache, sending each to `done` with the caller's number (`None`: the shard
/// vanished). A send nobody receives any more is no error: the decodes go on, to be cached.
async fn fetch_inner(
    ctx: ReadContext,
    meta: Arc<ArrayMeta>,
    key: StoreKey,
    shard: ObjectMeta,
    span: Range<u64>,
    members: Vec<(usize, u64, Range<u64>)>,
    done: tokio::sync::mpsc::Sender<(usize, CachedChunk)>,
) -> Result<(), ReadError> {
    let fetched = ctx
        .store
        .get_range_bytes(&key, ByteRange::Bounded(span.start, span.end))
        .await;
    let Some((bytes, object)) = fetched.map_err(|e| inner_read_error(&key, e))? else {
        for (i, ..) in members {
            if done.send((i, None)).await.is_err() {
                break;
            }
        }
        return Ok(());
    };
    if !object.same_object(&shard) {
        return Err(ReadError::Changed(key.to_string()));
    }
    // The inner chunks of one fetched range decode concurrently, as many at once as the
    // request has decode permits.
    let (ctx, meta, key, shard, bytes, done) = (&ctx, &meta, &key, &shard, &bytes, &done);
    stream::iter(members)
        .map(|(i, number, r)| async move {
            let (a, b) = ((r.start - span.start) as usize, (r.end - span.start) as usize);
            if b > bytes.len() {
                return Err(ReadError::copy(key, "short read of a shard range".into()));
            }
            let load = decode(ctx, meta, key, bytes.slice(a..b), true);
            let block = match &ctx.caches {
                Some(c) => {
                    let id = ctx.inner_id(meta, key, number, shard);
                    cached(&c.chunks, &c.chunk_counters, id, || async { load.await.map(Some) }).await?
                }
                None => Some(load.await?),
            };
            let _ = done.send((i, block)).await;
            Ok(())
        })
        .buffer_unordered(ctx.opts.decode_permits.max(1))
        .try_collect::<Vec<()>>()
        .await
        .map(|_| ())
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;
    use crate::zarr::parse_v2;

    /// A context's decode permits are made at the first decode, or when it is cloned: every
    /// clone and ranked copy shares them, whenever it was made.
    #[test]
    fn decode_turns_are_made_when_needed_and_shared_by_clones() {
        let dir = tempfile::tempdir().unwrap();
        let ctx = ReadContext::uncached(Store::new(crate::store::open_local(dir.path()).unwrap()));
        assert!(
            ctx.decoders.get().is_none(),
            "a context that decodes nothing makes no permits"
        );
        let (clone, ranked) = (ctx.clone(), ctx.ranked(3));
        assert!(Arc::ptr_eq(ctx.decoders(), clone.decoders()));
        assert!(Arc::ptr_eq(ctx.decoders(), ranked.decoders()));
        assert!(Arc::ptr_eq(ctx.decoders(), clone.clone().decoders()));
        assert_eq!(ranked.rank, 3);
    }

    fn sel(dims: &[(u64, u64, u64)]) -> Selection {
        Selection(
            dims.iter()
                .map(|&(start, step, count)| DimSelection::Slice { start, step, count })
                .collect(),
        )
    }

    #[test]
    fn limits_are_413_and_corruption_500() {
        use crate::error::ApiError;
        let key = StoreKey::new("a/c/0").unwrap();
        let over = ReadError::codec(&key, CodecError::OverLimit("vlen-utf8: too many".into()));
        let api: ApiError = over.into();
        assert!(
            matches!(&api, ApiError::TooLarge(m) if m.contains("a/c/0") && m.contains("too many")),
            "{api:?}"
        );
        let bomb: ApiError = ReadError::codec(&key, CodecError::TooLarge { limit: 10 }).into();
        assert!(matches!(bomb, ApiError::CorruptData { .. }), "{bomb:?}");
    }

    /// Ranges near each other are fetched together, in spans of at most the cap: a sparse
    /// read of a vast shard fetches no more than it must, a span at a time.
    #[test]
    fn coalesced_spans_are_capped() {
        let spans = |ranges: &[(u64, u64)], gap, cap| -> Vec<(Range<u64>, Vec<usize>)> {
            let ranges = ranges.iter().enumerate().map(|(i, &(a, b))| (i, a..b)).collect();
            coalesce(ranges, gap, cap)
                .into_iter()
                .map(|g| (g.span, g.members.into_iter().map(|(i, _)| i).collect()))
                .collect()
        };
        let near = [(0, 10), (15, 20), (20, 40), (100, 110)];
        assert_eq!(spans(&near, 10, 1000), [(0..40, vec![0, 1, 2]), (100..110, vec![3])]);
        assert_eq!(spans(&near, 100, 1000), [(0..110, vec![0, 1, 2, 3])]);
        assert_eq!(
            spans(&near, 100, 30),
            [(0..20, vec![0, 1]), (20..40, vec![2]), (100..110, vec![3])]
        );
        // A range larger than the cap is fetched alone.
        assert_eq!(
            spans(&[(0, 50), (50, 60)], 10, 30),
            [(0..50, vec![0]), (50..60, vec![1])]
        );
    }

    /// Inner chunks are cached under what tells their shard from another: a shard rewritten
    /// at the same size on an origin with no ETag differs only by its modification time.
    #[test]
    fn inner_chunk_ids_follow_the_shard_s_modification_time() {
        let doc = json!({
            "zarr_format": 2, "shape": [4], "chunks": [4], "dtype": "<u1",
            "compressor": null, "fill_value": 0, "order": "C", "filters": null
        });
        let meta = parse_v2(&doc, None).unwrap();
        let dir = tempfile::tempdir().unwrap();
        let ctx = ReadContext::uncached(Store::new(crate::store::open_local(dir.path()).unwrap()));
        let key = StoreKey::new("a/c/0").unwrap();
        let at = |secs| ObjectMeta {
            size: 100,
            last_modified: Some(std::time::UNIX_EPOCH + std::time::Duration::from_secs(secs)),
            version: None,
        };
        assert_eq!(
            ctx.inner_id(&meta, &key, 1, &at(5)),
            ctx.inner_id(&meta, &key, 1, &at(5))
        );
        assert_ne!(
            ctx.inner_id(&meta, &key, 1, &at(5)),
            ctx.inner_id(&meta, &key, 1, &at(6))
        );
    }

    #[test]
    fn one_unit_holds_the_selection() {
        let doc = json!({
            "zarr_format": 2, "shape": [10, 8], "chunks": [4, 1], "dtype": "<f4",
            "compressor": null, "fill_value": 0, "order": "C", "filters": null
        });
        let meta = parse_v2(&doc, None).unwrap();
        let one_unit = |meta: &ArrayMeta, sel: &Selection| {
            let mut coords = vec![0; sel.0.len()];
            one_unit(meta, sel, &mut coords).map(|whole| (coords, whole))
        };
        let unit = |coords: Vec<u64>, whole| Some((coords, whole));
        assert_eq!(one_unit(&meta, &sel(&[(4, 1, 4), (3, 1, 1)])), unit(vec![1, 3], true));
        // An integer on a dimension of chunk length 1 is that chunk too.
        let s = Selection(vec![
            DimSelection::Slice {
                start: 0,
                step: 1,
                count: 4,
            },
            DimSelection::Index(7),
        ]);
        assert_eq!(one_unit(&meta, &s), unit(vec![0, 7], true));
        // Inside one chunk, but not all of it.
        assert_eq!(one_unit(&meta, &sel(&[(4, 1, 3), (3, 1, 1)])), unit(vec![1, 3], false));
        assert_eq!(one_unit(&meta, &sel(&[(4, 3, 2), (3, 1, 1)])), unit(vec![1, 3], false));
        assert_eq!(one_unit(&meta, &sel(&[(8, 1, 2), (3, 1, 1)])), unit(vec![2, 3], false)); // the edge chunk
        for other in [
            sel(&[(2, 1, 4), (3, 1, 1)]), // straddles two
            sel(&[(0, 2, 4), (3, 1, 1)]), // a step that leaves the chunk
            sel(&[(0, 1, 4), (3, 1, 2)]), // two chunks along the second dimension
            sel(&[(4, 1, 0), (3, 1, 1)]), // nothing
            sel(&[(4, 1, 4)]),            // wrong rank
        ] {
            assert_eq!(one_unit(&meta, &other), None, "{other:?}");
        }
    }
}
