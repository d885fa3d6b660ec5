#!/usr/bin/env bash
# Usage: tests/interop/browser/setup.sh
#
# Idempotent installer for the browser interop suite. Prints ONE line on stdout: the
# node_modules directory to use (everything else goes to stderr).
#
# 1. Chromium from Debian (`apt-get install -y chromium`) when /usr/bin/chromium is missing;
#    `apt-get update` runs first only when the package is not known to apt yet (or the first
#    install attempt fails). Playwright never downloads a browser here.
# 2. The npm packages pinned in package.json + package-lock.json, by scripts/node-env.sh (`npm ci`
#    into a cache directory outside the repo, reused between runs).
# (The neuroglancer cases' Python venv is made by run_browser.sh, so that a failed install skips
# those cases instead of failing the suite.)
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
export PLAYWRIGHT_SKIP_BROWSER_DOWNLOAD=1

log() { echo "browser-setup: $*" >&2; }

# --- Chromium -------------------------------------------------------------------------
chromium="${ZARRGATE_CHROMIUM:-/usr/bin/chromium}"
if [ ! -x "$chromium" ]; then
  if ! command -v apt-get >/dev/null 2>&1; then
    log "$chromium missing and no apt-get to install it"; exit 1
  fi
  sudo=""
  if [ "$(id -u)" -ne 0 ]; then sudo="sudo"; fi
  export DEBIAN_FRONTEND=noninteractive
  if ! apt-cache show chromium >/dev/null 2>&1; then
    log "apt-get update"; $sudo apt-get update -qq >&2
  fi
  log "installing chromium"
  if ! $sudo apt-get install -y -qq chromium >&2; then
    log "install failed; apt-get update and retry"
    $sudo apt-get update -qq >&2
    $sudo apt-get install -y -qq chromium >&2
  fi
  [ -x "$chromium" ] || { log "chromium still missing at $chromium"; exit 1; }
fi

# --- npm packages ---------------------------------------------------------------------
exec "$here/../../../scripts/node-env.sh" "$here"
