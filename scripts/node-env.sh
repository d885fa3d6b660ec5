#!/usr/bin/env bash
# Usage: scripts/node-env.sh DIR
#
# Installs (idempotently) the npm packages pinned by DIR/package.json and DIR/package-lock.json
# (`npm ci`) into
#   ${ZARRGATE_CACHE:-$HOME/.cache/zarrgate}/node/<sha256 of the node version and the lock file>
# and prints its node_modules directory on stdout (all other output goes to stderr). A stamp
# file marks a complete install; nothing is written to the repository.
#
# Example:
#   NODE_PATH="$(scripts/node-env.sh tests/remote/azurite)" node ...
set -euo pipefail

if [ "$#" -ne 1 ] || [ ! -f "$1/package.json" ] || [ ! -f "$1/package-lock.json" ]; then
    echo "usage: $0 DIR (holding package.json and package-lock.json)" >&2
    exit 2
fi
command -v node >/dev/null 2>&1 || { echo "node-env: node is missing" >&2; exit 1; }
command -v npm >/dev/null 2>&1 || { echo "node-env: npm is missing" >&2; exit 1; }
cache="${ZARRGATE_CACHE:-$HOME/.cache/zarrgate}"
hash="$( { node --version; cat "$1/package-lock.json"; } | sha256sum | cut -c1-16)"
dir="$cache/node/$hash"
stamp="$dir/.complete"
if [ ! -f "$stamp" ] || [ ! -d "$dir/node_modules" ]; then
    echo "node-env: npm ci into $dir" >&2
    rm -rf "$dir"
    mkdir -p "$dir"
    cp "$1/package.json" "$1/package-lock.json" "$dir/"
    (cd "$dir" && npm ci --no-audit --no-fund --loglevel=error >&2)
    touch "$stamp"
fi
echo "$dir/node_modules"
