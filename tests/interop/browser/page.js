// The test page: bundled with esbuild (run_browser.cjs) and served from a second 127.0.0.1 port,
// so every request it makes to zarrgate is cross-origin. The driver calls the functions on
// `window.zarrgateTest` through playwright's page.evaluate.
import * as zarr from "zarrita";

const NO_STORE = { cache: "no-store" };

function store(url, { suffix }) {
  // useSuffixRequest: true  -> shard indexes are read with `Range: bytes=-N`
  // useSuffixRequest: false -> a HEAD for Content-Length, then `Range: bytes=a-b`
  return new zarr.FetchStore(url, { useSuffixRequest: suffix, overrides: NO_STORE });
}

const CTORS = {
  int8: Int8Array, int16: Int16Array, int32: Int32Array, int64: BigInt64Array,
  uint8: Uint8Array, uint16: Uint16Array, uint32: Uint32Array, uint64: BigUint64Array,
  float32: Float32Array, float64: Float64Array,
};

function toBase64(bytes) {
  let s = "";
  for (let i = 0; i < bytes.length; i += 0x8000) s += String.fromCharCode.apply(null, bytes.subarray(i, i + 0x8000));
  return btoa(s);
}

function jsonSafe(v) {
  return JSON.stringify(v, (_k, x) => {
    if (typeof x === "bigint") return x.toString();
    if (typeof x === "number" && !Number.isFinite(x)) return Number.isNaN(x) ? "NaN" : x > 0 ? "Infinity" : "-Infinity";
    if (x instanceof Uint8Array) return { $bytes: toBase64(x) };
    return x;
  });
}

/** zarrita's result {data, shape, stride} -> a C-order description the driver can compare. */
function encodeResult(dtype, shape, data, stride) {
  const size = shape.reduce((a, b) => a * b, 1);
  const order = []; // C-order element k -> index into data
  const idx = new Array(shape.length).fill(0);
  for (let k = 0; k < size; k++) {
    let off = 0;
    for (let d = 0; d < shape.length; d++) off += idx[d] * stride[d];
    order.push(off);
    for (let d = shape.length - 1; d >= 0; d--) {
      if (++idx[d] < shape[d]) break;
      idx[d] = 0;
    }
  }
  if (data && data.buffer instanceof ArrayBuffer && typeof data.BYTES_PER_ELEMENT === "number") {
    // Typed arrays and zarrita's BoolArray / ByteStringArray / UnicodeStringArray: raw element bytes.
    const itemsize = data.BYTES_PER_ELEMENT;
    const src = new Uint8Array(data.buffer, data.byteOffset, data.byteLength);
    const out = new Uint8Array(size * itemsize);
    order.forEach((off, k) => out.set(src.subarray(off * itemsize, (off + 1) * itemsize), k * itemsize));
    return { dtype, shape, encoding: "bytes", itemsize, b64: toBase64(out), ctor: data.constructor.name };
  }
  // Plain JS arrays: vlen strings, json2 objects.
  return { dtype, shape, encoding: "json", json: jsonSafe(order.map((off) => data[off])), ctor: data.constructor.name };
}

/**
 * Open the array at `${base}/zarr/${mount}/${path}` with zarr.open (which probes .zattrs /
 * .zarray / zarr.json and relies on 404s), read `region` ([[start, stop], ...] or null = all).
 */
async function readArray({ base, mount, path, suffix, region }) {
  const s = store(`${base}/zarr/${mount}/${path}`, { suffix });
  const arr = await zarr.open(s, { kind: "array" });
  if (arr.shape.length === 0) {
    const value = await zarr.get(arr);
    const Ctor = CTORS[arr.dtype] || (arr.dtype === "float16" ? globalThis.Float16Array : null);
    if (Ctor) return encodeResult(arr.dtype, [], Ctor.from([value]), []);
    if (arr.dtype === "bool") return encodeResult(arr.dtype, [], new Uint8Array([value ? 1 : 0]), []);
    return encodeResult(arr.dtype, [], [value], []);
  }
  const sel = region ? region.map(([a, b]) => zarr.slice(a, b)) : null;
  const out = await zarr.get(arr, sel);
  return encodeResult(arr.dtype, out.shape, out.data, out.stride);
}

/**
 * Open a group through its consolidated metadata (`.zmetadata` for v2, `consolidated_metadata`
 * in zarr.json for v3), list it, and read one listed array through the consolidated store.
 */
async function readConsolidated({ base, mount, path, format, suffix, read }) {
  const raw = store(`${base}/zarr/${mount}/${path}`, { suffix });
  const s = await zarr.withConsolidatedMetadata(raw, { format });
  const contents = s.contents().map((c) => ({ path: c.path, kind: c.kind }));
  let result = null;
  if (read) {
    const arr = await zarr.open(zarr.root(s).resolve(read), { kind: "array" });
    const out = await zarr.get(arr);
    result = encodeResult(arr.dtype, out.shape, out.data, out.stride);
  }
  return { contents, result };
}

/**
 * A viewer's path into an Icechunk mount: open the root group at `url` (`.../zarr/ice@VERSION/`)
 * through the consolidated metadata in its zarr.json, list it, and, with `read`, open that member
 * array and read `selection` (null = all; a list of numbers (an integer index), nulls (the whole
 * axis) and [start, stop] pairs (zarr.slice)). An array naming a codec zarrita's registry lacks
 * is returned as {skip: reason} instead of failing.
 */
async function openVersionedGroup({ url, read, selection }) {
  const s = await zarr.withConsolidatedMetadata(store(url, { suffix: true }), { format: "v3" });
  const group = await zarr.open(zarr.root(s), { kind: "group" });
  const contents = s.contents().map((c) => ({ path: c.path, kind: c.kind }));
  const out = { contents, attrs: group.attrs };
  if (!read) return out;
  const loc = zarr.root(s).resolve(read);
  const arr = await zarr.open(loc, { kind: "array" });
  const codecs = (JSON.parse(new TextDecoder().decode(await s.get(`${loc.path}/zarr.json`))).codecs || []).map((c) => c.name);
  const missing = codecs.filter((n) => !zarr.registry.has(n));
  out.array = {
    dtype: arr.dtype, shape: arr.shape, chunks: arr.chunks, attrs: arr.attrs, codecs,
    fillValue: jsonSafe(arr.fillValue),
  };
  if (missing.length) {
    out.skip = `codec ${missing.map((n) => `'${n}'`).join(", ")} not in zarrita's codec registry (zarrita.registry)`;
    return out;
  }
  const sel = selection ? selection.map((x) => (Array.isArray(x) ? zarr.slice(x[0], x[1]) : x)) : null;
  const r = await zarr.get(arr, sel);
  out.result = encodeResult(arr.dtype, r.shape, r.data, r.stride);
  return out;
}

/** A raw cross-origin fetch; a CORS failure shows as {error: "TypeError: Failed to fetch"}. */
async function probe({ url, method = "GET", headers = {} }) {
  try {
    const r = await fetch(url, { method, headers, cache: "no-store", mode: "cors" });
    const body = method === "HEAD" ? new Uint8Array(0) : new Uint8Array(await r.arrayBuffer());
    const h = {};
    for (const k of ["content-range", "content-length", "etag", "last-modified", "accept-ranges", "content-type", "content-encoding"]) {
      const v = r.headers.get(k);
      if (v !== null) h[k] = v;
    }
    return { status: r.status, headers: h, bodyLength: body.length, body: toBase64(body.subarray(0, 4096)) };
  } catch (e) {
    return { error: String(e) };
  }
}

function describeError(e) {
  const parts = [];
  for (let x = e, depth = 0; x && depth < 4; x = x.cause, depth++) parts.push(`${x.name || "Error"}: ${x.message || x}`);
  return parts.join(" <- caused by ");
}

async function wrap(fn, arg) {
  try {
    return { ok: true, value: await fn(arg) };
  } catch (e) {
    return { ok: false, error: describeError(e) };
  }
}

window.zarrgateTest = {
  readArray: (a) => wrap(readArray, a),
  readConsolidated: (a) => wrap(readConsolidated, a),
  openVersionedGroup: (a) => wrap(openVersionedGroup, a),
  probe,
  features: () => ({ float16: typeof globalThis.Float16Array === "function", userAgent: navigator.userAgent }),
};
window.zarrgateReady = true;
document.title = "zarrgate browser interop (ready)";
