"use strict";
// Which fixture arrays zarrita.js 0.7.5 can read at all, decided from the array's metadata the
// same way zarrita decides (its codec registry in dist/src/codecs.js, coerceDtype / getCtr in
// dist/src/util.js, createShardedChunkGetter in dist/src/codecs/sharding.js). An array it
// cannot read is SKIPPED with the reason, never counted as a failure: these are client
// limitations, not server bugs. Everything else is read, and any difference is a failure.

const fs = require("fs");
const path = require("path");

// numcodecs ids zarrita resolves for v2 (`numcodecs.${id}`), plus fixedscaleoffset, which its
// v2 -> v3 translation turns into scale_offset + cast_value.
const V2_CODECS = new Set(["blosc", "lz4", "zstd", "gzip", "zlib", "vlen-utf8", "shuffle", "delta", "bitround", "json2", "fixedscaleoffset"]);
const V2_DTYPES = new Set(["b1", "i1", "u1", "i2", "u2", "i4", "u4", "i8", "u8", "f2", "f4", "f8"]);
// The whole registry: v3 metadata may also name the numcodecs.* entries directly.
const V3_CODECS = new Set([
  "blosc", "lz4", "zstd", "gzip", "zlib", "transpose", "bytes", "crc32c", "vlen-utf8", "json2", "bitround", "cast_value", "scale_offset",
  "numcodecs.blosc", "numcodecs.lz4", "numcodecs.zstd", "numcodecs.gzip", "numcodecs.zlib", "numcodecs.vlen-utf8",
  "numcodecs.shuffle", "numcodecs.delta", "numcodecs.bitround", "numcodecs.json2",
]);
const V3_DTYPES = new Set(["bool", "int8", "int16", "int32", "int64", "uint8", "uint16", "uint32", "uint64", "float16", "float32", "float64", "string"]);
const ARRAY_TO_BYTES = new Set(["bytes", "vlen-utf8", "sharding_indexed", "json2"]);

/**
 * Returns null when zarrita can read the array stored in directory `dir` as `reader` (the
 * manifest's reference reader) does, else the reason.
 */
function unsupportedReason(dir, zarrFormat, reader = "") {
  if (zarrFormat === 1) return "Zarr v1 (meta/attrs keys): zarrita.js reads v2 and v3 only";
  if (zarrFormat === 2) {
    const meta = JSON.parse(fs.readFileSync(path.join(dir, ".zarray"), "utf8"));
    if (typeof meta.dtype !== "string") return "structured dtype: not in zarrita's dtype table";
    if (meta.dtype !== "|O") {
      const m = /^[<>|](.*)$/.exec(meta.dtype);
      const rest = m ? m[1] : meta.dtype;
      if (!V2_DTYPES.has(rest) && !/^[SU]\d+$/.test(rest)) return `dtype ${meta.dtype}: not in zarrita's dtype table (no complex, datetime64, timedelta64)`;
    }
    for (const f of meta.filters || []) {
      if (!V2_CODECS.has(f.id)) return `v2 filter/object codec '${f.id}': not in zarrita's codec registry`;
      // zarrita's DeltaCodec decodes with the array's dtype and ignores `astype`.
      if (f.id === "delta" && f.astype && f.astype !== meta.dtype) return "delta filter with astype != dtype: zarrita's DeltaCodec ignores astype";
      // zarrita's scale_offset computes in float64; NumPy (numcodecs) in a float astype.
      if (f.id === "fixedscaleoffset" && /^[<>|]?f[24]$/.test(f.astype || "")) return "fixedscaleoffset with a float32/float16 astype: zarrita computes enc / scale + offset in float64, NumPy in the astype";
      // zarrita's JsonCodec returns the chunk's nested lists as they are (no flattening).
      if (f.id === "json2" && meta.chunks.length > 1) return "json2 with N-d chunks (N > 1): zarrita's JsonCodec does not flatten the nested item lists";
    }
    // zarrita fills missing chunks with the fill_value as stored; v2 stores |S fill values as
    // base64, which zarrita does not decode (writing the base64 text overruns the item size).
    if (/^\|S\d+$/.test(meta.dtype) && meta.fill_value && hasMissingV2Chunk(dir, meta)) {
      return "v2 |S dtype with a base64 fill_value and a missing chunk: zarrita does not decode the fill_value";
    }
    // zarr 2's old default fill 0 for a <U array: zarrita encodes the fill as text and fails on
    // a number (zarr 2 reads it as "0", as zarrgate does).
    if (/^[<>]U\d+$/.test(meta.dtype) && typeof meta.fill_value === "number" && hasMissingV2Chunk(dir, meta)) {
      return "v2 <U dtype with a numeric fill_value (zarr 2's old default) and a missing chunk: zarrita cannot encode it";
    }
    // zarrita fills a missing chunk of an object array with the fill_value as stored (0, null);
    // zarr-python 3 reads a vlen-utf8 array's fill as text ("0", "" for null), zarr 2 null as None.
    if (meta.dtype === "|O" && typeof meta.fill_value !== "string" && hasMissingV2Chunk(dir, meta) &&
        !(meta.fill_value === null && reader.startsWith("zarr 2"))) {
      return "v2 object array with a fill_value that is not a string and a missing chunk: zarrita fills it as stored, zarr-python 3 as text";
    }
    if (numericText(meta.fill_value) && /^[<>|]?f\d$/.test(meta.dtype)) {
      return "float fill_value written as numeric text (' 1_000.5 '), which zarr-python reads: zarrita reads NaN";
    }
    if (meta.compressor && !V2_CODECS.has(meta.compressor.id)) return `v2 compressor '${meta.compressor.id}': not in zarrita's codec registry`;
    if (meta.dtype === "|O" && !(meta.filters || []).some((f) => f.id === "vlen-utf8" || f.id === "json2")) {
      return "object array without a vlen-utf8/json2 object codec";
    }
    return null;
  }
  const meta = JSON.parse(fs.readFileSync(path.join(dir, "zarr.json"), "utf8"));
  const dt = meta.data_type;
  if (typeof dt !== "string") return `data type ${JSON.stringify(dt)}: extension data types are not supported by zarrita`;
  if (!V3_DTYPES.has(dt)) return `data type '${dt}': not supported by zarrita`;
  if (/^float/.test(dt) && numericText(meta.fill_value) && !/^0x[0-9a-fA-F]+$/.test(meta.fill_value)) {
    return "float fill_value written as numeric text ('-inf'), which zarr-python reads: zarrita reads NaN";
  }
  return codecChainReason(meta.codecs || [], false);
}

/** A fill value that is a number written as text, other than the spec's own spellings. */
function numericText(fill) {
  if (typeof fill !== "string" || ["NaN", "Infinity", "-Infinity"].includes(fill)) return false;
  const t = fill.trim().replace(/_/g, "");
  return t !== "" && (!Number.isNaN(Number(t)) || /^[+-]?(inf|infinity|nan)$/i.test(t));
}

function hasMissingV2Chunk(dir, meta) {
  const sep = meta.dimension_separator || ".";
  const counts = meta.shape.map((n, i) => Math.ceil(n / meta.chunks[i]));
  const total = counts.reduce((a, b) => a * b, 1);
  const idx = counts.map(() => 0);
  for (let k = 0; k < total; k++) {
    if (!fs.existsSync(path.join(dir, ...(idx.length ? idx.join(sep) : "0").split("/")))) return true;
    for (let d = idx.length - 1; d >= 0; d--) {
      if (++idx[d] < counts[d]) break;
      idx[d] = 0;
    }
  }
  return false;
}

function codecChainReason(codecs, inner) {
  for (const c of codecs) {
    if (c.name === "sharding_indexed") {
      if (inner) return "nested sharding_indexed: zarrita's inner codec pipeline has no sharding codec";
      const cfg = c.configuration || {};
      if ((cfg.index_location || "end") !== "end") return "sharding index_location 'start': zarrita always reads the index from the end";
      const r = codecChainReason(cfg.codecs || [], true) || codecChainReason(cfg.index_codecs || [], true);
      if (r) return r;
      continue;
    }
    if (c.name === "vlen-bytes") return "codec 'vlen-bytes': not in zarrita's codec registry";
    if (!V3_CODECS.has(c.name)) return `codec '${c.name}': not in zarrita's codec registry`;
  }
  // Checked after the names: an array->bytes codec zarrita lacks (numcodecs.pcodec) is named.
  if (!codecs.some((c) => ARRAY_TO_BYTES.has(c.name))) {
    return "no array->bytes codec (ZEP0007 variable-length chunk layout): zarrita requires one";
  }
  return null;
}

module.exports = { unsupportedReason };
