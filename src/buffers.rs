//! Spare byte buffers, kept for reuse in pools bounded in bytes.
//!
//! A large allocation is mapped anew by the allocator and faulted in page by page when first
//! written: for a zstd chunk of 1 MiB that is about a third of the CPU of decoding it. Memory the
//! process already has costs no faults, so buffers that are freed at the rate new ones are needed
//! (read buffers; decoded chunks once the chunk cache is full) are handed back here and reused.
//! A new large buffer has its pages mapped in one call rather than a fault at a time.

use std::sync::Mutex;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};

/// Allocations at least this large are populated when new ([`populate`]).
const POPULATE_FROM: usize = 256 << 10;

/// Has the kernel map all pages of a new large allocation in one call, instead of one page
/// fault per page (4 KiB here) as the decoder first writes each. The pages are the same zeroed
/// pages the faults would map, and the bytes the buffer holds are unchanged; what is saved is
/// a trap per page: a cold 64 MiB region of 1 MiB zstd chunks took ~9% less CPU
/// (bench/JOURNAL.md).
///
/// A block the allocator carved from its reserve ([`crate::alloc::start_reserve`]) has all its
/// pages faulted in already, and asking again walks them all for nothing (6% of the server's CPU
/// in a cold blosc region). A fresh mapping has none, so the first page tells which it is.
fn populate(buf: &mut Vec<u8>) {
    #[cfg(target_os = "linux")]
    {
        if buf.capacity() < POPULATE_FROM {
            return;
        }
        let Some(page) = crate::alloc::page_size() else {
            return;
        };
        let start = buf.as_mut_ptr() as usize;
        let first = start.next_multiple_of(page);
        let end = (start + buf.capacity()) / page * page;
        if end > first && !resident(first, page) {
            // SAFETY: the range lies within the buffer's allocation, which this function has
            // exclusive access to; MADV_POPULATE_WRITE maps pages as a write would without
            // writing, so no byte of the allocation changes. An error (a kernel before 5.14)
            // leaves the pages to be faulted in as usual.
            unsafe {
                libc::madvise(first as *mut libc::c_void, end - first, libc::MADV_POPULATE_WRITE);
            }
        }
    }
}

/// Whether the page at `page_start` (page-aligned, within an allocation) is in memory.
#[cfg(target_os = "linux")]
fn resident(page_start: usize, page: usize) -> bool {
    let mut state = 0u8;
    // SAFETY: mincore only reads the page tables of the one page and writes one byte of state
    // for it into `state`.
    let ok = unsafe { libc::mincore(page_start as *mut libc::c_void, page, &mut state) } == 0;
    ok && state & 1 == 1
}

/// A pool of spare buffers: at most `max_total` bytes of capacity, each between `min_each` and
/// `max_each` bytes.
#[derive(Debug)]
pub struct BufferPool {
    spare: Mutex<Vec<Vec<u8>>>,
    min_each: usize,
    max_each: usize,
    max_total: AtomicUsize,
    /// The capacity of the spare buffers in all: changed only with `spare` locked, read
    /// without it too ([`Self::room`]).
    kept: AtomicUsize,
    reuses: AtomicU64,
}

/// Read buffers of blocking store reads (compressed chunks, shard ranges, metadata documents).
pub static READS: BufferPool = BufferPool::new(0, 4 << 20, 16 << 20);

/// Buffers of decoded chunks (and inner chunks of shards), kept when a chunk leaves the chunk
/// cache: a server whose cache is full decodes each new chunk into the buffer of one it
/// evicted. Sized with the cache (`cache::Caches::new`). Smaller buffers come from the
/// allocator's arenas, where freed memory is reused anyway.
pub static DECODED: BufferPool = BufferPool::new(64 << 10, usize::MAX, 0);

impl BufferPool {
    /// An empty pool.
    pub const fn new(min_each: usize, max_each: usize, max_total: usize) -> Self {
        Self {
            spare: Mutex::new(Vec::new()),
            min_each,
            max_each,
            max_total: AtomicUsize::new(max_total),
            kept: AtomicUsize::new(0),
            reuses: AtomicU64::new(0),
        }
    }

    /// Sets the most bytes the pool keeps (buffers already kept stay until taken).
    pub fn set_max_total(&self, bytes: usize) {
        self.max_total.store(bytes, Ordering::Relaxed);
    }

    /// The most recently kept buffer, emptied, whatever its capacity (it grows as needed).
    pub fn take_any(&self) -> Vec<u8> {
        self.spare
            .lock()
            .ok()
            .and_then(|mut s| {
                let buf = s.pop()?;
                self.kept.fetch_sub(buf.capacity(), Ordering::Relaxed);
                self.reuses.fetch_add(1, Ordering::Relaxed);
                Some(buf)
            })
            .unwrap_or_default()
    }

    /// An empty buffer with room for `len` bytes: a kept one (see [`Self::kept`]), or a new
    /// allocation.
    pub fn take(&self, len: usize) -> Vec<u8> {
        self.kept(len).unwrap_or_else(|| {
            let mut buf = Vec::with_capacity(len);
            populate(&mut buf);
            buf
        })
    }

    /// `len` zero bytes, for decoders that write into an initialised slice: a kept buffer
    /// zeroed, or a new zeroed allocation (whose pages the allocator maps as zero, unwritten).
    pub fn take_zeroed(&self, len: usize) -> Vec<u8> {
        match self.kept(len) {
            Some(mut buf) => {
                buf.resize(len, 0);
                buf
            }
            None => {
                let mut buf = vec![0; len];
                populate(&mut buf);
                buf
            }
        }
    }

    /// A kept buffer, emptied, with room for `len` bytes and a capacity at most an eighth over
    /// it (so that the bytes it holds are what a cache weighs).
    fn kept(&self, len: usize) -> Option<Vec<u8>> {
        if len < self.min_each {
            return None;
        }
        let mut s = self.spare.lock().ok()?;
        let i = s
            .iter()
            .rposition(|b| b.capacity() >= len && b.capacity() - len <= len / 8)?;
        let buf = s.swap_remove(i);
        self.kept.fetch_sub(buf.capacity(), Ordering::Relaxed);
        self.reuses.fetch_add(1, Ordering::Relaxed);
        Some(buf)
    }

    /// Keeps `buf` (emptied) for reuse when its capacity is in the pool's range and the pool has
    /// room; otherwise frees it.
    pub fn give(&self, mut buf: Vec<u8>) {
        let capacity = buf.capacity();
        if capacity < self.min_each.max(1) || capacity > self.max_each {
            return;
        }
        buf.clear();
        if let Ok(mut s) = self.spare.lock()
            && self.kept_bytes() + capacity <= self.max_total.load(Ordering::Relaxed)
        {
            self.kept.fetch_add(capacity, Ordering::Relaxed);
            s.push(buf);
        }
    }

    /// Buffers handed out again.
    pub fn reuses(&self) -> u64 {
        self.reuses.load(Ordering::Relaxed)
    }

    /// Bytes of capacity kept.
    pub fn kept_bytes(&self) -> usize {
        self.kept.load(Ordering::Relaxed)
    }

    /// Bytes the pool has room for, read without taking its lock.
    pub fn room(&self) -> usize {
        self.max_total.load(Ordering::Relaxed).saturating_sub(self.kept_bytes())
    }
}

/// Text of at most `N` bytes, written on the stack ([`std::fmt::Write`]): for short strings
/// made for every request (a chunk's key, a header's value) that are copied into an allocation
/// of their own anyway. A write past `N` bytes fails (the caller then takes another way).
pub struct StackText<const N: usize> {
    buf: [u8; N],
    len: usize,
}

impl<const N: usize> StackText<N> {
    /// Empty.
    pub fn new() -> Self {
        Self { buf: [0; N], len: 0 }
    }

    /// What was written.
    pub fn as_str(&self) -> &str {
        // Only whole `str`s are written: the bytes are UTF-8.
        std::str::from_utf8(&self.buf[..self.len]).unwrap_or_default()
    }
}

impl<const N: usize> Default for StackText<N> {
    fn default() -> Self {
        Self::new()
    }
}

impl<const N: usize> std::fmt::Write for StackText<N> {
    fn write_str(&mut self, s: &str) -> std::fmt::Result {
        let end = self.len + s.len();
        self.buf
            .get_mut(self.len..end)
            .ok_or(std::fmt::Error)?
            .copy_from_slice(s.as_bytes());
        self.len = end;
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn buffers_are_reused_within_bounds() {
        let pool = BufferPool::new(1024, 1 << 20, 3 << 12);
        let mut a = pool.take(4096);
        a.extend_from_slice(&[7; 4096]);
        let ptr = a.as_ptr();
        pool.give(a);
        assert_eq!(pool.kept_bytes(), 4096);
        // Too large for it, or too small: a new allocation; the kept one stays.
        assert_eq!(pool.take(8192).capacity(), 8192);
        assert!(pool.take(3000).capacity() >= 3000);
        assert_eq!(pool.kept_bytes(), 4096);
        // Within an eighth: reused, emptied.
        let b = pool.take(3700);
        assert_eq!((b.as_ptr(), b.len(), b.capacity()), (ptr, 0, 4096));
        assert_eq!(pool.kept_bytes(), 0);
        // Outside the size range, or over the total: freed.
        pool.give(Vec::with_capacity(512));
        pool.give(Vec::with_capacity(2 << 20));
        assert_eq!(pool.kept_bytes(), 0);
        for _ in 0..4 {
            pool.give(Vec::with_capacity(4096));
        }
        assert_eq!(pool.kept_bytes(), 3 << 12);
        assert_eq!(pool.take_any().capacity(), 4096);
        // Below the pool's smallest size nothing is looked up.
        assert_eq!(pool.take(100).capacity(), 100);
        // Zeroed: a kept buffer that held other bytes comes back as zeros, and so does a new one.
        let mut c = pool.take(4096);
        c.extend_from_slice(&[9; 4096]);
        let ptr = c.as_ptr();
        pool.give(c);
        let z = pool.take_zeroed(4000);
        assert_eq!((z.as_ptr(), z.len()), (ptr, 4000));
        assert!(z.iter().all(|&b| b == 0));
        assert_eq!(pool.take_zeroed(5000), vec![0; 5000]);
        // New large buffers are populated: still zeros, and what is written stays.
        let big = pool.take_zeroed(POPULATE_FROM + 12345);
        assert_eq!(big.len(), POPULATE_FROM + 12345);
        assert!(big.iter().all(|&b| b == 0));
        let mut fresh = pool.take(POPULATE_FROM * 2);
        fresh.extend((0..POPULATE_FROM * 2).map(|i| i as u8));
        assert!(fresh.iter().enumerate().all(|(i, &b)| b == i as u8));
    }

    #[cfg(target_os = "linux")]
    #[test]
    fn a_page_is_resident_once_written_and_not_before() {
        let page = crate::alloc::page_size().unwrap();
        // SAFETY: a new private anonymous mapping of two pages, written and unmapped only here.
        unsafe {
            let map = libc::mmap(
                std::ptr::null_mut(),
                2 * page,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_PRIVATE | libc::MAP_ANONYMOUS,
                -1,
                0,
            );
            assert_ne!(map, libc::MAP_FAILED);
            let (a, b) = (map as usize, map as usize + page);
            assert!(!resident(a, page) && !resident(b, page));
            *(b as *mut u8) = 1;
            assert!(!resident(a, page) && resident(b, page));
            libc::munmap(map, 2 * page);
        }
    }

    #[test]
    fn stack_text_holds_what_fits_and_refuses_more() {
        use std::fmt::Write;
        let mut text = StackText::<8>::new();
        assert_eq!(text.as_str(), "");
        text.write_str("c/1").unwrap();
        text.write_char('/').unwrap();
        text.write_str("élan").unwrap_err();
        assert_eq!(text.as_str(), "c/1/");
        text.write_str("éla").unwrap();
        assert_eq!(text.as_str(), "c/1/éla");
        text.write_str("x").unwrap_err();
        assert_eq!(text.as_str(), "c/1/éla");
    }
}
