"use strict";
// Normalise expected values (.npy / .json files of tests/fixtures) and what the page returned
// from zarrita into plain JS values in C order, and compare them.
//
// Canonical values: integers -> BigInt, floats -> Number (NaN equals NaN), bool -> boolean,
// |S -> Buffer without trailing NULs (numpy semantics), <U / >U / vlen strings -> string without
// trailing NULs, json2 objects -> JSON values (non-finite numbers as "NaN"/"Infinity"/"-Infinity").

const { parseNpy } = require("./npy.cjs");

function f16(bits) {
  const sign = bits & 0x8000 ? -1 : 1;
  const exp = (bits >> 10) & 0x1f;
  const frac = bits & 0x3ff;
  if (exp === 0) return sign * Math.pow(2, -14) * (frac / 1024);
  if (exp === 0x1f) return frac ? NaN : sign * Infinity;
  return sign * Math.pow(2, exp - 15) * (1 + frac / 1024);
}

/** Decode one element of a simple numpy typestr ('<i4', '>f2', '|b1', '|S5', '>U4'). */
function decodeElement(kind, size, little, b) {
  switch (kind) {
    case "b":
      return b[0] !== 0;
    case "i":
    case "u": {
      const signed = kind === "i";
      if (size === 1) return BigInt(signed ? b.readInt8(0) : b.readUInt8(0));
      if (size === 2) return BigInt(signed ? (little ? b.readInt16LE(0) : b.readInt16BE(0)) : little ? b.readUInt16LE(0) : b.readUInt16BE(0));
      if (size === 4) return BigInt(signed ? (little ? b.readInt32LE(0) : b.readInt32BE(0)) : little ? b.readUInt32LE(0) : b.readUInt32BE(0));
      if (size === 8) return signed ? (little ? b.readBigInt64LE(0) : b.readBigInt64BE(0)) : little ? b.readBigUInt64LE(0) : b.readBigUInt64BE(0);
      break;
    }
    case "f":
      if (size === 2) return f16(little ? b.readUInt16LE(0) : b.readUInt16BE(0));
      if (size === 4) return little ? b.readFloatLE(0) : b.readFloatBE(0);
      if (size === 8) return little ? b.readDoubleLE(0) : b.readDoubleBE(0);
      break;
    case "S": {
      let end = b.length;
      while (end > 0 && b[end - 1] === 0) end--;
      return Buffer.from(b.subarray(0, end));
    }
    case "U": {
      let s = "";
      for (let i = 0; i + 4 <= b.length; i += 4) {
        const cp = little ? b.readUInt32LE(i) : b.readUInt32BE(i);
        s += String.fromCodePoint(cp);
      }
      return s.replace(/\u0000+$/, "");
    }
  }
  throw new Error(`no comparator for kind ${kind}${size}`);
}

function parseTypestr(t) {
  const m = /^([<>|=])([biufSU])(\d+)$/.exec(t);
  if (!m) return null;
  return { little: m[1] !== ">", kind: m[2], size: Number(m[3]) };
}

/** Load an expected file -> {shape, values, family, descr}. family: one of int, float, bool, bytes, string, object. */
function loadExpected(buf, name) {
  if (name.endsWith(".npy")) return expectedFromNpy(parseNpy(buf));
  const doc = JSON.parse(buf.toString("utf8"));
  let values = doc.values;
  if (doc.kind === "bytes") values = values.map((v) => (v === null ? null : Buffer.from(v, "base64")));
  return { shape: doc.shape, values, family: doc.kind, descr: doc.kind };
}

function expectedFromNpy(npy) {
  if (typeof npy.descr !== "string") throw new Error(`structured dtype ${JSON.stringify(npy.descr)} is not compared`);
  const t = parseTypestr(npy.descr);
  if (!t) throw new Error(`no comparator for dtype ${npy.descr}`);
  const values = npy.elements.map((b) => decodeElement(t.kind, t.size, t.little, b));
  // size: bytes per element (4 per character for U), as zarritaLayout reports it.
  return { shape: npy.shape, values, family: family(t.kind), descr: npy.descr, kind: t.kind, size: npy.itemsize };
}

function family(kind) {
  return { b: "bool", i: "int", u: "int", f: "float", S: "bytes", U: "string" }[kind];
}

/** zarrita data_type -> {kind, size} of its in-memory elements (little-endian). */
function zarritaLayout(dtype) {
  const fixed = {
    bool: ["b", 1], int8: ["i", 1], int16: ["i", 2], int32: ["i", 4], int64: ["i", 8],
    uint8: ["u", 1], uint16: ["u", 2], uint32: ["u", 4], uint64: ["u", 8],
    float16: ["f", 2], float32: ["f", 4], float64: ["f", 8],
  }[dtype];
  if (fixed) return { kind: fixed[0], size: fixed[1] };
  const m = /^v2:([SU])(\d+)$/.exec(dtype);
  if (m) return { kind: m[1], size: m[1] === "U" ? 4 * Number(m[2]) : Number(m[2]) };
  return null;
}

/** What the page returned -> {shape, values, family, dtype}. */
function actualFromPage(r) {
  if (r.encoding === "bytes") {
    const layout = zarritaLayout(r.dtype);
    if (!layout) throw new Error(`page returned bytes for unknown zarrita dtype ${r.dtype}`);
    if (layout.size !== r.itemsize) throw new Error(`zarrita ${r.dtype}: itemsize ${r.itemsize}, expected ${layout.size}`);
    const buf = Buffer.from(r.b64, "base64");
    const values = [];
    for (let k = 0; k * r.itemsize < buf.length; k++) {
      values.push(decodeElement(layout.kind, layout.size, true, buf.subarray(k * r.itemsize, (k + 1) * r.itemsize)));
    }
    return { shape: r.shape, values, family: family(layout.kind), dtype: r.dtype, kind: layout.kind, size: layout.size };
  }
  const raw = JSON.parse(r.json);
  const values = raw.map((v) => (v && typeof v === "object" && "$bytes" in v ? Buffer.from(v.$bytes, "base64") : v));
  const fam = r.dtype === "string" ? "string" : "object";
  return { shape: r.shape, values, family: fam, dtype: r.dtype };
}

/** Is zarrita's dtype the right one for the expected array? Returns an error string or null. */
function dtypeMismatch(expected, actual) {
  if (expected.kind && actual.kind) {
    if (expected.kind !== actual.kind || expected.size !== actual.size) {
      return `dtype: expected ${expected.descr}, zarrita returned ${actual.dtype}`;
    }
    return null;
  }
  // json expected (vlen) or a vlen actual: strings must read as strings.
  const exp = expected.family;
  const act = actual.family;
  if (exp === "string" && !(act === "string" || act === "object")) return `dtype: expected strings, zarrita returned ${actual.dtype}`;
  if (exp === "object" && act !== "object") return `dtype: expected objects, zarrita returned ${actual.dtype}`;
  if (exp === "bytes" && actual.kind !== undefined && actual.kind !== "S") return `dtype: expected bytes, zarrita returned ${actual.dtype}`;
  return null;
}

function same(a, b) {
  if (typeof a === "number" && typeof b === "number") return a === b || (Number.isNaN(a) && Number.isNaN(b));
  if (typeof a === "bigint" || typeof b === "bigint") return typeof a === typeof b && a === b;
  if (Buffer.isBuffer(a) || Buffer.isBuffer(b)) return Buffer.isBuffer(a) && Buffer.isBuffer(b) && a.equals(b);
  if (Array.isArray(a) || Array.isArray(b)) {
    return Array.isArray(a) && Array.isArray(b) && a.length === b.length && a.every((x, i) => same(x, b[i]));
  }
  if (a && b && typeof a === "object" && typeof b === "object") {
    const ka = Object.keys(a).sort();
    const kb = Object.keys(b).sort();
    return same(ka, kb) && ka.every((k) => same(a[k], b[k]));
  }
  return a === b;
}

function show(v) {
  if (typeof v === "bigint") return `${v}n`;
  if (Buffer.isBuffer(v)) return `b'${v.toString("latin1")}'`;
  if (typeof v === "number") return Number.isNaN(v) ? "NaN" : String(v);
  return JSON.stringify(v);
}

/** C-order sub-region [[start, stop], ...] of a flat value list of `shape`. */
function subRegion(values, shape, region) {
  const outShape = region.map(([a, b]) => b - a);
  const size = outShape.reduce((x, y) => x * y, 1);
  const stride = [];
  let s = 1;
  for (let d = shape.length - 1; d >= 0; d--) { stride[d] = s; s *= shape[d]; }
  const out = [];
  const idx = new Array(shape.length).fill(0);
  for (let k = 0; k < size; k++) {
    let off = 0;
    for (let d = 0; d < shape.length; d++) off += (region[d][0] + idx[d]) * stride[d];
    out.push(values[off]);
    for (let d = shape.length - 1; d >= 0; d--) {
      if (++idx[d] < outShape[d]) break;
      idx[d] = 0;
    }
  }
  return { shape: outShape, values: out };
}

/** Compare; returns null when equal, else a short description of the first differences. */
function compare(expected, actual) {
  const dt = dtypeMismatch(expected, actual);
  if (dt) return dt;
  if (!same(expected.shape, actual.shape)) return `shape: expected [${expected.shape}], got [${actual.shape}]`;
  if (expected.values.length !== actual.values.length) return `size: expected ${expected.values.length}, got ${actual.values.length}`;
  const bad = [];
  let count = 0;
  for (let i = 0; i < expected.values.length; i++) {
    if (!same(expected.values[i], actual.values[i])) {
      count++;
      if (bad.length < 4) bad.push(`[${i}] expected ${show(expected.values[i])}, got ${show(actual.values[i])}`);
    }
  }
  return count ? `${count} of ${expected.values.length} values differ: ${bad.join("; ")}` : null;
}

module.exports = { loadExpected, expectedFromNpy, actualFromPage, compare, subRegion, decodeElement, parseTypestr, zarritaLayout };
