//! Slice selections: the HSDS-style `select` grammar (`[0:10, 5, ::2]`, brackets optional),
//! normalised against an array shape with NumPy's rules (negatives count from the end, stops
//! clamp, steps are >= 1, an integer drops its dimension, missing trailing terms are `:`).

/// Why a selection was refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("invalid selection: {0}")]
pub struct SelectionError(pub String);

/// One dimension of a normalised selection.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum DimSelection {
    /// A single index; the dimension is dropped from the result.
    Index(u64),
    /// `start + k * step` for `k < count`.
    Slice {
        /// First index.
        start: u64,
        /// Step (>= 1).
        step: u64,
        /// Number of indices (may be 0).
        count: u64,
    },
}

impl DimSelection {
    /// (start, step, count) of the indices selected.
    pub fn span(&self) -> (u64, u64, u64) {
        match *self {
            DimSelection::Index(i) => (i, 1, 1),
            DimSelection::Slice { start, step, count } => (start, step, count),
        }
    }
}

/// A normalised selection: one entry per array dimension.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Selection(pub Vec<DimSelection>);

/// An integer: wide enough for every index of a dimension of up to 2^64 - 1, negative ones too.
fn parse_int(s: &str, what: &str) -> Result<i128, SelectionError> {
    wide(s.trim()).map_err(|_| SelectionError(format!("'{s}' is not an integer {what}")))
}

/// `t` as an integer: as an `i64` where it is one (the usual case, and a third of the work of
/// parsing an `i128`), else as an `i128`.
fn wide(t: &str) -> Result<i128, std::num::ParseIntError> {
    t.parse::<i64>().map(i128::from).or_else(|_| t.parse::<i128>())
}

/// The pieces of `text` between the `sep`s. Splitting on a char predicate walks the few
/// characters of a term; splitting on a `char` sets up a `memchr` for each piece, which costs
/// more than the walk on text this short.
#[expect(
    clippy::manual_pattern_char_comparison,
    reason = "a predicate, not a char: see above"
)]
fn pieces(text: &str, sep: char) -> std::str::Split<'_, impl FnMut(char) -> bool> {
    text.split(move |c| c == sep)
}

/// A part of a plain term ([`Selection::parse_plain`]): `Some(None)` when empty, the integer
/// when it is an optional `-` and 1 to 18 ASCII digits (which always fit an `i64`), `None` for
/// anything else.
fn plain_int(part: &[u8]) -> Option<Option<i64>> {
    if part.is_empty() {
        return Some(None);
    }
    let (negative, digits) = match part {
        [b'-', digits @ ..] => (true, digits),
        digits => (false, digits),
    };
    if digits.is_empty() || digits.len() > 18 {
        return None;
    }
    let mut v = 0i64;
    for &b in digits {
        if !b.is_ascii_digit() {
            return None;
        }
        v = v * 10 + i64::from(b - b'0');
    }
    Some(Some(if negative { -v } else { v }))
}

/// Index `i` of a dimension of size `n` (a negative one counts from the end), if it is in it.
fn index_of(i: i128, n: u64) -> Option<u64> {
    let n_i = n as i128;
    let idx = if i < 0 { i + n_i } else { i };
    (0..n_i).contains(&idx).then_some(idx as u64)
}

/// The slice `start:stop:step` of a dimension of size `n` by NumPy's rules: `start` and `stop`
/// (negatives count from the end) clamped to the dimension, `step` (at least 1) to its size.
fn slice_of(start: Option<i128>, stop: Option<i128>, step: i128, n: u64) -> DimSelection {
    let n_i = n as i128;
    // A step past the dimension takes one element, as the dimension's size does.
    let step = step.min(n_i.max(1));
    let clamp = |v: i128| -> i128 { if v < 0 { (v + n_i).max(0) } else { v.min(n_i) } };
    let start = start.map_or(0, clamp);
    let stop = stop.map_or(n_i, clamp);
    // Clamped, `start` and `stop` are in 0..=n and `step` in 1..=max(n, 1): all fit a u64,
    // whose division is cheaper than an i128's.
    let (start, stop, step) = (start as u64, stop as u64, step as u64);
    DimSelection::Slice {
        start,
        step,
        count: stop.saturating_sub(start).div_ceil(step),
    }
}

/// A slice's start, stop or step: an integer, one past i128 saturating (NumPy clamps
/// `a[0:10**40]` to the dimension).
fn parse_bound(s: &str, what: &str) -> Result<i128, SelectionError> {
    let t = s.trim();
    wide(t).or_else(|_| {
        let digits = t.strip_prefix(['-', '+']).unwrap_or(t);
        if !digits.is_empty() && digits.bytes().all(|b| b.is_ascii_digit()) {
            Ok(if t.starts_with('-') { i128::MIN } else { i128::MAX })
        } else {
            Err(SelectionError(format!("'{s}' is not an integer {what}")))
        }
    })
}

impl Selection {
    /// Units of `unit` shape (chunks, or inner chunks) the selection touches, in all
    /// dimensions but `except`; saturating.
    pub fn units_touched(&self, unit: &[u64], except: Option<usize>) -> u64 {
        self.0
            .iter()
            .zip(unit)
            .enumerate()
            .filter(|&(d, _)| Some(d) != except)
            .fold(1u64, |n, (_, (s, &c))| n.saturating_mul(cells_touched(*s, c)))
    }

    /// Everything.
    pub fn all(shape: &[u64]) -> Self {
        Selection(
            shape
                .iter()
                .map(|&n| DimSelection::Slice {
                    start: 0,
                    step: 1,
                    count: n,
                })
                .collect(),
        )
    }

    /// Parses `select` for an array of `shape`.
    pub fn parse(text: &str, shape: &[u64]) -> Result<Self, SelectionError> {
        match Self::parse_plain(text, shape) {
            Some(plain) => Ok(plain),
            None => Self::parse_general(text, shape),
        }
    }

    /// Parses `select` by the whole grammar (spaces, brackets, a trailing comma, `+`, integers
    /// of any length), with a message for what it refuses.
    fn parse_general(text: &str, shape: &[u64]) -> Result<Self, SelectionError> {
        let mut body = text.trim();
        if let Some(inner) = body.strip_prefix('[') {
            body = inner
                .strip_suffix(']')
                .ok_or_else(|| SelectionError("unbalanced brackets".into()))?
                .trim();
        }
        if body.is_empty() {
            return Ok(Self::all(shape));
        }
        // One trailing comma is allowed, as in NumPy (`a[0,]`).
        let body = body.strip_suffix(',').unwrap_or(body);
        let terms = pieces(body, ',').count();
        if terms > shape.len() {
            let plural = |n: usize, what: &str| format!("{n} {what}{}", if n == 1 { "" } else { "s" });
            return Err(SelectionError(format!(
                "{} for an array of {}",
                plural(terms, "term"),
                plural(shape.len(), "dimension")
            )));
        }
        let mut terms = pieces(body, ',').map(str::trim);
        let mut dims = Vec::with_capacity(shape.len());
        for (d, &n) in shape.iter().enumerate() {
            dims.push(Self::parse_term(terms.next().unwrap_or(":"), n, d)?);
        }
        Ok(Selection(dims))
    }

    /// A selection as viewers and scripts write it, read in one pass over its bytes: terms of
    /// integers (ASCII digits, an optional `-`, at most 18 digits) and colons, between single
    /// commas, with no space, bracket, sign `+` or trailing comma; and valid for `shape`.
    /// `None` for anything else, which [`Selection::parse`]'s general reading then takes (and
    /// refuses with its message where it must). Where this gives a selection, that reading
    /// gives the same (a property test holds them together); it is a fifth of the work.
    fn parse_plain(text: &str, shape: &[u64]) -> Option<Self> {
        let bytes = text.as_bytes();
        if bytes.is_empty() || bytes.last() == Some(&b',') {
            return None;
        }
        let mut terms = bytes.split(|&b| b == b',');
        let mut dims = Vec::with_capacity(shape.len());
        for &n in shape {
            dims.push(match terms.next() {
                Some(term) => Self::plain_term(term, n)?,
                None => DimSelection::Slice {
                    start: 0,
                    step: 1,
                    count: n,
                },
            });
        }
        match terms.next() {
            Some(_) => None,
            None => Some(Selection(dims)),
        }
    }

    /// One term of [`Selection::parse_plain`], normalised as [`Selection::parse_term`] does it
    /// ([`index_of`], [`slice_of`]).
    fn plain_term(term: &[u8], n: u64) -> Option<DimSelection> {
        let mut parts = term.split(|&b| b == b':');
        let start = plain_int(parts.next()?)?;
        let Some(stop) = parts.next() else {
            return index_of(i128::from(start?), n).map(DimSelection::Index);
        };
        let stop = plain_int(stop)?;
        let step = match parts.next() {
            Some(part) => plain_int(part)?.unwrap_or(1),
            None => 1,
        };
        if step < 1 || parts.next().is_some() {
            return None;
        }
        Some(slice_of(
            start.map(i128::from),
            stop.map(i128::from),
            i128::from(step),
            n,
        ))
    }

    fn parse_term(term: &str, n: u64, dim: usize) -> Result<DimSelection, SelectionError> {
        if !term.bytes().any(|b| b == b':') {
            // An integer past i64 is out of bounds (as in NumPy), not "no integer".
            let out_of_bounds = |i: &dyn std::fmt::Display| {
                SelectionError(format!("index {i} is out of bounds for dimension {dim} of size {n}"))
            };
            let i = parse_int(term, "index").map_err(|e| match parse_bound(term, "index") {
                Ok(_) => out_of_bounds(&term.trim()),
                Err(_) => e,
            })?;
            return index_of(i, n).map(DimSelection::Index).ok_or_else(|| out_of_bounds(&i));
        }
        // start:stop:step, each part optional.
        let mut parts = [None; 3];
        for (i, part) in pieces(term, ':').enumerate() {
            let Some(slot) = parts.get_mut(i) else {
                return Err(SelectionError(format!("'{term}' has too many ':'")));
            };
            *slot = Some(part);
        }
        let opt = |s: Option<&str>, what: &str| -> Result<Option<i128>, SelectionError> {
            match s.map(str::trim) {
                None | Some("") => Ok(None),
                Some(s) => parse_bound(s, what).map(Some),
            }
        };
        let step = opt(parts[2], "step")?.unwrap_or(1);
        if step < 1 {
            return Err(SelectionError(format!(
                "step {step} in dimension {dim}: steps must be >= 1"
            )));
        }
        let start = opt(parts[0], "start")?;
        let stop = opt(parts[1], "stop")?;
        Ok(slice_of(start, stop, step, n))
    }

    /// The result shape with integer-indexed dimensions kept as 1 (the layout of assembly).
    pub fn full_shape(&self) -> Vec<u64> {
        self.0.iter().map(|d| d.span().2).collect()
    }

    /// The result shape, integer-indexed dimensions dropped.
    pub fn shape(&self) -> Vec<u64> {
        self.0
            .iter()
            .filter_map(|d| match d {
                DimSelection::Index(_) => None,
                DimSelection::Slice { count, .. } => Some(*count),
            })
            .collect()
    }

    /// Number of elements selected, saturating at `u64::MAX` (more than any size limit admits)
    /// where the true count does not fit.
    pub fn len(&self) -> u64 {
        self.0.iter().fold(1u64, |n, d| n.saturating_mul(d.span().2))
    }

    /// Whether nothing is selected.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

/// The part of one dimension's selection that falls in one grid cell.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct CellPart {
    /// Cell index (relative to the grid origin).
    pub cell: u64,
    /// First selected index inside the cell.
    pub src_start: u64,
    /// Indices selected in the cell.
    pub count: u64,
    /// Where they go in the result along this dimension.
    pub dst_start: u64,
}

/// How many `cell`-sized cells (from 0) a dimension's selection touches, without listing them:
/// with a step of at least a cell every selected index lies in its own cell, otherwise every
/// cell between the first and the last selected index holds one.
pub fn cells_touched(sel: DimSelection, cell: u64) -> u64 {
    let (start, step, count) = sel.span();
    if count == 0 || cell == 0 {
        return 0;
    }
    if step >= cell {
        return count;
    }
    let last = start.saturating_add((count - 1).saturating_mul(step));
    last / cell - start / cell + 1
}

/// Splits a dimension's selection over a grid of `cell`-sized cells starting at `origin`,
/// considering only absolute indices in `lo..hi`.
pub fn cells(sel: DimSelection, cell: u64, origin: u64, lo: u64, hi: u64) -> Vec<CellPart> {
    let (start, step, count) = sel.span();
    let k_at = |x: u64| -> u64 { if x <= start { 0 } else { (x - start).div_ceil(step) } };
    let k_min = k_at(lo);
    let k_max = k_at(hi).min(count);
    let mut out = Vec::new();
    let mut k = k_min;
    while k < k_max {
        let idx = start + k * step;
        let c = (idx - origin) / cell;
        let cell_lo = origin + c * cell;
        // Saturating: the last cell of an array close to u64::MAX elements ends past it.
        let k_end = k_at(cell_lo.saturating_add(cell)).min(k_max);
        out.push(CellPart {
            cell: c,
            src_start: idx - cell_lo,
            count: k_end - k,
            dst_start: k,
        });
        k = k_end;
    }
    out
}

#[cfg(test)]
mod tests {
    use proptest::prelude::*;

    use super::*;
    use DimSelection::*;

    fn s(start: u64, step: u64, count: u64) -> DimSelection {
        Slice { start, step, count }
    }

    #[test]
    fn too_many_terms_are_counted_in_words() {
        let err = |text: &str, shape: &[u64]| Selection::parse(text, shape).unwrap_err().to_string();
        assert!(
            err("0", &[]).contains("1 term for an array of 0 dimensions"),
            "{}",
            err("0", &[])
        );
        assert!(
            err("0,1", &[5]).contains("2 terms for an array of 1 dimension"),
            "{}",
            err("0,1", &[5])
        );
    }

    #[test]
    fn grammar_and_numpy_rules() {
        let shape = [10, 20, 30];
        assert_eq!(Selection::parse("", &shape).unwrap(), Selection::all(&shape));
        assert_eq!(
            Selection::parse("[1:3, 5, ::7]", &shape).unwrap().0,
            [s(1, 1, 2), Index(5), s(0, 7, 5)]
        );
        assert_eq!(Selection::parse("-3:", &shape).unwrap().0[0], s(7, 1, 3));
        assert_eq!(Selection::parse("-1", &shape).unwrap().0[0], Index(9));
        assert_eq!(
            Selection::parse("5:100", &shape).unwrap().0[0],
            s(5, 1, 5),
            "stop clamps"
        );
        assert_eq!(Selection::parse("8:2", &shape).unwrap().0[0], s(8, 1, 0), "empty");
        assert_eq!(Selection::parse("-100:2", &shape).unwrap().0[0], s(0, 1, 2));
        assert_eq!(Selection::parse("0:10:3", &shape).unwrap().0[0], s(0, 3, 4));
        assert_eq!(
            Selection::parse(" 1 : 9 : 2 , : , ::", &shape).unwrap().0,
            [s(1, 2, 4), s(0, 1, 20), s(0, 1, 30)]
        );
        assert_eq!(
            Selection::parse("0, 1:2:3:4", &shape).unwrap_err().to_string(),
            "invalid selection: '1:2:3:4' has too many ':'"
        );
        // Bounds and steps past i64 saturate, as NumPy clamps a[0:10**20]; an index does not.
        let huge = "99999999999999999999";
        assert_eq!(
            Selection::parse(&format!("0:{huge}"), &shape).unwrap().0[0],
            s(0, 1, 10)
        );
        assert_eq!(
            Selection::parse(&format!("-{huge}:2"), &shape).unwrap().0[0],
            s(0, 1, 2)
        );
        assert_eq!(
            Selection::parse(&format!("+{huge}:"), &shape).unwrap().0[0],
            s(10, 1, 0)
        );
        assert_eq!(Selection::parse(&format!("::{huge}"), &shape).unwrap().shape()[0], 1);
        let err = Selection::parse(&format!(" -{huge}"), &shape).unwrap_err().to_string();
        assert_eq!(
            err,
            format!("invalid selection: index -{huge} is out of bounds for dimension 0 of size 10")
        );
        assert_eq!(
            Selection::parse("1.5", &shape).unwrap_err().to_string(),
            "invalid selection: '1.5' is not an integer index"
        );
        assert!(Selection::parse("0:1e20", &shape).is_err());
        let sel = Selection::parse("2, 3:5", &shape).unwrap();
        assert_eq!(sel.shape(), [2, 30]);
        assert_eq!(sel.full_shape(), [1, 2, 30]);
        // A trailing comma, as NumPy allows; only one.
        assert_eq!(
            Selection::parse("[2,]", &shape).unwrap(),
            Selection::parse("2", &shape).unwrap()
        );
        assert_eq!(Selection::parse("1,2,3,", &shape).unwrap().shape(), Vec::<u64>::new());
        for bad in [
            "10", "-11", "::0", "::-1", "a:b", "1:2:3:4", "[1", "1,2,3,4", "1.5", "1,,", ",", "1,2,3,4,",
        ] {
            assert!(Selection::parse(bad, &shape).is_err(), "{bad}");
        }
        assert_eq!(
            Selection::parse("", &[]).unwrap().len(),
            1,
            "0-d arrays have one element"
        );
        assert!(Selection::parse("0", &[]).is_err());
        // A dimension of 2^64 - 1: every index of it, from either end, and bounds past i64.
        let vast = [u64::MAX, 3];
        let max = u64::MAX;
        assert_eq!(
            Selection::parse(&(max - 2).to_string(), &vast).unwrap().0[0],
            Index(max - 2)
        );
        assert_eq!(Selection::parse(&format!("-{max}"), &vast).unwrap().0[0], Index(0));
        assert_eq!(
            Selection::parse("9223372036854775807:9223372036854775810", &vast)
                .unwrap()
                .0[0],
            s(i64::MAX as u64, 1, 3)
        );
        assert_eq!(
            Selection::parse(&format!("-3::{}", u128::MAX), &vast).unwrap().0[0],
            s(max - 3, max, 1)
        );
        assert!(Selection::parse(&max.to_string(), &vast).is_err());
    }

    fn shape() -> impl Strategy<Value = Vec<u64>> {
        prop::collection::vec(prop::sample::select(vec![0u64, 1, 5, 17, 1 << 40, u64::MAX]), 0..4)
    }

    fn int() -> impl Strategy<Value = String> {
        prop_oneof![
            4 => (-20i64..20).prop_map(|i| i.to_string()),
            1 => any::<i64>().prop_map(|i| i.to_string()),
            1 => "-?[0-9]{17,19}",
        ]
    }

    fn term() -> impl Strategy<Value = String> {
        let part = || prop::option::of(int()).prop_map(Option::unwrap_or_default);
        prop_oneof![
            int(),
            (part(), part()).prop_map(|(a, b)| format!("{a}:{b}")),
            (part(), part(), part()).prop_map(|(a, b, c)| format!("{a}:{b}:{c}")),
        ]
    }

    proptest! {
        /// Any text of the plain alphabet the one-pass reading takes, it reads as the general
        /// reading does.
        #[test]
        fn the_plain_reading_agrees_where_it_reads(text in "[0-9:,-]{0,24}", shape in shape()) {
            if let Some(plain) = Selection::parse_plain(&text, &shape) {
                prop_assert_eq!(Ok(plain), Selection::parse_general(&text, &shape));
            }
        }

        /// Selections written plainly are read by the one-pass reading, which gives what the
        /// general reading gives and refuses (to it) what that refuses.
        #[test]
        fn plain_selections_are_read_in_one_pass(terms in prop::collection::vec(term(), 1..5), shape in shape()) {
            let text = terms.join(",");
            let general = Selection::parse_general(&text, &shape);
            let long = terms.iter().any(|t| t.split(':').any(|p| p.trim_start_matches('-').len() > 18));
            if long {
                prop_assert_eq!(Selection::parse_plain(&text, &shape), None);
            } else {
                prop_assert_eq!(Selection::parse_plain(&text, &shape), general.ok());
            }
        }
    }

    #[test]
    fn a_tile_is_read_in_one_pass() {
        let tile = Selection::parse_plain("520:584,-64:,3", &[1024, 1024, 4]).unwrap();
        assert_eq!(tile, Selection(vec![s(520, 1, 64), s(960, 1, 64), Index(3)]));
        for general in [
            "[0:2]", " 0:2", "0:2,", "+1", "0:2 ,1", "1e3", "0::0", "5", "0:1:2:3", ",", "",
        ] {
            assert_eq!(Selection::parse_plain(general, &[4, 4]), None, "{general:?}");
        }
    }

    #[test]
    fn len_saturates_instead_of_overflowing() {
        // Found by fuzz/selection: 2^40 x 2^40 elements overflowed the product (a panic in
        // debug builds, a wrapped count that slipped under max_slice_bytes in release).
        let sel = Selection::parse(":, :", &[1 << 40, 1 << 40]).unwrap();
        assert_eq!(sel.len(), u64::MAX);
        assert!(!sel.is_empty());
        let empty = Selection::parse(":, :, 0:0", &[1 << 40, 1 << 40, 5]).unwrap();
        assert_eq!(empty.len(), 0);
        assert!(empty.is_empty());
    }

    #[test]
    fn touched_cells_are_counted_without_listing_them() {
        for (sel, cell) in [
            (s(3, 2, 5), 4),
            (s(0, 10, 3), 4),
            (s(0, 1, 100), 7),
            (s(5, 3, 0), 2),
            (s(9, 1, 1), 4),
        ] {
            assert_eq!(
                cells_touched(sel, cell),
                cells(sel, cell, 0, 0, u64::MAX).len() as u64,
                "{sel:?} / {cell}"
            );
        }
        // A dimension of 2^40 one-element chunks is counted, not allocated.
        assert_eq!(cells_touched(s(0, 1, 1 << 40), 1), 1 << 40);
    }

    #[test]
    fn cells_at_the_end_of_the_u64_range() {
        // Found by fuzz/selection: the end of the last cell overflowed (a panic in debug
        // builds; in release the wrapped end made the loop restart at k = 0 forever).
        let n = u64::MAX;
        let sel = Selection::parse("-5:-1", &[n]).unwrap().0[0];
        let parts = cells(sel, 60, 0, 0, n);
        assert_eq!(parts.iter().map(|p| p.count).sum::<u64>(), 4);
        assert_eq!(parts[0].dst_start, 0);
        assert_eq!(parts[0].cell * 60 + parts[0].src_start, n - 5);
        let whole = cells(Selection::parse(":", &[n]).unwrap().0[0], 1 << 62, 0, n - 10, n);
        assert_eq!(whole.len(), 1);
        assert_eq!(whole[0].count, 10);
    }

    #[test]
    fn cells_split_selections() {
        // indices 3, 5, 7, 9, 11 over cells of 4: cell 0 -> [3], cell 1 -> [5, 7], cell 2 -> [9, 11]
        let parts = cells(s(3, 2, 5), 4, 0, 0, 100);
        assert_eq!(
            parts,
            [
                CellPart {
                    cell: 0,
                    src_start: 3,
                    count: 1,
                    dst_start: 0
                },
                CellPart {
                    cell: 1,
                    src_start: 1,
                    count: 2,
                    dst_start: 1
                },
                CellPart {
                    cell: 2,
                    src_start: 1,
                    count: 2,
                    dst_start: 3
                },
            ]
        );
        // A big step skips whole cells.
        let parts = cells(s(0, 10, 3), 4, 0, 0, 100);
        assert_eq!(parts.iter().map(|p| p.cell).collect::<Vec<_>>(), [0, 2, 5]);
        // Restricted to a window (a shard 8..16) with inner cells of 4 from origin 8.
        let parts = cells(s(3, 2, 5), 4, 8, 8, 16);
        assert_eq!(
            parts,
            [CellPart {
                cell: 0,
                src_start: 1,
                count: 2,
                dst_start: 3
            },]
        );
    }
}
