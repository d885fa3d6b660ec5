"use strict";
// Neuroglancer cases (ZARRGATE_NEUROGLANCER=1; run.sh sets it by default): the client bundled in
// the `neuroglancer` PyPI wheel, driven through neuroglancer.Viewer on 127.0.0.1, opens zarr2://
// and zarr3:// (sharded) layers on zarrgate in headless Chromium and reads the arrays back.
//
// neuroglancer_read.py (in the venv of requirements-neuroglancer.txt, made by run_browser.sh)
// starts the viewer's server on its own 127.0.0.1 port, so the client's requests to zarrgate are
// cross-origin, adds one image layer per case and prints the viewer URL; this file opens it in a
// new page of the suite's Chromium. The Python side then asks the client for each volume
// (viewer.volume): the client fetches the chunks from zarrgate in its Web Workers with its own
// zarr driver, decodes them and hands them back, and Python compares the values with the
// expected data. Here every request the client made to zarrgate is checked as well (status,
// CORS, no Content-Encoding; byte ranges answered 206 on the shards). Requests come from Web
// Workers, so they are observed through playwright's context-wide events.

const fs = require("fs");
const os = require("os");
const path = require("path");
const { spawn } = require("child_process");

// expected: {npy: path relative to the repo} (manifest values written by zarr-python) or
// {local: {driver, path relative to the repo}} (tensorstore reading the local files).
const CASES = [
  // sharded: 16x128x128 uint16, shards 8x64x64 of 4x32x32 zstd inner chunks, crc32c index at the end
  { mount: "demo", path: "v3.zarr/volume", format: 3, sharded: true, expected: { local: { driver: "zarr3", path: "data/demo/v3.zarr/volume" } } },
  { mount: "fx", path: "v3/sharding_end_i4", format: 3, sharded: true, expected: { npy: "tests/fixtures/expected/v3/sharding_end_i4.npy" } },
  // one shard of 2x2 big-endian gzip inner chunks, crc32c on the index
  { mount: "fx", path: "v3/sharding_index_crc32c_gzip_inner_u2", format: 3, sharded: true, expected: { npy: "tests/fixtures/expected/v3/sharding_index_crc32c_gzip_inner_u2.npy" } },
  // index at the start of the shard; shards inside shards; transpose in the inner codecs
  { mount: "fx", path: "v3/sharding_start_i4", format: 3, sharded: true, expected: { npy: "tests/fixtures/expected/v3/sharding_start_i4.npy" } },
  { mount: "fx", path: "v3/sharding_nested_i4", format: 3, sharded: true, expected: { npy: "tests/fixtures/expected/v3/sharding_nested_i4.npy" } },
  { mount: "fx", path: "v3/sharding_transpose_inner_i2", format: 3, sharded: true, expected: { npy: "tests/fixtures/expected/v3/sharding_transpose_inner_i2.npy" } },
  { mount: "zarrita", path: "v3/data.zarr/3d.chunked.mixed.compressed.sharded.i2", format: 3, sharded: true,
    expected: { npy: "tests/fixtures/zarrita_expected/v3/data.zarr/3d.chunked.mixed.compressed.sharded.i2.npy" } },
  // 256x256 float32, blosc lz4 64x64 chunks; "/" separator; order F; big-endian
  { mount: "demo", path: "v2.zarr/image", format: 2, expected: { local: { driver: "zarr", path: "data/demo/v2.zarr/image" } } },
  { mount: "fx", path: "v2/separator_slash_3d_f4", format: 2, expected: { npy: "tests/fixtures/expected/v2/separator_slash_3d_f4.npy" } },
  { mount: "fx", path: "v2/order_F_3d_u2_nocompressor", format: 2, expected: { npy: "tests/fixtures/expected/v2/order_F_3d_u2_nocompressor.npy" } },
  { mount: "fx", path: "v2/dtype_be_u4", format: 2, expected: { npy: "tests/fixtures/expected/v2/dtype_be_u4.npy" } },
  { mount: "zarrita", path: "v2/data.zarr/3d.chunked.mixed.i2.F", format: 2,
    expected: { npy: "tests/fixtures/zarrita_expected/v2/data.zarr/3d.chunked.mixed.i2.F.npy" } },
].map((c) => ({ ...c, name: `neuroglancer: zarr${c.format}://${c.mount}/${c.path}` }));

const BUDGET_MS = 150000;
const sleep = (ms) => new Promise((r) => setTimeout(r, ms));

/**
 * python: the neuroglancer venv's interpreter, or null with `skipReason`.
 * present(mount): whether zarrgate serves that mount (else its cases are skipped).
 * deadline: Date.now() value by which everything must be over (cases not finished then fail).
 */
async function runNeuroglancer({ base, browser, python, skipReason, repo, present, record, deadline = Infinity }) {
  if (!python) {
    for (const c of CASES) record(c.name, "skip", skipReason || "neuroglancer not installed");
    return;
  }
  const budget = Math.min(BUDGET_MS, deadline - Date.now());
  if (budget < 20000) {
    for (const c of CASES) record(c.name, "fail", "not run: time budget exceeded");
    return;
  }
  const cases = [];
  for (const c of CASES) {
    if (!(await present(c.mount))) record(c.name, "skip", `mount '${c.mount}' not served`);
    else cases.push(c);
  }
  if (!cases.length) return;

  const work = fs.mkdtempSync(path.join(os.tmpdir(), "zarrgate-ng-"));
  const planFile = path.join(work, "plan.json");
  const abs = (p) => path.join(repo, p);
  fs.writeFileSync(planFile, JSON.stringify({
    cases: cases.map((c) => ({
      name: c.name,
      source: `zarr${c.format}://${base}/zarr/${c.mount}/${c.path}/`,
      expected: c.expected.npy ? { npy: abs(c.expected.npy) } : { local: { ...c.expected.local, path: abs(c.expected.local.path) } },
      region: true,
    })),
  }));

  const seen = [];
  const onFinished = async (req) => {
    if (!req.url().startsWith(base + "/")) return;
    const resp = await req.response().catch(() => null);
    seen.push({
      method: req.method(),
      url: req.url(),
      range: (await req.allHeaders().catch(() => ({}))).range,
      status: resp && resp.status(),
      headers: resp ? await resp.allHeaders().catch(() => ({})) : {},
    });
  };
  const onFailed = (req) => {
    if (req.url().startsWith(base + "/")) seen.push({ method: req.method(), url: req.url(), failed: (req.failure() || {}).errorText || "failed" });
  };
  browser.context.on("requestfinished", onFinished);
  browser.context.on("requestfailed", onFailed);

  const started = Date.now();
  const results = new Map();
  const stderr = [];
  let page;
  let done = false;
  let exited = false;
  const child = spawn(python, [path.join(__dirname, "neuroglancer_read.py"), planFile], { stdio: ["ignore", "pipe", "pipe"] });
  const exit = new Promise((resolve) => {
    child.on("exit", (code, signal) => { exited = true; resolve(signal || code); });
    child.on("error", (e) => { exited = true; stderr.push(String(e.message)); resolve("spawn failed"); });
  });
  child.stderr.on("data", (d) => {
    stderr.push(...String(d).split("\n").filter(Boolean));
    stderr.splice(0, Math.max(0, stderr.length - 20));
  });
  let buf = "";
  let opening = null;
  let openError = null;
  child.stdout.on("data", (d) => {
    buf += d;
    for (let i; (i = buf.indexOf("\n")) >= 0; buf = buf.slice(i + 1)) {
      let msg;
      try {
        msg = JSON.parse(buf.slice(0, i));
      } catch {
        continue;
      }
      if (msg.url && !opening) {
        opening = openViewer(browser, msg.url).then((p) => { page = p; }, (e) => { openError = `could not open the viewer: ${e.message}`; });
      }
      if (msg.case) results.set(msg.case, msg);
      if (msg.done) done = true;
    }
  });

  const pageErrors = [];
  let fatal = null;
  try {
    while (!done && !exited && !openError && Date.now() - started < budget) await sleep(100);
    if (opening) await opening;
    if (!done) {
      fatal = openError || (exited
        ? `neuroglancer_read.py exited early (${await exit}): ${stderr.slice(-5).join(" | ")}`
        : `not finished within ${Math.round(budget / 1000)} s`);
    }
    // Let the rendering's own chunk requests settle before judging the traffic.
    await sleep(500);
    if (page) pageErrors.push(...page.__errors);
  } finally {
    browser.context.off("requestfinished", onFinished);
    browser.context.off("requestfailed", onFailed);
    if (page) await page.close().catch(() => {});
    if (!exited) {
      child.kill("SIGTERM");
      await Promise.race([exit, sleep(3000)]);
      if (!exited) child.kill("SIGKILL");
    }
    fs.rmSync(work, { recursive: true, force: true });
  }

  for (const c of cases) {
    const errors = [];
    const r = results.get(c.name);
    if (!r) errors.push(fatal || "no result from neuroglancer_read.py");
    else errors.push(...r.errors, ...requestErrors(base, seen.filter((s) => s.url.startsWith(`${base}/zarr/${c.mount}/${c.path}/`)), c));
    if (pageErrors.length) errors.push(`page errors: ${pageErrors.slice(0, 2).join(" | ")}`);
    const info = r && r.info && r.info.chunkShape ? `neuroglancer: ${r.info.dataType}, shape ${r.info.upperBound}, chunks ${r.info.chunkShape}` : "";
    record(c.name, errors.length ? "fail" : "pass", errors.length ? errors.slice(0, 6).join("\n    ") : info);
  }
  const all = seen.filter((s) => s.url.startsWith(`${base}/zarr/`));
  console.log(`browser: neuroglancer made ${all.length} requests to zarrgate (${all.filter((s) => s.status === 206).length} answered 206) in ${((Date.now() - started) / 1000).toFixed(1)} s`);
}

async function openViewer(browser, url) {
  const page = await browser.context.newPage();
  page.__errors = [];
  page.on("pageerror", (e) => page.__errors.push(String(e)));
  const cdp = await browser.context.newCDPSession(page);
  await cdp.send("Network.enable");
  await cdp.send("Network.setCacheDisabled", { cacheDisabled: true });
  try {
    if (!/^http:\/\/127\.0\.0\.1:\d+\//.test(url)) throw new Error(`viewer not on 127.0.0.1: ${url}`);
    await page.goto(url);
  } catch (e) {
    await page.close().catch(() => {});
    throw e;
  }
  return page;
}

function requestErrors(base, reqs, c) {
  const errors = [];
  const isMeta = (u) => /(zarr\.json|\.zarray|\.zattrs|\.zgroup|\.zmetadata)$/.test(u);
  for (const r of reqs) {
    const what = `${r.method} ${r.url.slice(base.length)}${r.range ? ` (Range: ${r.range})` : ""}`;
    if (r.failed) {
      // Neuroglancer cancels requests it no longer needs (e.g. a HEAD once it has the size).
      if (!/ERR_ABORTED/.test(r.failed)) errors.push(`request failed: ${what}: ${r.failed}`);
      continue;
    }
    if (![200, 206, 404].includes(r.status)) errors.push(`status ${r.status}: ${what}`);
    if (!r.headers["access-control-allow-origin"]) errors.push(`no Access-Control-Allow-Origin: ${what}`);
    if (r.headers["content-encoding"] && r.headers["content-encoding"] !== "identity") errors.push(`Content-Encoding ${r.headers["content-encoding"]}: ${what}`);
    if (r.status === 206 && !r.headers["content-range"]) errors.push(`206 without Content-Range: ${what}`);
  }
  const data = reqs.filter((r) => !r.failed && !isMeta(r.url));
  if (!data.length) errors.push("no chunk or shard request reached zarrgate");
  if (c.sharded && !data.some((r) => r.status === 206 && r.range)) errors.push("no byte-range request on a shard was answered 206");
  if (!c.sharded && !data.some((r) => r.status === 200)) errors.push("no chunk was answered 200");
  return errors;
}

module.exports = { runNeuroglancer, CASES };
