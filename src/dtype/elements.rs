//! Decoded array data: fixed-size elements as little-endian bytes in C order, or
//! variable-length elements as vectors.

use serde_json::Value;

use super::fill::FillValue;

/// The elements of a decoded chunk or of an assembled region, in C order.
#[derive(Debug, Clone, PartialEq)]
pub enum Elements {
    /// Fixed-size elements, little-endian, `item_size` bytes each.
    Fixed(Vec<u8>),
    /// Variable-length strings (`None`: missing).
    Strings(Vec<Option<String>>),
    /// Variable-length byte strings (`None`: missing).
    Bytes(Vec<Option<Vec<u8>>>),
    /// Arbitrary objects (json2).
    Objects(Vec<Value>),
}

impl Elements {
    /// `n` copies of the fill value.
    pub fn filled(fill: &FillValue, n: usize) -> Elements {
        match fill {
            FillValue::Fixed(one) => {
                if one.iter().all(|b| *b == 0) {
                    Elements::Fixed(vec![0; one.len() * n])
                } else {
                    Elements::Fixed(one.repeat(n))
                }
            }
            FillValue::String(s) => Elements::Strings(vec![Some(s.clone()); n]),
            FillValue::Bytes(b) => Elements::Bytes(vec![Some(b.clone()); n]),
            FillValue::Object(v) => Elements::Objects(vec![v.clone(); n]),
        }
    }

    /// The bytes [`Elements::filled`] takes for `n` elements (saturating): for variable-length
    /// elements, the element itself and its copy of the fill value.
    pub fn filled_size(fill: &FillValue, n: u64) -> u64 {
        let each = match fill {
            FillValue::Fixed(one) => one.len(),
            FillValue::String(s) => ELEMENT_BYTES + s.len(),
            FillValue::Bytes(b) => ELEMENT_BYTES + b.len(),
            FillValue::Object(v) => VALUE_BYTES + v.content(),
        };
        n.saturating_mul(each as u64)
    }

    /// Number of elements, given the item size of fixed-size data.
    pub fn count(&self, item_size: usize) -> usize {
        match self {
            Elements::Fixed(b) => b.len().checked_div(item_size).unwrap_or(0),
            Elements::Strings(v) => v.len(),
            Elements::Bytes(v) => v.len(),
            Elements::Objects(v) => v.len(),
        }
    }

    /// Approximate heap size in bytes (for cache weighing).
    pub fn heap_size(&self) -> usize {
        match self {
            Elements::Fixed(b) => b.capacity(),
            Elements::Strings(v) => v.iter().map(|s| ELEMENT_BYTES + s.content()).sum(),
            Elements::Bytes(v) => v.iter().map(|s| ELEMENT_BYTES + s.content()).sum(),
            // As json2 bounds what it parses: values, not their text, which is a fraction of
            // them (and is not written out for it).
            Elements::Objects(v) => v.iter().map(|o| VALUE_BYTES + o.content()).sum(),
        }
    }
}

/// A strided block copy between two C-order arrays: along each dimension `d`, source indices
/// `src_start[d] + k * src_step[d]` for `k < count[d]` land at `dst_start[d] + k`.
#[derive(Debug, Clone, Copy)]
pub struct BlockCopy<'a> {
    /// Source array shape.
    pub src_shape: &'a [u64],
    /// First source index per dimension.
    pub src_start: &'a [u64],
    /// Source step per dimension (>= 1).
    pub src_step: &'a [u64],
    /// Destination array shape.
    pub dst_shape: &'a [u64],
    /// First destination index per dimension.
    pub dst_start: &'a [u64],
    /// Elements copied per dimension.
    pub count: &'a [u64],
}

/// Why a block copy was refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("block copy does not fit: {0}")]
pub struct CopyError(pub String);

/// Writes the C-order element strides of `shape` into `s` (as long as `shape`).
fn strides_into(shape: &[u64], s: &mut [usize]) {
    let mut stride = 1usize;
    for (s, &n) in s.iter_mut().zip(shape).rev() {
        *s = stride;
        stride *= n as usize;
    }
}

impl BlockCopy<'_> {
    fn check(&self, src_len: usize, dst_len: usize) -> Result<(), CopyError> {
        let n = self.count.len();
        let same = [
            self.src_shape.len(),
            self.src_start.len(),
            self.src_step.len(),
            self.dst_shape.len(),
            self.dst_start.len(),
        ];
        if same.iter().any(|&l| l != n) {
            return Err(CopyError("dimension counts differ".into()));
        }
        if self.src_shape.iter().product::<u64>() as usize != src_len
            || self.dst_shape.iter().product::<u64>() as usize != dst_len
        {
            return Err(CopyError(format!(
                "buffers of {src_len} and {dst_len} elements do not match shapes {:?} and {:?}",
                self.src_shape, self.dst_shape
            )));
        }
        for d in 0..n {
            if self.count[d] == 0 {
                return Ok(());
            }
            let last_src = self.src_start[d] + (self.count[d] - 1) * self.src_step[d].max(1);
            if last_src >= self.src_shape[d] || self.dst_start[d] + self.count[d] > self.dst_shape[d] {
                return Err(CopyError(format!("dimension {d} is out of bounds")));
            }
        }
        Ok(())
    }

    /// Calls `run(src, dst, len, src_step)` for each innermost run, in element offsets.
    fn for_each_run(&self, mut run: impl FnMut(usize, usize, usize, usize)) {
        let n = self.count.len();
        if n == 0 {
            run(0, 0, 1, 1);
            return;
        }
        if self.count.contains(&0) {
            return;
        }
        // The source's and destination's moves for one step of each dimension (strides, the
        // source's times its step) and the odometer's digits: on the stack for the usual few
        // dimensions.
        let (mut stack, mut heap) = ([0usize; 3 * STACK_DIMS], Vec::new());
        let (src_move, rest) = scratch(&mut stack, &mut heap, 3 * n).split_at_mut(n);
        let (dst_move, k) = rest.split_at_mut(n);
        strides_into(self.src_shape, src_move);
        strides_into(self.dst_shape, dst_move);
        let (mut src, mut dst) = (0usize, 0usize);
        for d in 0..n {
            src += self.src_start[d] as usize * src_move[d];
            dst += self.dst_start[d] as usize * dst_move[d];
            src_move[d] *= self.src_step[d].max(1) as usize;
        }
        let last = n - 1;
        let (len, step) = (self.count[last] as usize, src_move[last]);
        // The runs along the last dimension but one (a 2-D tile's rows) are walked by a plain
        // loop; the odometer turns over the dimensions before it.
        let (rows, outer) = match last.checked_sub(1) {
            Some(o) => (self.count[o] as usize, o),
            None => (1, 0),
        };
        let (src_row, dst_row) = (src_move[outer], dst_move[outer]);
        loop {
            let (mut s, mut t) = (src, dst);
            for _ in 0..rows {
                run(s, t, len, step);
                s += src_row;
                t += dst_row;
            }
            // The odometer over the outer dimensions, moving both offsets with its digits.
            let mut d = outer;
            loop {
                if d == 0 {
                    return;
                }
                d -= 1;
                k[d] += 1;
                src += src_move[d];
                dst += dst_move[d];
                if (k[d] as u64) < self.count[d] {
                    break;
                }
                src -= k[d] * src_move[d];
                dst -= k[d] * dst_move[d];
                k[d] = 0;
            }
        }
    }
}

/// Dimensions up to which per-dimension bookkeeping (a block copy's, a one-unit gather's) is kept
/// on the stack.
pub const STACK_DIMS: usize = 8;

/// Room for `len` values: the first `len` of `stack` when they fit, else `heap` grown to `len`
/// with defaults (given fresh, both hold defaults only). For bookkeeping sized by an array's
/// dimensions, a few almost always, which then costs no allocation.
pub fn scratch<'a, T: Copy + Default, const N: usize>(
    stack: &'a mut [T; N],
    heap: &'a mut Vec<T>,
    len: usize,
) -> &'a mut [T] {
    match stack.get_mut(..len) {
        Some(on_stack) => on_stack,
        None => {
            heap.resize(len, T::default());
            heap
        }
    }
}

/// Bytes a variable-length element holds on the heap (its content, nested values' too).
pub trait Content {
    /// The bytes.
    fn content(&self) -> usize;
}

impl Content for Option<String> {
    fn content(&self) -> usize {
        self.as_ref().map_or(0, String::len)
    }
}

impl Content for Option<Vec<u8>> {
    fn content(&self) -> usize {
        self.as_ref().map_or(0, Vec::len)
    }
}

impl Content for Value {
    fn content(&self) -> usize {
        match self {
            Value::String(s) => s.len(),
            Value::Array(v) => v.iter().map(|x| VALUE_BYTES + x.content()).sum(),
            Value::Object(m) => m.iter().map(|(k, x)| k.len() + VALUE_BYTES + x.content()).sum(),
            _ => 0,
        }
    }
}

/// Bytes of one `Value` besides what it holds.
pub const VALUE_BYTES: usize = std::mem::size_of::<Value>();

/// Bytes a variable-length string or byte string takes besides its content (its
/// `Option<String>` or `Option<Vec<u8>>`: 24).
pub const ELEMENT_BYTES: usize = std::mem::size_of::<Option<String>>();

/// Copies a strided block of `src` into `dst`; returns the heap bytes of what it copied.
fn copy_vec<T: Clone + Content>(src: &[T], dst: &mut [T], copy: &BlockCopy) -> usize {
    let mut content = 0;
    copy.for_each_run(|s, d, len, step| {
        for i in 0..len {
            let one = &src[s + i * step];
            content += one.content();
            dst[d + i] = one.clone();
        }
    });
    content
}

impl Elements {
    /// Copies a strided block of `src` into `self`. Both hold the same kind of elements;
    /// `item` is the byte size of fixed-size elements.
    /// Returns the heap bytes of the variable-length elements it copied (0 for fixed-size ones).
    pub fn copy_block(&mut self, src: &Elements, item: usize, copy: &BlockCopy) -> Result<usize, CopyError> {
        if let (Elements::Fixed(dst), Elements::Fixed(src)) = (&mut *self, src) {
            return copy_fixed(dst, src, item, copy).map(|()| 0);
        }
        copy.check(src.count(item), self.count(item))?;
        Ok(match (self, src) {
            (Elements::Strings(dst), Elements::Strings(src)) => copy_vec(src, dst, copy),
            (Elements::Bytes(dst), Elements::Bytes(src)) => copy_vec(src, dst, copy),
            (Elements::Objects(dst), Elements::Objects(src)) => copy_vec(src, dst, copy),
            _ => return Err(CopyError("element kinds differ".into())),
        })
    }
}

/// [`Elements::copy_block`] of fixed-size elements (`item` bytes each) between byte buffers.
pub fn copy_fixed(dst: &mut [u8], src: &[u8], item: usize, copy: &BlockCopy) -> Result<(), CopyError> {
    let count = |len: usize| len.checked_div(item).unwrap_or(0);
    copy.check(count(src.len()), count(dst.len()))?;
    copy.for_each_run(|s, d, len, step| {
        let (s, d) = (s * item, d * item);
        if step == 1 {
            dst[d..d + len * item].copy_from_slice(&src[s..s + len * item]);
        } else {
            for i in 0..len {
                let from = s + i * step * item;
                dst[d + i * item..d + (i + 1) * item].copy_from_slice(&src[from..from + item]);
            }
        }
    });
    Ok(())
}

/// The block `copy` describes, gathered out of `src` (fixed-size elements of `item` bytes) into
/// a new C-order buffer of `copy.count` elements, which must be the copy's whole destination
/// (`dst_shape` is `count`, `dst_start` zeros). The buffer is written by appending, in the
/// order the runs come, so it is never zeroed first.
pub fn gather_fixed(src: &[u8], item: usize, copy: &BlockCopy) -> Result<Vec<u8>, CopyError> {
    if copy.dst_shape != copy.count || copy.dst_start.iter().any(|&s| s != 0) {
        return Err(CopyError("a gathered block is its whole destination".into()));
    }
    let len = copy.count.iter().product::<u64>() as usize;
    copy.check(src.len().checked_div(item).unwrap_or(0), len)?;
    let mut out = Vec::with_capacity(len * item);
    copy.for_each_run(|s, _, len, step| {
        let s = s * item;
        if step == 1 {
            out.extend_from_slice(&src[s..s + len * item]);
        } else {
            for i in 0..len {
                let from = s + i * step * item;
                out.extend_from_slice(&src[from..from + item]);
            }
        }
    });
    Ok(out)
}

/// Writes the fixed-size element `one` into a block of the C-order byte array `dst` of `shape`:
/// the `count` elements per dimension from `start`.
pub fn fill_fixed(dst: &mut [u8], one: &[u8], shape: &[u64], start: &[u64], count: &[u64]) -> Result<(), CopyError> {
    let item = one.len();
    if item == 0 {
        return Ok(());
    }
    let zeros = vec![0; count.len()];
    let ones = vec![1; count.len()];
    let copy = BlockCopy {
        src_shape: count,
        src_start: &zeros,
        src_step: &ones,
        dst_shape: shape,
        dst_start: start,
        count,
    };
    copy.check(count.iter().product::<u64>() as usize, dst.len() / item)?;
    copy.for_each_run(|_, d, len, _| {
        for slot in dst[d * item..(d + len) * item].chunks_exact_mut(item) {
            slot.copy_from_slice(one);
        }
    });
    Ok(())
}

impl Elements {
    /// Writes the fixed-size element `one` into a block of this C-order array of `shape`: the
    /// `count` elements per dimension from `start`.
    pub fn fill_block(&mut self, one: &[u8], shape: &[u64], start: &[u64], count: &[u64]) -> Result<(), CopyError> {
        let Elements::Fixed(dst) = self else {
            return Err(CopyError("only fixed-size elements are filled by block".into()));
        };
        fill_fixed(dst, one, shape, start, count)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Objects weigh what they hold as values (32 bytes each, nested ones too), not their text:
    /// `[0, 0, 0]` is 7 bytes of text and 4 values.
    #[test]
    fn objects_weigh_their_values() {
        let objects = Elements::Objects(vec![serde_json::json!([0, 0, 0]), serde_json::json!("abc")]);
        assert_eq!(objects.heap_size(), 4 * VALUE_BYTES + (VALUE_BYTES + 3));
    }

    #[test]
    fn strided_block_copy_matches_indexing() {
        // src 4x5 of u16 values 0..20; take rows 1..4 step 2, cols 0..5 step 2 -> 2x3 at (1,1) of a 3x4 dst.
        let src = Elements::Fixed((0u16..20).flat_map(|v| v.to_le_bytes()).collect());
        let mut dst = Elements::Fixed(vec![0xff; 3 * 4 * 2]);
        dst.copy_block(
            &src,
            2,
            &BlockCopy {
                src_shape: &[4, 5],
                src_start: &[1, 0],
                src_step: &[2, 2],
                dst_shape: &[3, 4],
                dst_start: &[1, 1],
                count: &[2, 3],
            },
        )
        .unwrap();
        let Elements::Fixed(bytes) = dst else { unreachable!() };
        let vals: Vec<u16> = bytes
            .chunks_exact(2)
            .map(|b| u16::from_le_bytes([b[0], b[1]]))
            .collect();
        let x = 0xffff;
        assert_eq!(vals, [x, x, x, x, x, 5, 7, 9, x, 15, 17, 19]);
    }

    /// A gathered block holds what copying it into a zeroed buffer of its own shape gives:
    /// strided and contiguous runs of a 3-D source, and its whole source.
    #[test]
    fn a_gathered_block_is_the_copied_block() {
        let (shape, item) = ([3u64, 4, 5], 2usize);
        let src: Vec<u8> = (0u16..60).flat_map(|v| v.to_le_bytes()).collect();
        let blocks: [([u64; 3], [u64; 3], [u64; 3]); 3] = [
            ([1, 0, 1], [1, 2, 2], [2, 2, 2]),
            ([0, 1, 0], [1, 1, 1], [3, 3, 5]),
            ([0, 0, 0], [1, 1, 1], [3, 4, 5]),
        ];
        for (start, step, count) in blocks {
            let copy = BlockCopy {
                src_shape: &shape,
                src_start: &start,
                src_step: &step,
                dst_shape: &count,
                dst_start: &[0, 0, 0],
                count: &count,
            };
            let mut copied = vec![0; count.iter().product::<u64>() as usize * item];
            copy_fixed(&mut copied, &src, item, &copy).unwrap();
            assert_eq!(
                gather_fixed(&src, item, &copy).unwrap(),
                copied,
                "block at {start:?} step {step:?}"
            );
        }
        // Element (1, 0, 1) then (1, 0, 3): values 21 and 23.
        let copy = BlockCopy {
            src_shape: &shape,
            src_start: &[1, 0, 1],
            src_step: &[1, 1, 2],
            dst_shape: &[1, 1, 2],
            dst_start: &[0, 0, 0],
            count: &[1, 1, 2],
        };
        assert_eq!(gather_fixed(&src, item, &copy).unwrap(), [21, 0, 23, 0]);
        let elsewhere = BlockCopy {
            dst_start: &[0, 0, 1],
            dst_shape: &[1, 1, 3],
            ..copy
        };
        assert!(gather_fixed(&src, item, &elsewhere).is_err());
    }

    /// The block `copy` describes, copied element by element: every index of `count`,
    /// decomposed from a flat counter, mapped to its source and destination offsets.
    fn copied_by_indexing(src: &[u16], dst: &mut [u16], copy: &BlockCopy) {
        let offset = |shape: &[u64], at: &dyn Fn(usize) -> u64| {
            (0..shape.len()).fold(0u64, |o, x| o * shape[x] + at(x)) as usize
        };
        for flat in 0..copy.count.iter().product::<u64>() {
            let mut k = vec![0u64; copy.count.len()];
            let mut rest = flat;
            for x in (0..k.len()).rev() {
                (k[x], rest) = (rest % copy.count[x], rest / copy.count[x]);
            }
            let from = offset(copy.src_shape, &|x| copy.src_start[x] + k[x] * copy.src_step[x]);
            let to = offset(copy.dst_shape, &|x| copy.dst_start[x] + k[x]);
            dst[to] = src[from];
        }
    }

    /// Blocks with a step and an offset in every dimension land where element-by-element
    /// indexing puts them, from 1-D to past the dimensions kept on the stack: the row loop and
    /// the odometer carry over several dimensions at once.
    #[test]
    fn strided_copies_match_indexing_in_any_number_of_dimensions() {
        for n in [1usize, 2, 3, 4, STACK_DIMS, STACK_DIMS + 2] {
            // The first four dimensions' sizes repeat beyond them with shapes of at most 2
            // (`past`) and a count of 1: ten dimensions of the first four's shapes would be
            // millions of elements.
            let d = |a: [u64; 4], past: u64| -> Vec<u64> {
                (0..n).map(|x| if x < 4 { a[x] } else { a[x % 4].min(past) }).collect()
            };
            let (src_shape, dst_shape) = (d([3, 4, 5, 6], 2), d([4, 3, 4, 5], 2));
            let (src_start, src_step) = (d([1, 0, 1, 1], 1), d([1, 2, 3, 2], u64::MAX));
            let (dst_start, count) = (d([1, 1, 2, 1], 1), d([2, 2, 2, 3], 1));
            let copy = BlockCopy {
                src_shape: &src_shape,
                src_start: &src_start,
                src_step: &src_step,
                dst_shape: &dst_shape,
                dst_start: &dst_start,
                count: &count,
            };
            let src: Vec<u16> = (0..src_shape.iter().product::<u64>() as u16).collect();
            let mut want = vec![0xffffu16; dst_shape.iter().product::<u64>() as usize];
            copied_by_indexing(&src, &mut want, &copy);
            let bytes = |v: &[u16]| -> Vec<u8> { v.iter().flat_map(|x| x.to_le_bytes()).collect() };
            let mut got = bytes(&vec![0xffff; want.len()]);
            copy_fixed(&mut got, &bytes(&src), 2, &copy).unwrap();
            assert_eq!(got, bytes(&want), "{n} dimensions");

            // Gathered into a block of its own, the same elements in the same order.
            let zeros = vec![0u64; n];
            let whole = BlockCopy {
                dst_shape: &count,
                dst_start: &zeros,
                ..copy
            };
            let mut alone = vec![0xffffu16; count.iter().product::<u64>() as usize];
            copied_by_indexing(&src, &mut alone, &whole);
            assert_eq!(
                gather_fixed(&bytes(&src), 2, &whole).unwrap(),
                bytes(&alone),
                "{n} dimensions, gathered"
            );
        }
    }

    #[test]
    fn fill_block_writes_only_the_block() {
        let mut dst = Elements::Fixed(vec![0; 3 * 4 * 2]);
        dst.fill_block(&[0xab, 0xcd], &[3, 4], &[1, 1], &[2, 2]).unwrap();
        let Elements::Fixed(bytes) = &dst else { unreachable!() };
        let vals: Vec<u16> = bytes
            .chunks_exact(2)
            .map(|b| u16::from_le_bytes([b[0], b[1]]))
            .collect();
        let f = 0xcdab;
        assert_eq!(vals, [0, 0, 0, 0, 0, f, f, 0, 0, f, f, 0]);
        assert!(dst.fill_block(&[1, 2], &[3, 4], &[2, 3], &[2, 2]).is_err());
        assert!(
            Elements::Strings(vec![None])
                .fill_block(&[1], &[1], &[0], &[1])
                .is_err()
        );
    }

    #[test]
    fn out_of_bounds_is_an_error_not_a_panic() {
        let src = Elements::Strings(vec![Some("a".into()); 4]);
        let mut dst = Elements::Strings(vec![None; 4]);
        let bad = BlockCopy {
            src_shape: &[4],
            src_start: &[2],
            src_step: &[2],
            dst_shape: &[4],
            dst_start: &[0],
            count: &[2],
        };
        assert!(dst.copy_block(&src, 0, &bad).is_err());
        let zero_d = BlockCopy {
            src_shape: &[],
            src_start: &[],
            src_step: &[],
            dst_shape: &[],
            dst_start: &[],
            count: &[],
        };
        let mut one = Elements::Strings(vec![None]);
        one.copy_block(&Elements::Strings(vec![Some("z".into())]), 0, &zero_d)
            .unwrap();
        assert_eq!(one, Elements::Strings(vec![Some("z".into())]));
    }
}
