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
//! of its time in the kernel (bench/README.md). Mapping Rust's large allocations here leaves
//! glibc's threshold free for C's short-lived ones, which its arenas reuse.

use std::alloc::{GlobalAlloc, Layout, System};
use std::ptr;

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

// SAFETY: every block is either the system allocator's (small, or over-aligned) or a mapping of
// exactly `layout.size()` bytes made here, and `mapped(layout)` tells which, for the same
// layout, at allocation and at release. Mappings are page-aligned, so they satisfy any
// alignment up to MIN_PAGE.
unsafe impl GlobalAlloc for MapLarge {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        if mapped(&layout) {
            map(layout.size())
        } else {
            // SAFETY: forwarded with the caller's guarantees.
            unsafe { System.alloc(layout) }
        }
    }

    unsafe fn alloc_zeroed(&self, layout: Layout) -> *mut u8 {
        if mapped(&layout) {
            // New anonymous pages read as zeros: nothing to clear.
            map(layout.size())
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
