// The PNG reader of the tests: a module of the unit tests of `src/format/png.rs` (by path), and
// included in `tests/integration/common` for the integration tests.

/// Width, height and RGBA pixels of a PNG (gray and alpha, which gray images are, spread to
/// RGBA as viewers show them).
pub fn png_rgba(bytes: &[u8]) -> (u32, u32, Vec<u8>) {
    let mut reader = png::Decoder::new(std::io::Cursor::new(bytes)).read_info().unwrap();
    let mut buf = vec![0; reader.output_buffer_size().unwrap()];
    let info = reader.next_frame(&mut buf).unwrap();
    let buf = &buf[..info.buffer_size()];
    let rgba = match info.color_type {
        png::ColorType::Rgba => buf.to_vec(),
        png::ColorType::GrayscaleAlpha => buf.chunks_exact(2).flat_map(|p| [p[0], p[0], p[0], p[1]]).collect(),
        other => panic!("unexpected colour type {other:?}"),
    };
    (info.width, info.height, rgba)
}
