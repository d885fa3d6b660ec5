"use strict";
// Bundle a browser entry module with esbuild and write an index.html that loads it.
//
//   const { buildPage } = require("./lib/bundle.cjs");
//   await buildPage({ entry: "page.js", outdir: "/tmp/x", title: "..." });
//   // -> /tmp/x/page.bundle.js and /tmp/x/index.html (serve outdir with startStaticServer)
//
// Bare imports (e.g. "zarrita") resolve from NODE_PATH, i.e. the cached node_modules that
// setup.sh prints; nothing is installed into the repo.

const fs = require("fs");
const path = require("path");

async function buildPage({ entry, outdir, title = "zarrgate browser test", bundleName = "page.bundle.js" }) {
  const esbuild = require("esbuild");
  const nodePaths = (process.env.NODE_PATH || "").split(path.delimiter).filter(Boolean);
  await esbuild.build({
    entryPoints: [entry],
    bundle: true,
    format: "esm",
    platform: "browser",
    target: "chrome120",
    outfile: path.join(outdir, bundleName),
    nodePaths,
    logLevel: "warning",
    legalComments: "none",
  });
  fs.writeFileSync(
    path.join(outdir, "index.html"),
    `<!doctype html>\n<html><head><meta charset="utf-8"><title>${title}</title></head>\n` +
      `<body><h1>${title}</h1><script type="module" src="/${bundleName}"></script></body></html>\n`,
  );
  return { bundle: path.join(outdir, bundleName), html: path.join(outdir, "index.html") };
}

module.exports = { buildPage };
