//! `shuffle`: numcodecs' byte [`shuffle`](https://numcodecs.readthedocs.io/en/stable/filter/shuffle.html)
//! filter.
//!
//! Encoding groups bytes by their position within an `elementsize`-byte element: all first
//! bytes, then all second bytes, and so on (byte `b` of element `i` goes to `b * n + i` for `n`
//! whole elements). Decoding puts them back. numcodecs refuses buffers that are not whole
//! elements (recent versions) or leaves the tail unshuffled (its kernel); this keeps trailing
//! bytes where they are, as blosc's shuffle does. An `elementsize` of 0 or 1 is a copy.

use std::mem::MaybeUninit;

use serde_json::Value;

use super::{BytesToBytes, CodecError, numcodecs_object, optional_int};

/// numcodecs' default element size.
const DEFAULT_ELEMENTSIZE: usize = 4;

/// The byte unshuffle for one element size.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Shuffle {
    /// Bytes per element.
    pub elementsize: usize,
}

impl Shuffle {
    /// From a numcodecs dict: `{"id": "shuffle", "elementsize": 4}`; `elementsize` is optional
    /// (default 4), a non-negative integer.
    pub fn from_v2(config: &Value) -> Result<Self, CodecError> {
        let options = numcodecs_object("shuffle", config)?;
        let elementsize = match optional_int("shuffle", options, "elementsize", 0..=i64::from(u32::MAX))? {
            None => DEFAULT_ELEMENTSIZE,
            Some(n) => usize::try_from(n).map_err(|_| CodecError::Config(format!("shuffle: elementsize {n}")))?,
        };
        Ok(Self { elementsize })
    }
}

impl BytesToBytes for Shuffle {
    fn decode(&self, input: &[u8], limit: usize) -> Result<Vec<u8>, CodecError> {
        if input.len() > limit {
            return Err(CodecError::TooLarge { limit });
        }
        let size = self.elementsize;
        if size <= 1 {
            return Ok(input.to_vec());
        }
        let mut out = Vec::with_capacity(input.len());
        unshuffle_into(size, input, &mut out.spare_capacity_mut()[..input.len()]);
        // SAFETY: `unshuffle_into` wrote every one of the `input.len()` bytes.
        unsafe { out.set_len(input.len()) };
        Ok(out)
    }
}

/// Undoes the byte shuffle of `src` for `size`-byte elements into `dst` (of the same length),
/// writing every byte of it: byte `b` of element `i` is read from `b * n + i` for `n` whole
/// elements, and the bytes after the last whole element are copied as they are. blosc's buffers
/// are shuffled block by block in the same layout.
///
/// With AVX2 (checked at run time), element sizes 2, 4 and 8 take 32 elements a step.
pub(crate) fn unshuffle_into(size: usize, src: &[u8], dst: &mut [MaybeUninit<u8>]) {
    assert_eq!(
        src.len(),
        dst.len(),
        "unshuffle: source and destination differ in length"
    );
    #[cfg(target_arch = "x86_64")]
    let done = if has_simd(size) {
        // SAFETY: AVX2 is present (checked by `has_simd`), and the lengths are equal.
        unsafe { avx2::unshuffle(size, src, dst) }
    } else {
        0
    };
    #[cfg(not(target_arch = "x86_64"))]
    let done = 0;
    unshuffle_scalar(size, src, dst, done);
}

/// Whether [`unshuffle_into`] has a vector kernel for `size` on this CPU.
pub(crate) fn has_simd(size: usize) -> bool {
    #[cfg(target_arch = "x86_64")]
    {
        matches!(size, 2 | 4 | 8) && std::is_x86_feature_detected!("avx2")
    }
    #[cfg(not(target_arch = "x86_64"))]
    {
        let _ = size;
        false
    }
}

/// The elements from `from` on, and the trailing bytes, one byte at a time.
fn unshuffle_scalar(size: usize, src: &[u8], dst: &mut [MaybeUninit<u8>], from: usize) {
    let size = size.max(1);
    let count = src.len() / size;
    let whole = count * size;
    for (i, element) in dst[..whole].chunks_exact_mut(size).enumerate().skip(from) {
        for (b, byte) in element.iter_mut().enumerate() {
            byte.write(src[b * count + i]);
        }
    }
    for (d, &s) in dst[whole..].iter_mut().zip(&src[whole..]) {
        d.write(s);
    }
}

#[cfg(target_arch = "x86_64")]
mod avx2 {
    //! Byte unshuffles of 32 elements a step: `size` registers, one per byte lane, are
    //! interleaved by bytes, then 16-bit and 32-bit pairs (each step within 128-bit halves), and
    //! the halves are put in order last.

    use std::arch::x86_64::{
        __m256i, _mm256_loadu_si256, _mm256_permute2x128_si256, _mm256_storeu_si256, _mm256_unpackhi_epi8,
        _mm256_unpackhi_epi16, _mm256_unpackhi_epi32, _mm256_unpacklo_epi8, _mm256_unpacklo_epi16,
        _mm256_unpacklo_epi32,
    };
    use std::mem::MaybeUninit;

    /// Elements a step.
    const STEP: usize = 32;

    /// Unshuffles the first whole steps of elements of `src` into `dst` for `size` 2, 4 or 8
    /// (any other size: nothing); returns how many elements it wrote.
    ///
    /// # Safety
    /// AVX2 must be present and `src.len() == dst.len()`.
    #[target_feature(enable = "avx2")]
    pub(super) unsafe fn unshuffle(size: usize, src: &[u8], dst: &mut [MaybeUninit<u8>]) -> usize {
        let Some(count) = src.len().checked_div(size) else {
            return 0;
        };
        let steps = count / STEP;
        let src = src.as_ptr();
        let dst = dst.as_mut_ptr().cast::<u8>();
        // SAFETY (all loads and stores below): step `s` reads bytes `b * count + s * 32 ..+ 32`
        // of lane `b < size`, within `size * count <= src.len()`, and writes bytes
        // `s * 32 * size ..+ 32 * size`, within `steps * 32 * size <= dst.len()`.
        let load = |b: usize, s: usize| unsafe { _mm256_loadu_si256(src.add(b * count + s * STEP).cast::<__m256i>()) };
        let store = |s: usize, k: usize, v: __m256i| unsafe {
            _mm256_storeu_si256(dst.add((s * STEP * size) + k * 32).cast::<__m256i>(), v)
        };
        match size {
            2 => {
                for s in 0..steps {
                    let (a0, a1) = (load(0, s), load(1, s));
                    // Elements 0-7 | 16-23, and 8-15 | 24-31.
                    let lo = _mm256_unpacklo_epi8(a0, a1);
                    let hi = _mm256_unpackhi_epi8(a0, a1);
                    store(s, 0, _mm256_permute2x128_si256::<0x20>(lo, hi));
                    store(s, 1, _mm256_permute2x128_si256::<0x31>(lo, hi));
                }
            }
            4 => {
                for s in 0..steps {
                    let (a0, a1, a2, a3) = (load(0, s), load(1, s), load(2, s), load(3, s));
                    let b01lo = _mm256_unpacklo_epi8(a0, a1);
                    let b01hi = _mm256_unpackhi_epi8(a0, a1);
                    let b23lo = _mm256_unpacklo_epi8(a2, a3);
                    let b23hi = _mm256_unpackhi_epi8(a2, a3);
                    // Whole elements 0-3 | 16-19, 4-7 | 20-23, 8-11 | 24-27, 12-15 | 28-31.
                    let e0 = _mm256_unpacklo_epi16(b01lo, b23lo);
                    let e4 = _mm256_unpackhi_epi16(b01lo, b23lo);
                    let e8 = _mm256_unpacklo_epi16(b01hi, b23hi);
                    let e12 = _mm256_unpackhi_epi16(b01hi, b23hi);
                    store(s, 0, _mm256_permute2x128_si256::<0x20>(e0, e4));
                    store(s, 1, _mm256_permute2x128_si256::<0x20>(e8, e12));
                    store(s, 2, _mm256_permute2x128_si256::<0x31>(e0, e4));
                    store(s, 3, _mm256_permute2x128_si256::<0x31>(e8, e12));
                }
            }
            8 => {
                for s in 0..steps {
                    let a = [
                        load(0, s),
                        load(1, s),
                        load(2, s),
                        load(3, s),
                        load(4, s),
                        load(5, s),
                        load(6, s),
                        load(7, s),
                    ];
                    // Byte pairs (lanes 2k, 2k+1) of elements 0-7 | 16-23 and 8-15 | 24-31.
                    let p: [[__m256i; 2]; 4] = std::array::from_fn(|k| {
                        [
                            _mm256_unpacklo_epi8(a[2 * k], a[2 * k + 1]),
                            _mm256_unpackhi_epi8(a[2 * k], a[2 * k + 1]),
                        ]
                    });
                    // Bytes 0-3 (q) and 4-7 (r) of elements 0-3, 4-7, 8-11, 12-15 (| +16).
                    let q = [
                        _mm256_unpacklo_epi16(p[0][0], p[1][0]),
                        _mm256_unpackhi_epi16(p[0][0], p[1][0]),
                        _mm256_unpacklo_epi16(p[0][1], p[1][1]),
                        _mm256_unpackhi_epi16(p[0][1], p[1][1]),
                    ];
                    let r = [
                        _mm256_unpacklo_epi16(p[2][0], p[3][0]),
                        _mm256_unpackhi_epi16(p[2][0], p[3][0]),
                        _mm256_unpacklo_epi16(p[2][1], p[3][1]),
                        _mm256_unpackhi_epi16(p[2][1], p[3][1]),
                    ];
                    // Whole elements 0-1, 2-3, ..., 14-15 (| +16).
                    let e: [__m256i; 8] = std::array::from_fn(|k| {
                        if k % 2 == 0 {
                            _mm256_unpacklo_epi32(q[k / 2], r[k / 2])
                        } else {
                            _mm256_unpackhi_epi32(q[k / 2], r[k / 2])
                        }
                    });
                    for k in 0..4 {
                        store(s, k, _mm256_permute2x128_si256::<0x20>(e[2 * k], e[2 * k + 1]));
                        store(s, k + 4, _mm256_permute2x128_si256::<0x31>(e[2 * k], e[2 * k + 1]));
                    }
                }
            }
            _ => return 0,
        }
        steps * STEP
    }
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;
    use crate::codec::test_vectors::{expected, vector};

    #[test]
    fn decodes_numcodecs_vectors() {
        for (size, name) in [(4, "elementsize4"), (8, "elementsize8")] {
            let input = vector("shuffle", name);
            assert_ne!(input, expected());
            assert_eq!(
                Shuffle { elementsize: size }.decode(&input, 1 << 20).unwrap(),
                expected(),
                "{name}"
            );
        }
    }

    #[test]
    fn small_cases() {
        let two = Shuffle { elementsize: 2 };
        assert_eq!(two.decode(&[1, 3, 5, 2, 4, 6], 6).unwrap(), [1, 2, 3, 4, 5, 6]);
        // numcodecs' kernel shuffles 10 bytes with elementsize 4 as [0 4 1 5 2 6 3 7] + tail.
        let four = Shuffle { elementsize: 4 };
        assert_eq!(
            four.decode(&[0, 4, 1, 5, 2, 6, 3, 7, 8, 9], 10).unwrap(),
            [0, 1, 2, 3, 4, 5, 6, 7, 8, 9]
        );
        // Fewer bytes than one element: all tail.
        assert_eq!(four.decode(&[9, 8, 7], 10).unwrap(), [9, 8, 7]);
        assert_eq!(four.decode(&[], 0).unwrap(), Vec::<u8>::new());
        for size in [0, 1] {
            assert_eq!(Shuffle { elementsize: size }.decode(&[3, 2, 1], 3).unwrap(), [3, 2, 1]);
        }
        assert_eq!(four.decode(&[0; 8], 7), Err(CodecError::TooLarge { limit: 7 }));
    }

    /// The layout by definition, one byte at a time.
    fn reference(size: usize, src: &[u8]) -> Vec<u8> {
        let count = src.len() / size;
        let mut out = src.to_vec();
        for i in 0..count {
            for b in 0..size {
                out[i * size + b] = src[b * count + i];
            }
        }
        out
    }

    fn unshuffled(size: usize, src: &[u8], vector: bool) -> Vec<u8> {
        // A buffer that held other bytes: a byte left unwritten keeps one of them.
        let mut out = vec![0xa5u8; src.len()];
        out.clear();
        let dst = &mut out.spare_capacity_mut()[..src.len()];
        if vector {
            unshuffle_into(size, src, dst);
        } else {
            unshuffle_scalar(size, src, dst, 0);
        }
        unsafe { out.set_len(src.len()) };
        out
    }

    #[test]
    fn kernels_match_the_layout() {
        // Lengths around whole 32-element steps, with and without trailing bytes.
        let data: Vec<u8> = (0..70_000u32)
            .map(|i| (i.wrapping_mul(2_654_435_761) >> 13) as u8)
            .collect();
        for size in 1..=17 {
            for len in [
                0,
                1,
                size,
                31 * size,
                32 * size,
                32 * size + 1,
                33 * size - 1,
                64 * size + 3,
                1000,
                65_539,
            ] {
                let src = &data[..len.min(data.len())];
                let want = reference(size, src);
                assert_eq!(unshuffled(size, src, true), want, "size {size}, {len} bytes");
                assert_eq!(unshuffled(size, src, false), want, "size {size}, {len} bytes (scalar)");
            }
        }
    }

    #[test]
    #[cfg(target_arch = "x86_64")]
    fn vector_kernels_cover_whole_steps() {
        if !std::is_x86_feature_detected!("avx2") {
            return;
        }
        assert!(has_simd(2) && has_simd(4) && has_simd(8) && !has_simd(3) && !has_simd(16));
        let src: Vec<u8> = (0..8 * 100).map(|i| (i % 251) as u8).collect();
        for size in [2, 4, 8] {
            let src = &src[..size * 100];
            // Filled with a byte the data never holds (it is below 251): a byte left unwritten
            // shows.
            let mut out = vec![MaybeUninit::new(0xfeu8); src.len()];
            // 100 elements: three steps of 32 by the vector kernel, the last 4 left.
            assert_eq!(unsafe { avx2::unshuffle(size, src, &mut out) }, 96);
            let got: Vec<u8> = out[..96 * size].iter().map(|b| unsafe { b.assume_init() }).collect();
            assert_eq!(got, reference(size, src)[..96 * size], "size {size}");
        }
        for size in [0, 1, 3, 16] {
            let mut out = vec![MaybeUninit::new(0u8); 64];
            assert_eq!(unsafe { avx2::unshuffle(size, &src[..64], &mut out) }, 0, "size {size}");
        }
    }

    #[test]
    fn config() {
        assert_eq!(
            Shuffle::from_v2(&json!({ "id": "shuffle", "elementsize": 8 })),
            Ok(Shuffle { elementsize: 8 })
        );
        assert_eq!(
            Shuffle::from_v2(&json!({ "id": "shuffle" })),
            Ok(Shuffle { elementsize: 4 })
        );
        for bad in [
            json!({ "id": "shuffle", "elementsize": -1 }),
            json!({ "id": "shuffle", "elementsize": "4" }),
        ] {
            assert!(matches!(Shuffle::from_v2(&bad), Err(CodecError::Config(_))), "{bad}");
        }
    }
}
