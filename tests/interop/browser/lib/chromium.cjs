"use strict";
// Headless Chromium (Debian's /usr/bin/chromium) driven by playwright-core, plus a CDP network
// recorder. Reusable by any browser test of zarrgate (e.g. the web page at `/`).
//
//   const { launchChromium, recordNetwork } = require("./lib/chromium.cjs");
//   const browser = await launchChromium();          // fresh --user-data-dir, no browser download
//   const page = browser.page;
//   const net = await recordNetwork(page, { disableCache: true });
//   await page.goto("http://127.0.0.1:PORT/");
//   ...
//   const bad = net.failures("http://127.0.0.1:ZARRGATE_PORT");   // CORS / network failures
//   await browser.close();                           // also deletes the profile dir
//
// playwright-core is resolved through NODE_PATH (set by run_browser.sh to the cached
// node_modules that setup.sh prints).

const fs = require("fs");
const os = require("os");
const path = require("path");

const CHROMIUM_ARGS = [
  "--headless",
  "--no-sandbox",
  "--disable-gpu",
  "--disable-quic",
  "--no-first-run",
  "--disable-background-networking",
  "--disable-component-update",
  "--disable-sync",
];

/**
 * Launch headless Chromium with a fresh profile. Returns {context, page, userDataDir, close}.
 * Options: executablePath (default $ZARRGATE_CHROMIUM or /usr/bin/chromium), extraArgs, timeoutMs.
 */
async function launchChromium({ executablePath, extraArgs = [], timeoutMs = 60000 } = {}) {
  const { chromium } = require("playwright-core");
  const exe = executablePath || process.env.ZARRGATE_CHROMIUM || "/usr/bin/chromium";
  if (!fs.existsSync(exe)) throw new Error(`chromium not found at ${exe} (run setup.sh)`);
  const userDataDir = fs.mkdtempSync(path.join(os.tmpdir(), "zarrgate-chromium-"));
  let context;
  try {
    context = await chromium.launchPersistentContext(userDataDir, {
      executablePath: exe,
      headless: true,
      args: [...CHROMIUM_ARGS, ...extraArgs],
      timeout: timeoutMs,
      viewport: { width: 1280, height: 800 },
    });
  } catch (e) {
    fs.rmSync(userDataDir, { recursive: true, force: true });
    throw e;
  }
  const page = context.pages()[0] || (await context.newPage());
  const consoleMessages = [];
  const pageErrors = [];
  page.on("console", (m) => consoleMessages.push({ type: m.type(), text: m.text() }));
  page.on("pageerror", (e) => pageErrors.push(String(e && e.stack ? e.stack : e)));
  let closed = false;
  return {
    context,
    page,
    userDataDir,
    consoleMessages,
    pageErrors,
    version: () => context.browser()?.version() ?? null,
    async close() {
      if (closed) return;
      closed = true;
      try {
        await context.close();
      } finally {
        fs.rmSync(userDataDir, { recursive: true, force: true });
      }
    },
  };
}

/**
 * Record every network request of `page` through the DevTools protocol (so CORS errors keep
 * their reason, which playwright's own events drop). With disableCache, the HTTP cache is off
 * (Network.setCacheDisabled) so every read reaches the server.
 *
 * Returns { requests: Map(requestId -> record), forOrigin(origin), failures(origin), detach() }.
 * A record: {url, method, requestHeaders, type, status, statusText, responseHeaders,
 *            failed, errorText, corsError, blockedReason, canceled}
 */
async function recordNetwork(page, { disableCache = true } = {}) {
  const cdp = await page.context().newCDPSession(page);
  const requests = new Map();
  const rec = (id) => {
    if (!requests.has(id)) requests.set(id, { requestId: id });
    return requests.get(id);
  };
  cdp.on("Network.requestWillBeSent", (e) => {
    const r = rec(e.requestId);
    // A redirect reuses the requestId; keep the last hop.
    Object.assign(r, {
      url: e.request.url,
      method: e.request.method,
      requestHeaders: e.request.headers,
      type: e.type,
    });
  });
  cdp.on("Network.responseReceived", (e) => {
    const r = rec(e.requestId);
    Object.assign(r, {
      status: e.response.status,
      statusText: e.response.statusText,
      responseHeaders: lowerKeys(e.response.headers),
      fromDiskCache: !!e.response.fromDiskCache,
    });
  });
  cdp.on("Network.loadingFailed", (e) => {
    const r = rec(e.requestId);
    Object.assign(r, {
      failed: true,
      errorText: e.errorText,
      canceled: !!e.canceled,
      corsError: e.corsErrorStatus ? e.corsErrorStatus.corsError : undefined,
      blockedReason: e.blockedReason,
    });
  });
  cdp.on("Network.loadingFinished", (e) => {
    rec(e.requestId).finished = true;
  });
  await cdp.send("Network.enable");
  if (disableCache) await cdp.send("Network.setCacheDisabled", { cacheDisabled: true });
  const forOrigin = (origin) => [...requests.values()].filter((r) => r.url && r.url.startsWith(origin + "/"));
  return {
    cdp,
    requests,
    forOrigin,
    /** Requests to `origin` that the browser did not complete (CORS errors included). */
    failures: (origin) => forOrigin(origin).filter((r) => r.failed && !r.canceled),
    async detach() {
      await cdp.detach().catch(() => {});
    },
  };
}

function lowerKeys(h) {
  const out = {};
  for (const [k, v] of Object.entries(h || {})) out[k.toLowerCase()] = v;
  return out;
}

module.exports = { launchChromium, recordNetwork, CHROMIUM_ARGS };
