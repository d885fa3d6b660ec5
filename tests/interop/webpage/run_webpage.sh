#!/usr/bin/env bash
# Usage: tests/interop/webpage/run_webpage.sh [--dev] URL
#
# Browser test of zarrgate's web page (static/index.html) in headless Debian Chromium driven by
# playwright-core (see run_webpage.cjs for what it checks). The server must have the `demo` mount
# and `fx` (tests/fixtures/data), as tests/interop/run.sh mounts them; the Icechunk checks need
# `ice` (tests/fixtures/icechunk/repo) and are skipped without it.
#
#   run_webpage.sh http://127.0.0.1:8080         the page served by zarrgate itself at URL/ (CI)
#   run_webpage.sh --dev http://127.0.0.1:8080   serve the working copy of static/index.html from a
#                                                127.0.0.1 dev server (dev-server.cjs) that proxies
#                                                /api, /zarr, /metrics, /healthz to the zarrgate at URL
#                                                (no rebuild needed after editing the page)
#
# Chromium and the pinned npm packages come from tests/interop/browser/setup.sh (a cache dir outside
# the repo). Screenshots: target/webpage-screenshots/. The LAST line of output is
# `webpage: N passed, N failed, N skipped`; the exit code is non-zero on any failure.
set -uo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
args=("$@")
# The URL is the last argument, else $ZARRGATE_URL (indexing an empty array by -1 is an error).
if [ "$#" -gt 0 ]; then url="${args[$#-1]}"; else url="${ZARRGATE_URL:-}"; fi
if [ -z "$url" ]; then
  echo "usage: $0 [--dev] http://127.0.0.1:PORT" >&2
  echo "webpage: 0 passed, 1 failed, 0 skipped"
  exit 2
fi
if [ "$#" -eq 0 ]; then args=("$url"); fi

if ! node_modules="$("$here/../browser/setup.sh")" || [ ! -d "$node_modules" ]; then
  echo "webpage: tests/interop/browser/setup.sh failed (chromium or npm packages could not be installed)"
  echo "webpage: 0 passed, 1 failed, 0 skipped"
  exit 1
fi

export NODE_PATH="$node_modules"
export PLAYWRIGHT_SKIP_BROWSER_DOWNLOAD=1
export ZARRGATE_REPO="${ZARRGATE_REPO:-$(cd "$here/../../.." && pwd)}"
timeout -k 10 240 node "$here/run_webpage.cjs" "${args[@]}"
status=$?
if [ "$status" -eq 124 ] || [ "$status" -eq 137 ]; then
  echo "webpage: timed out"
  echo "webpage: 0 passed, 1 failed, 0 skipped"
fi
exit "$status"
