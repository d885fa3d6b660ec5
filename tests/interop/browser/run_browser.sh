#!/usr/bin/env bash
# Usage: tests/interop/browser/run_browser.sh ZARRGATE_URL
#
# Browser half of the interop suite: zarrita.js in headless Chromium reads a running zarrgate
# cross-origin (see README.md here). The server must already serve the mounts `fx`
# (tests/fixtures/data), `zarrita` (../shared/fixtures/zarrita, optional) and `demo`.
# Installs what it needs (setup.sh: Debian chromium, npm packages into a cache outside the repo),
# then runs run_browser.cjs. The LAST line of output is `browser: N passed, N failed, N skipped`;
# the exit code is non-zero on any failure.
#
# ZARRGATE_NEUROGLANCER=1 (run.sh sets it unless it is set already) adds the neuroglancer cases
# (neuroglancer.cjs): their venv (requirements-neuroglancer.txt) is made here with
# scripts/python-env.sh; when it cannot be installed the cases are SKIPPED with the reason.
set -uo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
url="${1:-${ZARRGATE_URL:-}}"
if [ -z "$url" ]; then
  echo "usage: $0 http://127.0.0.1:PORT" >&2
  echo "browser: 0 passed, 1 failed, 0 skipped"
  exit 2
fi

if ! node_modules="$("$here/setup.sh")" || [ ! -d "$node_modules" ]; then
  echo "browser: setup.sh failed (chromium or npm packages could not be installed)"
  echo "browser: 0 passed, 1 failed, 0 skipped"
  exit 1
fi

export NODE_PATH="$node_modules"
export PLAYWRIGHT_SKIP_BROWSER_DOWNLOAD=1
export ZARRGATE_REPO="${ZARRGATE_REPO:-$(cd "$here/../../.." && pwd)}"

unset ZARRGATE_NEUROGLANCER_PYTHON
if [ "${ZARRGATE_NEUROGLANCER:-0}" = "1" ]; then
  ng_req="$here/requirements-neuroglancer.txt"
  ng_version="$(sed -n 's/^neuroglancer==//p' "$ng_req")"
  if ng_venv="$(timeout 600 "$ZARRGATE_REPO/scripts/python-env.sh" interop-neuroglancer "$ng_req")" \
      && [ -x "$ng_venv/bin/python" ]; then
    export ZARRGATE_NEUROGLANCER_PYTHON="$ng_venv/bin/python"
  else
    export ZARRGATE_NEUROGLANCER_SKIP="neuroglancer==$ng_version could not be installed (scripts/python-env.sh interop-neuroglancer; see its output above)"
    echo "browser: $ZARRGATE_NEUROGLANCER_SKIP"
  fi
else
  export ZARRGATE_NEUROGLANCER_SKIP="not enabled: set ZARRGATE_NEUROGLANCER=1 (run.sh does by default)"
fi
# Hard stop well under the 5-minute target even if Chromium hangs; the driver has its own budget.
timeout -k 10 290 node "$here/run_browser.cjs" "$url"
status=$?
if [ "$status" -eq 124 ] || [ "$status" -eq 137 ]; then
  echo "browser: timed out"
  echo "browser: 0 passed, 1 failed, 0 skipped"
fi
exit "$status"
