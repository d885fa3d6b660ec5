"use strict";
// Browser test of zarrgate's web page (static/index.html), started by run_webpage.sh (which sets
// NODE_PATH to the cached node_modules of tests/interop/browser/setup.sh).
//
//   node run_webpage.cjs PAGE_URL            the page at PAGE_URL/ with the API at the same origin
//                                            (zarrgate itself, or dev-server.cjs)
//   node run_webpage.cjs --dev ZARRGATE_URL  serve the working copy of static/index.html with
//                                            dev-server.cjs, proxying the API to ZARRGATE_URL
//
// Needs the `demo` mount (data/demo) and `fx` (tests/fixtures/data), as tests/interop/run.sh mounts
// them. Drives headless Debian Chromium through playwright-core: the mount tree, the array view of
// demo/v3.zarr/volume (metadata, snippets, the PNG slice viewer, its slider and the value under the
// cursor, checked against GET /api/v1/slice), a 1-D plot, string tables, readable API errors, the
// layout at 1280x800 and 390x844 (no horizontal overflow), and the fixes listed in README.md.
// Screenshots go to target/webpage-screenshots/. The LAST line of output is
// `webpage: N passed, N failed, N skipped`; the exit code is non-zero on any failure.

const fs = require("fs");
const http = require("http");
const path = require("path");
const { launchChromium } = require("../browser/lib/chromium.cjs");
const { startDevServer } = require("./dev-server.cjs");

const REPO = path.resolve(process.env.ZARRGATE_REPO || path.join(__dirname, "..", "..", ".."));
const SHOTS = path.join(REPO, "target", "webpage-screenshots");
const STEP_TIMEOUT = 10000;
const BUDGET_MS = Number(process.env.ZARRGATE_WEBPAGE_BUDGET_MS || 180000);
// ZARRGATE_WEBPAGE_ONLY=REGEX runs only the checks whose name matches (and the first, which loads
// the page); for working on one check.
const ONLY = process.env.ZARRGATE_WEBPAGE_ONLY ? new RegExp(process.env.ZARRGATE_WEBPAGE_ONLY, "i") : null;
const started = Date.now();

const results = [];
let page = null;
let browser = null;
let base = null;
let target = null;
let abortReason = null;

/** Thrown by a check that the server cannot run (a mount it lacks): counted as skipped. */
class Skip extends Error {}
/** Run one named check. A failed `fatal` check (the page did not load) skips the rest. */
async function check(name, fn, { fatal = false } = {}) {
  if (ONLY && !fatal && !ONLY.test(name)) return;
  if (abortReason || Date.now() - started > BUDGET_MS) {
    results.push({ name, ok: false });
    console.log(`FAIL ${name}: not run (${abortReason || "time budget of " + BUDGET_MS + " ms used up"})`);
    return;
  }
  const t0 = Date.now();
  try {
    await fn();
    results.push({ name, ok: true });
    console.log(`ok   ${name} (${Date.now() - t0} ms)`);
  } catch (e) {
    if (e instanceof Skip) {
      results.push({ name, ok: true, skipped: true });
      console.log(`skip ${name}: ${e.message}`);
      return;
    }
    results.push({ name, ok: false });
    console.log(`FAIL ${name}: ${e && e.message ? e.message.split("\n")[0] : e}`);
    if (fatal) abortReason = `'${name}' failed`;
    if (page) await shot(`fail-${name.replace(/[^a-z0-9]+/gi, "-")}`).catch(() => {});
  }
}
function assert(cond, msg) {
  if (!cond) throw new Error(msg);
}
function assertEq(actual, expected, what) {
  const a = JSON.stringify(actual), b = JSON.stringify(expected);
  if (a !== b) throw new Error(`${what}: expected ${b}, got ${a}`);
}
async function shot(name, opts) {
  fs.mkdirSync(SHOTS, { recursive: true });
  await page.screenshot({ path: path.join(SHOTS, name + ".png"), ...(opts || {}) });
}
async function api(rel) {
  const r = await fetch(base + rel);
  const body = await r.json();
  return { status: r.status, body };
}
const sliceRel = (p, q) => `/api/v1/slice/demo/${p}?${q}`;
/** What the page should show for bytes that the API sends as base64: a Python bytes literal. */
function pyBytes(b64) {
  let out = 'b"';
  for (const c of Buffer.from(b64, "base64")) {
    const named = { 0x5c: "\\\\", 0x22: '\\"', 9: "\\t", 10: "\\n", 13: "\\r" }[c];
    out += named || (c >= 0x20 && c < 0x7f ? String.fromCharCode(c) : "\\x" + c.toString(16).padStart(2, "0"));
  }
  return out + '"';
}
/** The repo's fixtures (tests/fixtures/data) are mounted as fx by tests/interop/run.sh. */
async function needFx() {
  const mounts = (await api("/api/v1/mounts")).body.mounts.map((m) => m.name);
  assert(mounts.includes("fx"), `the server has no fx mount (tests/fixtures/data, as tests/interop/run.sh mounts it): ${mounts}`);
}

/** The fixture Icechunk repository's expected.json (tests/fixtures/icechunk), when the server
    mounts the repository as `ice` (kind icechunk), as tests/interop/run.sh does; the check is
    skipped on a server without an `ice` mount. */
let iceFixture = null;
async function needIce() {
  const m = (await api("/api/v1/mounts")).body.mounts.find((x) => x.name === "ice");
  if (!m) throw new Skip("the server has no ice mount (tests/fixtures/icechunk/repo, as tests/interop/run.sh mounts it)");
  assertEq(m.kind, "icechunk", "kind of the ice mount");
  iceFixture ||= JSON.parse(fs.readFileSync(path.join(REPO, "tests", "fixtures", "icechunk", "expected.json"), "utf8"));
  return iceFixture;
}
/** The snapshot of `version` (branch.dev, tag.v1, ...; "" the mount's default) in expected.json. */
async function iceSnapshot(x, version) {
  const v = version || (await api("/api/v1/versions/ice")).body.default;
  assert(x.versions[v], `expected.json has no version ${v}`);
  return x.snapshots[x.versions[v]];
}
/** The members of `group` ("" the root) in a snapshot of expected.json, sorted. */
function iceMembers(snap, group) {
  const prefix = "/" + (group ? group + "/" : "");
  const names = Object.keys(snap.arrays).concat(Object.keys(snap.groups))
    .filter((k) => k.startsWith(prefix) && k.length > prefix.length).map((k) => k.slice(prefix.length).split("/")[0]);
  return [...new Set(names)].sort();
}
/** The version picker, once it lists the versions. */
async function versionPicker() {
  await waitUntil(() => document.querySelector("[data-testid=version]")?.dataset.state === "ready", null, "the version picker", "[data-testid=version]");
  return page.getByLabel("version", { exact: true });
}
/** Wait for the view of mount segment `ref` at `p` (its crumbs name ref, its title the node) and
    return its member rows (empty for an array or an error). */
async function viewOf(ref, p) {
  await waitUntil(([r, t]) => {
    const a = document.querySelectorAll("main .crumbs a");
    return a[1]?.textContent === r && document.querySelector("main h2")?.textContent === t &&
      document.querySelector("main .titlebar .badge, main .error");
  }, [ref, p ? p.split("/").pop() : ref], `the view of ${ref}/${p}`, "main h2");
  return page.$$eval("main table.list tbody tr", (trs) => trs.map((tr) => tr.children[0].textContent));
}
/** The cells of the table view shown for `key` (mount segment/path). */
async function tableCells(key) {
  await waitUntil((k) => document.querySelector(`[data-testid=table][data-path="${k}"]`)?.dataset.state === "ready", key, `the table of ${key}`, "[data-testid=table]");
  return page.$$eval("[data-testid=table] tbody tr td", (tds) => tds.map((td) => td.textContent));
}

/** Pixels of the viewer's <img> (drawn at natural size) vs. the PNG the API returns for `select`. */
async function imageState(expectSelect) {
  return page.evaluate(async (sel) => {
    const img = document.querySelector("[data-testid=slice-img]");
    const draw = (src) => {
      const c = document.createElement("canvas");
      c.width = src.naturalWidth || src.width;
      c.height = src.naturalHeight || src.height;
      const g = c.getContext("2d");
      g.drawImage(src, 0, 0);
      return g.getImageData(0, 0, c.width, c.height);
    };
    const shown = draw(img);
    let hash = 2166136261;
    for (let i = 0; i < shown.data.length; i++) hash = Math.imul(hash ^ shown.data[i], 16777619) >>> 0;
    let colored = 0;
    for (let i = 0; i < shown.data.length; i += 4) if (shown.data[i] !== shown.data[i + 1] || shown.data[i + 1] !== shown.data[i + 2]) colored++;
    let sameAsApi = null;
    if (sel) {
      // The same request the page makes, rebuilt from the visible controls.
      const q = new URLSearchParams({ select: sel, format: "png", cmap: document.querySelector("[data-testid=cmap]").value });
      const vmin = document.querySelector("[data-testid=vmin]").value;
      const vmax = document.querySelector("[data-testid=vmax]").value;
      if (vmin) q.set("vmin", vmin);
      if (vmax) q.set("vmax", vmax);
      const r = await fetch(new URL("api/v1/slice/demo/v3.zarr/volume?" + q, location.href));
      const ref = draw(await createImageBitmap(await r.blob()));
      sameAsApi = ref.width === shown.width && ref.height === shown.height && ref.data.every((v, i) => v === shown.data[i]);
    }
    return { w: shown.width, h: shown.height, hash, colored, sameAsApi };
  }, expectSelect || null);
}
/** page.waitForFunction that, on timeout, says what it waited for and what the page showed. */
async function waitUntil(fn, arg, what, selector) {
  try {
    await page.waitForFunction(fn, arg, { timeout: STEP_TIMEOUT });
  } catch (e) {
    const now = await page.evaluate((sel) => {
      const el = sel && document.querySelector(sel);
      const err = document.querySelector("main .error");
      return (el ? `${sel} ${JSON.stringify({ ...el.dataset })} '${el.textContent.slice(0, 120)}'` : `${sel || "-"} missing`) +
        (err ? `; error shown: '${err.textContent.slice(0, 200)}'` : "");
    }, selector || null).catch(() => "?");
    throw new Error(`timed out waiting for ${what}; page has ${now}`);
  }
}
async function waitStage(select) {
  await waitUntil(
    (s) => {
      const st = document.querySelector("[data-testid=stage]");
      return st && st.dataset.state === "ready" && st.dataset.select === s;
    },
    select, `image of select=${select}`, "[data-testid=stage]");
}
async function noOverflow(what) {
  const m = await page.evaluate(() => ({
    doc: [document.documentElement.scrollWidth, document.documentElement.clientWidth],
    body: [document.body.scrollWidth, document.body.clientWidth],
    wide: [...document.querySelectorAll("body *")]
      .filter((e) => e.getBoundingClientRect().right > document.documentElement.clientWidth + 1 && e.offsetParent !== null)
      .filter((e) => !e.closest(".scroll-x, .table-wrap, pre, .tabs"))
      .slice(0, 3)
      .map((e) => e.tagName.toLowerCase() + (e.className && typeof e.className === "string" ? "." + e.className.split(" ")[0] : "")),
  }));
  assert(m.doc[0] <= m.doc[1] && m.body[0] <= m.body[1],
    `${what}: horizontal overflow (document ${m.doc[0]} > ${m.doc[1]} or body ${m.body[0]} > ${m.body[1]}; e.g. ${m.wide.join(", ")})`);
}
async function expandTreeItem(key) {
  const li = page.locator(`#tree li[data-key="${key}"]`);
  await li.waitFor({ timeout: STEP_TIMEOUT });
  if ((await li.getAttribute("aria-expanded")) !== "true") await li.locator(":scope > .row .twisty").click();
  await page.waitForFunction((k) => {
    const e = document.querySelector(`#tree li[data-key="${k}"]`);
    // Wait for real members, not a "loading" placeholder row.
    return e && e.getAttribute("aria-expanded") === "true" && e.querySelector(":scope > ul > li[role=treeitem]");
  }, key, { timeout: STEP_TIMEOUT });
  return page.$$eval(`#tree li[data-key="${key}"] > ul > li[role=treeitem]`, (els) => els.map((e) => e.dataset.key));
}
/** The listing of demo/v3.zarr, which v3WithListedChild edits. */
const V3_LIST = /\/api\/v1\/list\/demo\/v3\.zarr$/;
/** Opens demo/v3.zarr with `child` added to its listing as /api/v1/list describes one (no CI
    group holds such a child; ZOM, the server's own, names the group's Zarr members only), and
    returns the group table's rows ([name, type]), its summary line and the tree's children of
    the group. `listed.n` counts the listings served. The caller unroutes V3_LIST. */
async function v3WithListedChild(child, listed) {
  await page.goto("about:blank");
  await editJson(V3_LIST, (b) => {
    listed.n++;
    b.children.push(child);
    b.children.sort((x, y) => (x.name < y.name ? -1 : 1));
    return b;
  });
  await page.goto(base + "/#/demo/v3.zarr");
  await page.locator("main table.list a", { hasText: "volume" }).waitFor();
  await page.locator("main table.list a", { hasText: child.name }).waitFor({ timeout: 3000 }).catch(() => {});
  const rows = await page.$$eval("main table.list tbody tr", (trs) => trs.map((tr) => [tr.children[0].textContent, tr.children[1].textContent]));
  const summary = await page.locator("main .summary").innerText();
  const kids = await expandTreeItem("demo/v3.zarr");
  return { rows, summary, kids };
}
/** The cells of the table view of fx/`p` (switched to from an image or plot view when the
    array opens in one). */
async function tableOf(p) {
  await page.goto(base + "/#/fx/" + p);
  await page.locator('[data-testid=table], button[data-mode="table"]').first().waitFor({ timeout: STEP_TIMEOUT });
  const button = page.locator('button[data-mode="table"]');
  if (await button.count()) await button.click();
  await waitUntil((k) => document.querySelector(`[data-testid=table][data-path="${k}"]`)?.dataset.state === "ready", "fx/" + p, `the table of ${p}`, "[data-testid=table]");
  return page.$$eval("[data-testid=table] tbody tr td", (tds) => tds.map((td) => td.textContent));
}
async function openInTree(key) {
  await page.locator(`#tree li[data-key="${key}"] > .row a`).click();
  await page.waitForFunction((k) => location.hash === "#/" + k.split("/").map(encodeURIComponent).join("/"), key, { timeout: STEP_TIMEOUT });
}
async function errorTextIn(selector, hasText) {
  const loc = page.locator(`${selector} .error`, hasText ? { hasText } : {}).first();
  await loc.waitFor({ timeout: STEP_TIMEOUT });
  return loc.innerText();
}

/** Wait in node (not in the page) until fn() is true. */
async function until(fn, what) {
  const t0 = Date.now();
  while (!fn()) {
    if (Date.now() - t0 > STEP_TIMEOUT) throw new Error(`timed out waiting for ${what}`);
    await new Promise((r) => setTimeout(r, 20));
  }
}
/** A proxy on 127.0.0.1 (a free port) to `upstream` (the page's origin) that sends the status,
    headers and first 5 bytes of each response whose URL matches `slow` at once and the rest
    `delayMs` later: a request aborted in between is aborted while its body arrives. `opened` lists
    the URLs whose first bytes were sent. */
function startSlowProxy(upstream, slow, delayMs) {
  const up = new URL(upstream);
  const opened = [];
  const server = http.createServer((req, res) => {
    const preq = http.request({ hostname: up.hostname, port: up.port, method: req.method, path: req.url, headers: { ...req.headers, host: up.host } }, (pres) => {
      if (!slow.test(req.url)) {
        res.writeHead(pres.statusCode, pres.headers);
        return pres.pipe(res);
      }
      const headers = { ...pres.headers };
      delete headers["content-length"];
      res.writeHead(pres.statusCode, headers);
      const chunks = [];
      pres.on("data", (c) => chunks.push(c));
      pres.on("end", () => {
        const body = Buffer.concat(chunks);
        res.write(body.subarray(0, 5));
        opened.push(req.url);
        const t = setTimeout(() => res.end(body.subarray(5)), delayMs);
        res.on("close", () => clearTimeout(t));
      });
    });
    preq.on("error", () => { if (!res.headersSent) res.writeHead(502); res.end(); });
    req.pipe(preq);
  });
  return new Promise((resolve, reject) => {
    server.once("error", reject);
    server.listen(0, "127.0.0.1", () => resolve({
      url: `http://127.0.0.1:${server.address().port}`,
      opened,
      close: () => new Promise((r) => { server.closeAllConnections?.(); server.close(() => r()); }),
    }));
  });
}

/** Answer requests matching `re` with the server's JSON passed through edit(body). */
async function editJson(re, edit) {
  await page.route(re, async (r) => {
    const res = await r.fetch();
    await r.fulfill({ response: res, json: edit(await res.json()) });
  });
}
/** Answer requests matching `re` with `status` and the API error {code, message}. */
async function fakeError(re, status, code, message) {
  await page.route(re, (r) => r.fulfill({ status, json: { error: { code, message } } }));
}
/** Run fn with the console errors of the responses it fakes (status `status`) not counted by the
    "no script errors" check; every other console error still is. */
async function withFakedStatus(status, fn) {
  const from = browser.consoleMessages.length;
  try {
    await fn();
  } finally {
    const re = new RegExp(`Failed to load resource: the server responded with a status of ${status}\\b`);
    for (let i = browser.consoleMessages.length - 1; i >= from; i--) {
      if (browser.consoleMessages[i].type === "error" && re.test(browser.consoleMessages[i].text)) browser.consoleMessages.splice(i, 1);
    }
  }
}
/** Make the page see a mount `name` (kind local) whose root is `realMount/realPath` of the server:
    /api/v1/mounts gains it, and its list, zom and slice requests are answered by the real node's.
    The CI server has no mount whose root is a node; this lends it one. Returns an undo function. */
async function lendMount(name, realMount, realPath) {
  const mountsRe = /\/api\/v1\/mounts$/;
  const nodeRe = new RegExp(`/api/v1/(list|zom|slice)/${name}(/[^?]*)?(\\?.*)?$`);
  await page.route(mountsRe, async (r) => {
    const res = await r.fetch();
    const body = await res.json();
    body.mounts.push({ name, kind: "local", url: `(test: ${realMount}/${realPath})`, consolidated: true });
    await r.fulfill({ response: res, json: body });
  });
  await page.route(nodeRe, async (r) => {
    const u = new URL(r.request().url());
    const [, route, rest = "", query = ""] = nodeRe.exec(u.pathname + u.search);
    const sub = rest.replace(/^\/+/, "");
    u.pathname = u.pathname.replace(/\/api\/v1\/.*$/, `/api/v1/${route}/${realMount}/${realPath}${sub ? "/" + sub : ""}`);
    u.search = query;
    await r.fulfill({ response: await r.fetch({ url: u.href }) });
  });
  await page.goto("about:blank"); // the next page load asks for the mounts again
  return async () => { await page.unroute(mountsRe); await page.unroute(nodeRe); await page.goto("about:blank"); };
}

async function main() {
  const args = process.argv.slice(2);
  const dev = args[0] === "--dev";
  target = (dev ? args[1] : args[0] || "").replace(/\/+$/, "");
  if (!/^http:\/\/(127\.0\.0\.1|localhost|\[::1\]):\d+$/.test(target)) {
    throw new Error(`usage: run_webpage.cjs [--dev] http://127.0.0.1:PORT (got '${target}')`);
  }
  let devServer = null;
  if (dev) {
    devServer = await startDevServer({ upstream: target });
    base = devServer.url;
    console.log(`webpage: working copy of static/index.html served at ${base}, API proxied to ${target}`);
  } else {
    base = target;
  }
  const health = await fetch(base + "/healthz").catch((e) => ({ ok: false, status: String(e) }));
  if (!health.ok) throw new Error(`zarrgate not reachable at ${base}/healthz (${health.status})`);

  fs.rmSync(SHOTS, { recursive: true, force: true });
  fs.mkdirSync(SHOTS, { recursive: true });
  browser = await launchChromium();
  page = browser.page;
  page.setDefaultTimeout(STEP_TIMEOUT);
  try {
    await check("page loads and lists the demo mount", async () => {
      await page.goto(base + "/");
      const isPage = await page.waitForSelector("#tree", { timeout: 5000 }).then(() => true, () => false);
      assert(isPage, `${base}/ is not this version of static/index.html (no #tree element): does the zarrgate binary embed an older page? Rebuild it, or run with --dev to serve the working copy`);
      const mounts = (await api("/api/v1/mounts")).body.mounts.map((m) => m.name);
      assert(mounts.includes("demo"), `the server has no demo mount (${mounts})`);
      await page.locator('#tree li[data-key="demo"]').waitFor();
      const shown = await page.$$eval("#tree > li[role=treeitem]", (els) => els.map((e) => e.dataset.key));
      assertEq(shown, mounts, "mounts in the tree");
      await page.locator("main table.list a", { hasText: "demo" }).waitFor();
      await shot("desktop-home");
    }, { fatal: true });

    await check("tree expands the demo hierarchy (list + zom)", async () => {
      const top = await expandTreeItem("demo");
      assertEq(top, ["demo/v2.zarr", "demo/v3.zarr"], "children of demo");
      const v3 = await expandTreeItem("demo/v3.zarr");
      assertEq(v3, ["demo/v3.zarr/names", "demo/v3.zarr/temperature", "demo/v3.zarr/volume"], "members of v3.zarr");
      const v2 = await expandTreeItem("demo/v2.zarr");
      assertEq(v2, ["demo/v2.zarr/counts", "demo/v2.zarr/image", "demo/v2.zarr/labels"], "members of v2.zarr");
      // collapse and re-open: children stay loaded
      await page.locator('#tree li[data-key="demo/v2.zarr"] > .row .twisty').click();
      assertEq(await page.getAttribute('#tree li[data-key="demo/v2.zarr"]', "aria-expanded"), "false", "collapsed v2.zarr");
    });

    await check("array view shows the metadata of demo/v3.zarr/volume", async () => {
      await openInTree("demo/v3.zarr/volume");
      const text = async (id) => (await page.locator(`[data-testid=${id}]`).first().innerText()).trim();
      await page.locator("[data-testid=shape]").waitFor();
      assertEq(await text("shape"), "16 × 128 × 128", "shape");
      assertEq(await text("dtype"), "uint16", "dtype");
      assert((await text("chunks")).startsWith("8 × 64 × 64"), `chunk (shard) shape: ${await text("chunks")}`);
      assert((await text("inner-chunks")).startsWith("4 × 32 × 32"), `inner chunk shape: ${await text("inner-chunks")}`);
      const codecs = await text("codecs");
      for (const c of ["sharding_indexed", "bytes", "zstd", "crc32c"]) assert(codecs.includes(c), `codecs lack ${c}: ${codecs}`);
      assertEq(await text("fill"), "0", "fill value");
      assertEq(await text("dims"), "z, y, x", "dimension names");
      assert((await text("attributes")).includes('"long_name": "smooth volume"'), "attributes");
      const url = base + "/zarr/demo/v3.zarr/volume";
      assertEq(await text("raw-url"), url, "raw-key URL");
      assert((await text("snippet-zarr")).includes(`zarr.open_array("${url}", mode="r")`), "zarr-python snippet");
      await page.locator('#access .tabs [data-tab="neuroglancer"]').click();
      assertEq(await text("snippet-neuroglancer"), "zarr3://" + url, "neuroglancer source");
      await page.locator('#access .tabs [data-tab="tensorstore"]').click();
      const tsSnippet = await text("snippet-tensorstore");
      assert(tsSnippet.includes('"driver": "zarr3"') && tsSnippet.includes(url), "tensorstore snippet");
      await page.locator('#access .tabs [data-tab="curl"]').click();
      const curl = await text("curl");
      assert(curl.includes(`curl -sg '${base}/api/v1/slice/demo/v3.zarr/volume?select=[7,:,:]&format=json'`), `curl commands: ${curl.slice(0, 300)}`);
      // the metadata curl command really works
      const meta = await fetch(url + "/zarr.json").then((r) => r.json());
      assertEq(meta.shape, [16, 128, 128], "zarr.json at the raw-key URL");
    });

    let before = null;
    await check("slice viewer renders the PNG of the middle plane", async () => {
      await waitStage("[7,:,:]");
      before = await imageState("[7,:,:]");
      assertEq([before.w, before.h], [128, 128], "image size");
      assert(before.sameAsApi, "shown image differs from GET /api/v1/slice?select=[7,:,:]&format=png");
      await shot("desktop-volume");
    });

    await check("moving the z slider changes the image", async () => {
      const slider = page.locator('input[type=range][data-dim="0"]');
      await slider.focus();
      for (let i = 0; i < 3; i++) await page.keyboard.press("ArrowRight");
      assertEq(await slider.inputValue(), "10", "slider value");
      await waitStage("[10,:,:]");
      const after = await imageState("[10,:,:]");
      assert(before && after.hash !== before.hash, "the image did not change");
      assert(after.sameAsApi, "shown image differs from GET /api/v1/slice?select=[10,:,:]&format=png");
    });

    await check("value under the cursor matches the slice API", async () => {
      const box = await page.locator("[data-testid=stage]").boundingBox();
      for (const [y, x] of [[90, 37], [5, 120], [64, 64]]) {
        await page.mouse.move(box.x + ((x + 0.5) * box.width) / 128, box.y + ((y + 0.5) * box.height) / 128);
        const idx = `[10,${y},${x}]`;
        await waitUntil((k) => {
          const r = document.querySelector("[data-testid=readout]");
          return r && r.dataset.index === k && r.dataset.state === "ready";
        }, idx, `the readout of ${idx}`, "[data-testid=readout]");
        const expected = (await api(sliceRel("v3.zarr/volume", `select=${idx}&format=json`))).body;
        assertEq(expected.shape, [], "shape of a one-element slice");
        const shownValue = await page.getAttribute("[data-testid=readout]", "data-value");
        assertEq(JSON.parse(shownValue), expected.data, `value at ${idx}`);
        const txt = await page.locator("[data-testid=readout]").innerText();
        assert(txt.includes(String(expected.data)) && txt.includes(`y=${y}`) && txt.includes(`x=${x}`), `readout text '${txt}'`);
      }
      await shot("desktop-volume-hover");
    });

    await check("swapped display dimensions (rows x, columns y) show the transposed plane", async () => {
      await page.selectOption("[data-testid=dim-rows]", "2");
      assertEq(await page.inputValue("[data-testid=dim-cols]"), "1", "columns after picking x for rows");
      await waitStage("[10,:,:]");
      const box = await page.locator("[data-testid=stage]").boundingBox();
      const [row, col] = [100, 20]; // displayed row = x index, displayed column = y index
      await page.mouse.move(box.x + ((col + 0.5) * box.width) / 128, box.y + ((row + 0.5) * box.height) / 128);
      const idx = `[10,${col},${row}]`;
      await waitUntil((k) => {
        const r = document.querySelector("[data-testid=readout]");
        return r && r.dataset.index === k && r.dataset.state === "ready";
      }, idx, `the readout of ${idx}`, "[data-testid=readout]");
      const expected = (await api(sliceRel("v3.zarr/volume", `select=${idx}&format=json`))).body.data;
      assertEq(JSON.parse(await page.getAttribute("[data-testid=readout]", "data-value")), expected, `value at ${idx}`);
      // What is on screen at displayed (row r, column c) is the server's PNG of [10,:,:] (rows y,
      // columns x) at pixel (x=r, y=c): the page really shows the transpose.
      await page.mouse.move(0, 0);
      for (const [r, c] of [[100, 20], [5, 120], [64, 30]]) {
        const clip = { x: box.x + ((c + 0.5) * box.width) / 128, y: box.y + ((r + 0.5) * box.height) / 128, width: 1, height: 1 };
        const onScreen = (await page.screenshot({ clip })).toString("base64");
        const [got, want] = await page.evaluate(async ([b64, x, y]) => {
          const px = async (blob, px, py) => {
            const bmp = await createImageBitmap(blob);
            const cv = document.createElement("canvas");
            cv.width = bmp.width; cv.height = bmp.height;
            const g = cv.getContext("2d");
            g.drawImage(bmp, 0, 0);
            return [...g.getImageData(px, py, 1, 1).data.slice(0, 3)];
          };
          const shot = await (await fetch("data:image/png;base64," + b64)).blob();
          const ref = await (await fetch(new URL("api/v1/slice/demo/v3.zarr/volume?select=[10,:,:]&format=png&cmap=gray", location.href))).blob();
          return [await px(shot, 0, 0), await px(ref, x, y)];
        }, [onScreen, r, c]);
        assert(got.every((v, i) => Math.abs(v - want[i]) <= 2), `on-screen pixel at displayed row ${r}, column ${c}: ${got}, PNG pixel (x=${r}, y=${c}): ${want}`);
      }
      await page.selectOption("[data-testid=dim-rows]", "1");
      assertEq(await page.inputValue("[data-testid=dim-cols]"), "2", "columns after picking y for rows again");
      await waitStage("[10,:,:]");
      await page.selectOption("[data-testid=dim-rows]", "0");
      assert(await page.locator('input[type=range][data-dim="1"]').count() === 1, "a slider for y once z is displayed");
      await waitStage("[:,63,:]");
      await page.selectOption("[data-testid=dim-rows]", "1");
      await waitStage("[10,:,:]");
    });

    await check("colormap viridis renders a coloured image", async () => {
      const gray = await imageState(null);
      assertEq(gray.colored, 0, "coloured pixels in gray");
      await page.selectOption("[data-testid=cmap]", "viridis");
      await page.waitForFunction(() => document.querySelector("[data-testid=stage]").dataset.state === "ready" &&
        document.querySelector("[data-testid=slice-img]").src !== "");
      await page.waitForFunction(() => {
        const s = document.querySelector("[data-testid=stage]");
        return s.dataset.state === "ready";
      });
      await page.waitForTimeout(50);
      const vir = await imageState("[10,:,:]");
      assert(vir.colored > 1000 && vir.sameAsApi, `viridis image: ${vir.colored} coloured pixels, same as API: ${vir.sameAsApi}`);
      await shot("desktop-volume-viridis");
    });

    await check("a bad vmin shows the API's error message", async () => {
      const expected = (await api(sliceRel("v3.zarr/volume", "select=[10,:,:]&format=png&vmin=abc"))).body.error.message;
      await page.fill("[data-testid=vmin]", "abc");
      await page.press("[data-testid=vmin]", "Enter");
      const txt = await errorTextIn("#viewer");
      assert(txt.includes(expected) && /Bad request \(400\)/.test(txt), `error shown: '${txt}' (API says '${expected}')`);
      await shot("desktop-error-vmin");
      await page.fill("[data-testid=vmin]", "");
      await page.press("[data-testid=vmin]", "Enter");
      await page.waitForFunction(() => document.querySelector("[data-testid=stage]").dataset.state === "ready" && !document.querySelector("#viewer .error"));
    });

    await check("slice API box runs queries and shows errors", async () => {
      await page.fill("#q-select", "[10,90,30:34]");
      await page.click("#q-run");
      await page.waitForFunction(() => document.querySelector("#q-result").dataset.state === "ready");
      const out = JSON.parse(await page.locator("[data-testid=q-output]").innerText());
      const expected = (await api(sliceRel("v3.zarr/volume", "select=[10,90,30:34]&format=json"))).body;
      assertEq(out, expected, "json result");
      await page.fill("#q-select", "[0,0,0,0]");
      await page.click("#q-run");
      const err = (await api(sliceRel("v3.zarr/volume", "select=[0,0,0,0]"))).body.error;
      const txt = await errorTextIn("#q-result");
      assert(txt.includes(err.message) && txt.includes(err.code), `error shown: '${txt}' (API: ${JSON.stringify(err)})`);
      const curl = await page.locator("[data-testid=q-curl]").innerText();
      assert(curl.includes("select=[0,0,0,0]"), `curl command follows the input: ${curl}`);
      await page.locator("#slice-api").scrollIntoViewIfNeeded();
      await shot("desktop-error-select");
    });

    await check("1-D array demo/v2.zarr/counts renders as a line plot", async () => {
      await expandTreeItem("demo/v2.zarr");
      await openInTree("demo/v2.zarr/counts");
      await waitUntil(() => document.querySelector("[data-testid=plot]")?.dataset.state === "ready", null, "the plot", "[data-testid=plot]");
      const expected = (await api(sliceRel("v2.zarr/counts", "format=json"))).body;
      const pts = await page.getAttribute("svg.plot", "data-points");
      assertEq(Number(pts), expected.shape[0], "points plotted");
      const segs = await page.$eval("svg.plot path.line", (p) => (p.getAttribute("d").match(/[ML]/g) || []).length);
      assertEq(segs, expected.data.length, "path vertices");
      const dims = (await page.locator("[data-testid=dims]").innerText()).trim();
      assertEq(dims, "i", "v2 dimension names from _ARRAY_DIMENSIONS");
      assertEq((await page.locator("[data-testid=dtype]").innerText()).trim(), "<i4", "v2 dtype");
      const box = await page.locator("svg.plot").boundingBox();
      await page.mouse.move(box.x + box.width * 0.6, box.y + box.height / 2);
      await page.waitForFunction(() => document.querySelector("[data-testid=readout]")?.dataset.index);
      const idx = JSON.parse(await page.getAttribute("[data-testid=readout]", "data-index"))[0];
      assertEq(JSON.parse(await page.getAttribute("[data-testid=readout]", "data-value")), expected.data[idx], `plot readout at ${idx}`);
      await shot("desktop-counts");
    });

    await check("string array demo/v3.zarr/names renders as a table", async () => {
      await openInTree("demo/v3.zarr/names");
      // The table of this array: the one of the array shown before stays until it is replaced.
      await waitUntil(() => document.querySelector('[data-testid=table][data-path="demo/v3.zarr/names"]')?.dataset.state === "ready", null, "the table", "[data-testid=table]");
      const expected = (await api(sliceRel("v3.zarr/names", "select=[0:12]&format=json"))).body;
      const cells = await page.$$eval("[data-testid=table] tbody tr td", (tds) => tds.map((td) => td.textContent));
      assertEq(cells, expected.data, "table cells");
      assertEq((await page.locator("[data-testid=dtype]").innerText()).trim(), "string", "dtype");
      await shot("desktop-names");
    });

    await check("v2 string array demo/v2.zarr/labels renders as a table", async () => {
      await openInTree("demo/v2.zarr/labels");
      // The table of this array: the one of the array shown before stays until it is replaced.
      await waitUntil(() => document.querySelector('[data-testid=table][data-path="demo/v2.zarr/labels"]')?.dataset.state === "ready", null, "the table", "[data-testid=table]");
      const expected = (await api(sliceRel("v2.zarr/labels", "format=json"))).body;
      const cells = await page.$$eval("[data-testid=table] tbody tr td", (tds) => tds.map((td) => td.textContent));
      assertEq(cells, expected.data, "table cells");
    });

    await check("2-D float array with NaN fill renders (demo/v3.zarr/temperature)", async () => {
      await openInTree("demo/v3.zarr/temperature");
      await waitStage("[:,:]");
      const st = await page.evaluate(() => {
        const img = document.querySelector("[data-testid=slice-img]");
        return [img.naturalWidth, img.naturalHeight];
      });
      assertEq(st, [36, 24], "image size");
      assertEq((await page.locator("[data-testid=fill]").innerText()).trim(), '"NaN"', "fill value");
    });

    await check("integers past 2^53 in the ZOM show exactly (fill value, attributes)", async () => {
      // The served ZOM of demo/v3.zarr/volume, with a uint64 fill value and an attribute that a
      // plain JSON.parse would round.
      const re = /\/api\/v1\/zom\/demo\/v3\.zarr\/volume(\?.*)?$/;
      await page.route(re, async (r) => {
        const res = await r.fetch();
        const text = await res.text();
        assert(text.includes('"fill_value":0') && text.includes('"attributes":{'), `zom: ${text.slice(0, 200)}`);
        const body = text.replace('"fill_value":0', '"fill_value":18446744073709551615')
          .replace('"attributes":{', '"attributes":{"big":9007199254740993,');
        await r.fulfill({ response: res, body });
      });
      try {
        await page.goto("about:blank");
        await page.goto(base + "/#/demo/v3.zarr/volume");
        const fill = page.locator("[data-testid=fill]").first();
        await fill.waitFor({ timeout: STEP_TIMEOUT });
        assertEq((await fill.innerText()).trim(), "18446744073709551615", "fill value");
        const attrs = (await page.locator("[data-testid=attributes]").first().innerText()).trim();
        assert(attrs.includes('"big": 9007199254740993'), `attributes: ${attrs}`);
      } finally {
        await page.unroute(re);
        await page.goto("about:blank");
      }
    });

    await check("the consolidated-metadata snippet shows on consolidated mounts only", async () => {
      const labels = async () => {
        await page.goto("about:blank");
        await page.goto(base + "/#/demo/v3.zarr");
        await page.locator('main .tabs [data-tab="curl"]').click();
        await page.locator("main .snippet .label", { hasText: "metadata" }).first().waitFor({ timeout: STEP_TIMEOUT });
        return page.$$eval("main .snippet .label", (ls) => ls.map((l) => l.textContent));
      };
      assert((await labels()).includes("consolidated metadata"), "snippet on demo (consolidated)");
      const re = /\/api\/v1\/mounts$/;
      await editJson(re, (body) => {
        for (const m of body.mounts) if (m.name === "demo") m.consolidated = false;
        return body;
      });
      try {
        const shown = await labels();
        assert(shown.includes("metadata") && !shown.includes("consolidated metadata"), `labels: ${shown}`);
      } finally {
        await page.unroute(re);
        await page.goto("about:blank");
      }
    });

    await check("an unknown node shows a readable 404", async () => {
      const expected = (await api("/api/v1/zom/demo/v3.zarr/nope")).body.error;
      assertEq((await api("/api/v1/zom/demo/v3.zarr/nope")).status, 404, "API status");
      await page.goto(base + "/#/demo/v3.zarr/nope");
      const txt = await errorTextIn("main");
      assert(txt.includes(expected.message) && txt.includes("Not found (404)"), `error shown: '${txt}'`);
      await shot("desktop-not-found");
    });

    await check("group view lists members (demo/v3.zarr)", async () => {
      await page.goto(base + "/#/demo/v3.zarr");
      await page.locator("main table.list a", { hasText: "volume" }).waitFor();
      const rows = await page.$$eval("main table.list tbody tr", (trs) => trs.map((tr) => tr.children[0].textContent));
      assertEq(rows, ["names", "temperature", "volume"], "members");
      await noOverflow("group view at 1280");
      await shot("desktop-group");
    });

    await check("no horizontal overflow at 1280x800", async () => {
      await page.goto(base + "/#/demo/v3.zarr/volume");
      await waitStage("[7,:,:]");
      await noOverflow("volume at 1280");
    });

    await check("phone width (390x844): no horizontal overflow, viewer usable", async () => {
      await page.setViewportSize({ width: 390, height: 844 });
      await page.goto(base + "/#/demo/v3.zarr/volume");
      await waitStage("[7,:,:]");
      await noOverflow("volume at 390");
      const box = await page.locator("[data-testid=stage]").boundingBox();
      assert(box.width >= 200 && box.x >= 0 && box.x + box.width <= 390, `image box at 390: ${JSON.stringify(box)}`);
      await shot("phone-volume");
      await shot("phone-volume-full", { fullPage: true });
      await page.click("#browse-toggle");
      await page.locator('#tree li[data-key="demo/v3.zarr/volume"] .row.selected').waitFor();
      await noOverflow("tree open at 390");
      await shot("phone-tree");
      await page.locator('#tree li[data-key="demo/v3.zarr/names"] > .row a').click();
      await waitUntil(() => document.querySelector("[data-testid=table]")?.dataset.state === "ready", null, "the table", "[data-testid=table]");
      assert(!(await page.locator("#sidebar").isVisible()), "the tree closes after picking an array on a phone");
      await noOverflow("names at 390");
      await shot("phone-names", { fullPage: true });
      await page.goto(base + "/#/demo/v2.zarr/counts");
      await page.waitForFunction(() => document.querySelector("[data-testid=plot]")?.dataset.state === "ready");
      await noOverflow("counts at 390");
      await page.goto(base + "/");
      await page.locator("main table.list a", { hasText: "demo" }).waitFor();
      await noOverflow("home at 390");
      await shot("phone-home");
      await page.setViewportSize({ width: 1280, height: 800 });
    });

    await check("?api= is used only when it is an http(s) URL (no javascript: links)", async () => {
      const dialogs = [];
      const onDialog = (d) => { dialogs.push(d.message()); d.dismiss().catch(() => {}); };
      page.on("dialog", onDialog);
      try {
        for (const bad of ["javascript://%0aalert(document.domain)/", " JavaScript:alert(1)//", "data:text/html,<script>alert(1)</script>", "vbscript:x"]) {
          await page.goto(base + "/?api=" + encodeURIComponent(bad));
          await page.locator("#metrics-link").waitFor();
          assertEq(await page.$eval("#metrics-link", (a) => a.href), base + "/metrics", `metrics link with ?api=${bad}`);
          await page.locator('#tree li[data-key="demo"]').waitFor();
          const raw = await page.locator("main table.list td.mono").last().innerText();
          assert(raw.startsWith(base + "/zarr/"), `raw-key URL with ?api=${bad}: ${raw}`);
        }
        // The reported exploit: a click on "metrics" (now a download of /metrics) runs no script.
        await page.goto(base + "/?api=" + encodeURIComponent("javascript://%0aalert(document.domain)/"));
        await page.locator('#tree li[data-key="demo"]').waitFor();
        await page.click("#metrics-link");
        await page.waitForTimeout(300);
        assertEq(dialogs, [], "dialogs opened");
        // What ?api= is for: another zarrgate (with --dev, the page's origin is the dev server and
        // the API is zarrgate's, over CORS).
        await page.goto(base + "/?api=" + encodeURIComponent(target + "/"));
        await page.locator('#tree li[data-key="demo"]').waitFor();
        assertEq(await page.$eval("#metrics-link", (a) => a.href), target + "/metrics", "metrics link with ?api=<zarrgate>");
        await page.locator('#tree li[data-key="demo"] > .row a').click();
        await page.locator("main table.list a", { hasText: "v3.zarr" }).waitFor();
        assertEq(await page.locator("[data-testid=raw-url]").innerText(), target + "/zarr/demo/", "raw-key URL with ?api=<zarrgate>");
      } finally {
        page.off("dialog", onDialog);
      }
    });

    await check("a table load aborted while its body arrives shows no error (not 'bad JSON')", async () => {
      const proxy = await startSlowProxy(base, /^\/api\/v1\/slice\/demo\/v3\.zarr\/volume\?.*format=json/, 1500);
      try {
        await page.goto(proxy.url + "/#/demo/v3.zarr/volume");
        await page.locator("#viewer .seg button[data-mode=table]").click();
        await waitUntil(() => document.querySelector("[data-testid=table]")?.dataset.state === "ready", null, "the table", "[data-testid=table]");
        // From now on, note every error the viewer shows, however briefly.
        await page.evaluate(() => {
          window.__viewerErrors = [];
          const v = document.getElementById("viewer");
          new MutationObserver(() => {
            const e = v.querySelector(".error");
            if (e || v.querySelector("[data-testid=table]")?.dataset.state === "error") window.__viewerErrors.push(e ? e.textContent : "table state error");
          }).observe(v, { subtree: true, childList: true, attributes: true });
        });
        const slider = page.locator('#viewer input[type=range][data-dim="0"]');
        await slider.focus();
        const n = proxy.opened.length;
        await page.keyboard.press("ArrowRight");
        await until(() => proxy.opened.length > n, "the body of the table at z=8 to start");
        await page.keyboard.press("ArrowRight"); // aborts the load of z=8, whose body is still arriving
        await waitUntil(() => {
          const t = document.querySelector("[data-testid=table]");
          return t && t.dataset.state === "ready" && t.dataset.select === "[9,0:100,0:20]";
        }, null, "the table at z=9", "[data-testid=table]");
        assert(proxy.opened.some((u) => u.includes("select=[8,")), "the load of z=8 was not made");
        assertEq(await page.evaluate(() => window.__viewerErrors), [], "errors shown");
      } finally {
        await proxy.close();
      }
    });

    await check("a slow tree reveal of an older route does not take the selection of a newer one", async () => {
      const slow = /\/api\/v1\/zom\/demo\/v3\.zarr\?depth=1$/;
      let held = 0, released = 0;
      await page.route(slow, async (r) => { held++; await new Promise((res) => setTimeout(res, 1500)); released++; await r.continue().catch(() => {}); });
      try {
        await page.goto(base + "/");
        await page.locator('#tree li[data-key="demo"]').waitFor();
        await page.evaluate(() => { location.hash = "#/demo/v3.zarr/volume"; });
        await until(() => held > 0, "the expansion of demo/v3.zarr to start");
        await page.evaluate(() => { location.hash = "#/demo/v2.zarr/counts"; });
        await waitUntil(() => document.querySelector("[data-testid=plot]")?.dataset.state === "ready", null, "the plot of counts", "[data-testid=plot]");
        await until(() => released === held, "the held expansion to be answered");
        await page.locator('#tree li[data-key="demo/v3.zarr/volume"]').waitFor(); // the old reveal's expansion is done
        await page.waitForTimeout(100);
        const selected = await page.$$eval("#tree .row.selected", (rs) => rs.map((r) => r.parentElement.dataset.key));
        assertEq(selected, ["demo/v2.zarr/counts"], "selected tree rows");
        assertEq(await page.locator("main h2").innerText(), "counts", "title");
      } finally {
        await page.unroute(slow);
      }
    });

    await check("slice API box shows the format it asked for when the menu changes meanwhile", async () => {
      const slow = /\/api\/v1\/slice\/demo\/v3\.zarr\/volume\?select=\[1,2,3:5\]&format=npy$/;
      let held = 0;
      await page.route(slow, async (r) => { held++; await new Promise((res) => setTimeout(res, 800)); await r.continue().catch(() => {}); });
      try {
        await page.goto(base + "/#/demo/v3.zarr/volume");
        await page.locator("#q-select").waitFor();
        await page.fill("#q-select", "[1,2,3:5]");
        await page.selectOption("#q-format", "npy");
        await page.click("#q-run");
        await until(() => held > 0, "the npy request");
        await page.selectOption("#q-format", "json");
        await page.waitForFunction(() => document.querySelector("#q-result").dataset.state === "ready");
        const link = page.locator("#q-result a[download]");
        const dl = (await link.count()) ? await link.getAttribute("download") : null;
        assertEq(dl, "slice.npy", "download offered");
        assertEq(await page.locator("#q-result pre").count(), 0, "text blocks in the result (npy bytes shown as text)");
      } finally {
        await page.unroute(slow);
      }
    });

    await check("a path below an array (demo/v3.zarr/volume/c) is not shown as the array", async () => {
      await page.goto(base + "/#/demo/v3.zarr/volume/c");
      const listed = (await api("/api/v1/list/demo/v3.zarr/volume/c")).body.children.map((c) => c.name);
      await waitUntil(() => document.querySelector("main h2")?.textContent === "c" &&
        (document.querySelector("main .titlebar .badge") || document.querySelector("main .error")), null, "the view of volume/c", "main h2");
      const err = await page.locator("main .error").count() ? await page.locator("main .error").innerText() : "";
      assertEq(await page.$$eval("main .titlebar .badge", (bs) => bs.map((b) => b.textContent)), ["directory"], `badges (error shown: '${err}')`);
      const rows = await page.$$eval("main table.list tbody tr", (trs) => trs.map((tr) => tr.children[0].textContent));
      assertEq(rows, listed, "entries of the directory");
      assertEq(await page.$$eval("#tree .row.selected", (rs) => rs.length), 0, "selected tree rows");
      // below that, nothing: the API's 404
      await page.goto(base + "/#/demo/v3.zarr/volume/zz");
      const txt = await errorTextIn("main");
      assert(txt.includes("Not found (404)"), `error shown: '${txt}'`);
    });

    await check("an array at the root of a mount is titled with the mount's name", async () => {
      const undo = await lendMount("rootarr", "demo", "v3.zarr/volume");
      try {
        await page.goto(base + "/#/rootarr");
        await page.locator("[data-testid=shape]").waitFor();
        assertEq(await page.locator("main h2").innerText(), "rootarr", "title");
        assertEq((await page.locator("[data-testid=shape]").innerText()).trim(), "16 × 128 × 128", "shape");
        assertEq(await page.title(), "rootarr · zarrgate", "document title");
        await waitStage("[7,:,:]");
        // The tree (opened at the mount): the mount is the array; its chunk directories are not its children.
        await page.locator('#tree li[data-key="rootarr"][aria-expanded=true] > ul > li.note', { hasText: "empty" }).waitFor();
        assertEq(await page.$$eval('#tree li[data-key="rootarr"] li[role=treeitem]', (ls) => ls.map((l) => l.dataset.key)), [], "children of rootarr in the tree");
      } finally {
        await undo();
      }
    });

    await check("Zarr v1 arrays: compression from meta, curl and slice API only (fx/v1)", async () => {
      await needFx();
      const text = async (id) => (await page.locator(`[data-testid=${id}]`).first().innerText()).trim();
      for (const [name, parts] of [["zlib_f8_2d", ["zlib", "level=1"]], ["blosc_i4_1d", ["blosc", "cname=lz4", "clevel=5", "shuffle=1"]], ["none_u2_2d_F", ["none"]]]) {
        await page.goto(base + "/#/fx/v1/" + name);
        await page.locator(`main h2:text-is("${name}")`).waitFor();
        const codecs = await text("codecs");
        for (const p of parts) assert(codecs.includes(p), `codecs of ${name} lack '${p}': '${codecs}'`);
        if (name !== "none_u2_2d_F") assert(!codecs.includes("none"), `codecs of ${name}: '${codecs}'`);
        const tabs = await page.$$eval("#access .tabs [data-tab]", (bs) => bs.map((b) => b.dataset.tab));
        assertEq(tabs, ["curl"], `snippet tabs of ${name}`);
        assertEq(await page.locator("[data-testid=snippet-zarr], [data-testid=snippet-tensorstore], [data-testid=snippet-neuroglancer]").count(), 0, "zarr-python / tensorstore / neuroglancer snippets");
        assert((await text("curl")).includes(`curl -s '${base}/zarr/fx/v1/${name}/meta'`), `curl tab of ${name}: ${await text("curl")}`);
        assert(await page.locator("#slice-api #q-run").count() === 1, "the slice API box");
      }
      await shot("desktop-v1");
    });

    await check("a listed node whose metadata cannot be read is 'invalid' with its error (not a directory)", async () => {
      // No CI mount holds a corrupt node, so the test adds one to the listing of demo's root as
      // /api/v1/list describes one, and answers its ZOM with the API's error for it.
      const message = "stored data at 'broken.zarr/zarr.json' could not be decoded";
      const listRe = /\/api\/v1\/list\/demo\/$/, zomRe = /\/api\/v1\/zom\/demo\/broken\.zarr(\?.*)?$/;
      await withFakedStatus(500, async () => {
        await page.goto("about:blank");
        await editJson(listRe, (b) => {
          b.children.push({ node_type: "invalid", error: { code: "corrupt_data", message }, name: "broken.zarr" });
          return b;
        });
        await fakeError(zomRe, 500, "corrupt_data", message);
        try {
          await page.goto(base + "/#/demo");
          await page.locator("main table.list a", { hasText: "broken.zarr" }).waitFor();
          const rows = await page.$$eval("main table.list tbody tr", (trs) => trs.map((tr) => [tr.children[0].textContent, tr.children[1].textContent]));
          assertEq(rows, [["v2.zarr", "group · v2"], ["v3.zarr", "group · v3"], ["broken.zarr", "invalid"]], "rows of demo");
          const box = page.locator('main [data-testid=invalid-entry][data-name="broken.zarr"]');
          assert((await box.count()) === 1, "no error box for broken.zarr");
          assert((await box.innerText()).includes(message) && (await box.getAttribute("data-code")) === "corrupt_data", `error box: ${await box.innerText()}`);
          const li = page.locator('#tree li[data-key="demo/broken.zarr"]');
          await li.waitFor();
          assertEq([await li.getAttribute("data-type"), await li.getAttribute("aria-expanded"), await li.locator(".icon").getAttribute("class")],
            ["invalid", null, "icon invalid"], "tree item of broken.zarr (type, expandable, icon)");
          await shot("desktop-invalid-entry");
          await li.locator(":scope > .row a").click();
          // The directory's own box for the entry is an error too, until the node's view
          // replaces it: wait for the node's.
          const txt = await errorTextIn("main", "Server error");
          assert(txt.includes(message) && txt.includes("Server error (500)"), `error shown for broken.zarr: '${txt}'`);
        } finally {
          await page.unroute(listRe);
          await page.unroute(zomRe);
          await page.goto("about:blank");
        }
      });
    });

    await check("a group with a corrupt member shows its other members and the bad one's error", async () => {
      // No CI mount holds a corrupt member: the test makes demo/v3.zarr look like a group with one, as
      // the API answers for it (ZOM depth=1 of the group: 500 corrupt_data; its listing: the member
      // as "invalid" with the error). The group itself (depth=0) and the other members are real.
      const message = "stored data at 'v3.zarr/broken/zarr.json' could not be decoded";
      const zomRe = /\/api\/v1\/zom\/demo\/v3\.zarr\?depth=1$/, listRe = /\/api\/v1\/list\/demo\/v3\.zarr$/;
      await withFakedStatus(500, async () => {
        await page.goto("about:blank");
        await fakeError(zomRe, 500, "corrupt_data", message);
        await editJson(listRe, (b) => {
          b.children.push({ node_type: "invalid", error: { code: "corrupt_data", message }, name: "broken" });
          b.children.sort((x, y) => (x.name < y.name ? -1 : 1));
          return b;
        });
        try {
          await page.goto(base + "/#/demo/v3.zarr");
          await waitUntil(() => document.querySelector("main h2")?.textContent === "v3.zarr" &&
            document.querySelector("main table.list, main > .error"), null, "the view of v3.zarr", "main h2");
          const failed = await page.locator("main > .error").count() ? await page.locator("main > .error").innerText() : null;
          assert(!failed, `the group view shows an error: '${failed}'`);
          const rows = await page.$$eval("main table.list tbody tr", (trs) => trs.map((tr) => [tr.children[0].textContent, tr.children[1].textContent]));
          assertEq(rows, [["broken", "invalid"], ["names", "array · v3"], ["temperature", "array · v3"], ["volume", "array · v3"]], "members");
          const box = page.locator('main [data-testid=invalid-entry][data-name="broken"]');
          assert((await box.count()) === 1 && (await box.innerText()).includes(message), "the error of broken");
          assert(await page.locator("main [data-testid=members-listed]").count() === 1, "the note that members come from the listing");
          assert((await page.locator("[data-testid=attributes]").innerText()).includes("v3"), "the group's own attributes (depth=0)");
          const kids = await expandTreeItem("demo/v3.zarr");
          assertEq(kids, ["demo/v3.zarr/broken", "demo/v3.zarr/names", "demo/v3.zarr/temperature", "demo/v3.zarr/volume"], "tree children of v3.zarr");
          assertEq(await page.getAttribute('#tree li[data-key="demo/v3.zarr/broken"]', "data-type"), "invalid", "tree type of broken");
          await shot("desktop-group-corrupt-member");
          await openInTree("demo/v3.zarr/volume");
          await waitStage("[7,:,:]");
        } finally {
          await page.unroute(zomRe);
          await page.unroute(listRe);
          await page.goto("about:blank");
        }
      });
    });

    await check("a group on a local mount also lists its plain subdirectories (not only ZOM members)", async () => {
      const mountsRe = /\/api\/v1\/mounts$/;
      const listed = { n: 0 };
      try {
        const got = await v3WithListedChild({ node_type: "directory", name: "plain" }, listed);
        assertEq(got.rows, [["names", "array · v3"], ["plain", "directory"], ["temperature", "array · v3"], ["volume", "array · v3"]], "children of v3.zarr");
        assert(got.summary.startsWith("3 members · 1 plain directory"), `summary: ${got.summary}`);
        assertEq(got.kids, ["demo/v3.zarr/names", "demo/v3.zarr/plain", "demo/v3.zarr/temperature", "demo/v3.zarr/volume"], "tree children of v3.zarr");
        assertEq(await page.getAttribute('#tree li[data-key="demo/v3.zarr/plain"]', "data-type"), "directory", "tree type of plain");
        // On a mount where a listing is not cheap (an object store), the group is not listed.
        await page.goto("about:blank");
        await editJson(mountsRe, (b) => { for (const m of b.mounts) if (m.name === "demo") m.kind = "s3"; return b; });
        listed.n = 0;
        await page.goto(base + "/#/demo/v3.zarr");
        await page.locator("main table.list a", { hasText: "volume" }).waitFor();
        await expandTreeItem("demo/v3.zarr");
        assertEq(listed.n, 0, "listings of demo/v3.zarr on an s3 mount");
      } finally {
        await page.unroute(V3_LIST);
        await page.unroute(mountsRe);
        await page.goto("about:blank");
      }
    });

    await check("a group on a local mount shows a member of the other Zarr format (a v2 array in a v3 group)", async () => {
      // ZOM of a v3 group names its v3 members only; /api/v1/list also finds a v2 array beside them.
      try {
        const got = await v3WithListedChild({ zarr_format: 2, node_type: "array", name: "legacy" }, { n: 0 });
        assertEq(got.rows, [["legacy", "array · v2"], ["names", "array · v3"], ["temperature", "array · v3"], ["volume", "array · v3"]], "children of v3.zarr");
        assertEq(got.kids, ["demo/v3.zarr/legacy", "demo/v3.zarr/names", "demo/v3.zarr/temperature", "demo/v3.zarr/volume"], "tree children of v3.zarr");
        assertEq(await page.getAttribute('#tree li[data-key="demo/v3.zarr/legacy"]', "data-type"), "array", "tree type of legacy");
      } finally {
        await page.unroute(V3_LIST);
        await page.goto("about:blank");
      }
    });

    await check("bytes values are shown as b\"...\" literals, not base64 (fx |S, vlen bytes, v3 bytes types)", async () => {
      await needFx();
      // The values written by tests/fixtures/data/make_fixtures*.py, as Python shows them.
      const vlen = ['b"a"', 'b"b\\x00c"', 'b""', 'b"\\xff\\xfe"', 'b"longer bytes value"', 'b"x"', 'b"yz"'];
      assertEq(await tableOf("v3/vlen_bytes"), vlen, "v3 variable_length_bytes");
      assertEq(await tableOf("v2/object_vlen_bytes"), vlen, "v2 |O with vlen-bytes");
      // Fixed-width |S: what the API sends (up to the trailing NULs with a server that strips them).
      for (const p of ["v2/dtype_S5", "v3/dtype_ext_fixed_bytes", "v3/zep0007_binary_gzip"]) {
        const data = (await api(`/api/v1/slice/fx/${p}?format=json`)).body.data;
        const cells = await tableOf(p);
        assertEq(cells, data.map(pyBytes), p);
      }
      const s5 = await tableOf("v2/dtype_S5");
      assert(["b\"ab\"", "b\"ab\\x00\\x00\\x00\""].includes(s5[0]) && s5[1] === 'b"cdefg"', `|S5 cells: ${s5}`);
      await shot("desktop-bytes");
      // Strings stay strings.
      const utf8 = (await api("/api/v1/slice/fx/v2/object_vlen_utf8?format=json")).body.data;
      assertEq(await tableOf("v2/object_vlen_utf8"), utf8, "v2 |O with vlen-utf8");
    });

    await check("a mount root whose listing is too large (413) takes its members from ZOM", async () => {
      const undo = await lendMount("rootgrp", "demo", "v3.zarr");
      const re = /\/api\/v1\/list\/rootgrp\/?(\?.*)?$/;
      await fakeError(re, 413, "too_large", "the directory has more than 10000 entries");
      try {
        await withFakedStatus(413, async () => {
          await page.goto(base + "/");
          const kids = await expandTreeItem("rootgrp");
          assertEq(kids, ["rootgrp/names", "rootgrp/temperature", "rootgrp/volume"], "members of rootgrp");
        });
      } finally {
        await page.unroute(re);
        await undo();
      }
    });

    await check("a plane of more chunks than a preview reads shows its top-left corner (not a 413)", async () => {
      // demo/v3.zarr/temperature (chunks 10 x 10) made to look 200000 x 200000: the whole plane,
      // strided, would read a chunk per sample (over the server's chunk limit).
      const re = /\/api\/v1\/zom\/demo(\/v3\.zarr(\/temperature)?)?\/?(\?.*)?$/;
      const huge = (z) => { if (z && z.node_type === "array") z.shape = [200000, 200000]; return z; };
      await editJson(re, (z) => {
        if (/temperature/.test(JSON.stringify(z.chunk_grid || "")) || z.node_type === "array") return huge(z);
        const walk = (n) => { for (const [k, m] of Object.entries((n && n.members) || {})) { if (k === "temperature") huge(m); else walk(m); } };
        walk(z);
        return z;
      });
      try {
        await page.goto(base + "/#/demo/v3.zarr/temperature");
        await waitStage("[0:640,0:640]");
        const note = await page.locator(".note", { hasText: "top-left" }).first().innerText();
        assert(/top-left 640 × 640 of 200,000 × 200,000/.test(note), `note: ${note}`);
      } finally {
        await page.unroute(re);
        await page.goto("about:blank");
      }
    });

    await check("64-bit integers beyond 2^53 are shown exactly (fx/v3/dtype_uint64, dtype_int64)", async () => {
      await needFx();
      // The first row of each, as zarr-python reads them (tests/fixtures/expected/v3/*.npy).
      const u = await tableOf("v3/dtype_uint64");
      assertEq(u.slice(0, 3), ["0", "16881266741821394515", "9557562849825770989"], "uint64 row 0");
      const i = await tableOf("v3/dtype_int64");
      assertEq(i.slice(0, 3), ["-9223372036854775808", "382234064969960533", "3254082014222424740"], "int64 row 0");
    });

    await check("a view's state is in the URL: a link (and a reload) opens the view as it was", async () => {
      await page.goto(base + "/#/demo/v3.zarr/volume?at=3,0,0&cmap=viridis");
      await waitStage("[3,:,:]");
      assertEq(await page.locator("[data-testid=cmap]").inputValue(), "viridis", "colormap from the URL");
      const shown = await imageState("[3,:,:]");
      assert(shown.sameAsApi && shown.colored > 0, "the image is the API's viridis PNG of [3,:,:]");
      const slider = page.locator('input[type=range][data-dim="0"]');
      await slider.focus();
      await page.keyboard.press("ArrowRight");
      await waitStage("[4,:,:]");
      const hash = await page.evaluate(() => location.hash);
      assert(hash.startsWith("#/demo/v3.zarr/volume?") && hash.includes("at=4,0,0") && hash.includes("cmap=viridis"), `the URL follows the view: ${hash}`);
      await page.reload();
      await waitStage("[4,:,:]");
      assertEq(await page.locator("[data-testid=cmap]").inputValue(), "viridis", "colormap after a reload");
      // Another view, and dimensions swapped, from a link; state that does not fit is ignored.
      await page.goto(base + "/#/demo/v3.zarr/volume?view=table&rows=2&cols=1&at=5,0,0");
      await waitUntil(() => document.querySelector("[data-testid=table]")?.dataset.state === "ready", null, "the table", "[data-testid=table]");
      assertEq(await page.getAttribute("[data-testid=table]", "data-select"), "[5,0:20,0:100]", "the table's selection");
      assertEq(await page.locator("[data-testid=dim-rows]").inputValue(), "2", "rows dimension from the URL");
      // The table's page too.
      await page.locator("[data-testid=table] ~ .pager button", { hasText: "next" }).click();
      await waitUntil(() => document.querySelector("[data-testid=table]")?.dataset.select === "[5,0:20,100:128]", null, "the next page", "[data-testid=table]");
      assert((await page.evaluate(() => location.hash)).includes("off=100,0"), "the page is in the URL");
      await page.reload();
      await waitUntil(() => document.querySelector("[data-testid=table]")?.dataset.select === "[5,0:20,100:128]", null, "the page after a reload", "[data-testid=table]");
      // What does not fit the array is ignored, and leaves the URL.
      await page.goto(base + "/#/demo/v3.zarr/volume?view=nope&rows=9&at=99,x");
      await waitStage("[7,:,:]");
      assertEq(await page.evaluate(() => location.hash), "#/demo/v3.zarr/volume", "the URL without the state that did not fit");
      // A link to the node shown (its tree row) keeps the view, and adds no history entry.
      await page.goto(base + "/#/demo/v3.zarr/volume?at=2,0,0");
      await waitStage("[2,:,:]");
      const entries = await page.evaluate(() => history.length);
      await page.locator('#tree li[data-key="demo/v3.zarr/volume"] > .row a').click();
      await page.waitForTimeout(300);
      assertEq(await page.evaluate(() => location.hash), "#/demo/v3.zarr/volume?at=2,0,0", "the URL after clicking the node shown");
      assertEq(await page.evaluate(() => history.length), entries, "history entries");
      assertEq(await page.getAttribute("[data-testid=stage]", "data-select"), "[2,:,:]", "the plane shown");
      // A colour bar's ends are short (a phone's width) and exact in their title.
      assertEq(await page.evaluate(() => [boundText("-9223372036854775808"), boundText("247.13839721679688"), boundText("0.00001")]),
        ["-9.223e18", "247.138", "1e-5"], "colour bar labels");
    });

    await check("Icechunk mount: a version picker lists the default, branches, tags and snapshots (ice)", async () => {
      const x = await needIce();
      const served = (await api("/api/v1/versions/ice")).body;
      await page.goto(base + "/#/ice");
      await viewOf("ice", "");
      const picker = await versionPicker();
      assertEq(await picker.count(), 1, "controls labelled 'version'");
      assertEq(await picker.inputValue(), "", "the version shown (the default)");
      const opts = await page.$$eval("[data-testid=version] option", (os) => os.map((o) => ({ value: o.value, text: o.textContent, group: o.parentElement.label || "" })));
      assertEq([opts[0].value, opts[0].text], ["", `default (${served.default})`], "first option");
      // Every version of the fixture: branch.main, branch.dev, tag.v1 and each snapshot.
      assertEq(opts.slice(1).map((o) => o.value).sort(), Object.keys(x.versions).sort(), "versions listed");
      for (const o of opts.slice(1)) {
        const [kind, id] = [o.value.split(".")[0], o.value.slice(o.value.indexOf(".") + 1)];
        assertEq(o.group, { branch: "branches", tag: "tags", snapshot: "snapshots" }[kind], `group of ${o.value}`);
        if (kind !== "snapshot") { assertEq(o.text, o.value, `label of ${o.value}`); continue; }
        const snap = x.snapshots[id];
        assertEq(o.text, `${id.slice(0, 8)} · ${snap.written_at.slice(0, 16).replace("T", " ")} · ${snap.message}`, `label of ${o.value}`);
      }
      // The mount root offers the versions route; a mount of another kind has no picker.
      await page.locator('main .tabs [data-tab="curl"]').click();
      assert((await page.locator("main .snippet pre", { hasText: "/api/v1/versions/ice" }).count()) === 1, "the versions curl snippet");
      await shot("desktop-ice-versions");
      await page.setViewportSize({ width: 390, height: 844 });
      await noOverflow("ice at 390");
      await page.setViewportSize({ width: 1280, height: 800 });
      await page.goto(base + "/#/demo/v3.zarr");
      await viewOf("demo", "v3.zarr");
      assertEq(await page.locator("[data-testid=version]").count(), 0, "version pickers on demo");
    });

    await check("Icechunk mount: a picked version's hierarchy shows (ice: extra on branch.dev only, nested/counts not there)", async () => {
      const x = await needIce();
      const [main, dev, v1] = await Promise.all(["", "branch.dev", "tag.v1"].map((v) => iceSnapshot(x, v)));
      assert(iceMembers(dev, "").includes("extra") && !iceMembers(v1, "").includes("extra") && !iceMembers(dev, "nested").includes("counts"), "the fixture's versions");
      await page.goto("about:blank");
      await page.goto(base + "/#/ice");
      assertEq(await viewOf("ice", ""), iceMembers(main, ""), "members of ice (default)");
      assertEq(await expandTreeItem("ice"), iceMembers(main, "").map((n) => "ice/" + n), "tree of ice (default)");
      await (await versionPicker()).selectOption("branch.dev");
      await page.waitForFunction(() => location.hash === "#/ice@branch.dev");
      assertEq(await viewOf("ice@branch.dev", ""), iceMembers(dev, ""), "members of ice@branch.dev");
      assertEq(await expandTreeItem("ice@branch.dev"), iceMembers(dev, "").map((n) => "ice@branch.dev/" + n), "tree of ice@branch.dev");
      await shot("desktop-ice-dev");
      // Every API request of the page names the version picked.
      const asked = [];
      const onRequest = (r) => asked.push(new URL(r.url()).pathname);
      page.on("request", onRequest);
      try {
        await (await versionPicker()).selectOption("tag.v1");
        await page.waitForFunction(() => location.hash === "#/ice@tag.v1");
        assertEq(await viewOf("ice@tag.v1", ""), iceMembers(v1, ""), "members of ice@tag.v1");
        assertEq(await expandTreeItem("ice@tag.v1"), iceMembers(v1, "").map((n) => "ice@tag.v1/" + n), "tree of ice@tag.v1");
      } finally {
        page.off("request", onRequest);
      }
      const ice = asked.filter((u) => /^\/(api\/v1\/(list|zom|slice)|zarr)\/ice([@/]|%40|$)/.test(u));
      assert(ice.length && ice.every((u) => /^\/[a-z/0-9]+\/ice@tag\.v1(\/|$)/.test(u)), `requests for ice: ${ice.join(" ")}`);
      assertEq(await page.$$eval("#tree > li[role=treeitem]", (ls) => ls.map((l) => l.dataset.key).filter((k) => k.startsWith("ice"))), ["ice@tag.v1"], "ice in the tree");
      // A group of one version, then of another: the path stays, its members are the version's.
      await page.goto(base + "/#/ice@branch.dev/nested");
      assertEq(await viewOf("ice@branch.dev", "nested"), iceMembers(dev, "nested"), "members of nested on branch.dev");
      await (await versionPicker()).selectOption("tag.v1");
      await page.waitForFunction(() => location.hash === "#/ice@tag.v1/nested");
      assertEq(await viewOf("ice@tag.v1", "nested"), iceMembers(v1, "nested"), "members of nested on tag.v1");
      assertEq(await expandTreeItem("ice@tag.v1/nested"), iceMembers(v1, "nested").map((n) => "ice@tag.v1/nested/" + n), "tree of nested on tag.v1");
    });

    await check("Icechunk mount: the version is in the URL, a reload keeps it, the table shows its values (ice@tag.v1)", async () => {
      const x = await needIce();
      const [main, v1] = await Promise.all(["", "tag.v1"].map((v) => iceSnapshot(x, v)));
      const small = v1.arrays["/small"].values.map(String);
      await page.goto("about:blank");
      await page.goto(base + "/#/ice@tag.v1/small?view=table");
      assertEq(await tableCells("ice@tag.v1/small"), small, "small at tag.v1");
      assertEq(await (await versionPicker()).inputValue(), "tag.v1", "the version shown");
      assertEq(await page.locator("[data-testid=raw-url]").first().innerText(), base + "/zarr/ice@tag.v1/small", "raw-key URL");
      await page.locator('#access .tabs [data-tab="curl"]').click();
      assert((await page.locator("[data-testid=curl]").innerText()).includes(`${base}/api/v1/slice/ice@tag.v1/small?select=[0:5]&format=json`), "curl command of the slice");
      await page.reload();
      assertEq(await tableCells("ice@tag.v1/small"), small, "small at tag.v1 after a reload");
      assertEq(await (await versionPicker()).inputValue(), "tag.v1", "the version shown after a reload");
      await page.locator('#tree li[data-key="ice@tag.v1/small"] > .row.selected').waitFor();
      // Values that differ between versions (commit 2 added 100 to temperature[0]); the view stays.
      const plane = (snap) => snap.arrays["/temperature"].values.slice(0, 48).map(String);
      assert(plane(v1).join() !== plane(main).join(), "the fixture's temperature[0] differs between tag.v1 and the default");
      await page.goto(base + "/#/ice@tag.v1/temperature?view=table&at=0,0,0");
      assertEq(await tableCells("ice@tag.v1/temperature"), plane(v1), "temperature[0] at tag.v1");
      await shot("desktop-ice-v1-table");
      await (await versionPicker()).selectOption({ index: 0 });
      await page.waitForFunction(() => location.hash === "#/ice/temperature?view=table&at=0,0,0");
      assertEq(await tableCells("ice/temperature"), plane(main), "temperature[0] at the default version");
      // A link with the "@" percent-encoded opens the same version.
      await page.goto("about:blank");
      await page.goto(base + "/#/ice%40tag.v1/small?view=table");
      assertEq(await tableCells("ice@tag.v1/small"), small, "small at ice%40tag.v1");
      assertEq(await (await versionPicker()).inputValue(), "tag.v1", "the version shown for ice%40tag.v1");
    });

    await check("no script errors", async () => {
      const errs = browser.pageErrors;
      const consoleErrs = browser.consoleMessages.filter((m) => m.type === "error" && !/Failed to load resource: the server responded with a status of (400|404)/.test(m.text));
      assert(!errs.length && !consoleErrs.length, `page errors: ${errs.concat(consoleErrs.map((m) => m.text)).join(" | ").slice(0, 500)}`);
    });
  } finally {
    await browser.close();
    if (devServer) await devServer.close();
  }
}

main()
  .catch((e) => {
    console.log(`FAIL setup: ${e && e.message ? e.message : e}`);
    results.push({ name: "setup", ok: false });
  })
  .finally(() => {
    const passed = results.filter((r) => r.ok && !r.skipped).length;
    const skipped = results.filter((r) => r.skipped).length;
    const failed = results.length - passed - skipped;
    console.log(`screenshots: ${SHOTS}`);
    console.log(`webpage: ${passed} passed, ${failed} failed, ${skipped} skipped`);
    process.exit(failed || !passed ? 1 : 0);
  });
