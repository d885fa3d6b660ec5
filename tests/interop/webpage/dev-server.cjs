"use strict";
// Development server for the web page (static/index.html) without rebuilding zarrgate.
//
//   node tests/interop/webpage/dev-server.cjs http://127.0.0.1:8080 [--port 8081] [--page FILE]
//
// Serves the working copy of the page at `/` (read from disk on every request, so an edit shows
// on reload) and proxies /api/, /zarr/, /metrics and /healthz to the zarrgate at the given URL,
// so the page sees the same origin layout as when zarrgate serves it itself. Binds 127.0.0.1
// only. Prints `dev-server: http://127.0.0.1:PORT` on stdout once it listens.
//
// run_webpage.sh --dev uses startDevServer() from here.

const fs = require("fs");
const http = require("http");
const path = require("path");

const REPO = path.resolve(__dirname, "..", "..", "..");
const PROXIED = /^\/(api\/|zarr(\/|$)|metrics$|healthz$)/;

function startDevServer({ upstream, page = path.join(REPO, "static", "index.html"), port = 0 } = {}) {
  const up = new URL(upstream);
  if (up.protocol !== "http:") throw new Error(`dev-server: upstream must be http:// (got ${upstream})`);
  const requests = [];
  const server = http.createServer((req, res) => {
    const pathname = req.url.split("?")[0];
    if (pathname === "/" || pathname === "/index.html") {
      requests.push({ method: req.method, url: req.url, status: 200 });
      let body;
      try {
        body = fs.readFileSync(page);
      } catch (e) {
        res.writeHead(500, { "Content-Type": "text/plain; charset=utf-8" });
        return res.end(`cannot read ${page}: ${e.message}`);
      }
      res.writeHead(200, { "Content-Type": "text/html; charset=utf-8", "Cache-Control": "no-store", "Content-Length": body.length });
      return res.end(req.method === "HEAD" ? undefined : body);
    }
    if (!PROXIED.test(pathname)) {
      requests.push({ method: req.method, url: req.url, status: 404 });
      res.writeHead(404, { "Content-Type": "application/json" });
      return res.end(JSON.stringify({ error: { code: "not_found", message: "dev-server: not proxied" } }));
    }
    const headers = { ...req.headers, host: up.host };
    const preq = http.request(
      { hostname: up.hostname, port: up.port || 80, method: req.method, path: req.url, headers },
      (pres) => {
        requests.push({ method: req.method, url: req.url, status: pres.statusCode });
        res.writeHead(pres.statusCode, pres.statusMessage, pres.headers);
        pres.pipe(res);
      },
    );
    preq.on("error", (e) => {
      requests.push({ method: req.method, url: req.url, status: 502 });
      if (!res.headersSent) res.writeHead(502, { "Content-Type": "application/json" });
      res.end(JSON.stringify({ error: { code: "upstream", message: `dev-server: zarrgate at ${upstream} unreachable (${e.code || e.message})` } }));
    });
    req.pipe(preq);
  });
  return new Promise((resolve, reject) => {
    server.once("error", reject);
    server.listen(port, "127.0.0.1", () => {
      const url = `http://127.0.0.1:${server.address().port}`;
      resolve({
        url,
        requests,
        close: () => new Promise((r) => { server.closeAllConnections?.(); server.close(() => r()); }),
      });
    });
  });
}

module.exports = { startDevServer };

if (require.main === module) {
  const args = process.argv.slice(2);
  let upstream = null, port = 0, page;
  for (let i = 0; i < args.length; i++) {
    if (args[i] === "--port") port = Number(args[++i]);
    else if (args[i] === "--page") page = path.resolve(args[++i]);
    else upstream = args[i];
  }
  if (!upstream) {
    console.error("usage: node dev-server.cjs ZARRGATE_URL [--port N] [--page FILE]");
    process.exit(2);
  }
  startDevServer({ upstream, port, page }).then((s) => {
    console.log(`dev-server: ${s.url}  (page ${page || "static/index.html"}, proxy -> ${upstream})`);
    const stop = () => s.close().then(() => process.exit(0));
    process.on("SIGINT", stop);
    process.on("SIGTERM", stop);
  }, (e) => { console.error(e.message); process.exit(1); });
}
