"use strict";
// Optional cases (ZARRGATE_NEUROGLANCER=1): neuroglancer's client, as bundled in the
// `neuroglancer` PyPI wheel, shows the demo arrays from zarrgate in headless Chromium.
//
// The bundled client is the Python-integration build: it insists on a URL of the form
// `/v/<token>/` (else "Failed to determine token from URL") and then polls the Python server's
// /events/<token> endpoint, which our static server answers with 404 ("Disconnected from Python
// server" in the status bar: harmless, the viewer state comes from the URL fragment).
// Neuroglancer fetches chunks from a Web Worker, so requests are observed through playwright's
// context-wide events (the page's CDP session does not see worker traffic).

const fs = require("fs");
const os = require("os");
const path = require("path");
const { startStaticServer } = require("./lib/static-server.cjs");

const CASES = [
  // zarr3://, sharded (index at the end, crc32c), inner zstd chunks: shard index via HEAD + range
  { name: "neuroglancer: zarr3:// sharded demo volume", source: "zarr3://BASE/zarr/demo/v3.zarr/volume/", key: "/zarr/demo/v3.zarr/volume/", range: [0, 2000], sharded: true },
  // zarr2://, blosc lz4 float32 chunks
  { name: "neuroglancer: zarr2:// demo image", source: "zarr2://BASE/zarr/demo/v2.zarr/image/", key: "/zarr/demo/v2.zarr/image/", range: [-0.5, 0.5], sharded: false },
];

const sleep = (ms) => new Promise((r) => setTimeout(r, ms));

async function runNeuroglancer({ base, browser, clientDir, record, demoMounted }) {
  if (!clientDir || !fs.existsSync(path.join(clientDir, "index.html"))) {
    for (const c of CASES) record(c.name, "skip", "optional: set ZARRGATE_NEUROGLANCER=1 to run");
    return;
  }
  if (!demoMounted) {
    for (const c of CASES) record(c.name, "skip", "mount 'demo' not served");
    return;
  }
  const root = fs.mkdtempSync(path.join(os.tmpdir(), "zarrgate-ng-"));
  fs.mkdirSync(path.join(root, "v"));
  fs.symlinkSync(path.resolve(clientDir), path.join(root, "v", "zarrgate"));
  const site = await startStaticServer({ root });
  try {
    for (const c of CASES) {
      const errors = await runOne({ base, browser, site, c });
      record(c.name, errors.length ? "fail" : "pass", errors.slice(0, 6).join("\n    "));
    }
  } finally {
    await site.close();
    fs.rmSync(root, { recursive: true, force: true });
  }
}

async function runOne({ base, browser, site, c }) {
  const errors = [];
  const page = await browser.context.newPage();
  const seen = [];
  const onFinished = async (req) => {
    if (!req.url().startsWith(base)) return;
    const resp = await req.response().catch(() => null);
    const headers = resp ? await resp.allHeaders().catch(() => ({})) : {};
    seen.push({ method: req.method(), url: req.url(), range: (await req.allHeaders().catch(() => ({}))).range, status: resp && resp.status(), headers });
  };
  const onFailed = (req) => {
    if (req.url().startsWith(base)) seen.push({ method: req.method(), url: req.url(), failed: req.failure() && req.failure().errorText });
  };
  const pageErrors = [];
  page.on("pageerror", (e) => pageErrors.push(String(e)));
  browser.context.on("requestfinished", onFinished);
  browser.context.on("requestfailed", onFailed);
  try {
    const state = {
      crossSectionScale: 0.2,
      layout: "xy",
      layers: [{ type: "image", name: "zarrgate", source: c.source.replace("BASE", base), shaderControls: { normalized: { range: c.range } } }],
    };
    await page.goto(`${site.url}/v/zarrgate/#!${encodeURIComponent(JSON.stringify(state))}`);
    // Wait until chunk traffic starts and then stays quiet for 1.5 s (at most 30 s).
    const data = () => seen.filter((r) => r.url.startsWith(base + c.key) && !/(zarr\.json|\.zarray|\.zattrs|\.zgroup)$/.test(r.url));
    let last = -1;
    let quietSince = Date.now();
    const until = Date.now() + 30000;
    while (Date.now() < until) {
      await sleep(250);
      const n = data().length;
      if (n !== last) { last = n; quietSince = Date.now(); }
      else if (n > 0 && Date.now() - quietSince > 1500) break;
    }
    const chunks = data();
    if (!chunks.length) errors.push("no chunk request reached zarrgate within 30 s");
    for (const r of seen) {
      const what = `${r.method} ${r.url.slice(base.length)}${r.range ? ` (Range: ${r.range})` : ""}`;
      // Neuroglancer aborts its HEAD (size probe) once it has the headers.
      if (r.failed) { if (!(r.method === "HEAD" && /ERR_ABORTED/.test(r.failed))) errors.push(`request failed: ${what}: ${r.failed}`); continue; }
      if (![200, 206, 404].includes(r.status)) errors.push(`status ${r.status}: ${what}`);
      if (!r.headers["access-control-allow-origin"]) errors.push(`no Access-Control-Allow-Origin: ${what}`);
    }
    if (c.sharded && !chunks.some((r) => r.status === 206 && r.range)) errors.push("no range request on a shard was answered 206");
    if (!c.sharded && !chunks.some((r) => r.status === 200)) errors.push("no chunk was answered 200");
    const text = await page.evaluate(() => document.body.innerText);
    const layerError = /error/i.test(text) ? text.split("\n").filter((l) => /error/i.test(l)).slice(0, 2).join(" | ") : null;
    if (layerError) errors.push(`viewer shows: ${layerError}`);
    if (pageErrors.length) errors.push(`page errors: ${pageErrors.slice(0, 2).join(" | ")}`);
    // The slice must show data: the middle of the panel is not one flat colour.
    await sleep(500);
    const png = await page.screenshot({ clip: { x: 620, y: 320, width: 40, height: 200 } });
    const levels = await page.evaluate(async (b64) => {
      const img = new Image();
      img.src = `data:image/png;base64,${b64}`;
      await img.decode();
      const cv = document.createElement("canvas");
      cv.width = img.width;
      cv.height = img.height;
      const g = cv.getContext("2d");
      g.drawImage(img, 0, 0);
      const px = g.getImageData(0, 0, cv.width, cv.height).data;
      const set = new Set();
      for (let i = 0; i < px.length; i += 4) set.add((px[i] << 16) | (px[i + 1] << 8) | px[i + 2]);
      return set.size;
    }, png.toString("base64"));
    if (levels < 4) errors.push(`rendered slice is (nearly) flat: ${levels} distinct colours in the panel centre`);
  } catch (e) {
    errors.push(String(e && e.message ? e.message : e));
  } finally {
    browser.context.off("requestfinished", onFinished);
    browser.context.off("requestfailed", onFailed);
    await page.close().catch(() => {});
  }
  return errors;
}

module.exports = { runNeuroglancer };
