//! The process's allocator (Linux): large Rust allocations are mappings of their own, the rest
//! is the system allocator.
//!
//! Decoded chunks (64 KiB to a few MiB) live in the chunk cache and are freed by whichever
//! thread evicts them. Kept in glibc's per-thread arenas, such buffers fragment them, and the
//! arenas never shrink: under the load test RSS reached about twice the cache (load/README.md).
//! As a mapping of its own, a buffer goes back to the system when it is freed, and RSS tracks
//! the cache.
//!
//! glibc would map them too with its mmap threshold pinned at 128 KiB, but that threshold is
//! the whole process's: the C libraries' temporaries would be mapped, faulted in and unmapped
//! at each call as well. c-blosc allocates two blocks' worth (1 MiB for 512 KiB blocks) for
//! every chunk it decodes, and with the pinned threshold a cold read of blosc chunks spent most
//! of its time in the kernel (bench/JOURNAL.md). Mapping Rust's large allocations here leaves
//! glibc's threshold free for C's short-lived ones, which its arenas reuse.
//!
//! A fresh mapping costs a page fault and a zeroed page per 4 KiB when first written: for a
//! cold 64 MiB slice, whose decoded chunks are new memory while the chunk cache grows, that was
//! a third of the server's CPU (bench/JOURNAL.md). [`start_reserve`] keeps a reserve of pages
//! already faulted in, made while the machine is otherwise idle, and large blocks are carved
//! from it while it lasts.

use std::alloc::{GlobalAlloc, Layout, System};
use std::ptr;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Mutex, OnceLock};
use std::thread::Thread;
use std::time::Duration;

/// Allocations of at least this many bytes (and at most page alignment) are mappings. A mapping
/// takes whole pages: with 4 KiB pages a block of this size or more wastes at most 3% (on a kernel
/// with 64 KiB pages, up to a third), as glibc's own mappings of large blocks do.
///
/// Each live block is a mapping of its own, and the kernel allows a process `vm.max_map_count`
/// of them (65,530 by default): 8 GiB of blocks of 128 KiB, far above a chunk cache's usual size.
pub const MAP_FROM: usize = 128 << 10;

/// Page size assumed for alignment: mappings are aligned to at least this (4 KiB is the
/// smallest page size Linux has).
const MIN_PAGE: usize = 4096;

/// Rust's global allocator for the server binary: see the module documentation.
#[derive(Debug, Default, Clone, Copy)]
pub struct MapLarge;

fn mapped(layout: &Layout) -> bool {
    layout.size() >= MAP_FROM && layout.align() <= MIN_PAGE
}

/// A fresh private anonymous mapping of `size` bytes (zeroed by the kernel), or null.
fn map(size: usize) -> *mut u8 {
    // SAFETY: a new anonymous mapping touches no existing memory.
    or_null(unsafe {
        libc::mmap(
            ptr::null_mut(),
            size,
            libc::PROT_READ | libc::PROT_WRITE,
            libc::MAP_PRIVATE | libc::MAP_ANONYMOUS,
            -1,
            0,
        )
    })
}

/// The block `mmap` or `mremap` returned, or null for their failure.
fn or_null(mapping: *mut libc::c_void) -> *mut u8 {
    if mapping == libc::MAP_FAILED {
        ptr::null_mut()
    } else {
        mapping.cast()
    }
}

/// The system's page size, if it says.
pub(crate) fn page_size() -> Option<usize> {
    // SAFETY: sysconf only reads a system setting.
    match unsafe { libc::sysconf(libc::_SC_PAGESIZE) } {
        p if p > 0 => Some(p as usize),
        _ => None,
    }
}

/// Regions the reserve holds at most.
const SLOTS: usize = 16;
/// The reserve is made in regions of a multiple of this.
const RESERVE_STEP: usize = 2 << 20;
/// A region is at most this large, so that the reserve grows in steps a request can use while
/// the rest is still being faulted in (a server's first request comes soon after it starts).
const REGION_MOST: usize = 16 << 20;

/// The reserve: regions of private anonymous pages, each page already faulted in and written
/// only with zeros, that large blocks are carved from the front of. `(start, length)`,
/// page-aligned; length 0 is an empty slot. The allocator only ever `try_lock`s it.
static RESERVE: Mutex<[(usize, usize); SLOTS]> = Mutex::new([(0, 0); SLOTS]);
/// Bytes in the reserve.
static RESERVED: AtomicUsize = AtomicUsize::new(0);
/// The bytes the reserve is being kept at.
static RESERVE_TARGET: AtomicUsize = AtomicUsize::new(0);
/// The page size blocks are carved in; 0 until the reserve is started.
static PAGE: AtomicUsize = AtomicUsize::new(0);
/// The thread that keeps the reserve, woken when it runs low.
static KEEPER: OnceLock<Thread> = OnceLock::new();

/// A block of `size` bytes carved from the reserve, or null when it has too little or is busy
/// (the allocator never waits for it).
fn reserved(size: usize) -> *mut u8 {
    let page = PAGE.load(Ordering::Relaxed);
    if page == 0 || RESERVED.load(Ordering::Relaxed) < size {
        return ptr::null_mut();
    }
    let size = size.next_multiple_of(page);
    let Ok(mut regions) = RESERVE.try_lock() else {
        return ptr::null_mut();
    };
    let Some((start, len)) = regions.iter_mut().find(|(_, len)| *len >= size) else {
        return ptr::null_mut();
    };
    let block = *start;
    *start += size;
    *len -= size;
    let left = RESERVED.fetch_sub(size, Ordering::Relaxed) - size;
    drop(regions);
    let target = RESERVE_TARGET.load(Ordering::Relaxed);
    if left + REGION_MOST.min(target / 2) <= target
        && let Some(keeper) = KEEPER.get()
    {
        keeper.unpark();
    }
    block as *mut u8
}

/// A block of `size` bytes for a mapped layout: from the reserve, else a fresh mapping.
fn block(size: usize) -> *mut u8 {
    let block = reserved(size);
    if block.is_null() { map(size) } else { block }
}

/// A new mapping of `size` bytes that the kernel keeps as an area of its own: marked
/// `MADV_DONTDUMP` (unlike other mappings) with an unmapped page after it (unlike the regions
/// made before it, which the kernel places above it). So blocks of other mappings are unmapped
/// without waiting on the faults of the idle thread in this one. Null if it cannot be made.
fn apart(size: usize, page: usize) -> *mut u8 {
    let Some(with_gap) = size.checked_add(page) else {
        return ptr::null_mut();
    };
    let region = map(with_gap);
    if !region.is_null() {
        // SAFETY: advice on, and the last page of, the new mapping only. If the advice fails,
        // the region may share an area with a neighbour, which costs only that independence.
        unsafe {
            libc::madvise(region.cast(), size, libc::MADV_DONTDUMP);
            libc::munmap(region.add(size).cast(), page);
        }
    }
    region
}

/// Cuts the end off a reserve slot, keeping its first `keep` bytes (the whole slot is emptied
/// for 0): what was cut is put in `gone`, to be unmapped, and its length returned.
fn cut_end(slot: &mut (usize, usize), keep: usize, gone: &mut (usize, usize)) -> usize {
    let cut = slot.1.saturating_sub(keep);
    if cut > 0 {
        *gone = (slot.0 + slot.1 - cut, cut);
        *slot = if cut == slot.1 { (0, 0) } else { (slot.0, slot.1 - cut) };
    }
    cut
}

/// Starts keeping a reserve of up to `most` bytes, or what `room()` says if less (read
/// without locks; it is polled each second, and when a region's worth, or half the reserve if
/// less, has been taken). Once per process: later calls do nothing.
///
/// Two threads: one at normal priority maps and unmaps regions (the calls that take the
/// process's memory-map lock), and one at idle priority (Linux's `SCHED_IDLE`: it runs only on
/// a CPU with nothing else to run) faults their pages in, in a region nobody else uses yet and
/// that the kernel keeps apart ([`apart`]). A reserve larger than `room()` (the cache filled,
/// or its spare buffers took the room) is released.
pub fn start_reserve(most: usize, room: impl Fn() -> usize + Send + 'static) -> std::io::Result<()> {
    if KEEPER.get().is_some() {
        return Ok(());
    }
    let Some(page) = page_size() else {
        return Ok(());
    };
    let (to_fault, regions) = std::sync::mpsc::channel::<(usize, usize)>();
    let (faulted, done) = std::sync::mpsc::channel::<()>();
    std::thread::Builder::new()
        .name("zarrgate-prefault".into())
        .spawn(move || {
            let idle = libc::sched_param { sched_priority: 0 };
            // SAFETY: sets this thread's own scheduling policy (lowering it needs no privilege).
            unsafe { libc::sched_setscheduler(0, libc::SCHED_IDLE, &idle) };
            for (start, len) in regions {
                for offset in (0..len).step_by(page) {
                    // SAFETY: within a new region that only this thread touches until it says
                    // it is done; writing zero over a zero page changes no byte.
                    unsafe { ptr::write_volatile((start + offset) as *mut u8, 0) };
                }
                if faulted.send(()).is_err() {
                    return;
                }
            }
        })?;
    let keeper = std::thread::Builder::new()
        .name("zarrgate-reserve".into())
        .spawn(move || {
            PAGE.store(page, Ordering::Relaxed);
            loop {
                let target = room().min(most) / RESERVE_STEP * RESERVE_STEP;
                RESERVE_TARGET.store(target, Ordering::Relaxed);
                // One piece of each slot, and one more slot whole.
                let mut unmap = [(0, 0); SLOTS + 1];
                let mut add = 0;
                if let Ok(mut regions) = RESERVE.lock() {
                    let mut have = RESERVED.load(Ordering::Relaxed);
                    for (slot, gone) in regions.iter_mut().zip(unmap.iter_mut()) {
                        // What is over the target goes from the end of a region (blocks are
                        // carved from the front), and remainders too small for a block go.
                        let over = have.saturating_sub(target).min(slot.1);
                        let keep = if slot.1 - over < MAP_FROM { 0 } else { slot.1 - over };
                        have -= cut_end(slot, keep, gone);
                    }
                    let room_for_more = |have: usize| have + RESERVE_STEP <= target;
                    // Every slot holding a piece: the smallest goes, so that a region fits.
                    if room_for_more(have)
                        && !regions.iter().any(|slot| slot.1 == 0)
                        && let Some(smallest) = regions.iter_mut().min_by_key(|slot| slot.1)
                    {
                        have -= cut_end(smallest, 0, &mut unmap[SLOTS]);
                    }
                    RESERVED.store(have, Ordering::Relaxed);
                    if room_for_more(have) {
                        add = (target - have).min(REGION_MOST);
                    }
                }
                for (start, len) in unmap {
                    if len > 0 {
                        // SAFETY: pages taken out of the reserve from the end of a region;
                        // blocks are carved from the front, so none was handed out.
                        unsafe { libc::munmap(start as *mut libc::c_void, len) };
                    }
                }
                let region = if add > 0 { apart(add, page) } else { ptr::null_mut() };
                if !region.is_null() {
                    // The region's first fault sets up its reverse map, which takes the
                    // process's memory-map lock (the faults after it lock only the region).
                    // Made here, at normal priority: by the idle thread, a fault holding that
                    // lock could wait for a free CPU while every mapping and unmapping of the
                    // request threads waited for it.
                    // SAFETY: the first byte of the new region, which nobody else uses yet;
                    // writing zero over a zero page changes no byte.
                    unsafe { ptr::write_volatile(region, 0) };
                    if to_fault.send((region as usize, add)).is_err() || done.recv().is_err() {
                        // SAFETY: the new region, never handed out.
                        unsafe { libc::munmap(region.cast(), add) };
                        return;
                    }
                    let placed = RESERVE.lock().ok().and_then(|mut regions| {
                        let slot = regions.iter_mut().find(|slot| slot.1 == 0)?;
                        *slot = (region as usize, add);
                        RESERVED.fetch_add(add, Ordering::Relaxed);
                        Some(())
                    });
                    if placed.is_none() {
                        // SAFETY: the new region, never handed out.
                        unsafe { libc::munmap(region.cast(), add) };
                    }
                    continue;
                }
                std::thread::park_timeout(Duration::from_secs(1));
            }
        })?;
    let _ = KEEPER.set(keeper.thread().clone());
    Ok(())
}

// SAFETY: every block is either the system allocator's (small, or over-aligned) or a mapping of
// exactly `layout.size()` bytes made here, and `mapped(layout)` tells which, for the same
// layout, at allocation and at release. Mappings are page-aligned, so they satisfy any
// alignment up to MIN_PAGE.
unsafe impl GlobalAlloc for MapLarge {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        if mapped(&layout) {
            block(layout.size())
        } else {
            // SAFETY: forwarded with the caller's guarantees.
            unsafe { System.alloc(layout) }
        }
    }

    unsafe fn alloc_zeroed(&self, layout: Layout) -> *mut u8 {
        if mapped(&layout) {
            // New anonymous pages read as zeros, and the reserve's are never written: nothing
            // to clear.
            block(layout.size())
        } else {
            // SAFETY: forwarded with the caller's guarantees.
            unsafe { System.alloc_zeroed(layout) }
        }
    }

    unsafe fn dealloc(&self, block: *mut u8, layout: Layout) {
        if mapped(&layout) {
            debug_assert_eq!(block as usize % MIN_PAGE, 0, "not a mapping made here");
            // SAFETY: `block` is a mapping of `layout.size()` bytes made by `map`, no longer used.
            // It can only fail to be unmapped (splitting a larger mapping at vm.max_map_count),
            // which leaks its pages and harms nothing else.
            let _unmapped = unsafe { libc::munmap(block.cast(), layout.size()) };
            debug_assert_eq!(_unmapped, 0, "munmap failed");
        } else {
            // SAFETY: forwarded with the caller's guarantees.
            unsafe { System.dealloc(block, layout) }
        }
    }

    unsafe fn realloc(&self, block: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        // SAFETY (of the layout): the caller guarantees `new_size`, rounded up to the
        // alignment, does not overflow isize.
        let new_layout = unsafe { Layout::from_size_align_unchecked(new_size, layout.align()) };
        match (mapped(&layout), mapped(&new_layout)) {
            // SAFETY: forwarded with the caller's guarantees.
            (false, false) => unsafe { System.realloc(block, layout, new_size) },
            (true, true) => {
                // SAFETY: `block` is a mapping of `layout.size()` bytes; the kernel moves or
                // resizes it, keeping its contents, or fails and leaves it as it was.
                or_null(unsafe { libc::mremap(block.cast(), layout.size(), new_size, libc::MREMAP_MAYMOVE) })
            }
            // Across the line: a new block of the other kind, the bytes both hold copied over.
            _ => {
                // SAFETY: `new_layout` has a non-zero size (the caller's guarantee).
                let new = unsafe { self.alloc(new_layout) };
                if !new.is_null() {
                    // SAFETY: both blocks hold at least the smaller size and do not overlap;
                    // the old one is released once, after the copy.
                    unsafe {
                        ptr::copy_nonoverlapping(block, new, layout.size().min(new_size));
                        self.dealloc(block, layout);
                    }
                }
                new
            }
        }
    }
}

/// Tunes glibc's malloc, which serves Rust's small allocations and all of the C libraries'
/// (codecs): their temporaries are freed at the end of each call and reused from the arenas.
///
/// - The mmap threshold is fixed at glibc's own ceiling (32 MiB on 64-bit targets): below it,
///   C temporaries (c-blosc's two blocks, bzip2's and lzma's state) are not mapped, faulted in
///   and unmapped at every chunk. Rust's large buffers do not reach glibc.
/// - The trim threshold is 4 MiB, not 128 KiB: at 128 KiB every freed 64 KiB response piece
///   gave its pages back and the next one faulted them in again (a streamed 64 MiB slice took
///   twice as long).
///
/// Either setting also turns off glibc's dynamic adjustment of the other. See load/README.md
/// and bench/JOURNAL.md. An operator's `MALLOC_MMAP_THRESHOLD_`, `MALLOC_TRIM_THRESHOLD_` or
/// `GLIBC_TUNABLES` wins.
#[cfg(all(target_os = "linux", target_env = "gnu"))]
pub fn tune_glibc_malloc() {
    // glibc's ceiling for the threshold: 32 MiB on 64-bit targets, 512 KiB on 32-bit ones.
    const MMAP_THRESHOLD: i32 = if cfg!(target_pointer_width = "64") {
        32 << 20
    } else {
        512 << 10
    };
    if std::env::var_os("GLIBC_TUNABLES").is_some() {
        return;
    }
    for (var, param, value) in [
        ("MALLOC_MMAP_THRESHOLD_", libc::M_MMAP_THRESHOLD, MMAP_THRESHOLD),
        ("MALLOC_TRIM_THRESHOLD_", libc::M_TRIM_THRESHOLD, 4 << 20),
    ] {
        if std::env::var_os(var).is_none() {
            // SAFETY: mallopt only changes allocator parameters; it runs before any other
            // thread exists, and glibc serialises it against allocations anyway.
            unsafe {
                libc::mallopt(param, value);
            }
        }
    }
}

#[cfg(not(all(target_os = "linux", target_env = "gnu")))]
pub fn tune_glibc_malloc() {}

#[cfg(test)]
mod tests {
    use super::*;

    /// Fills `len` bytes at `p` with a pattern that depends on the offset.
    unsafe fn fill(p: *mut u8, len: usize) {
        for i in 0..len {
            unsafe { p.add(i).write((i % 251) as u8) };
        }
    }

    unsafe fn holds_pattern(p: *const u8, len: usize) -> bool {
        (0..len).all(|i| unsafe { p.add(i).read() } == (i % 251) as u8)
    }

    #[test]
    fn large_blocks_are_mappings_and_small_or_overaligned_ones_are_the_systems() {
        let a = MapLarge;
        for (size, align, own) in [
            (MAP_FROM, 8, true),
            (3 << 20, 64, true),
            (MAP_FROM - 1, 8, false),
            (64, 8, false),
            (MAP_FROM, 2 * MIN_PAGE, false),
        ] {
            let layout = Layout::from_size_align(size, align).unwrap();
            unsafe {
                let p = a.alloc(layout);
                assert!(!p.is_null());
                assert_eq!(p as usize % align, 0, "{size} aligned to {align}");
                fill(p, size);
                assert!(holds_pattern(p, size));
                // glibc puts a header before each block, its own mappings too: a large block
                // at the start of a page is a mapping made here.
                assert_eq!(mapped(&layout), own, "{size} aligned to {align}");
                if own {
                    assert_eq!(p as usize % MIN_PAGE, 0, "{size}");
                }
                a.dealloc(p, layout);
            }
        }
    }

    #[test]
    fn zeroed_blocks_are_zero() {
        let a = MapLarge;
        for size in [100, MAP_FROM, 5 << 20] {
            let layout = Layout::from_size_align(size, 16).unwrap();
            unsafe {
                let p = a.alloc_zeroed(layout);
                assert!(!p.is_null());
                assert!((0..size).all(|i| p.add(i).read() == 0), "{size}");
                a.dealloc(p, layout);
            }
        }
    }

    #[test]
    fn realloc_keeps_the_bytes_within_and_across_the_line() {
        let a = MapLarge;
        // small -> small -> large -> larger -> smaller large -> small, the common prefix checked
        // at each step.
        let sizes = [1000, 50_000, MAP_FROM + 10, 4 << 20, MAP_FROM * 2, 10_000, 3];
        let mut layout = Layout::from_size_align(sizes[0], 8).unwrap();
        unsafe {
            let mut p = a.alloc(layout);
            fill(p, layout.size());
            for &size in &sizes[1..] {
                let kept = layout.size().min(size);
                p = a.realloc(p, layout, size);
                assert!(!p.is_null());
                assert!(holds_pattern(p, kept), "{} -> {size}", layout.size());
                layout = Layout::from_size_align(size, 8).unwrap();
                fill(p, size);
            }
            a.dealloc(p, layout);
        }
    }

    /// What the reserve's test lets it keep.
    static TEST_ROOM: AtomicUsize = AtomicUsize::new(0);

    fn wait_for(what: &str, done: impl Fn() -> bool) {
        let start = std::time::Instant::now();
        while !done() {
            assert!(start.elapsed() < Duration::from_secs(30), "{what}");
            std::thread::sleep(Duration::from_millis(5));
        }
    }

    /// Blocks carved from the reserve are zero, keep what is written to them through growing,
    /// shrinking and release, and the reserve is kept within the room it is given.
    #[test]
    fn the_reserve_hands_out_faulted_in_zero_blocks_within_its_room() {
        let a = MapLarge;
        TEST_ROOM.store(8 << 20, Ordering::Relaxed);
        start_reserve(7 << 20, || TEST_ROOM.load(Ordering::Relaxed)).unwrap();
        // At most `most`, rounded down to whole steps.
        wait_for("the reserve is made", || RESERVED.load(Ordering::Relaxed) == 6 << 20);
        let layout = Layout::from_size_align(MAP_FROM + 100, 16).unwrap();
        unsafe {
            let mut blocks = Vec::new();
            for _ in 0..4 {
                let before = RESERVED.load(Ordering::Relaxed);
                let p = a.alloc_zeroed(layout);
                assert!(!p.is_null());
                assert_eq!(p as usize % MIN_PAGE, 0);
                // Carved from the reserve (unless another test's block or the keeper took its
                // permit at the lock, which the allocator never waits for).
                let carved = RESERVED.load(Ordering::Relaxed) < before;
                assert!((0..layout.size()).all(|i| p.add(i).read() == 0));
                fill(p, layout.size());
                blocks.push((p, carved));
            }
            assert!(
                blocks.iter().any(|&(_, carved)| carved),
                "no block came from the reserve"
            );
            // Grown (moved out of the reserve's region), shrunk, released: the bytes stay.
            let (p, _) = blocks[0];
            let grown = a.realloc(p, layout, 3 << 20);
            assert!(holds_pattern(grown, layout.size()));
            let shrunk = a.realloc(grown, Layout::from_size_align(3 << 20, 16).unwrap(), MAP_FROM);
            assert!(holds_pattern(shrunk, MAP_FROM));
            a.dealloc(shrunk, Layout::from_size_align(MAP_FROM, 16).unwrap());
            for &(p, _) in &blocks[1..] {
                assert!(holds_pattern(p, layout.size()));
                a.dealloc(p, layout);
            }
        }
        // No room: the reserve is released.
        TEST_ROOM.store(0, Ordering::Relaxed);
        KEEPER.get().unwrap().unpark();
        wait_for("the reserve is released", || RESERVED.load(Ordering::Relaxed) == 0);
    }

    #[test]
    fn what_is_given_back_is_cut_from_the_end_of_a_region() {
        let mut gone = (0, 0);
        let mut slot = (1 << 20, 6 << 20);
        assert_eq!(cut_end(&mut slot, 4 << 20, &mut gone), 2 << 20);
        assert_eq!((slot, gone), ((1 << 20, 4 << 20), (5 << 20, 2 << 20)));
        assert_eq!(cut_end(&mut slot, 4 << 20, &mut gone), 0);
        assert_eq!(cut_end(&mut slot, 0, &mut gone), 4 << 20);
        assert_eq!((slot, gone), ((0, 0), (1 << 20, 4 << 20)));
    }

    /// (On 64-bit targets, where half the address space cannot be mapped.)
    #[cfg(target_pointer_width = "64")]
    #[test]
    fn a_mapping_that_cannot_be_made_is_null_not_an_abort() {
        let a = MapLarge;
        let huge = isize::MAX as usize / 2;
        let layout = Layout::from_size_align(huge, 8).unwrap();
        unsafe {
            assert!(a.alloc(layout).is_null());
            assert!(a.alloc_zeroed(layout).is_null());
            // A block that cannot grow that far is left as it was.
            let small = Layout::from_size_align(MAP_FROM * 2, 8).unwrap();
            let p = a.alloc(small);
            fill(p, small.size());
            assert!(a.realloc(p, small, huge).is_null());
            assert!(holds_pattern(p, small.size()));
            a.dealloc(p, small);
        }
    }
}
