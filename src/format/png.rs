//! PNG output of 2-D numeric or bool regions: values scaled linearly from `vmin` (default:
//! the smallest value) to `vmax` (default: the largest), NaN and fill values ignored for the
//! range and drawn transparent; colormaps `gray` and `viridis`.

use std::io::Write;

use super::{FormatError, Region, as_f64};
use crate::zarr::dtype::{DType, Kind};
use crate::zarr::elements::Elements;

/// zlib level of rendered images (with adaptive row filters). On a 512 x 512 float32 tile of
/// noisy data level 1 takes ~20 ms and 276 KB, the crate's default level 6 ~80 ms and 192 KB,
/// its fdeflate mode ~15 ms and 472 KB: images are rendered per request, so level 1.
const ZLIB_LEVEL: u8 = 1;
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
                let v = (t * 255.0).round() as u8;
                [v, v, v]
            }
            Colormap::Viridis => {
                // Published viridis colours at ten evenly spaced stops, interpolated linearly.
                const STOPS: [[u8; 3]; 10] = [
                    [0x44, 0x01, 0x54],
                    [0x48, 0x28, 0x78],
                    [0x3e, 0x49, 0x89],
                    [0x31, 0x68, 0x8e],
                    [0x26, 0x82, 0x8e],
                    [0x1f, 0x9e, 0x89],
                    [0x35, 0xb7, 0x79],
                    [0x6e, 0xce, 0x58],
                    [0xb5, 0xde, 0x2b],
                    [0xfd, 0xe7, 0x25],
                ];
                let x = t * 9.0;
                let i = (x.floor() as usize).min(8);
                let f = x - i as f64;
                let mix = |a: u8, b: u8| (a as f64 + (b as f64 - a as f64) * f).round() as u8;
                let (a, b) = (STOPS[i], STOPS[i + 1]);
                [mix(a[0], b[0]), mix(a[1], b[1]), mix(a[2], b[2])]
            }
        }
    }
}

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

/// Encodes a 2-D region as an RGBA PNG.
pub fn encode(region: &Region, opts: &PngOptions) -> Result<Rendered, FormatError> {
    let (width, height) = check(&region.shape, &region.dtype)?;
    let w = u64::from(width);
    let Elements::Fixed(bytes) = &region.elements else {
        return Err(FormatError::Unsupported("png needs numeric or bool data".into()));
    };
    let item = region.dtype.item_size().unwrap_or(0);
    // A pixel's value: `None` (transparent) for NaN and the fill value. Floats equal to the
    // fill are fill (-0.0 of a fill of 0.0, as in NumPy); integers are compared as stored
    // (as f64, the largest could compare equal to their neighbours).
    let float_fill = match region.dtype.kind {
        Kind::Float(_) => region.fill.as_deref().and_then(|f| as_f64(&region.dtype, f)),
        _ => None,
    };
    let value = |b: &[u8]| -> Option<f64> {
        let v = as_f64(&region.dtype, b)?;
        let is_fill = region.fill.as_deref() == Some(b) || float_fill == Some(v);
        (!v.is_nan() && !is_fill).then_some(v)
    };
    // The automatic range spans the finite values (bool: 0 to 1): infinities draw at its ends.
    // One pass over the bytes, and none when both ends are given.
    let (lo, hi) = match (opts.vmin, opts.vmax) {
        (Some(lo), Some(hi)) => (lo, hi),
        _ if region.dtype.kind == Kind::Bool => (0.0, 1.0),
        _ => bytes
            .chunks_exact(item)
            .filter_map(value)
            .filter(|v| v.is_finite())
            .fold((f64::INFINITY, f64::NEG_INFINITY), |(lo, hi), v| (lo.min(v), hi.max(v))),
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
    // Rows are coloured and compressed one at a time: memory holds the region, one RGBA row
    // and the compressed image, never the whole RGBA image (four bytes a pixel).
    let mut out = Vec::new();
    {
        let mut encoder = png::Encoder::new(&mut out, width, height);
        encoder.set_color(png::ColorType::Rgba);
        encoder.set_depth(png::BitDepth::Eight);
        encoder.set_deflate_compression(png::DeflateCompression::Level(ZLIB_LEVEL));
        encoder.set_filter(png::Filter::Adaptive);
        let mut writer = encoder.write_header().map_err(fail)?;
        let mut stream = writer.stream_writer_with_size(IDAT_BYTES).map_err(fail)?;
        let mut rgba = Vec::with_capacity(w as usize * 4);
        for line in bytes.chunks_exact(item * w as usize) {
            rgba.clear();
            for b in line.chunks_exact(item) {
                match value(b) {
                    Some(v) => {
                        let [r, g, b] = opts.cmap.rgb(position(v));
                        rgba.extend_from_slice(&[r, g, b, 255]);
                    }
                    None => rgba.extend_from_slice(&[0, 0, 0, 0]),
                }
            }
            stream
                .write_all(&rgba)
                .map_err(|e| FormatError::Unsupported(format!("png: {e}")))?;
        }
        stream.finish().map_err(fail)?;
    }
    Ok(Rendered { png: out, vmin, vmax })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::zarr::dtype::{DType, Kind};

    /// The range from the data, in gray.
    const AUTO: PngOptions = PngOptions {
        vmin: None,
        vmax: None,
        cmap: Colormap::Gray,
    };

    fn decode(png_bytes: &[u8]) -> (u32, u32, Vec<u8>) {
        let decoder = png::Decoder::new(std::io::Cursor::new(png_bytes));
        let mut reader = decoder.read_info().unwrap();
        let mut buf = vec![0; reader.output_buffer_size().unwrap()];
        let info = reader.next_frame(&mut buf).unwrap();
        (info.width, info.height, buf[..info.buffer_size()].to_vec())
    }

    #[test]
    fn large_images_are_written_row_by_row() {
        // 300 x 700 uint16 (840 KB of RGBA, several IDAT chunks): every pixel as computed.
        let (h, w) = (300usize, 700usize);
        let value = |i: usize, j: usize| ((i * 7 + j * 13) % 1000) as u16;
        let r = Region {
            shape: vec![h as u64, w as u64],
            dtype: DType::new(Kind::UInt(2)),
            elements: Elements::Fixed((0..h * w).flat_map(|k| value(k / w, k % w).to_le_bytes()).collect()),
            fill: Some(999u16.to_le_bytes().to_vec()),
        };
        let rendered = encode(&r, &AUTO).unwrap();
        assert_eq!((rendered.vmin, rendered.vmax), (0.0, 998.0));
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
            assert_eq!(px[k * 4..k * 4 + 4], want, "pixel {k}");
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
        assert_eq!(&px[20..24], [0xfd, 0xe7, 0x25, 255]);
        let one_d = Region { shape: vec![6], ..r };
        assert!(encode(&one_d, &opts).is_err());
    }
}
