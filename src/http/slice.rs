//! `GET /api/v1/slice/{mount}/{path}?select=...&format=...`: decoded data of a region as JSON,
//! raw binary, .npy, CSV or PNG (see DESIGN.md "Slice queries").

use std::borrow::Cow;
use std::ops::Range;
use std::sync::Arc;

use axum::body::Body;
use axum::extract::State;
use axum::http::{HeaderMap, HeaderName, HeaderValue, Method, Uri, header};
use axum::response::{IntoResponse, Response};
use bytes::Bytes;
use futures::stream::BoxStream;
use futures::{FutureExt, StreamExt, stream};

use crate::array::selection::cells;
use crate::array::{
    DimSelection, LoadedRegion, ReadContext, ReadError, Selection, load_region, read_region, read_region_bytes,
    row_axis, unit_shape, units_bytes,
};
use crate::buffers::StackText;
use crate::dtype::DType;
use crate::dtype::elements::Elements;
use crate::dtype::fill::FillValue;
use crate::error::ApiError;
use crate::format::png::{Colormap, PngOptions};
use crate::format::{Format, Region, bin, csv, json, png};
use crate::state::AppState;
use crate::store::StoreKey;
use crate::zarr::ArrayMeta;

/// Bytes a streamed band aims for: the decoded units it touches are loaded (and held) together.
const BAND_BYTES: u64 = 8 << 20;
/// Bytes of one body buffer a band is written out in: small enough to stay in the CPU cache
/// and below the allocator's mmap threshold, so buffers are reused rather than faulted in.
const PIECE_BYTES: u64 = 64 << 10;
/// Bands of a streamed response loading at once.
const BANDS_AHEAD: usize = 3;
/// Results of at most this many elements are encoded (JSON, CSV, PNG, strings) on the request's
/// own task: for them a hop to the blocking pool costs more than the encoding.
const INLINE_ENCODE_ELEMENTS: u64 = 16 * 1024;
/// ... and of at most this many bytes (decoded, or as text for variable-length elements).
const INLINE_ENCODE_BYTES: u64 = 256 << 10;
/// Elements of one piece of a streamed text (JSON, CSV) response, encoded on the blocking pool.
const TEXT_PIECE_ELEMENTS: u64 = 8 * 1024;

/// The query of a slice.
struct SliceQuery<'a> {
    select: Option<Cow<'a, str>>,
    format: Option<Cow<'a, str>>,
    vmin: Option<Cow<'a, str>>,
    vmax: Option<Cow<'a, str>>,
    cmap: Option<Cow<'a, str>>,
}

impl<'a> SliceQuery<'a> {
    fn of(uri: &'a Uri) -> Result<Self, ApiError> {
        let [select, format, vmin, vmax, cmap] = super::query(uri, ["select", "format", "vmin", "vmax", "cmap"])?;
        Ok(Self {
            select,
            format,
            vmin,
            vmax,
            cmap,
        })
    }
}

fn parse_number(v: Option<&str>, name: &str) -> Result<Option<f64>, ApiError> {
    match v.map(str::trim) {
        None | Some("") => Ok(None),
        Some(s) => s
            .parse::<f64>()
            .ok()
            .filter(|v| v.is_finite())
            .map(Some)
            .ok_or_else(|| ApiError::BadRequest(format!("{name} must be a finite number, got '{s}'"))),
    }
}

/// The formats the request takes, best first: the one `format` names, or those Accept lists
/// (JSON when it lists none).
fn formats_taken(query: &SliceQuery, headers: &HeaderMap) -> Result<Cow<'static, [Format]>, ApiError> {
    match query.format.as_deref() {
        Some(name) => Format::from_name(name)
            .map(|f| Cow::Borrowed(f.alone()))
            .ok_or_else(|| ApiError::BadRequest(format!("unknown format '{name}' (json, bin, npy, csv, png)"))),
        None => {
            let accepted = super::header_list(headers, header::ACCEPT)
                .map(|accept| Format::accepted(&accept))
                .unwrap_or_default();
            Ok(if accepted.is_empty() {
                Cow::Borrowed(Format::Json.alone())
            } else {
                Cow::Owned(accepted)
            })
        }
    }
}

/// Whether `format` can hold a result of `shape` and `dtype`, before anything is read.
fn can_hold(format: Format, shape: &[u64], dtype: &DType) -> Result<(), ApiError> {
    match format {
        Format::Csv => csv::check(shape, dtype)?,
        Format::Png => {
            png::check(shape, dtype)?;
        }
        Format::Npy => bin::check_npy(dtype, shape)?,
        Format::Bin => bin::check_bin(dtype)?,
        Format::Json => {}
    }
    Ok(())
}

/// Headers of slice answers ([`HeaderName::from_static`]: a name given as text is parsed and
/// copied for every answer).
const X_ZARR_SHAPE: HeaderName = HeaderName::from_static("x-zarr-shape");
const X_ZARR_DTYPE: HeaderName = HeaderName::from_static("x-zarr-dtype");
const X_ZARR_VMIN: HeaderName = HeaderName::from_static("x-zarr-vmin");
const X_ZARR_VMAX: HeaderName = HeaderName::from_static("x-zarr-vmax");
/// Every slice answer's `Vary` (its format may come from `Accept`), checked when compiled.
const VARY_ACCEPT: HeaderValue = HeaderValue::from_static("accept");

/// The `X-Zarr-Dtype` value of a type string: a numeric type's, static, as it is (no copy).
/// `DType::typestr`'s static strings are ASCII literals, which `from_static` takes without
/// panicking.
fn dtype_header(typestr: Cow<'static, str>) -> Result<HeaderValue, ApiError> {
    match typestr {
        Cow::Borrowed(s) => Ok(HeaderValue::from_static(s)),
        Cow::Owned(s) => HeaderValue::try_from(s).map_err(|_| ApiError::Internal),
    }
}

/// The `X-Zarr-Shape` value of `shape` (`64,64`), put together on the stack for the usual
/// shapes and copied once.
fn shape_header(shape: &[u64]) -> Result<HeaderValue, ApiError> {
    let mut text = StackText::<256>::new();
    let value = match crate::zarr::write_joined(&mut text, shape, ',') {
        Ok(()) => HeaderValue::from_str(text.as_str()),
        Err(_) => {
            let mut long = String::new();
            crate::zarr::push_joined(&mut long, shape, ',');
            HeaderValue::try_from(long)
        }
    };
    value.map_err(|_| ApiError::Internal)
}

/// A `Content-Length` value, its digits copied once (`HeaderValue::from(u64)` grows a buffer
/// and then shares it: two allocations).
fn length_header(n: u64) -> HeaderValue {
    HeaderValue::from_str(itoa::Buffer::new().format(n)).unwrap_or_else(|_| HeaderValue::from(n))
}

/// The handler. An error depends on Accept too (the format it chose may be the one refused),
/// so it says so as a response does.
///
/// [`answer`]'s future mapped, not an `async` function: that would hold the request's parts
/// twice over (as its arguments, and in the future it awaits).
pub fn slice(
    State(state): State<AppState>,
    method: Method,
    uri: Uri,
    headers: HeaderMap,
) -> impl Future<Output = Response> + Send {
    answer(state, method, uri, headers).map(|answered| {
        answered.unwrap_or_else(|e| {
            let mut response = e.into_response();
            response.headers_mut().append(header::VARY, VARY_ACCEPT);
            response
        })
    })
}

async fn answer(state: AppState, method: Method, uri: Uri, headers: HeaderMap) -> Result<Response, ApiError> {
    let query = SliceQuery::of(&uri)?;
    let formats = formats_taken(&query, &headers)?;
    let png_opts = PngOptions {
        vmin: parse_number(query.vmin.as_deref(), "vmin")?,
        vmax: parse_number(query.vmax.as_deref(), "vmax")?,
        cmap: match query.cmap.as_deref() {
            None => Colormap::Gray,
            Some(name) => Colormap::from_name(name)
                .ok_or_else(|| ApiError::BadRequest(format!("unknown cmap '{name}' (gray, viridis)")))?,
        },
    };
    let tail = uri.path().strip_prefix("/api/v1/slice/").unwrap_or("");
    let (mount_name, rest) = tail.split_once('/').unwrap_or((tail, ""));
    let mount = state.mount_at(mount_name).await?;
    let mount = &*mount;
    let (path, _) = StoreKey::from_url_path(rest)?;
    let meta = state.array(mount, &path).await?;
    let sel = Selection::parse(query.select.as_deref().unwrap_or(""), &meta.shape)?;
    // The best format that can hold the result, before anything is read: of those Accept
    // lists, the next when the best cannot (a csv of 3-D data is JSON for a client that takes
    // both); the only one, or the best, otherwise, which says why it cannot.
    let shape = sel.shape();
    let format = formats
        .iter()
        .copied()
        .find(|&f| can_hold(f, &shape, &meta.dtype).is_ok())
        .or(formats.first().copied())
        .unwrap_or(Format::Json);
    can_hold(format, &shape, &meta.dtype)?;
    // Text is compressed as the request accepts; the other formats never are.
    let is_text = matches!(format, Format::Json | Format::Csv);
    let coding = is_text.then(|| state.compression.wanted(&headers)).flatten();
    let text = |response: Response| match is_text {
        true => super::compress::apply(&state.compression, &method, coding, response),
        false => response,
    };
    if let (Format::Png, Some(lo), Some(hi)) = (format, png_opts.vmin, png_opts.vmax)
        && lo > hi
    {
        return Err(ApiError::BadRequest(format!("vmin ({lo}) is above vmax ({hi})")));
    }

    // Refuse before reading anything: the size is known from the metadata alone. Variable-length
    // elements count what the result holds before a chunk is read (the element and its copy of
    // the fill value), and are checked again once read.
    let asked = match meta.dtype.item_size() {
        Some(item) => sel.len().saturating_mul(item as u64),
        None => Elements::filled_size(&meta.fill, sel.len()),
    };
    let limit = state.config.limits.max_slice_bytes;
    if asked > limit {
        return Err(ApiError::TooLarge(format!(
            "the selection holds {} decoded ({}); the limit is {limit}",
            bytes_text(asked),
            count_text(sel.len(), "elements")
        )));
    }
    // JSON writes a structured element's field names with every element: they count too.
    let names = field_name_bytes(&meta.dtype);
    if format == Format::Json && names > 0 {
        let item = meta.dtype.item_size().unwrap_or(0) as u64;
        let text = sel.len().saturating_mul(names.saturating_add(item));
        if text > limit {
            return Err(ApiError::TooLarge(format!(
                "as json the selection holds {} with its field names ({names} bytes an element); the limit is {limit} bytes",
                bytes_text(text)
            )));
        }
    }
    // An image is up to four bytes a pixel before compression (RGBA; a gray one two, and a
    // filter byte a row), whatever the data's type, and its compressed bytes can be as many:
    // four are counted for every image.
    let pixels = sel.len();
    if format == Format::Png && pixels.saturating_mul(4) > limit {
        return Err(ApiError::TooLarge(format!(
            "as png the selection is {pixels} pixels of 4 bytes, {}; the limit is {limit} bytes",
            bytes_text(pixels.saturating_mul(4))
        )));
    }
    // An empty selection is still one JSON list for every index of the dimensions before the
    // empty one: `select=:,0:0` of a 2^40-row array would be a document of 2^40 `[]`.
    let lists = shape
        .iter()
        .take_while(|&&d| d != 0)
        .fold(1u64, |n, &d| n.saturating_mul(d));
    if format == Format::Json && sel.is_empty() && lists.saturating_mul(3) > limit {
        return Err(ApiError::TooLarge(format!(
            "the selection is empty, but as JSON it is {lists} nested empty lists of 3 bytes each; the limit is {limit} bytes \
             (select a range of the leading dimensions, or use format=bin)"
        )));
    }

    // Chunks, and the inner chunks of shards, each decoded (and planned, and cached) apart.
    let max_chunks = state.config.limits.max_chunks_per_slice;
    for (unit, what) in [(&meta.chunk_shape[..], "chunks"), (unit_shape(&meta), "inner chunks")] {
        let n = sel.units_touched(unit, None);
        if n > max_chunks {
            return Err(ApiError::TooLarge(format!(
                "the selection touches {n} {what}; the limit is {max_chunks}"
            )));
        }
    }

    let ctx = state.read_context(mount);
    // Chunks too large to decode: refused before a HEAD answers, as a GET is.
    crate::array::read::check_unit(&ctx, &meta)?;
    let mut response = super::response();
    super::append(&mut response, header::CONTENT_TYPE, format.content_type());
    // Without `format`, the body depends on Accept: caches must not give one to the other.
    super::append(&mut response, header::VARY, VARY_ACCEPT);
    super::append(&mut response, X_ZARR_SHAPE, shape_header(&shape)?);

    let fixed = meta.dtype.item_size().is_some();
    if method == Method::HEAD {
        return head_only(response, format, &meta, &sel, fixed.then_some(asked)).map(text);
    }
    // Large results of fixed-size elements stream in bands of rows, as bytes or as text, so
    // that memory holds a few bands and never the whole result (nor its text, which is several
    // times larger).
    if fixed
        && asked > BAND_BYTES
        && let Some(rows) = RowsAs::of(format, &meta, &sel)?
    {
        let mut response = response;
        super::append(&mut response, X_ZARR_DTYPE, dtype_header(meta.dtype.typestr())?);
        let permit = stream_permit(&state)?;
        return stream_bands(ctx, path, meta, sel, rows, response, permit)
            .await
            .map(text);
    }
    if matches!(format, Format::Bin | Format::Npy) && fixed {
        super::append(&mut response, X_ZARR_DTYPE, dtype_header(meta.dtype.typestr())?);
        // Fixed-size binary: the bytes as read (a single whole chunk is not even copied).
        let data = read_region_bytes(&ctx, &path, meta.clone(), &sel).await?;
        let header = match format {
            Format::Npy => Bytes::from(bin::npy_header(&meta.dtype, &sel.shape())),
            _ => Bytes::new(),
        };
        if header.is_empty() {
            // A body of exact size: the connection states its length.
            return response.body(Body::from(data)).map_err(|_| ApiError::Internal);
        }
        let length = header.len() + data.len();
        let body = Body::from_stream(stream::iter([Ok::<Bytes, std::io::Error>(header), Ok(data)]));
        super::append(&mut response, header::CONTENT_LENGTH, length_header(length as u64));
        return response.body(body).map_err(|_| ApiError::Internal);
    }

    // A result that is sent whole but large (an image, text of variable-length elements)
    // takes its permit before it is read: the region and its encoding are held meanwhile, and a
    // busy server refuses before reading rather than after.
    let whole = match format {
        Format::Png => asked.max(pixels.saturating_mul(4)),
        _ => asked,
    };
    let (permit, held) = match whole > BAND_BYTES {
        // The region and its encoding, at once: the encoding's share of the memory budget.
        true => (
            Some(stream_permit(&state)?),
            Some(whole_share(&state, asked.saturating_add(whole))?),
        ),
        false => (None, None),
    };
    let elements = read_region(&ctx, &path, meta.clone(), &sel).await?;
    let variable = crate::format::variable_bytes(&elements, format);
    if let Some(bytes) = variable.filter(|&b| b > limit) {
        return Err(ApiError::TooLarge(format!(
            "the selection's variable-length elements take {} as {}; the limit is {limit}",
            bytes_text(bytes),
            format.name()
        )));
    }
    let region = Region {
        shape: sel.shape(),
        dtype: meta.dtype.clone(),
        elements,
        fill: match &meta.fill {
            FillValue::Fixed(b) if meta.fill_declared => Some(b.clone()),
            _ => None,
        },
    };
    // The body, its dtype, for PNG the value range the colours span, and the share of the
    // memory budget held (by the encoding itself: one on the blocking pool goes on when its
    // request has gone, and holds the memory until it ends).
    type Encoded = (
        Vec<u8>,
        Cow<'static, str>,
        Option<(f64, f64)>,
        Option<tokio::sync::OwnedSemaphorePermit>,
    );
    let encode = move || -> Result<Encoded, ApiError> {
        let typestr = region.dtype.typestr();
        let (body, typestr, range) = match format {
            Format::Json => (json::encode(&region), typestr, None),
            Format::Csv => (csv::encode(&region)?, typestr, None),
            Format::Png => {
                let image = png::encode(&region, &png_opts)?;
                (image.png, typestr, Some((image.vmin, image.vmax)))
            }
            Format::Bin => {
                let (dtype, data) = bin::fixed_width(region)?;
                (data, dtype.typestr(), None)
            }
            Format::Npy => {
                let (dtype, data) = bin::encode_npy(region)?;
                (data, dtype.typestr(), None)
            }
        };
        Ok((body, typestr, range, held))
    };
    // Small results are encoded here; larger ones on the blocking pool, off the async workers.
    // Small by their bytes too: a few long strings are as much work as many numbers.
    // An empty selection is lists in JSON, 3 bytes each.
    let json_lists = if format == Format::Json {
        lists.saturating_mul(3)
    } else {
        0
    };
    let text_bytes = variable.unwrap_or(asked).max(json_lists);
    let (body, dtype, range, held) = if sel.len() <= INLINE_ENCODE_ELEMENTS && text_bytes <= INLINE_ENCODE_BYTES {
        encode()?
    } else {
        crate::workers::spawn_blocking(encode)
            .await
            .map_err(|_| ApiError::Internal)??
    };
    if let Some((vmin, vmax)) = range {
        // As Rust writes numbers (0, 1.5), in the fewest digits of the data's own float size
        // as JSON writes them (-3.6922765 of a float32, not its f64 -3.6922764778137207), in
        // exponent form where that is long (1e308, not its 309 digits).
        let size = match meta.dtype.kind {
            crate::dtype::Kind::Float(n) => n,
            _ => 8,
        };
        fn short<T: std::fmt::Display + std::fmt::LowerExp>(v: T) -> String {
            match v.to_string() {
                t if t.len() <= 24 => t,
                _ => format!("{v:e}"),
            }
        }
        let text = |v: f64| match size {
            4 if f64::from(v as f32) == v => short(v as f32),
            2 if f64::from(half::f16::from_f64(v)) == v => short(crate::format::shortest_half(v)),
            _ => short(v),
        };
        response = response.header(X_ZARR_VMIN, text(vmin)).header(X_ZARR_VMAX, text(vmax));
    }
    let length = body.len();
    response
        .header(X_ZARR_DTYPE, dtype_header(dtype)?)
        .header(header::CONTENT_LENGTH, length_header(length as u64))
        .body(whole_body(&state, Bytes::from(body), permit, held)?)
        .map(text)
        .map_err(|_| ApiError::Internal)
}

/// The share of [`AppState::whole_mib`] an answer built whole holds for `bytes` (at most all
/// of it, so that one larger than the budget may run alone); 503 when the rest is held.
fn whole_share(state: &AppState, bytes: u64) -> Result<tokio::sync::OwnedSemaphorePermit, ApiError> {
    let budget = crate::state::whole_budget_mib(state.config.limits.max_slice_bytes);
    let mib = u32::try_from(bytes.div_ceil(1 << 20))
        .unwrap_or(u32::MAX)
        .clamp(1, budget);
    state
        .whole_mib
        .clone()
        .try_acquire_many_owned(mib)
        .map_err(|_| ApiError::Overloaded)
}

/// The body of a response encoded whole (png, variable-length elements, text of small
/// results). One over [`BAND_BYTES`] holds a stream permit (`permit`, taken before it was read, or
/// one taken now), as a streamed one does, and is sent in pieces of [`PIECE_BYTES`]: hyper
/// takes a body of one piece at once, so clients that did not read held such bodies (a 26 MB
/// image each) past every limit, and the access log counted them as sent.
fn whole_body(
    state: &AppState,
    body: Bytes,
    permit: Option<tokio::sync::OwnedSemaphorePermit>,
    held: Option<tokio::sync::OwnedSemaphorePermit>,
) -> Result<Body, ApiError> {
    if body.len() as u64 <= BAND_BYTES {
        return Ok(Body::from(body));
    }
    let permit = match permit {
        Some(permit) => permit,
        None => stream_permit(state)?,
    };
    let piece = PIECE_BYTES as usize;
    let pieces = (0..body.len().div_ceil(piece))
        .map(move |i| Ok::<Bytes, std::io::Error>(body.slice(i * piece..((i + 1) * piece).min(body.len()))));
    // The body holds its share of the memory budget until it is sent, as its permit.
    Ok(holding(stream::iter(pieces), (permit, held)))
}

/// A permit to send a streamed (or large whole) body ([`AppState::streams`]); 503 when none is
/// left.
fn stream_permit(state: &AppState) -> Result<tokio::sync::OwnedSemaphorePermit, ApiError> {
    state
        .streams
        .clone()
        .try_acquire_owned()
        .map_err(|_| ApiError::Overloaded)
}

/// A body of `pieces` that holds `permit` until it is sent or dropped.
fn holding(
    pieces: impl futures::Stream<Item = Result<Bytes, std::io::Error>> + Send + 'static,
    permit: impl Send + 'static,
) -> Body {
    Body::from_stream(pieces.map(move |piece| {
        let _sending = &permit;
        piece
    }))
}

/// Bytes of the field names (quoted, with their colon) JSON writes for one element of a
/// structured type, nested fields and subarrays included; 0 for other types.
fn field_name_bytes(dtype: &DType) -> u64 {
    match &dtype.kind {
        crate::dtype::Kind::Structured(fields) => fields.iter().fold(0u64, |n, f| {
            let count = f.shape.iter().fold(1u64, |c, &d| c.saturating_mul(d as u64));
            n.saturating_add(f.name.len() as u64 + 3)
                .saturating_add(field_name_bytes(&f.dtype).saturating_mul(count))
        }),
        _ => 0,
    }
}

/// A byte count for a message ([`count_text`]).
fn bytes_text(bytes: u64) -> String {
    count_text(bytes, "bytes")
}

/// A count of `what` for a message; a count saturated at the largest u64 is "2^64 or more".
fn count_text(n: u64, what: &str) -> String {
    if n == u64::MAX {
        format!("2^64 {what} or more")
    } else {
        format!("{n} {what}")
    }
}

/// The answer to a HEAD of a slice that passed every check made before reading: the headers a
/// GET sends that are known without reading a chunk (RFC 9110 section 9.3.2 lets the others
/// go), so that a HEAD costs no decoding. A fixed-size result as bin or npy has its exact
/// Content-Length; other bodies have none (text is sent chunked, and a PNG's size is known once
/// made). The dtype is the array's, but for variable-length elements as bin or npy (as wide as
/// the longest, known once read); a PNG's value range is known once read. Stored data that does
/// not decode is found by the GET only.
fn head_only(
    response: axum::http::response::Builder,
    format: Format,
    meta: &ArrayMeta,
    sel: &Selection,
    fixed_bytes: Option<u64>,
) -> Result<Response, ApiError> {
    let bytes = matches!(format, Format::Bin | Format::Npy);
    let mut response = response;
    // bin and npy write variable-length elements at the width of the longest: that type is
    // known once they are read. Every other answer names the array's own.
    if !bytes || fixed_bytes.is_some() {
        super::append(&mut response, X_ZARR_DTYPE, dtype_header(meta.dtype.typestr())?);
    }
    if let (true, Some(data)) = (bytes, fixed_bytes) {
        let header = match format {
            Format::Npy => bin::npy_header(&meta.dtype, &sel.shape()).len() as u64,
            _ => 0,
        };
        response = response.header(header::CONTENT_LENGTH, length_header(header.saturating_add(data)));
        return response.body(Body::empty()).map_err(|_| ApiError::Internal);
    }
    // A body of unknown length, as the GET's: no Content-Length is made up for it.
    response
        .body(Body::from_stream(stream::empty::<Result<Bytes, std::io::Error>>()))
        .map_err(|_| ApiError::Internal)
}

/// Splits a selection into bands of whole rows of decode units (chunks, or inner chunks of
/// shards) along its [`row_axis`] (the first dimension whose length is not 1, so that
/// `select=0,:,:` streams in bands as `select=:,:` does): as many unit rows as hold about
/// [`BAND_BYTES`] of decoded units, at least one. Each band comes with the index of its first
/// row in the result. Also returns the bytes of units one band holds at most.
fn bands(meta: &ArrayMeta, sel: &Selection) -> (Vec<(u64, Selection)>, u64) {
    let axis = row_axis(&sel.full_shape());
    // The decoded units one row of units along the axis holds.
    let held = units_bytes(meta, sel, Some(axis)).max(1);
    let Some(&along) = sel.0.get(axis) else {
        return (vec![(0, sel.clone())], held);
    };
    let per_band = BAND_BYTES.div_ceil(held).max(1);
    let (start, step, _) = along.span();
    let mut out = Vec::new();
    let mut pending: Option<(u64, u64, u64)> = None; // (first k, count, unit rows)
    for part in cells(along, unit_shape(meta)[axis], 0, 0, meta.shape[axis]) {
        let (k0, n, rows) = match pending {
            Some((k0, n, rows)) => (k0, n + part.count, rows + 1),
            None => (part.dst_start, part.count, 1),
        };
        if rows >= per_band {
            out.push((k0, n));
            pending = None;
        } else {
            pending = Some((k0, n, rows));
        }
    }
    out.extend(pending.map(|(k0, n, _)| (k0, n)));
    let bands = out
        .into_iter()
        .map(|(k0, n)| {
            let mut dims = sel.0.clone();
            dims[axis] = match along {
                DimSelection::Index(i) => DimSelection::Index(i),
                DimSelection::Slice { .. } => DimSelection::Slice {
                    start: start + k0 * step,
                    step,
                    count: n,
                },
            };
            (k0, Selection(dims))
        })
        .collect();
    (bands, held.saturating_mul(per_band))
}

/// How the rows of a streamed response are written out.
#[derive(Debug)]
enum RowsAs {
    /// Their bytes (bin; npy after its header).
    Bytes { npy: bool },
    /// Text (JSON, CSV).
    Text(Arc<TextRows>),
}

/// Rows of a streamed text response: rows of the result along the selection's row `axis` (of
/// its full shape), each of `row_shape`.
#[derive(Debug)]
struct TextRows {
    dtype: DType,
    axis: usize,
    row_shape: Vec<u64>,
    form: TextForm,
}

/// The text a row is written as.
#[derive(Debug)]
enum TextForm {
    /// JSON lists, inside `outer` lists of one element (the leading dimensions of length 1
    /// before the row axis).
    Json { outer: usize },
    /// CSV values, `cols` a line.
    Csv { cols: u64 },
}

impl RowsAs {
    /// How `format` streams `sel`; `None` when it does not (PNG, which needs the whole value
    /// range first, and a result without rows: one element).
    fn of(format: Format, meta: &ArrayMeta, sel: &Selection) -> Result<Option<RowsAs>, ApiError> {
        let axis = row_axis(&sel.full_shape());
        if !matches!(sel.0.get(axis), Some(DimSelection::Slice { .. })) {
            return Ok(None);
        }
        // The result's dimensions before the row axis (all of length 1), and those of a row.
        let outer = sel.0[..axis]
            .iter()
            .filter(|d| matches!(d, DimSelection::Slice { .. }))
            .count();
        let shape = sel.shape();
        let form = match format {
            Format::Bin => return Ok(Some(RowsAs::Bytes { npy: false })),
            Format::Npy => return Ok(Some(RowsAs::Bytes { npy: true })),
            Format::Png => return Ok(None),
            Format::Json => TextForm::Json { outer },
            Format::Csv => {
                csv::check(&shape, &meta.dtype)?;
                TextForm::Csv {
                    cols: csv::columns(&shape),
                }
            }
        };
        Ok(Some(RowsAs::Text(Arc::new(TextRows {
            dtype: meta.dtype.clone(),
            axis,
            row_shape: shape.get(outer + 1..).unwrap_or_default().to_vec(),
            form,
        }))))
    }

    /// What comes before the rows, and after them.
    fn frame(&self, meta: &ArrayMeta, sel: &Selection) -> (Bytes, Bytes) {
        match self {
            RowsAs::Bytes { npy: true } => (Bytes::from(bin::npy_header(&meta.dtype, &sel.shape())), Bytes::new()),
            RowsAs::Bytes { npy: false } => (Bytes::new(), Bytes::new()),
            RowsAs::Text(t) => match t.form {
                TextForm::Json { outer } => {
                    let mut head = Vec::new();
                    json::push_head(&mut head, &sel.shape(), &t.dtype);
                    head.extend(std::iter::repeat_n(b'[', outer + 1));
                    let mut tail = vec![b']'; outer + 1];
                    tail.push(b'}');
                    (Bytes::from(head), Bytes::from(tail))
                }
                TextForm::Csv { .. } => (Bytes::new(), Bytes::new()),
            },
        }
    }

    /// The body of a loaded band whose first row is row `first` of the result.
    fn pieces(&self, band: LoadedRegion, first: u64) -> BoxStream<'static, Result<Bytes, std::io::Error>> {
        match self {
            RowsAs::Bytes { .. } => byte_pieces(band).boxed(),
            RowsAs::Text(t) => text_pieces(band, first, t.clone()).boxed(),
        }
    }
}

impl TextRows {
    /// The text of elements `elements` of row `row` of the result (`bytes` holds just them):
    /// a part of a row too long to write at once.
    fn text_part(&self, bytes: &[u8], row: u64, elements: Range<u64>) -> Result<Vec<u8>, String> {
        let item = self.dtype.item_size().unwrap_or(0) as u64;
        let per_row = self.row_shape.iter().product::<u64>();
        if bytes.len() as u64 != (elements.end - elements.start).saturating_mul(item) || elements.end > per_row {
            return Err(format!(
                "{} bytes for elements {elements:?} of a row of {per_row}",
                bytes.len()
            ));
        }
        let mut out = Vec::with_capacity(bytes.len() * 3);
        match self.form {
            TextForm::Json { .. } => {
                json::push_row_part(&mut out, &self.dtype, &self.row_shape, bytes, elements, row > 0)
            }
            TextForm::Csv { cols } => csv::push_fixed(
                &mut out,
                &self.dtype,
                bytes,
                row.saturating_mul(per_row) + elements.start,
                cols,
            ),
        }
        Ok(out)
    }

    /// The text of `rows` rows of bytes whose first is row `first` of the result.
    fn text(&self, bytes: &[u8], rows: u64, first: u64) -> Result<Vec<u8>, String> {
        let per_row = self.row_shape.iter().product::<u64>();
        let item = self.dtype.item_size().unwrap_or(0) as u64;
        if (bytes.len() as u64) != rows.saturating_mul(per_row).saturating_mul(item) {
            return Err(format!(
                "{} bytes for {rows} rows of {per_row} elements of {item} bytes",
                bytes.len()
            ));
        }
        let mut out = Vec::with_capacity(bytes.len() * 3);
        match self.form {
            TextForm::Json { .. } => {
                json::push_fixed_rows(&mut out, &self.dtype, &self.row_shape, bytes, rows as usize, first == 0)
            }
            TextForm::Csv { cols } => {
                csv::push_fixed(&mut out, &self.dtype, bytes, first.saturating_mul(per_row), cols)
            }
        }
        Ok(out)
    }
}

/// A failure after the response started: logged, and the body ends in an error.
fn broken(e: impl std::fmt::Display) -> std::io::Error {
    tracing::error!(error = %e, "slice stream failed after the response started");
    std::io::Error::other("read failed")
}

/// The bytes of a loaded band in buffers of about [`PIECE_BYTES`] ([`pieces_of`]), copied
/// out as they are sent.
fn byte_pieces(band: LoadedRegion) -> impl futures::Stream<Item = Result<Bytes, std::io::Error>> {
    let band = Arc::new(band);
    let pieces = pieces_of(&band, PIECE_BYTES / band.item().max(1) as u64);
    stream::iter(pieces).map(move |piece| band.write_part(&piece.ranges).map(Bytes::from).map_err(broken))
}

/// A piece of a band to write out: the block `ranges` cut out of it, which is a run of whole
/// rows (`part` is `None`), or elements `part.1` of row `part.0` of the band.
#[derive(Debug, Clone, PartialEq)]
struct Piece {
    ranges: Vec<(usize, Range<u64>)>,
    part: Option<(u64, Range<u64>)>,
}

/// How a band is written out about `elements` at a time: runs of whole rows, or, when a row
/// holds more than that, parts of each row: cut along the outermost dimension after the row
/// axis whose every index holds at most `elements` (the dimensions between taken one index
/// at a time). No piece copies more than about `elements`, however the row is shaped.
fn pieces_of(band: &LoadedRegion, elements: u64) -> Vec<Piece> {
    let (shape, axis) = (band.shape(), band.axis());
    let rows = band.rows();
    let elements = elements.max(1);
    let row_dims = shape.get(axis + 1..).unwrap_or_default();
    let per_row = row_dims.iter().product::<u64>().max(1);
    if per_row <= elements || rows == 0 {
        let step = (elements / per_row).max(1);
        return (0..rows)
            .step_by(step as usize)
            .map(|r| Piece {
                ranges: vec![(axis, r..(r + step).min(rows))],
                part: None,
            })
            .collect();
    }
    // The cut dimension (an index of row_dims): the first whose indices each hold few enough.
    let inner_of = |j: usize| row_dims[j + 1..].iter().product::<u64>();
    let j = (0..row_dims.len())
        .find(|&j| inner_of(j) <= elements)
        .unwrap_or(row_dims.len() - 1);
    let (len, inner) = (row_dims[j], inner_of(j));
    let step = (elements / inner.max(1)).max(1);
    let before = &row_dims[..j];
    let outer: u64 = before.iter().product();
    let mut pieces = Vec::new();
    for r in 0..rows {
        for o in 0..outer {
            // The indices of the dimensions before the cut one, for the o-th of their tuples.
            let mut ranges = vec![(axis, r..r + 1)];
            let mut rest = o;
            for (k, &n) in before.iter().enumerate().rev() {
                ranges.push((axis + 1 + k, rest % n..rest % n + 1));
                rest /= n;
            }
            for c in (0..len).step_by(step as usize) {
                let end = (c + step).min(len);
                let mut cut = ranges.clone();
                cut.push((axis + 1 + j, c..end));
                let first = (o * len + c) * inner;
                pieces.push(Piece {
                    ranges: cut,
                    part: Some((r, first..first + (end - c) * inner)),
                });
            }
        }
    }
    pieces
}

/// The text of a loaded band whose first row is row `first` of the result, encoded on the
/// blocking pool about [`TEXT_PIECE_ELEMENTS`] at a time ([`pieces_of`]; rows of the result,
/// along the selection's row axis whatever the band's own shape, or parts of a longer row),
/// the next piece while one is sent.
fn text_pieces(
    band: LoadedRegion,
    first: u64,
    text: Arc<TextRows>,
) -> impl futures::Stream<Item = Result<Bytes, std::io::Error>> {
    let band = Arc::new(band.along(text.axis));
    let pieces = pieces_of(&band, TEXT_PIECE_ELEMENTS);
    stream::iter(pieces)
        .map(move |piece| {
            let (band, text) = (band.clone(), text.clone());
            crate::workers::spawn_blocking(move || {
                let bytes = band.write_part(&piece.ranges).map_err(broken)?;
                let written = match piece.part {
                    None => {
                        let rows = &piece.ranges[0].1;
                        text.text(&bytes, rows.end - rows.start, first + rows.start)
                    }
                    Some((r, elements)) => text.text_part(&bytes, first + r, elements),
                };
                written.map(Bytes::from).map_err(broken)
            })
        })
        .buffered(2)
        .map(|piece| piece.map_err(broken).and_then(|p| p))
}

/// Streams a large response band by band. A band's decoded units are loaded by a task of its
/// own while the bands before it are written out, so decoding and sending overlap; each band
/// is copied out (or encoded as text) in small buffers, so memory holds the units of a few
/// bands and no assembled copy of them. Bytes have a known length; text is sent chunked.
async fn stream_bands(
    ctx: ReadContext,
    path: StoreKey,
    meta: Arc<ArrayMeta>,
    sel: Selection,
    rows_as: RowsAs,
    mut response: axum::http::response::Builder,
    permit: tokio::sync::OwnedSemaphorePermit,
) -> Result<Response, ApiError> {
    let (head, tail) = rows_as.frame(&meta, &sel);
    if let RowsAs::Bytes { .. } = rows_as {
        let item = meta.dtype.item_size().unwrap_or(0) as u64;
        let length = head.len() as u64 + sel.len() * item;
        response = response.header(header::CONTENT_LENGTH, length_header(length));
    }
    let rows_as = Arc::new(rows_as);
    // Each band is loaded by a task of its own, up to BANDS_AHEAD at once, from the start: the
    // bands after the first are decoding while the first is awaited and sent. Bands that hold
    // more than BAND_BYTES of units (one row of units can) load fewer at once, down to one.
    let (bands, held) = bands(&meta, &sel);
    let ahead = (BAND_BYTES * BANDS_AHEAD as u64 / held).clamp(1, BANDS_AHEAD as u64) as usize;
    let mut loads = stream::iter(bands.into_iter().zip(0..))
        .map(move |((first, band), rank)| {
            // Ranked by band: the permits to decode go to the band sent first.
            let (ctx, path, meta) = (ctx.ranked(rank), path.clone(), meta.clone());
            // Aborted when dropped: a client that leaves stops the bands still loading (the
            // chunk loads they started run on to be cached, within DETACHED_LOADS).
            tokio_util::task::AbortOnDropHandle::new(crate::workers::spawn(async move {
                (first, load_region(&ctx, &path, meta, &band).await)
            }))
        })
        .buffered(ahead)
        .map(|loaded| match loaded {
            Ok((first, Ok(band))) => Ok((first, band)),
            Ok((_, Err(e))) => Err(e),
            Err(e) => Err(ReadError::Internal(format!("band task failed: {e}"))),
        });
    // The first band is loaded before answering, so that common errors still get a status.
    let (first_row, first) = match loads.next().await {
        Some(band) => band?,
        None => return Err(ApiError::Internal),
    };
    let pieces = rows_as.clone();
    let rest = loads
        .map(move |band| match band {
            Ok((first, band)) => pieces.pieces(band, first),
            Err(e) => stream::iter([Err(broken(e))]).boxed(),
        })
        .flatten();
    let body = stream::iter([Ok::<Bytes, std::io::Error>(head)])
        .chain(rows_as.pieces(first, first_row))
        .chain(rest)
        .chain(stream::iter([Ok(tail)]));
    response.body(holding(body, permit)).map_err(|_| ApiError::Internal)
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    /// Answers built whole share a budget of four times `limits.max_slice_bytes`: shares are
    /// refused (503) once it is held, and free again when dropped; one larger than the whole
    /// budget takes all of it, alone.
    #[tokio::test]
    async fn whole_answers_share_a_memory_budget() {
        let mut config = crate::config::Config::default();
        config.limits.max_slice_bytes = 64 << 20;
        let state = AppState::from_config(config).unwrap();
        assert_eq!(state.whole_mib.available_permits(), 256);
        let first = whole_share(&state, 100 << 20).unwrap();
        let second = whole_share(&state, (100 << 20) + 1).unwrap();
        assert_eq!(state.whole_mib.available_permits(), 55);
        assert!(matches!(whole_share(&state, 56 << 20), Err(ApiError::Overloaded)));
        let small = whole_share(&state, 10).unwrap();
        assert!(matches!(whole_share(&state, 1 << 40), Err(ApiError::Overloaded)));
        drop((first, second, small));
        let all = whole_share(&state, 1 << 40).unwrap();
        assert_eq!(state.whole_mib.available_permits(), 0);
        drop(all);
        // The budget is at least 64 MiB.
        assert_eq!(crate::state::whole_budget_mib(1 << 20), 64);
    }

    #[test]
    fn saturated_counts_are_not_printed_as_numbers() {
        assert_eq!(bytes_text(12), "12 bytes");
        assert_eq!(bytes_text(u64::MAX), "2^64 bytes or more");
        assert_eq!(count_text(u64::MAX, "elements"), "2^64 elements or more");
    }

    /// The metadata of a v3 array of uncompressed chunks.
    fn raw_array(shape: &[u64], chunks: &[u64], data_type: &str) -> ArrayMeta {
        crate::zarr::parse_v3(&json!({
            "zarr_format": 3, "node_type": "array", "shape": shape, "data_type": data_type,
            "chunk_grid": {"name": "regular", "configuration": {"chunk_shape": chunks}},
            "chunk_key_encoding": {"name": "default"}, "fill_value": 0,
            "codecs": [{"name": "bytes", "configuration": {"endian": "little"}}]
        }))
        .unwrap()
    }

    #[test]
    fn text_pieces_join_into_the_whole_document() {
        let meta = raw_array(&[2, 5, 7], &[1, 5, 7], "float64");
        // Leading dimensions of length 1 kept or dropped, rows of one element or of lists, a
        // CSV line split across pieces; every way of cutting the rows into pieces.
        for text in [":,:,:", "0:1,:,:", "1,:,:", "0:1,3,:", "1,2:3,::2", "0:2,4,1:6"] {
            let sel = Selection::parse(text, &meta.shape).unwrap();
            let n = sel.len() as usize;
            let bytes: Vec<u8> = (0..n).flat_map(|i| (i as f64 * 1.5 - 3.0).to_le_bytes()).collect();
            let region = Region {
                shape: sel.shape(),
                dtype: meta.dtype.clone(),
                elements: Elements::Fixed(bytes.clone()),
                fill: None,
            };
            let rows = sel.full_shape()[row_axis(&sel.full_shape())] as usize;
            let row_bytes = bytes.len() / rows;
            let formats: &[Format] = if region.shape.len() <= 2 {
                &[Format::Json, Format::Csv]
            } else {
                &[Format::Json]
            };
            for &format in formats {
                let whole = match format {
                    Format::Json => json::encode(&region),
                    _ => csv::encode(&region).unwrap(),
                };
                let rows_as = RowsAs::of(format, &meta, &sel).unwrap().unwrap();
                let (head, tail) = rows_as.frame(&meta, &sel);
                let RowsAs::Text(text_rows) = &rows_as else {
                    panic!("{format:?} is text")
                };
                for cut in 1..=rows {
                    let mut joined = head.to_vec();
                    for r in (0..rows).step_by(cut) {
                        let end = (r + cut).min(rows);
                        let piece = &bytes[r * row_bytes..end * row_bytes];
                        joined.extend(text_rows.text(piece, (end - r) as u64, r as u64).unwrap());
                    }
                    joined.extend_from_slice(&tail);
                    assert_eq!(
                        String::from_utf8(joined).unwrap(),
                        String::from_utf8(whole.clone()).unwrap(),
                        "{text} {format:?} in pieces of {cut} rows"
                    );
                }
            }
        }
        // A single element has no rows to stream.
        let one = Selection::parse("1,2,3", &meta.shape).unwrap();
        assert!(RowsAs::of(Format::Json, &meta, &one).unwrap().is_none());
        let cube = Selection::parse(":,:,:", &meta.shape).unwrap();
        assert!(RowsAs::of(Format::Csv, &meta, &cube).is_err());
    }

    #[test]
    fn bands_are_sized_by_the_units_they_hold() {
        // One column of every 256-wide chunk: 1 KiB of result a row, 64 MiB of chunks a row of
        // chunks. A band is one row of chunks (256 rows, not the 8192 that 8 MiB of result
        // would be), and they load one at a time.
        let meta = raw_array(&[99840, 65536], &[256, 256], "float32");
        let sel = Selection::parse("0:99840,::256", &meta.shape).unwrap();
        let (split, held) = bands(&meta, &sel);
        assert_eq!(held, 256 * 256 * 256 * 4);
        assert_eq!(split.len(), 390);
        assert!(
            split
                .iter()
                .enumerate()
                .all(|(k, (first, b))| *first == k as u64 * 256 && b.0[0].span() == (k as u64 * 256, 1, 256))
        );
        assert_eq!((BAND_BYTES * BANDS_AHEAD as u64 / held).clamp(1, BANDS_AHEAD as u64), 1);
        // Dense: 8 MiB of units is 8 MiB of result (8 rows of 256 chunks of 4 KiB).
        let meta = raw_array(&[4096, 65536], &[4, 256], "float32");
        let sel = Selection::parse(":,:", &meta.shape).unwrap();
        let (split, held) = bands(&meta, &sel);
        assert_eq!((held, split.len()), (8 << 20, 4096 / 32));
    }

    #[test]
    fn bands_split_the_first_dimension_longer_than_one() {
        let meta = raw_array(&[2, 21000, 1000], &[1, 300, 500], "float32");
        for text in ["1,:,:", "1:2,:,:"] {
            let sel = Selection::parse(text, &meta.shape).unwrap();
            let (bands, held) = bands(&meta, &sel);
            assert_eq!(held, 7 * 2 * 300 * 500 * 4);
            // 84 MB in bands of whole chunk rows: 7 chunk rows (2100 rows, 8.4 MB) pass 8 MiB.
            let rows: Vec<(u64, u64, u64)> = bands.iter().map(|(_, b)| b.0[1].span()).collect();
            let want: Vec<(u64, u64, u64)> = (0..10).map(|k| (k * 2100, 1, 2100)).collect();
            assert_eq!(rows, want, "{text}");
            let firsts: Vec<u64> = bands.iter().map(|(first, _)| *first).collect();
            assert_eq!(firsts, (0..10).map(|k| k * 2100).collect::<Vec<_>>(), "{text}");
            assert!(bands.iter().all(|(_, b)| b.0[0] == sel.0[0] && b.0[2] == sel.0[2]));
        }
    }
}
