"use strict";
// A small .npy reader (format versions 1.0, 2.0 and 3.0) for the browser interop suite.
//
//   const { parseNpy } = require("./lib/npy.cjs");
//   const { descr, shape, fortranOrder, itemsize, elements } = parseNpy(fs.readFileSync(f));
//
// `elements` is the list of the raw bytes of each element (Buffer, in the file's byte order),
// in C order whatever `fortran_order` says. Structured dtypes (a list descr) are reported with
// `descr` as the list and `elements` undefined: the suite does not compare them.

const MAGIC = Buffer.from([0x93, 0x4e, 0x55, 0x4d, 0x50, 0x59]); // \x93NUMPY

/** Parse the Python-literal header dict numpy writes: {'descr': ..., 'fortran_order': ..., 'shape': (...), } */
function parseHeaderDict(text) {
  let i = 0;
  const ws = () => {
    while (i < text.length && /\s/.test(text[i])) i++;
  };
  function value() {
    ws();
    const c = text[i];
    if (c === "'" || c === '"') {
      const q = c;
      let s = "";
      i++;
      while (text[i] !== q) {
        if (text[i] === "\\") i++;
        s += text[i++];
        if (i >= text.length) throw new Error("npy header: unterminated string");
      }
      i++;
      return s;
    }
    if (c === "{") {
      i++;
      const out = {};
      for (;;) {
        ws();
        if (text[i] === "}") { i++; return out; }
        const k = value();
        ws();
        if (text[i] !== ":") throw new Error(`npy header: expected ':' at ${i}`);
        i++;
        out[k] = value();
        ws();
        if (text[i] === ",") i++;
      }
    }
    if (c === "(" || c === "[") {
      const close = c === "(" ? ")" : "]";
      i++;
      const out = [];
      for (;;) {
        ws();
        if (text[i] === close) { i++; return out; }
        out.push(value());
        ws();
        if (text[i] === ",") i++;
      }
    }
    const m = /^(True|False|None|-?\d+)/.exec(text.slice(i));
    if (!m) throw new Error(`npy header: cannot parse at ${i}: ${text.slice(i, i + 20)}`);
    i += m[0].length;
    if (m[0] === "True") return true;
    if (m[0] === "False") return false;
    if (m[0] === "None") return null;
    return Number(m[0]);
  }
  return value();
}

/** Bytes per element of a simple (non-structured) numpy typestr such as '<i4', '|S7', '>U13', '<M8[ns]'. */
function itemsizeOf(descr) {
  const m = /^([<>|=])([a-zA-Z])(\d+)/.exec(descr);
  if (!m) throw new Error(`npy: unsupported descr ${descr}`);
  const n = Number(m[3]);
  return m[2] === "U" ? 4 * n : n;
}

function parseNpy(buf) {
  if (!Buffer.isBuffer(buf)) buf = Buffer.from(buf);
  if (buf.length < 10 || !buf.subarray(0, 6).equals(MAGIC)) throw new Error("npy: bad magic");
  const major = buf[6];
  let headerLen;
  let start;
  if (major === 1) {
    headerLen = buf.readUInt16LE(8);
    start = 10;
  } else if (major === 2 || major === 3) {
    headerLen = buf.readUInt32LE(8);
    start = 12;
  } else {
    throw new Error(`npy: unsupported version ${major}.${buf[7]}`);
  }
  const header = parseHeaderDict(buf.subarray(start, start + headerLen).toString(major === 3 ? "utf8" : "latin1"));
  const { descr, fortran_order: fortranOrder, shape } = header;
  const data = buf.subarray(start + headerLen);
  const size = shape.reduce((a, b) => a * b, 1);
  if (typeof descr !== "string") return { descr, shape, fortranOrder, itemsize: undefined, elements: undefined };
  const itemsize = itemsizeOf(descr);
  if (data.length !== size * itemsize) {
    throw new Error(`npy: ${data.length} data bytes, expected ${size} x ${itemsize}`);
  }
  const elements = new Array(size);
  if (!fortranOrder || shape.length < 2) {
    for (let k = 0; k < size; k++) elements[k] = data.subarray(k * itemsize, (k + 1) * itemsize);
  } else {
    // Fortran order: the first index varies fastest in the file.
    const fstride = [];
    let s = 1;
    for (let d = 0; d < shape.length; d++) { fstride[d] = s; s *= shape[d]; }
    const idx = new Array(shape.length).fill(0);
    for (let k = 0; k < size; k++) {
      let off = 0;
      for (let d = 0; d < shape.length; d++) off += idx[d] * fstride[d];
      elements[k] = data.subarray(off * itemsize, (off + 1) * itemsize);
      for (let d = shape.length - 1; d >= 0; d--) {
        if (++idx[d] < shape[d]) break;
        idx[d] = 0;
      }
    }
  }
  return { descr, shape, fortranOrder, itemsize, elements };
}

module.exports = { parseNpy, parseHeaderDict, itemsizeOf };
