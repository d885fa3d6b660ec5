//! `Selection::parse` on an arbitrary string against a small arbitrary shape, then the split of
//! each dimension over a chunk grid (`cells`), as the slice route plans a read.
//!
//! Input: byte 0 = number of dimensions (mod 5); per dimension one byte `t` (the size when
//! `t < 0xf0`, else the size is the next 8 bytes, little-endian) and one byte (chunk size - 1);
//! the rest is the `select` text (lossy UTF-8).
#![no_main]

use libfuzzer_sys::fuzz_target;
use zarrgate::array::selection::{DimSelection, Selection, cells};

fn take<'a>(data: &mut &'a [u8], n: usize) -> Option<&'a [u8]> {
    let (head, tail) = data.split_at_checked(n)?;
    *data = tail;
    Some(head)
}

fuzz_target!(|data: &[u8]| {
    let mut data = data;
    let Some(&[ndim]) = take(&mut data, 1) else { return };
    let ndim = (ndim % 5) as usize;
    let mut shape = Vec::with_capacity(ndim);
    let mut chunks = Vec::with_capacity(ndim);
    for _ in 0..ndim {
        let Some(&[t]) = take(&mut data, 1) else { return };
        let n = if t < 0xf0 {
            t as u64
        } else {
            let Some(b) = take(&mut data, 8) else { return };
            u64::from_le_bytes(b.try_into().unwrap())
        };
        let Some(&[c]) = take(&mut data, 1) else { return };
        shape.push(n);
        chunks.push(c as u64 + 1);
    }
    let text = String::from_utf8_lossy(data);
    let Ok(sel) = Selection::parse(&text, &shape) else { return };

    assert_eq!(sel.0.len(), shape.len(), "one term per dimension");
    for (d, (&dim, &n)) in sel.0.iter().zip(&shape).enumerate() {
        match dim {
            DimSelection::Index(i) => assert!(i < n, "dim {d}: index {i} out of 0..{n}"),
            DimSelection::Slice { start, step, count } => {
                assert!(step >= 1, "dim {d}: step {step}");
                assert!(count <= n, "dim {d}: count {count} > size {n}");
                if count > 0 {
                    let last = start as u128 + (count as u128 - 1) * step as u128;
                    assert!(last < n as u128, "dim {d}: last index {last} out of 0..{n}");
                }
            }
        }
    }
    // What the slice route asks of a selection before reading.
    let _ = sel.full_shape();
    let _ = sel.shape();
    let len = sel.len();
    let _ = sel.is_empty();
    let _ = len;

    // The read plan: each dimension split over its chunk grid (bounded, as the size limit
    // bounds the server's selections before it plans).
    for (d, (&dim, (&chunk, &n))) in sel.0.iter().zip(chunks.iter().zip(&shape)).enumerate() {
        let (start, step, count) = dim.span();
        if count > 1 << 16 {
            continue;
        }
        let parts = cells(dim, chunk, 0, 0, n);
        let mut next = 0u64;
        for p in &parts {
            assert_eq!(p.dst_start, next, "dim {d}: parts are consecutive");
            assert!(p.count >= 1, "dim {d}: empty part");
            assert!(p.src_start < chunk, "dim {d}: src_start {} >= chunk {chunk}", p.src_start);
            let abs = p.cell as u128 * chunk as u128 + p.src_start as u128;
            assert_eq!(abs, start as u128 + p.dst_start as u128 * step as u128, "dim {d}: part start");
            let last = p.src_start as u128 + (p.count as u128 - 1) * step as u128;
            assert!(last < chunk as u128, "dim {d}: part runs past its cell");
            next += p.count;
        }
        assert_eq!(next, count, "dim {d}: parts cover the selection");
    }
});
