"use strict";
// Reuse entry point for browser tests of zarrgate (see ../README.md, "Reusing lib/").
//
//   nm="$(tests/interop/browser/setup.sh)"          # chromium + cached node_modules
//   NODE_PATH="$nm" node my_test.cjs http://127.0.0.1:PORT
//
//   // my_test.cjs
//   const { withBrowser, recordNetwork } = require("./tests/interop/browser/lib/index.cjs");
//   await withBrowser(async ({ page, pageErrors }) => {
//     const net = await recordNetwork(page, { disableCache: true });
//     await page.goto(`${url}/`);                     // zarrgate's own web page
//     await page.screenshot({ path: "/tmp/ui.png" });
//     if (net.failures(url).length || pageErrors.length) process.exitCode = 1;
//   });

const { launchChromium, recordNetwork, CHROMIUM_ARGS } = require("./chromium.cjs");
const { startStaticServer } = require("./static-server.cjs");
const { buildPage } = require("./bundle.cjs");
const { parseNpy } = require("./npy.cjs");
const compare = require("./compare.cjs");

/** Launch Chromium, run `fn(browser)`, and always close it (and delete its profile). */
async function withBrowser(fn, opts) {
  const browser = await launchChromium(opts);
  try {
    return await fn(browser);
  } finally {
    await browser.close();
  }
}

module.exports = { launchChromium, recordNetwork, withBrowser, startStaticServer, buildPage, parseNpy, compare, CHROMIUM_ARGS };
