#!/usr/bin/env bash
# Prints the path of the zarrgate binary the process suites run: $ZARRGATE_BIN when set (which
# must be executable), else target/release/zarrgate (under $CARGO_TARGET_DIR), built first.
# Run from the repository root; exits non-zero, saying why on stderr, when there is none.
set -uo pipefail
if [ -n "${ZARRGATE_BIN:-}" ]; then
  [ -x "$ZARRGATE_BIN" ] || { echo "ZARRGATE_BIN=$ZARRGATE_BIN is not an executable file" >&2; exit 1; }
  bin="$ZARRGATE_BIN"
else
  cargo build --release --bin zarrgate >&2 || { echo "cargo build --release failed" >&2; exit 1; }
  bin="${CARGO_TARGET_DIR:-target}/release/zarrgate"
fi
case "$bin" in /*) ;; *) bin="$PWD/$bin" ;; esac
echo "$bin"
