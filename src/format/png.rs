//! PNG output of 2-D numeric or bool regions: values scaled linearly from `vmin` (default:
//! the smallest value) to `vmax` (default: the largest), NaN and fill values ignored for the
//! range and drawn transparent; colormaps `gray` and `viridis`.

use std::io::Write;

use super::{FormatError, Region, as_f64};
use crate::dtype::elements::Elements;
use crate::dtype::{DType, Kind};

/// zlib level of rendered images (with adaptive row filters). On a 512 x 512 float32 tile of
/// noisy data level 1 takes ~20 ms and 276 KB, the crate's default level 6 ~80 ms and 192 KB,
/// its fdeflate mode ~15 ms and 472 KB: images are rendered per request, so level 1.
const ZLIB_LEVEL: u8 = 1;
/// `x` (from 0 to 255) rounded half away from zero, as `f64::round`, which is a call to libm's
/// `round` for every pixel. (Past 255, 255.)
fn round_byte(x: f64) -> u8 {
    let whole = x as u8;
    if x - f64::from(whole) >= 0.5 {
        whole.saturating_add(1)
    } else {
        whole
    }
}

/// Pixels read as numbers and coloured at a time.
const PIECE_PIXELS: usize = 4096;

/// The elements of `line` (of a number or bool type) as f64, in `out` (emptied first): the
/// type matched once for the run, not for each element. What is no number is NaN.
fn read_numbers(dtype: &DType, line: &[u8], out: &mut Vec<f64>) {
    out.clear();
    match dtype.kind {
        Kind::Bool | Kind::UInt(1) => out.extend(line.iter().map(|&b| f64::from(b))),
        Kind::Int(1) => out.extend(line.iter().map(|&b| f64::from(b as i8))),
        Kind::UInt(2) => out.extend(
            line.chunks_exact(2)
                .map(|c| f64::from(u16::from_le_bytes([c[0], c[1]]))),
        ),
        Kind::Int(2) => out.extend(
            line.chunks_exact(2)
                .map(|c| f64::from(i16::from_le_bytes([c[0], c[1]]))),
        ),
        Kind::UInt(4) => out.extend(
            line.chunks_exact(4)
                .map(|c| f64::from(u32::from_le_bytes([c[0], c[1], c[2], c[3]]))),
        ),
        Kind::Int(4) => out.extend(
            line.chunks_exact(4)
                .map(|c| f64::from(i32::from_le_bytes([c[0], c[1], c[2], c[3]]))),
        ),
        Kind::Float(4) => out.extend(
            line.chunks_exact(4)
                .map(|c| f64::from(f32::from_le_bytes([c[0], c[1], c[2], c[3]]))),
        ),
        Kind::Float(8) => out.extend(
            line.chunks_exact(8)
                .map(|c| f64::from_le_bytes([c[0], c[1], c[2], c[3], c[4], c[5], c[6], c[7]])),
        ),
        _ => {
            let item = dtype.item_size().unwrap_or(1).max(1);
            out.extend(line.chunks_exact(item).map(|b| as_f64(dtype, b).unwrap_or(f64::NAN)));
        }
    }
}

/// An element's stored bytes (1, 2, 4 or 8 of them) as one number; `None` for other sizes.
fn stored_bits(b: &[u8]) -> Option<u64> {
    Some(match *b {
        [a] => u64::from(a),
        [a, b] => u64::from(u16::from_le_bytes([a, b])),
        [a, b, c, d] => u64::from(u32::from_le_bytes([a, b, c, d])),
        [a, b, c, d, e, f, g, h] => u64::from_le_bytes([a, b, c, d, e, f, g, h]),
        _ => return None,
    })
}

/// Bytes of one IDAT chunk of compressed image data.
const IDAT_BYTES: usize = 256 << 10;

/// Colormaps.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Colormap {
    /// Black to white.
    Gray,
    /// Perceptually uniform blue-green-yellow.
    Viridis,
}

impl Colormap {
    /// From the `cmap` parameter.
    pub fn from_name(name: &str) -> Option<Colormap> {
        match name {
            "gray" | "grey" => Some(Colormap::Gray),
            "viridis" => Some(Colormap::Viridis),
            _ => None,
        }
    }

    fn rgb(self, t: f64) -> [u8; 3] {
        let t = t.clamp(0.0, 1.0);
        match self {
            Colormap::Gray => {
                let v = round_byte(t * 255.0);
                [v, v, v]
            }
            // As matplotlib maps a value to its 256 colours (`x * N`, floored, the top one for
            // 1.0) and renders them to bytes (`bytes=True`: scaled by 255 and truncated).
            Colormap::Viridis => VIRIDIS[((t * 256.0) as usize).min(255)],
        }
    }
}

/// The viridis colour map (Stéfan van der Walt, Nathaniel Smith and Eric Firing; public domain,
/// CC0) as matplotlib 3.11 renders its 256 colours to bytes: `cm.viridis(range(256), bytes=True)`.
#[rustfmt::skip]
const VIRIDIS: [[u8; 3]; 256] = [
    [68, 1, 84], [68, 2, 85], [68, 3, 87], [69, 5, 88], [69, 6, 90], [69, 8, 91], [70, 9, 92], [70, 11, 94],
    [70, 12, 95], [70, 14, 97], [71, 15, 98], [71, 17, 99], [71, 18, 101], [71, 20, 102], [71, 21, 103], [71, 22, 105],
    [71, 24, 106], [72, 25, 107], [72, 26, 108], [72, 28, 110], [72, 29, 111], [72, 30, 112], [72, 32, 113], [72, 33, 114],
    [72, 34, 115], [72, 35, 116], [71, 37, 117], [71, 38, 118], [71, 39, 119], [71, 40, 120], [71, 42, 121], [71, 43, 122],
    [71, 44, 123], [70, 45, 124], [70, 47, 124], [70, 48, 125], [70, 49, 126], [69, 50, 127], [69, 52, 127], [69, 53, 128],
    [69, 54, 129], [68, 55, 129], [68, 57, 130], [67, 58, 131], [67, 59, 131], [67, 60, 132], [66, 61, 132], [66, 62, 133],
    [66, 64, 133], [65, 65, 134], [65, 66, 134], [64, 67, 135], [64, 68, 135], [63, 69, 135], [63, 71, 136], [62, 72, 136],
    [62, 73, 137], [61, 74, 137], [61, 75, 137], [61, 76, 137], [60, 77, 138], [60, 78, 138], [59, 80, 138], [59, 81, 138],
    [58, 82, 139], [58, 83, 139], [57, 84, 139], [57, 85, 139], [56, 86, 139], [56, 87, 140], [55, 88, 140], [55, 89, 140],
    [54, 90, 140], [54, 91, 140], [53, 92, 140], [53, 93, 140], [52, 94, 141], [52, 95, 141], [51, 96, 141], [51, 97, 141],
    [50, 98, 141], [50, 99, 141], [49, 100, 141], [49, 101, 141], [49, 102, 141], [48, 103, 141], [48, 104, 141], [47, 105, 141],
    [47, 106, 141], [46, 107, 142], [46, 108, 142], [46, 109, 142], [45, 110, 142], [45, 111, 142], [44, 112, 142], [44, 113, 142],
    [44, 114, 142], [43, 115, 142], [43, 116, 142], [42, 117, 142], [42, 118, 142], [42, 119, 142], [41, 120, 142], [41, 121, 142],
    [40, 122, 142], [40, 122, 142], [40, 123, 142], [39, 124, 142], [39, 125, 142], [39, 126, 142], [38, 127, 142], [38, 128, 142],
    [38, 129, 142], [37, 130, 142], [37, 131, 141], [36, 132, 141], [36, 133, 141], [36, 134, 141], [35, 135, 141], [35, 136, 141],
    [35, 137, 141], [34, 137, 141], [34, 138, 141], [34, 139, 141], [33, 140, 141], [33, 141, 140], [33, 142, 140], [32, 143, 140],
    [32, 144, 140], [32, 145, 140], [31, 146, 140], [31, 147, 139], [31, 148, 139], [31, 149, 139], [31, 150, 139], [30, 151, 138],
    [30, 152, 138], [30, 153, 138], [30, 153, 138], [30, 154, 137], [30, 155, 137], [30, 156, 137], [30, 157, 136], [30, 158, 136],
    [30, 159, 136], [30, 160, 135], [31, 161, 135], [31, 162, 134], [31, 163, 134], [32, 164, 133], [32, 165, 133], [33, 166, 133],
    [33, 167, 132], [34, 167, 132], [35, 168, 131], [35, 169, 130], [36, 170, 130], [37, 171, 129], [38, 172, 129], [39, 173, 128],
    [40, 174, 127], [41, 175, 127], [42, 176, 126], [43, 177, 125], [44, 177, 125], [46, 178, 124], [47, 179, 123], [48, 180, 122],
    [50, 181, 122], [51, 182, 121], [53, 183, 120], [54, 184, 119], [56, 185, 118], [57, 185, 118], [59, 186, 117], [61, 187, 116],
    [62, 188, 115], [64, 189, 114], [66, 190, 113], [68, 190, 112], [69, 191, 111], [71, 192, 110], [73, 193, 109], [75, 194, 108],
    [77, 194, 107], [79, 195, 105], [81, 196, 104], [83, 197, 103], [85, 198, 102], [87, 198, 101], [89, 199, 100], [91, 200, 98],
    [94, 201, 97], [96, 201, 96], [98, 202, 95], [100, 203, 93], [103, 204, 92], [105, 204, 91], [107, 205, 89], [109, 206, 88],
    [112, 206, 86], [114, 207, 85], [116, 208, 84], [119, 208, 82], [121, 209, 81], [124, 210, 79], [126, 210, 78], [129, 211, 76],
    [131, 211, 75], [134, 212, 73], [136, 213, 71], [139, 213, 70], [141, 214, 68], [144, 214, 67], [146, 215, 65], [149, 215, 63],
    [151, 216, 62], [154, 216, 60], [157, 217, 58], [159, 217, 56], [162, 218, 55], [165, 218, 53], [167, 219, 51], [170, 219, 50],
    [173, 220, 48], [175, 220, 46], [178, 221, 44], [181, 221, 43], [183, 221, 41], [186, 222, 39], [189, 222, 38], [191, 223, 36],
    [194, 223, 34], [197, 223, 33], [199, 224, 31], [202, 224, 30], [205, 224, 29], [207, 225, 28], [210, 225, 27], [212, 225, 26],
    [215, 226, 25], [218, 226, 24], [220, 226, 24], [223, 227, 24], [225, 227, 24], [228, 227, 24], [231, 228, 25], [233, 228, 25],
    [236, 228, 26], [238, 229, 27], [241, 229, 28], [243, 229, 30], [246, 230, 31], [248, 230, 33], [250, 230, 34], [253, 231, 36],
];

/// Rendering options.
#[derive(Debug, Clone, Copy)]
pub struct PngOptions {
    /// Value drawn at the bottom of the colormap.
    pub vmin: Option<f64>,
    /// Value drawn at the top.
    pub vmax: Option<f64>,
    /// The colormap.
    pub cmap: Colormap,
}

/// A rendered image and the value range its colours span.
#[derive(Debug, Clone)]
pub struct Rendered {
    /// The PNG file.
    pub png: Vec<u8>,
    /// The value at the bottom of the colormap (`vmin`, or the data's minimum).
    pub vmin: f64,
    /// The value at the top (`vmax`, or the data's maximum).
    pub vmax: f64,
}

/// Whether a result of this shape and type has a PNG form: 2-D, not empty, at most 2^32 - 1
/// pixels a side, of numbers or booleans. Returns the width and height.
pub fn check(shape: &[u64], dtype: &DType) -> Result<(u32, u32), FormatError> {
    let &[h, w] = shape else {
        return Err(FormatError::BadRequest(format!(
            "png needs a 2-D result; this one is {}-D",
            shape.len()
        )));
    };
    let (Ok(width), Ok(height)) = (u32::try_from(w), u32::try_from(h)) else {
        return Err(FormatError::BadRequest("image too large".into()));
    };
    if width == 0 || height == 0 {
        return Err(FormatError::BadRequest("png needs a non-empty result".into()));
    }
    let numeric = dtype
        .item_size()
        .is_some_and(|item| as_f64(dtype, &vec![0u8; item.max(8)]).is_some());
    if !numeric {
        return Err(FormatError::Unsupported(format!(
            "png needs numeric or bool data, not {}",
            dtype.typestr()
        )));
    }
    Ok((width, height))
}

/// Encodes a 2-D region as a PNG: gray and alpha for `gray` (two bytes a pixel: less work and
/// a fifth fewer bytes than RGBA, and every viewer shows the same pixels), RGBA for `viridis`.
pub fn encode(region: &Region, opts: &PngOptions) -> Result<Rendered, FormatError> {
    let (width, height) = check(&region.shape, &region.dtype)?;
    let w = u64::from(width);
    let Elements::Fixed(bytes) = &region.elements else {
        return Err(FormatError::Unsupported("png needs numeric or bool data".into()));
    };
    let item = region.dtype.item_size().unwrap_or(0);
    // A pixel's value: `None` (transparent) for NaN and the fill value. Floats equal to the
    // fill are fill (-0.0 of a fill of 0.0, as in NumPy); integers are compared as stored
    // (as f64, the largest could compare equal to their neighbours): as numbers where f64
    // holds every value of the type, else by their bytes.
    let fill = region.fill.as_deref().filter(|f| f.len() == item);
    let fill_value = fill.and_then(|f| as_f64(&region.dtype, f));
    let fill_bits = match region.dtype.kind {
        Kind::Int(8) | Kind::UInt(8) => fill.and_then(stored_bits),
        _ => None,
    };
    let shown = |v: f64, b: &[u8]| -> Option<f64> {
        let is_fill = match fill_bits {
            Some(f) => stored_bits(b) == Some(f),
            None => fill_value == Some(v),
        };
        (!v.is_nan() && !is_fill).then_some(v)
    };
    // The pixels are read as numbers [`PIECE_PIXELS`] at a time (the type matched once a piece,
    // not once a pixel; a piece, not a row: a row can be millions of pixels wide). The png
    // writer cuts the pixels into rows itself.
    let image = &bytes[..bytes.len().min(item * w as usize * height as usize)];
    let piece_bytes = item * PIECE_PIXELS;
    let mut numbers = Vec::with_capacity(PIECE_PIXELS);
    // The automatic range spans the finite values (bool: 0 to 1): infinities draw at its ends.
    // One pass over the bytes, and none when both ends are given.
    let (lo, hi) = match (opts.vmin, opts.vmax) {
        (Some(lo), Some(hi)) => (lo, hi),
        _ if region.dtype.kind == Kind::Bool => (0.0, 1.0),
        _ => image
            .chunks(piece_bytes)
            .fold((f64::INFINITY, f64::NEG_INFINITY), |(mut lo, mut hi), piece| {
                read_numbers(&region.dtype, piece, &mut numbers);
                for (&v, b) in numbers.iter().zip(piece.chunks_exact(item)) {
                    if let Some(v) = shown(v, b).filter(|v| v.is_finite()) {
                        (lo, hi) = (lo.min(v), hi.max(v));
                    }
                }
                (lo, hi)
            }),
    };
    let mut vmin = opts.vmin.unwrap_or(if lo.is_finite() { lo } else { 0.0 });
    let mut vmax = opts.vmax.unwrap_or(if hi.is_finite() { hi } else { 1.0 });
    if opts.vmin.is_none() && opts.vmax.is_none() && vmin == vmax {
        // One value (besides fill and NaN), as in a mask: it draws in the middle of a range
        // around it, not at the bottom colour (black, where the rest is transparent).
        let half = (vmin.abs() * 4.0 * f64::EPSILON).max(0.5);
        (vmin, vmax) = (vmin - half, vmax + half);
    }
    if vmin > vmax {
        return Err(FormatError::BadRequest(format!(
            "vmin ({vmin}) is above vmax ({vmax}); give both"
        )));
    }
    // The span of finite values can overflow (-1e308 to 1e308): then in halves, which cannot
    // (and which the smallest spans, 5e-324, cannot be taken in).
    let span = vmax - vmin;
    let halves = !span.is_finite();
    let span = if halves { vmax / 2.0 - vmin / 2.0 } else { span };
    let position = |v: f64| {
        if span == 0.0 {
            // vmin = vmax, given: a step there.
            if v > vmax { 1.0 } else { 0.0 }
        } else if halves {
            (v / 2.0 - vmin / 2.0) / span
        } else {
            (v - vmin) / span
        }
    };
    let fail = |e: png::EncodingError| FormatError::Unsupported(format!("png: {e}"));
    // Pixels are coloured a piece at a time and compressed as they come: memory holds the
    // region, the png writer's rows (two, for its filters) and the compressed image, never the
    // whole image (up to four bytes a pixel).
    let gray = opts.cmap == Colormap::Gray;
    let mut out = Vec::new();
    {
        let mut encoder = png::Encoder::new(&mut out, width, height);
        encoder.set_color(match gray {
            true => png::ColorType::GrayscaleAlpha,
            false => png::ColorType::Rgba,
        });
        encoder.set_depth(png::BitDepth::Eight);
        encoder.set_deflate_compression(png::DeflateCompression::Level(ZLIB_LEVEL));
        encoder.set_filter(png::Filter::Adaptive);
        let mut writer = encoder.write_header().map_err(fail)?;
        let mut stream = writer.stream_writer_with_size(IDAT_BYTES).map_err(fail)?;
        let mut row = Vec::with_capacity(PIECE_PIXELS * 4);
        for piece in image.chunks(piece_bytes) {
            row.clear();
            read_numbers(&region.dtype, piece, &mut numbers);
            for (&v, b) in numbers.iter().zip(piece.chunks_exact(item)) {
                match (shown(v, b), gray) {
                    (Some(v), true) => row.extend_from_slice(&[opts.cmap.rgb(position(v))[0], 255]),
                    (Some(v), false) => {
                        let [r, g, b] = opts.cmap.rgb(position(v));
                        row.extend_from_slice(&[r, g, b, 255]);
                    }
                    (None, true) => row.extend_from_slice(&[0, 0]),
                    (None, false) => row.extend_from_slice(&[0, 0, 0, 0]),
                }
            }
            stream
                .write_all(&row)
                .map_err(|e| FormatError::Unsupported(format!("png: {e}")))?;
        }
        stream.finish().map_err(fail)?;
    }
    Ok(Rendered { png: out, vmin, vmax })
}

#[cfg(test)]
#[path = "../../tests/integration/common/png_rgba.rs"]
mod png_rgba;

#[cfg(test)]
mod tests {
    use super::png_rgba::png_rgba as decode;
    use super::*;
    use crate::dtype::{DType, Kind};

    /// The range from the data, in gray.
    const AUTO: PngOptions = PngOptions {
        vmin: None,
        vmax: None,
        cmap: Colormap::Gray,
    };

    /// `round_byte` rounds as `f64::round` does, halves and the values just below them too.
    #[test]
    fn bytes_round_as_f64_round() {
        let mut xs: Vec<f64> = (0..=2550).map(|i| f64::from(i) / 10.0).collect();
        xs.extend((0..255).flat_map(|i| {
            let half = f64::from(i) + 0.5;
            [half, half.next_down(), half.next_up(), f64::from(i).next_up()]
        }));
        xs.extend([0.0, 255.0, 254.99999999999997, 0.49999999999999994]);
        for x in xs {
            assert_eq!(super::round_byte(x), x.round() as u8, "{x}");
        }
    }

    /// A row read as numbers is what `as_f64` reads of each element, for every type a png
    /// draws.
    #[test]
    fn rows_read_as_each_element_reads() {
        let mut x = 0x9e37_79b9_7f4a_7c15u64;
        let bytes: Vec<u8> = (0..4096)
            .map(|_| {
                x ^= x << 13;
                x ^= x >> 7;
                x ^= x << 17;
                (x >> 32) as u8
            })
            .collect();
        let kinds = [
            Kind::Bool,
            Kind::Int(1),
            Kind::Int(2),
            Kind::Int(4),
            Kind::Int(8),
            Kind::UInt(1),
            Kind::UInt(2),
            Kind::UInt(4),
            Kind::UInt(8),
            Kind::Float(2),
            Kind::Float(4),
            Kind::Float(8),
        ];
        let mut out = vec![1.0];
        for kind in kinds {
            let dtype = DType::new(kind.clone());
            let item = dtype.item_size().unwrap();
            super::read_numbers(&dtype, &bytes, &mut out);
            let each: Vec<f64> = bytes.chunks_exact(item).map(|b| as_f64(&dtype, b).unwrap()).collect();
            assert_eq!(out.len(), each.len(), "{kind:?}");
            for (a, b) in out.iter().zip(&each) {
                assert!(
                    a.to_bits() == b.to_bits() || a.is_nan() && b.is_nan(),
                    "{kind:?}: {a} {b}"
                );
            }
        }
    }

    /// A 64-bit integer next to the fill reads as the same f64 as the fill, but is drawn: the
    /// fill is told by its stored bytes.
    #[test]
    fn large_integers_beside_the_fill_are_drawn() {
        let fill = (1i64 << 53) + 1;
        for kind in [Kind::Int(8), Kind::UInt(8)] {
            let r = Region {
                shape: vec![1, 3],
                dtype: DType::new(kind.clone()),
                elements: Elements::Fixed([fill, 1 << 53, 0].iter().flat_map(|v| v.to_le_bytes()).collect()),
                fill: Some(fill.to_le_bytes().to_vec()),
            };
            let (_, _, px) = decode(&encode(&r, &AUTO).unwrap().png);
            let alpha: Vec<u8> = px.chunks(4).map(|p| p[3]).collect();
            assert_eq!(alpha, [0, 255, 255], "{kind:?}");
        }
    }

    /// Gray images are gray and alpha; viridis ones RGBA.
    #[test]
    fn gray_is_written_as_gray_and_alpha() {
        let r = Region {
            shape: vec![2, 2],
            dtype: DType::new(Kind::UInt(1)),
            elements: Elements::Fixed(vec![0, 1, 2, 9]),
            fill: Some(vec![9]),
        };
        let color = |cmap| {
            let png = encode(&r, &PngOptions { cmap, ..AUTO }).unwrap().png;
            png::Decoder::new(std::io::Cursor::new(png))
                .read_info()
                .unwrap()
                .info()
                .color_type
        };
        assert_eq!(color(Colormap::Gray), png::ColorType::GrayscaleAlpha);
        assert_eq!(color(Colormap::Viridis), png::ColorType::Rgba);
        let (_, _, px) = decode(&encode(&r, &AUTO).unwrap().png);
        assert_eq!(px, [0, 0, 0, 255, 128, 128, 128, 255, 255, 255, 255, 255, 0, 0, 0, 0]);
    }

    #[test]
    fn large_images_are_written_row_by_row() {
        // 300 x 700 uint16 (840 KB of RGBA, several IDAT chunks), and shapes whose rows are
        // wider than a piece of pixels or cross pieces: every pixel as computed.
        for (h, w) in [(300usize, 700usize), (1, PIECE_PIXELS * 2 + 7), (3, PIECE_PIXELS + 1)] {
            let value = |i: usize, j: usize| ((i * 7 + j * 13) % 1000) as u16;
            let r = Region {
                shape: vec![h as u64, w as u64],
                dtype: DType::new(Kind::UInt(2)),
                elements: Elements::Fixed((0..h * w).flat_map(|k| value(k / w, k % w).to_le_bytes()).collect()),
                fill: Some(999u16.to_le_bytes().to_vec()),
            };
            let rendered = encode(&r, &AUTO).unwrap();
            assert_eq!((rendered.vmin, rendered.vmax), (0.0, 998.0), "{h}x{w}");
            let (pw, ph, px) = decode(&rendered.png);
            assert_eq!((pw as usize, ph as usize), (w, h));
            for k in 0..h * w {
                let v = value(k / w, k % w);
                let want = if v == 999 {
                    [0, 0, 0, 0]
                } else {
                    let g = (v as f64 / 998.0 * 255.0).round() as u8;
                    [g, g, g, 255]
                };
                assert_eq!(px[k * 4..k * 4 + 4], want, "{h}x{w} pixel {k}");
            }
        }
    }

    /// -0.0 is the fill value 0.0 (equal, as in NumPy): transparent, and not in the range.
    #[test]
    fn negative_zero_is_a_fill_of_zero() {
        let r = Region {
            shape: vec![1, 4],
            dtype: DType::new(Kind::Float(4)),
            elements: Elements::Fixed([1.0f32, -0.0, 0.0, 3.0].iter().flat_map(|v| v.to_le_bytes()).collect()),
            fill: Some(0.0f32.to_le_bytes().to_vec()),
        };
        let rendered = encode(&r, &AUTO).unwrap();
        assert_eq!((rendered.vmin, rendered.vmax), (1.0, 3.0));
        let (_, _, px) = decode(&rendered.png);
        assert_eq!(px, [0, 0, 0, 255, 0, 0, 0, 0, 0, 0, 0, 0, 255, 255, 255, 255]);
    }

    /// The range of finite float64 values can span more than the largest float, or less than
    /// its half can hold: its colours are still spread over it.
    #[test]
    fn ranges_wider_than_the_largest_float() {
        let r = Region {
            shape: vec![1, 3],
            dtype: DType::new(Kind::Float(8)),
            elements: Elements::Fixed(
                [-1.7e308f64, 0.0, 1.7e308]
                    .iter()
                    .flat_map(|v| v.to_le_bytes())
                    .collect(),
            ),
            fill: None,
        };
        let (_, _, px) = decode(&encode(&r, &AUTO).unwrap().png);
        assert_eq!(px, [0, 0, 0, 255, 128, 128, 128, 255, 255, 255, 255, 255]);
        let tiny = Region {
            elements: Elements::Fixed([0.0f64, 5e-324, 5e-324].iter().flat_map(|v| v.to_le_bytes()).collect()),
            ..r
        };
        let (_, _, px) = decode(&encode(&tiny, &AUTO).unwrap().png);
        assert_eq!(px, [0, 0, 0, 255, 255, 255, 255, 255, 255, 255, 255, 255]);
    }

    /// Bool draws on 0..1 (true white, false the fill: transparent); data of one value
    /// besides the fill draws in the middle of a range around it, not black; a vmin given
    /// alone above the data is refused, and vmin = vmax given is a step.
    #[test]
    fn bool_masks_single_values_and_one_sided_ranges() {
        let mask = Region {
            shape: vec![1, 3],
            dtype: DType::new(Kind::Bool),
            elements: Elements::Fixed(vec![1, 0, 1]),
            fill: Some(vec![0]),
        };
        let image = encode(&mask, &AUTO).unwrap();
        assert_eq!((image.vmin, image.vmax), (0.0, 1.0));
        let (_, _, px) = decode(&image.png);
        assert_eq!(px, [255, 255, 255, 255, 0, 0, 0, 0, 255, 255, 255, 255]);
        let labels = Region {
            shape: vec![1, 3],
            dtype: DType::new(Kind::Int(4)),
            elements: Elements::Fixed([7i32, 0, 7].iter().flat_map(|v| v.to_le_bytes()).collect()),
            fill: Some(0i32.to_le_bytes().to_vec()),
        };
        let image = encode(&labels, &AUTO).unwrap();
        assert_eq!((image.vmin, image.vmax), (6.5, 7.5));
        let (_, _, px) = decode(&image.png);
        assert_eq!(&px[..4], [128, 128, 128, 255]);
        let above = PngOptions {
            vmin: Some(100.0),
            ..AUTO
        };
        assert!(matches!(encode(&labels, &above), Err(FormatError::BadRequest(m)) if m.contains("above")));
        let step = PngOptions {
            vmin: Some(7.0),
            vmax: Some(7.0),
            cmap: Colormap::Gray,
        };
        let values = Region {
            elements: Elements::Fixed([7i32, 8, 6].iter().flat_map(|v| v.to_le_bytes()).collect()),
            fill: None,
            ..labels
        };
        let (_, _, px) = decode(&encode(&values, &step).unwrap().png);
        assert_eq!(px, [0, 0, 0, 255, 255, 255, 255, 255, 0, 0, 0, 255]);
    }

    #[test]
    fn gray_scaling_and_transparency() {
        let vals = [0.0f32, 5.0, 10.0, f32::NAN, -1.0, 20.0];
        let r = Region {
            shape: vec![2, 3],
            dtype: DType::new(Kind::Float(4)),
            elements: Elements::Fixed(vals.iter().flat_map(|v| v.to_le_bytes()).collect()),
            fill: Some((-1.0f32).to_le_bytes().to_vec()),
        };
        let opts = PngOptions {
            vmin: Some(0.0),
            vmax: Some(10.0),
            cmap: Colormap::Gray,
        };
        let (w, h, px) = decode(&encode(&r, &opts).unwrap().png);
        assert_eq!((w, h), (3, 2));
        let pixel = |i: usize| &px[i * 4..i * 4 + 4];
        assert_eq!(pixel(0), [0, 0, 0, 255]);
        assert_eq!(pixel(1), [128, 128, 128, 255]);
        assert_eq!(pixel(2), [255, 255, 255, 255]);
        assert_eq!(pixel(3)[3], 0, "NaN is transparent");
        assert_eq!(pixel(4)[3], 0, "the fill value is transparent");
        assert_eq!(pixel(5), [255, 255, 255, 255], "clamped above vmax");
        // Default range: data min..max ignoring NaN and fill (0..20).
        let auto = encode(&r, &AUTO).unwrap();
        assert_eq!((auto.vmin, auto.vmax), (0.0, 20.0));
        let (_, _, px) = decode(&auto.png);
        assert_eq!(&px[8..12], [128, 128, 128, 255]);
        let (_, _, px) = decode(
            &encode(
                &r,
                &PngOptions {
                    vmin: None,
                    vmax: None,
                    cmap: Colormap::Viridis,
                },
            )
            .unwrap()
            .png,
        );
        assert_eq!(&px[0..4], [0x44, 0x01, 0x54, 255]);
        assert_eq!(&px[20..24], [253, 231, 36, 255]);
        let one_d = Region { shape: vec![6], ..r };
        assert!(encode(&one_d, &opts).is_err());
    }

    /// viridis as matplotlib 3.11 draws it: `cm.viridis(np.array([x]), bytes=True)` for each x.
    #[test]
    fn viridis_is_matplotlibs() {
        for (x, rgb) in [
            (0.0, [68, 1, 84]),
            (0.25, [58, 82, 139]),
            (0.5, [32, 144, 140]),
            (242.0 / 255.0, [220, 226, 24]),
            (0.999, [253, 231, 36]),
            (1.0, [253, 231, 36]),
        ] {
            assert_eq!(Colormap::Viridis.rgb(x), rgb, "{x}");
        }
    }
}
