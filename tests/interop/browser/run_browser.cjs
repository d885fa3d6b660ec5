"use strict";
// Driver of the browser interop suite (started by run_browser.sh, which sets NODE_PATH).
//
//   node run_browser.cjs ZARRGATE_URL
//
// Bundles page.js (zarrita.js) with esbuild, serves it from a second 127.0.0.1 port, opens it in
// headless Chromium and reads, cross-origin through zarrita's FetchStore with the HTTP cache off:
//   fx:<path>       v2/v3 cases of tests/fixtures/cases.json from the mount `fx`
//   zarrita:<path>  cases of tests/fixtures/zarrita_expected/cases.json from the mount `zarrita`
//   demo:<path>     the demo arrays, compared with zarrgate's own slice API (.npy)
//   consolidated:*  groups opened through consolidated metadata
//   ice:*           the Icechunk mount `ice` at tag.v1, branch.dev, snapshot.<main> and bare:
//                   the root group through its consolidated metadata, three arrays (native,
//                   inline and virtual chunks) and a region, compared with
//                   tests/fixtures/icechunk/expected.json (icechunk-python's reading)
//   http:*          raw cross-origin fetches: 404s, HEAD, Range (suffix too), 416, ETag/304
//   neuroglancer:*  ZARRGATE_NEUROGLANCER=1 (run.sh's default): neuroglancer.Viewer and its bundled
//                   client open zarr2:// and zarr3:// (sharded) layers and read the arrays back
//                   (neuroglancer.cjs, neuroglancer_read.py), compared with the expected values
// Every array is read three times: without suffix ranges (HEAD + bytes=a-b for shard indexes),
// with suffix ranges (bytes=-N) and a sub-region with suffix ranges. Afterwards every request the
// page made to zarrgate must have succeeded with CORS headers.
// Prints failures, skips by reason, and as the LAST line `browser: N passed, N failed, N skipped`.

const fs = require("fs");
const os = require("os");
const path = require("path");
const { launchChromium, recordNetwork } = require("./lib/chromium.cjs");
const { startStaticServer } = require("./lib/static-server.cjs");
const { buildPage } = require("./lib/bundle.cjs");
const { loadExpected, expectedFromNpy, actualFromPage, compare, subRegion } = require("./lib/compare.cjs");
const { parseNpy } = require("./lib/npy.cjs");
const { unsupportedReason } = require("./zarrita-support.cjs");
const { runNeuroglancer } = require("./neuroglancer.cjs");

const HERE = __dirname;
const REPO = path.resolve(process.env.ZARRGATE_REPO || path.join(HERE, "..", "..", ".."));
const FIXTURES = path.join(REPO, "tests", "fixtures");
const ZARRITA_DIR = path.resolve(process.env.ZARRGATE_ZARRITA_DIR || path.join(REPO, "..", "shared", "fixtures", "zarrita"));
const DEMO_DIR = path.join(REPO, "data", "demo");
const VERBOSE = !!process.env.ZARRGATE_BROWSER_VERBOSE;
const CALL_TIMEOUT_MS = 30000;
const BUDGET_MS = Number(process.env.ZARRGATE_BROWSER_BUDGET_MS || 240000);
// The neuroglancer cases must end before run_browser.sh's hard stop (290 s).
const NG_DEADLINE_MS = 275000;
const started = Date.now();

const results = [];
function record(name, status, message) {
  results.push({ name, status, message });
  if (status === "fail") console.log(`FAIL ${name}: ${message}`);
  else if (VERBOSE) console.log(`${status === "pass" ? "ok  " : "skip"} ${name}${message ? `: ${message}` : ""}`);
}

function withTimeout(promise, ms, what) {
  let t;
  return Promise.race([
    promise.finally(() => clearTimeout(t)),
    new Promise((_, rej) => { t = setTimeout(() => rej(new Error(`${what}: timed out after ${ms} ms`)), ms); }),
  ]);
}

const sleep = (ms) => new Promise((r) => setTimeout(r, ms));

function readJson(file) {
  return JSON.parse(fs.readFileSync(file, "utf8"));
}

function isSharded(dir, zarrFormat) {
  if (zarrFormat !== 3) return false;
  try {
    return (readJson(path.join(dir, "zarr.json")).codecs || []).some((c) => c.name === "sharding_indexed");
  } catch {
    return false;
  }
}

function regionFor(shape) {
  if (!shape.length || !shape.some((n) => n > 2)) return null;
  return shape.map((n) => (n > 2 ? [1, n - 1] : [0, n]));
}

async function main() {
  const base = (process.argv[2] || process.env.ZARRGATE_URL || "").replace(/\/+$/, "");
  if (!/^http:\/\/(127\.0\.0\.1|localhost|\[::1\]):\d+$/.test(base)) {
    throw new Error(`usage: run_browser.cjs http://127.0.0.1:PORT (got '${base}')`);
  }
  const health = await fetch(`${base}/healthz`).catch((e) => ({ ok: false, status: String(e) }));
  if (!health.ok) throw new Error(`zarrgate not reachable at ${base}/healthz (${health.status})`);

  const work = fs.mkdtempSync(path.join(os.tmpdir(), "zarrgate-browser-"));
  let browser;
  let site;
  try {
    await buildPage({ entry: path.join(HERE, "page.js"), outdir: work, title: "zarrgate browser interop" });
    site = await startStaticServer({ root: work });
    if (new URL(site.url).origin === new URL(base).origin) throw new Error("page and zarrgate share an origin");
    browser = await launchChromium();
    const { page } = browser;
    const net = await recordNetwork(page, { disableCache: true });
    await page.goto(`${site.url}/`);
    await page.waitForFunction(() => window.zarrgateReady === true, null, { timeout: 30000 });
    const features = await page.evaluate(() => window.zarrgateTest.features());
    console.log(`browser: Chromium ${browser.version()}, page ${site.url} -> zarrgate ${base}`);

    const ctx = { base, page, net, features, deadline: started + BUDGET_MS };
    await runFixtureCases(ctx);
    await runDemoCases(ctx);
    await runConsolidated(ctx);
    await runIcechunk(ctx);
    await runHttpProbes(ctx);
    await runGlobalNetworkChecks(ctx, site);
    await runNeuroglancer({
      base,
      browser,
      python: process.env.ZARRGATE_NEUROGLANCER === "1" ? process.env.ZARRGATE_NEUROGLANCER_PYTHON || null : null,
      skipReason: process.env.ZARRGATE_NEUROGLANCER_SKIP,
      repo: REPO,
      present: async (mount) => (mount === "demo" ? demoMounted(base) : mount === "zarrita" ? fs.existsSync(ZARRITA_DIR) : true),
      record,
      deadline: started + NG_DEADLINE_MS,
    });
    if (browser.pageErrors.length) {
      record("page: no uncaught errors", "fail", browser.pageErrors.slice(0, 3).join(" | "));
    } else {
      record("page: no uncaught errors", "pass");
    }
    await net.detach();
  } finally {
    if (browser) await browser.close().catch(() => {});
    if (site) await site.close().catch(() => {});
    fs.rmSync(work, { recursive: true, force: true });
  }
}

// --- arrays -------------------------------------------------------------------------------

async function call(ctx, fn, arg) {
  return withTimeout(ctx.page.evaluate(([f, a]) => window.zarrgateTest[f](a), [fn, arg]), CALL_TIMEOUT_MS, fn);
}

/** Read one array in the three modes and compare each with `expected` (loaded already). */
async function readAndCompare(ctx, { mount, arrayPath, expected }) {
  const errors = [];
  const modes = [
    { mode: "range", suffix: false, region: null },
    { mode: "suffix", suffix: true, region: null },
  ];
  const region = regionFor(expected.shape);
  if (region) modes.push({ mode: "suffix+region", suffix: true, region });
  for (const m of modes) {
    let r;
    try {
      r = await call(ctx, "readArray", { base: ctx.base, mount, path: arrayPath, suffix: m.suffix, region: m.region });
    } catch (e) {
      errors.push(`[${m.mode}] ${e.message}`);
      await ctx.page.reload().catch(() => {});
      await ctx.page.waitForFunction(() => window.zarrgateReady === true, null, { timeout: 30000 }).catch(() => {});
      break;
    }
    if (!r.ok) {
      errors.push(`[${m.mode}] zarrita: ${r.error}`);
      continue;
    }
    let diff;
    try {
      const actual = actualFromPage(r.value);
      const want = m.region ? { ...expected, ...subRegion(expected.values, expected.shape, m.region) } : expected;
      diff = compare(want, actual);
    } catch (e) {
      diff = `compare: ${e.message}`;
    }
    if (diff) errors.push(`[${m.mode}] ${diff}`);
  }
  return errors;
}

/** Network checks for every request under `${base}/zarr/${mount}/${prefix}/`. */
async function networkErrors(ctx, mount, prefix, { sharded }) {
  const urlPrefix = `${ctx.base}/zarr/${mount}/${prefix}/`;
  const mine = () => [...ctx.net.requests.values()].filter((r) => r.url && r.url.startsWith(urlPrefix));
  for (let i = 0; i < 100 && mine().some((r) => !r.finished && !r.failed); i++) await sleep(20);
  return requestErrors(ctx, mine(), { sharded });
}

function requestErrors(ctx, reqs, { sharded = false, statuses = [200, 206, 404] } = {}) {
  const errors = [];
  for (const r of reqs) {
    const what = `${r.method} ${r.url.slice(ctx.base.length)}${r.requestHeaders && r.requestHeaders.Range ? ` (Range: ${r.requestHeaders.Range})` : ""}`;
    if (r.failed && !r.canceled) {
      errors.push(`request failed: ${what}: ${r.errorText}${r.corsError ? ` CORS ${r.corsError}` : ""}${r.blockedReason ? ` blocked ${r.blockedReason}` : ""}`);
      continue;
    }
    if (r.status === undefined) continue; // no response seen (canceled)
    const okStatus = r.method === "OPTIONS" ? [200, 204] : statuses;
    if (!okStatus.includes(r.status)) errors.push(`status ${r.status}: ${what}`);
    const h = r.responseHeaders || {};
    if (r.method !== "OPTIONS" && !h["access-control-allow-origin"]) errors.push(`no Access-Control-Allow-Origin: ${what} -> ${r.status}`);
    if (h["content-encoding"] && h["content-encoding"] !== "identity") errors.push(`Content-Encoding ${h["content-encoding"]}: ${what}`);
    if (r.status === 206 && !h["content-range"]) errors.push(`206 without Content-Range: ${what}`);
  }
  if (sharded) {
    const suffix = reqs.filter((r) => r.requestHeaders && /^bytes=-\d+$/.test(r.requestHeaders.Range || ""));
    if (!suffix.length) errors.push("sharded array but no suffix range request (bytes=-N) was seen");
    else if (!suffix.some((r) => r.status === 206)) errors.push(`suffix range requests answered ${[...new Set(suffix.map((r) => r.status))]} (want 206)`);
    const heads = reqs.filter((r) => r.method === "HEAD");
    if (!heads.length) errors.push("sharded array but no HEAD request (non-suffix mode) was seen");
  }
  return errors;
}

async function runFixtureCases(ctx) {
  const sets = [
    { mount: "fx", manifest: path.join(FIXTURES, "cases.json"), dataDir: path.join(FIXTURES, "data"), expDir: FIXTURES, present: true },
    {
      mount: "zarrita",
      manifest: path.join(FIXTURES, "zarrita_expected", "cases.json"),
      dataDir: ZARRITA_DIR,
      expDir: path.join(FIXTURES, "zarrita_expected"),
      present: fs.existsSync(ZARRITA_DIR),
    },
  ];
  for (const set of sets) {
    if (!fs.existsSync(set.manifest)) continue;
    for (const c of readJson(set.manifest)) {
      const name = `${set.mount}:${c.path}`;
      if (!set.present) { record(name, "skip", `${path.relative(REPO, set.dataDir)} is absent`); continue; }
      if (!c.expected) { record(name, "skip", "no expected values (unreadable by the reference reader)"); continue; }
      const dir = path.join(set.dataDir, c.path);
      let reason;
      try {
        reason = unsupportedReason(dir, c.zarr_format, c.reader);
      } catch (e) {
        record(name, "fail", `metadata: ${e.message}`);
        continue;
      }
      if (!reason && !ctx.features.float16 && /f2|float16/.test(JSON.stringify(c.dtype))) reason = "this Chromium has no Float16Array";
      if (reason) { record(name, "skip", reason); continue; }
      if (Date.now() > ctx.deadline) { record(name, "fail", "not run: time budget exceeded"); continue; }
      let expected;
      try {
        expected = loadExpected(fs.readFileSync(path.join(set.expDir, c.expected)), c.expected);
      } catch (e) {
        record(name, "fail", `expected values: ${e.message}`);
        continue;
      }
      const errors = await readAndCompare(ctx, { mount: set.mount, arrayPath: c.path, expected });
      errors.push(...(await networkErrors(ctx, set.mount, c.path, { sharded: isSharded(dir, c.zarr_format) })));
      record(name, errors.length ? "fail" : "pass", errors.slice(0, 6).join("\n    "));
    }
  }
}

// --- demo: compare with the server's own decoding -------------------------------------------

const DEMO_ARRAYS = ["v2.zarr/image", "v2.zarr/counts", "v2.zarr/labels", "v3.zarr/volume", "v3.zarr/names", "v3.zarr/temperature"];

async function demoMounted(base) {
  const r = await fetch(`${base}/zarr/demo/v3.zarr/zarr.json`).catch(() => null);
  return !!(r && r.ok);
}

async function serverNpy(base, arrayPath) {
  const r = await fetch(`${base}/api/v1/slice/demo/${arrayPath}?format=npy`);
  if (r.status !== 200) throw new Error(`slice API ${r.status}: ${(await r.text()).slice(0, 200)}`);
  return expectedFromNpy(parseNpy(Buffer.from(await r.arrayBuffer())));
}

async function runDemoCases(ctx) {
  const mounted = await demoMounted(ctx.base);
  for (const p of DEMO_ARRAYS) {
    const name = `demo:${p}`;
    if (!mounted) { record(name, "skip", "mount 'demo' not served"); continue; }
    const dir = path.join(DEMO_DIR, p);
    const fmt = fs.existsSync(path.join(dir, "zarr.json")) ? 3 : 2;
    const reason = fs.existsSync(dir) ? unsupportedReason(dir, fmt) : null;
    if (reason) { record(name, "skip", reason); continue; }
    let expected;
    try {
      expected = await serverNpy(ctx.base, p);
    } catch (e) {
      record(name, "fail", `expected values from /api/v1/slice: ${e.message}`);
      continue;
    }
    const errors = await readAndCompare(ctx, { mount: "demo", arrayPath: p, expected });
    errors.push(...(await networkErrors(ctx, "demo", p, { sharded: isSharded(dir, fmt) })));
    record(name, errors.length ? "fail" : "pass", errors.slice(0, 6).join("\n    "));
  }
}

// --- consolidated metadata -------------------------------------------------------------------

async function runConsolidated(ctx) {
  const demo = await demoMounted(ctx.base);
  const groups = [
    // stored .zmetadata
    { mount: "fx", path: "v2/group_consolidated", format: "v2", want: ["/x", "/sub", "/sub/y"], read: "x",
      expected: () => loadExpected(fs.readFileSync(path.join(FIXTURES, "expected/v2/group_consolidated/x.npy")), "x.npy") },
    // stored consolidated_metadata in zarr.json
    { mount: "zarrita", path: "v3/data.zarr/consolidated", format: "v3", want: ["/1d.chunked.i2", "/2d.contiguous.i2", "/nested", "/nested/1d.i2"],
      read: "nested/1d.i2", present: fs.existsSync(ZARRITA_DIR),
      expected: () => loadExpected(fs.readFileSync(path.join(FIXTURES, "zarrita_expected/v3/data.zarr/consolidated/nested/1d.i2.npy")), "x.npy") },
    // synthesized by zarrgate (mounts consolidate by default; these groups store none)
    { mount: "fx", path: "v2/group_nested", format: "v2", want: ["/top", "/sub", "/sub/inner", "/sub/subsub", "/sub/subsub/deep"], read: "sub/subsub/deep",
      expected: () => loadExpected(fs.readFileSync(path.join(FIXTURES, "expected/v2/group_nested/sub/subsub/deep.npy")), "x.npy") },
    { mount: "fx", path: "v3/group_nested", format: "v3", want: ["/top", "/sub", "/sub/inner", "/sub/subsub", "/sub/subsub/deep"], read: "sub/inner",
      expected: () => loadExpected(fs.readFileSync(path.join(FIXTURES, "expected/v3/group_nested/sub/inner.npy")), "x.npy") },
    { mount: "demo", path: "v2.zarr", format: "v2", want: ["/image", "/counts", "/labels"], read: "counts", present: demo,
      expected: () => serverNpy(ctx.base, "v2.zarr/counts") },
    { mount: "demo", path: "v3.zarr", format: "v3", want: ["/volume", "/names", "/temperature"], read: "temperature", present: demo,
      expected: () => serverNpy(ctx.base, "v3.zarr/temperature") },
  ];
  for (const g of groups) {
    const name = `consolidated:${g.mount}:${g.path} (${g.format})`;
    if (g.present === false) { record(name, "skip", `mount '${g.mount}' not served`); continue; }
    const errors = [];
    try {
      const r = await call(ctx, "readConsolidated", { base: ctx.base, mount: g.mount, path: g.path, format: g.format, suffix: true, read: g.read });
      if (!r.ok) {
        errors.push(`zarrita: ${r.error}`);
      } else {
        const listed = new Set(r.value.contents.map((c) => c.path));
        const missing = g.want.filter((p) => !listed.has(p));
        if (missing.length) errors.push(`contents lack ${missing.join(", ")} (listed: ${[...listed].join(", ")})`);
        const diff = compare(await g.expected(), actualFromPage(r.value.result));
        if (diff) errors.push(`read ${g.read}: ${diff}`);
      }
    } catch (e) {
      errors.push(e.message);
    }
    errors.push(...(await networkErrors(ctx, g.mount, g.path, { sharded: false })));
    record(name, errors.length ? "fail" : "pass", errors.slice(0, 6).join("\n    "));
  }
}

// --- Icechunk mount: versions addressed in the mount segment ----------------------------------

const ICE_DIR = path.join(FIXTURES, "icechunk");
// Arrays read at every version: native chunks with a missing one (NaN fill), an inline chunk,
// virtual chunks (bytes + numcodecs.shuffle + numcodecs.zlib, -9999 fill for the missing one).
const ICE_ARRAYS = ["temperature", "small", "virtual/temperature"];
// zarr.get(arr, [1, null, zarr.slice(2, 6)]) of temperature: [start, stop] pairs are slices.
const ICE_REGION = { path: "temperature", selection: [1, null, [2, 6]], label: "[1, :, 2:6]" };

/** Is the mount `ice` served? Only its absence skips the ice: cases. */
async function iceMounted(base) {
  try {
    const r = await fetch(`${base}/api/v1/mounts`);
    if (r.ok) {
      const doc = await r.json();
      if (Array.isArray(doc.mounts)) return doc.mounts.some((m) => m.name === "ice");
    }
  } catch {
    // fall through to the raw key
  }
  const r = await fetch(`${base}/zarr/ice/zarr.json`).catch(() => null);
  if (!r) return true; // unreachable: let the cases fail and say why
  if (r.status !== 404) return true;
  const body = await r.text().catch(() => "");
  return !/unknown_mount/.test(body);
}

const ICE_KINDS = {
  bool: ["b", 1], int8: ["i", 1], int16: ["i", 2], int32: ["i", 4], int64: ["i", 8],
  uint8: ["u", 1], uint16: ["u", 2], uint32: ["u", 4], uint64: ["u", 8],
  float32: ["f", 4], float64: ["f", 8],
};

function iceNumber(v, dtype) {
  if (v === "NaN") return NaN;
  if (v === "Infinity") return Infinity;
  if (v === "-Infinity") return -Infinity;
  if (typeof v !== "number") throw new Error(`expected.json value ${JSON.stringify(v)} is not a number`);
  // float32: the value as a float32 (expected.json prints it in float32's shortest form)
  return dtype === "float32" ? Math.fround(v) : v;
}

/** expected.json's array -> the shape compare() takes (flat C-order values, NaN as NaN). */
function iceExpected(a) {
  const k = ICE_KINDS[a.dtype];
  if (!k) throw new Error(`no comparator for expected.json dtype ${a.dtype}`);
  const [kind, size] = k;
  const values = a.values.map((v) => (kind === "b" ? !!v : kind === "f" ? iceNumber(v, a.dtype) : BigInt(v)));
  return { shape: a.shape, values, family: kind === "b" ? "bool" : kind === "f" ? "float" : "int", descr: a.dtype, kind, size };
}

/** The expected values of a zarr.get selection (integers drop their axis, as zarrita's do). */
function iceSelect(expected, selection) {
  const region = selection.map((x, d) => (x === null ? [0, expected.shape[d]] : Array.isArray(x) ? x : [x, x + 1]));
  const sub = subRegion(expected.values, expected.shape, region);
  return { ...expected, shape: sub.shape.filter((_, d) => typeof selection[d] !== "number"), values: sub.values };
}

function sameJson(a, b) {
  const norm = (x) => JSON.stringify(x, (_k, v) => (v && typeof v === "object" && !Array.isArray(v) ? Object.fromEntries(Object.entries(v).sort()) : v));
  return norm(a) === norm(b);
}

/** zarrita's view of the array's metadata against expected.json's. */
function iceMetadataErrors(got, want) {
  const errors = [];
  if (got.dtype !== want.dtype) errors.push(`dtype: zarrita ${got.dtype}, expected ${want.dtype}`);
  if (!sameJson(got.shape, want.shape)) errors.push(`shape: zarrita [${got.shape}], expected [${want.shape}]`);
  if (!sameJson(got.chunks, want.chunks)) errors.push(`chunks: zarrita [${got.chunks}], expected [${want.chunks}]`);
  if (!sameJson(got.attrs, want.attributes)) errors.push(`attributes: zarrita ${JSON.stringify(got.attrs)}, expected ${JSON.stringify(want.attributes)}`);
  const fill = JSON.parse(got.fillValue);
  const wantFill = typeof want.fill_value === "number" ? String(want.fill_value) : want.fill_value;
  if (String(fill) !== String(wantFill) && Number(fill) !== Number(wantFill)) {
    errors.push(`fill_value: zarrita ${got.fillValue}, expected ${JSON.stringify(want.fill_value)}`);
  }
  return errors;
}

async function runIcechunk(ctx) {
  const mounted = await iceMounted(ctx.base);
  let exp = null;
  let expError = null;
  try {
    exp = readJson(path.join(ICE_DIR, "expected.json"));
  } catch (e) {
    expError = `tests/fixtures/icechunk/expected.json: ${e.message}`;
  }
  const main = exp && exp.branches && exp.branches.main;
  // [mount segment, the snapshot id whose arrays it must show]
  const versions = exp
    ? [
        ["ice@tag.v1", exp.tags && exp.tags.v1],
        ["ice@branch.dev", exp.branches && exp.branches.dev],
        [`ice@snapshot.${main}`, main],
        ["ice", main],
      ]
    : [["ice@tag.v1"], ["ice@branch.dev"], ["ice@snapshot.<main>"], ["ice"]];
  for (const [segment, snapId] of versions) {
    const prefix = `${ctx.base}/zarr/${segment}/`;
    const cases = [
      { name: `ice:${segment}/ (root group, consolidated)`, read: null },
      ...ICE_ARRAYS.map((p) => ({ name: `ice:${segment}/${p}`, read: p, selection: null })),
      { name: `ice:${segment}/${ICE_REGION.path}${ICE_REGION.label}`, read: ICE_REGION.path, selection: ICE_REGION.selection },
    ];
    for (const c of cases) {
      if (!mounted) { record(c.name, "skip", "mount 'ice' not served"); continue; }
      if (expError) { record(c.name, "fail", expError); continue; }
      const snap = exp.snapshots && exp.snapshots[snapId];
      if (!snap) { record(c.name, "fail", `expected.json has no snapshot ${snapId} for ${segment}`); continue; }
      if (Date.now() > ctx.deadline) { record(c.name, "fail", "not run: time budget exceeded"); continue; }
      const before = new Set(ctx.net.requests.keys());
      const errors = [];
      let skip = null;
      try {
        const r = await call(ctx, "openVersionedGroup", { url: prefix, read: c.read, selection: c.selection });
        if (!r.ok) errors.push(`zarrita: ${r.error}`);
        else if (!c.read) errors.push(...iceGroupErrors(r.value, snap));
        else {
          const want = snap.arrays[`/${c.read}`];
          if (!want) errors.push(`expected.json has no array /${c.read} in snapshot ${snapId}`);
          else {
            errors.push(...iceMetadataErrors(r.value.array, want));
            if (r.value.skip) skip = r.value.skip;
            else {
              let expected = iceExpected(want);
              if (c.selection) expected = iceSelect(expected, c.selection);
              const diff = compare(expected, actualFromPage(r.value.result));
              if (diff) errors.push(diff);
            }
          }
        }
      } catch (e) {
        errors.push(e.message);
        await ctx.page.reload().catch(() => {});
        await ctx.page.waitForFunction(() => window.zarrgateReady === true, null, { timeout: 30000 }).catch(() => {});
      }
      const mine = () => [...ctx.net.requests.entries()].filter(([id, r]) => !before.has(id) && r.url && r.url.startsWith(prefix)).map(([, r]) => r);
      for (let i = 0; i < 100 && mine().some((r) => !r.finished && !r.failed); i++) await sleep(20);
      const reqs = mine();
      errors.push(...requestErrors(ctx, reqs));
      if (!reqs.some((r) => r.url === `${prefix}zarr.json` && r.status === 200)) errors.push(`no 200 for ${prefix.slice(ctx.base.length)}zarr.json was seen`);
      if (c.read && !skip && !reqs.some((r) => r.url.startsWith(`${prefix}${c.read}/c/`) && r.status === 200)) {
        errors.push(`no chunk of ${c.read} was fetched with 200 under ${prefix.slice(ctx.base.length)}`);
      }
      if (errors.length) record(c.name, "fail", errors.slice(0, 6).join("\n    "));
      else record(c.name, skip ? "skip" : "pass", skip || "");
    }
  }
}

/** The root group: its attributes and the nodes its consolidated metadata lists. */
function iceGroupErrors(got, snap) {
  const errors = [];
  const root = snap.groups && snap.groups["/"];
  if (root && !sameJson(got.attrs, root.attributes)) errors.push(`root attributes: zarrita ${JSON.stringify(got.attrs)}, expected ${JSON.stringify(root.attributes)}`);
  const want = new Map([
    ...Object.keys(snap.arrays || {}).map((p) => [p, "array"]),
    ...Object.keys(snap.groups || {}).filter((p) => p !== "/").map((p) => [p, "group"]),
  ]);
  const listed = new Map(got.contents.filter((c) => c.path !== "/").map((c) => [c.path, c.kind]));
  const missing = [...want].filter(([p, k]) => listed.get(p) !== k).map(([p, k]) => `${p} (${k})`);
  const extra = [...listed.keys()].filter((p) => !want.has(p));
  if (missing.length) errors.push(`consolidated contents lack ${missing.join(", ")}`);
  if (extra.length) errors.push(`consolidated contents list nodes not in this version: ${extra.join(", ")}`);
  return errors;
}

// --- raw HTTP behaviour seen from a cross-origin page ----------------------------------------

async function runHttpProbes(ctx) {
  const shardRel = "v3/sharding_end_i4/c/0/0";
  const shardFile = path.join(FIXTURES, "data", shardRel);
  const metaRel = "v3/zstd_i4/zarr.json";
  const shard = fs.readFileSync(shardFile);
  const L = shard.length;
  const u = (rel) => `${ctx.base}/zarr/fx/${rel}`;
  const b64 = (buf) => Buffer.from(buf).toString("base64");
  const probe = (arg) => withTimeout(ctx.page.evaluate((a) => window.zarrgateTest.probe(a), arg), CALL_TIMEOUT_MS, "probe");

  const checks = [
    ["http: GET missing key -> 404 readable cross-origin", { url: u("v3/zstd_i4/.zarray") }, (r) => r.status === 404],
    ["http: HEAD missing key -> 404", { url: u("v3/zstd_i4/.zattrs"), method: "HEAD" }, (r) => r.status === 404],
    ["http: GET missing chunk -> 404", { url: u("v3/sharding_missing_shard_f8/c/1/1") }, (r) => r.status === 404],
    ["http: GET directory -> 404", { url: u("v3/zstd_i4") }, (r) => r.status === 404],
    ["http: HEAD -> 200 with exact Content-Length", { url: u(shardRel), method: "HEAD" },
      (r) => r.status === 200 && r.headers["content-length"] === String(L)],
    [`http: Range bytes=-16 -> 206 last 16 bytes`, { url: u(shardRel), headers: { Range: "bytes=-16" } },
      (r) => r.status === 206 && r.headers["content-range"] === `bytes ${L - 16}-${L - 1}/${L}` && r.body === b64(shard.subarray(L - 16))],
    [`http: Range bytes=-N larger than the object -> whole object`, { url: u(shardRel), headers: { Range: `bytes=-${L + 100}` } },
      (r) => (r.status === 206 || r.status === 200) && r.body === b64(shard.subarray(0, 4096)) && r.bodyLength === L],
    ["http: Range bytes=0-9 -> 206", { url: u(shardRel), headers: { Range: "bytes=0-9" } },
      (r) => r.status === 206 && r.headers["content-range"] === `bytes 0-9/${L}` && r.body === b64(shard.subarray(0, 10))],
    ["http: Range bytes=5- -> 206", { url: u(shardRel), headers: { Range: "bytes=5-" } },
      (r) => r.status === 206 && r.headers["content-range"] === `bytes 5-${L - 1}/${L}` && r.bodyLength === L - 5],
    ["http: Range end past the object is clamped", { url: u(shardRel), headers: { Range: `bytes=2-${L + 50}` } },
      (r) => r.status === 206 && r.headers["content-range"] === `bytes 2-${L - 1}/${L}` && r.bodyLength === L - 2],
    ["http: unsatisfiable Range -> 416 with bytes */total", { url: u(shardRel), headers: { Range: `bytes=${L + 10}-${L + 20}` } },
      (r) => r.status === 416 && r.headers["content-range"] === `bytes */${L}`],
  ];
  for (const [name, arg, ok] of checks) {
    let r;
    try {
      r = await probe(arg);
    } catch (e) {
      record(name, "fail", e.message);
      continue;
    }
    if (r.error) record(name, "fail", `fetch threw (CORS?): ${r.error}`);
    else if (!ok(r)) record(name, "fail", `got ${r.status} ${JSON.stringify(r.headers)} body ${r.bodyLength} bytes`);
    else record(name, "pass");
  }

  // ETag exposed, then If-None-Match -> 304 (the header needs a preflight that allows it).
  const name = "http: ETag exposed and If-None-Match -> 304";
  try {
    const first = await probe({ url: u(metaRel) });
    const etag = first.headers && first.headers.etag;
    if (first.error || !etag) record(name, "fail", `first GET: ${first.error || `no ETag readable: ${JSON.stringify(first.headers)}`}`);
    else {
      const second = await probe({ url: u(metaRel), headers: { "If-None-Match": etag } });
      if (second.error || second.status !== 304) record(name, "fail", `If-None-Match ${etag}: ${second.error || second.status}`);
      else record(name, "pass");
    }
  } catch (e) {
    record(name, "fail", e.message);
  }
}

async function runGlobalNetworkChecks(ctx, site) {
  const all = ctx.net.forOrigin(ctx.base);
  for (let i = 0; i < 100 && all.some((r) => !r.finished && !r.failed); i++) await sleep(20);
  // The http: probes also ask for 304 and 416 on purpose.
  const errs = requestErrors(ctx, all.filter((r) => r.url.includes("/zarr/")), { statuses: [200, 206, 304, 404, 416] });
  const name = "cors: every cross-origin request to /zarr/ succeeded with CORS headers";
  record(name, errs.length ? "fail" : "pass", errs.slice(0, 8).join("\n    "));
  const stats = {
    requests: all.length,
    preflights: all.filter((r) => r.method === "OPTIONS").length,
    head: all.filter((r) => r.method === "HEAD").length,
    suffixRanges: all.filter((r) => /^bytes=-/.test((r.requestHeaders || {}).Range || "")).length,
    ranges: all.filter((r) => /^bytes=\d/.test((r.requestHeaders || {}).Range || "")).length,
    notFound: all.filter((r) => r.status === 404).length,
    fromCache: all.filter((r) => r.fromDiskCache).length,
  };
  console.log(`browser: network ${JSON.stringify(stats)}; page server answered ${site.requests.length} requests`);
  const cacheName = "cache: no zarrgate response came from the browser's HTTP cache";
  record(cacheName, stats.fromCache ? "fail" : "pass", stats.fromCache ? `${stats.fromCache} from disk cache` : "");
}

// --- main ------------------------------------------------------------------------------------

function summary() {
  const n = (s) => results.filter((r) => r.status === s).length;
  const skips = new Map();
  for (const r of results.filter((x) => x.status === "skip")) {
    if (!skips.has(r.message)) skips.set(r.message, []);
    skips.get(r.message).push(r.name);
  }
  if (skips.size) {
    console.log("skipped (client limitations, not failures):");
    for (const [reason, names] of skips) console.log(`  ${names.length} x ${reason}: ${names.join(", ")}`);
  }
  console.log(`browser: took ${((Date.now() - started) / 1000).toFixed(1)} s`);
  console.log(`browser: ${n("pass")} passed, ${n("fail")} failed, ${n("skip")} skipped`);
  return n("fail");
}

main()
  .then(() => process.exit(summary() ? 1 : 0))
  .catch((e) => {
    record("browser suite", "fail", e && e.stack ? e.stack : String(e));
    summary();
    process.exit(1);
  });
