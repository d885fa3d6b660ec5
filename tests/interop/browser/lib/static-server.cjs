"use strict";
// A tiny static file server for browser tests, bound to 127.0.0.1 only.
//
//   const { startStaticServer } = require("./lib/static-server.cjs");
//   const srv = await startStaticServer({ root: "/some/dir" });       // port 0 = any free port
//   // srv.url -> "http://127.0.0.1:PORT"; srv.requests -> [{method, url, status}]
//   await srv.close();
//
// Serves files under `root` (no directory listings; `.../` -> `.../index.html`) and, optionally, in-memory
// `files` ({"/path": Buffer|string}) that take precedence. Sends `Cache-Control: no-store`.
// Because it listens on a different port than zarrgate, pages it serves make cross-origin requests
// to zarrgate, which is what the CORS checks rely on.

const fs = require("fs");
const http = require("http");
const path = require("path");

const TYPES = {
  ".html": "text/html; charset=utf-8",
  ".js": "text/javascript; charset=utf-8",
  ".mjs": "text/javascript; charset=utf-8",
  ".cjs": "text/javascript; charset=utf-8",
  ".css": "text/css; charset=utf-8",
  ".json": "application/json",
  ".map": "application/json",
  ".wasm": "application/wasm",
  ".png": "image/png",
  ".svg": "image/svg+xml",
  ".txt": "text/plain; charset=utf-8",
};

function startStaticServer({ root, files = {}, host = "127.0.0.1", port = 0 } = {}) {
  if (host !== "127.0.0.1" && host !== "localhost" && host !== "::1") {
    throw new Error("static server: refusing to bind anything but loopback");
  }
  const absRoot = root ? path.resolve(root) : null;
  const requests = [];
  const server = http.createServer((req, res) => {
    const send = (status, body, type) => {
      requests.push({ method: req.method, url: req.url, status });
      res.writeHead(status, {
        "Content-Type": type || "text/plain; charset=utf-8",
        "Content-Length": Buffer.byteLength(body),
        "Cache-Control": "no-store",
      });
      res.end(req.method === "HEAD" ? undefined : body);
    };
    if (req.method !== "GET" && req.method !== "HEAD") return send(405, "method not allowed");
    let pathname;
    try {
      pathname = decodeURIComponent(new URL(req.url, "http://x").pathname);
    } catch {
      return send(400, "bad path");
    }
    if (pathname.endsWith("/")) pathname += "index.html";
    if (Object.prototype.hasOwnProperty.call(files, pathname)) {
      return send(200, Buffer.from(files[pathname]), TYPES[path.extname(pathname)]);
    }
    if (!absRoot || pathname.includes("\0")) return send(404, "not found");
    const file = path.resolve(absRoot, "." + pathname);
    if (file !== absRoot && !file.startsWith(absRoot + path.sep)) return send(404, "not found");
    fs.readFile(file, (err, body) => {
      if (err) return send(404, "not found");
      send(200, body, TYPES[path.extname(file)] || "application/octet-stream");
    });
  });
  return new Promise((resolve, reject) => {
    server.once("error", reject);
    server.listen(port, host, () => {
      const { port: actual } = server.address();
      resolve({
        url: `http://${host === "::1" ? "[::1]" : host}:${actual}`,
        port: actual,
        requests,
        server,
        close: () =>
          new Promise((r) => {
            server.closeAllConnections?.();
            server.close(() => r());
          }),
      });
    });
  });
}

module.exports = { startStaticServer };
