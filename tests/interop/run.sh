#!/usr/bin/env bash
# Interop suite: real Zarr clients read from a running zarrgate.
#
# Builds the release binary, serves the demo, the repo's fixtures and (when present)
# ../shared/fixtures/zarrita on 127.0.0.1, runs the Python suites against it, stops the server
# by PID, and ends with one line "N passed, N failed". Everything it needs is installed by
# scripts/python-env.sh into ${ZARRGATE_CACHE:-~/.cache/zarrgate}, outside the repo.
set -uo pipefail
cd "$(dirname "$0")/../.."
repo="$PWD"
work="$(mktemp -d)"
server_pid=""
cleanup() {
  if [ -n "$server_pid" ]; then kill "$server_pid" 2>/dev/null; wait "$server_pid" 2>/dev/null; fi
  rm -rf "$work"
}
trap cleanup EXIT

venv="$(scripts/python-env.sh interop tests/interop/requirements.txt)" || {
  echo "interop: could not install the Python clients"; echo "0 passed, 1 failed"; exit 1; }

cargo build --release --bin zarrgate || { echo "0 passed, 1 failed"; exit 1; }

port="$("$venv/bin/python" -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])')"
mounts=(--mount "fx=$repo/tests/fixtures/data")
zarrita="$repo/../shared/fixtures/zarrita"
if [ -d "$zarrita" ]; then
  mounts+=(--mount "zarrita=$zarrita")
else
  echo "interop: ../shared/fixtures/zarrita absent, its cases are skipped"
fi
ZARRGATE_LOG=info target/release/zarrgate serve --config config.toml --bind "127.0.0.1:$port" "${mounts[@]}" \
  >"$work/server.out" 2>"$work/access.log" &
server_pid=$!
for _ in $(seq 1 100); do
  curl -fs "http://127.0.0.1:$port/healthz" >/dev/null 2>&1 && break
  sleep 0.1
done

export ZARRGATE_URL="http://127.0.0.1:$port"
export ZARRGATE_REPO="$repo"
export ZARRGATE_ACCESS_LOG="$work/access.log"
"$venv/bin/python" -m pytest -q -p no:cacheprovider --junitxml="$work/junit.xml" tests/interop
status=$?

kill "$server_pid" 2>/dev/null; wait "$server_pid" 2>/dev/null; server_pid=""
"$venv/bin/python" - "$work/junit.xml" "$status" <<'PY'
import sys, xml.etree.ElementTree as ET
try:
    root = ET.parse(sys.argv[1]).getroot()
    suites = [root] if root.tag == "testsuite" else list(root)
    total = sum(int(s.get("tests", 0)) for s in suites)
    failed = sum(int(s.get("failures", 0)) + int(s.get("errors", 0)) for s in suites)
    skipped = sum(int(s.get("skipped", 0)) for s in suites)
except Exception as e:  # no report: pytest itself failed
    print(f"interop: no test report ({e})")
    total, failed, skipped = 1, 1, 0
if int(sys.argv[2]) not in (0, 1) and failed == 0:
    failed = 1
print(f"{total - failed - skipped} passed, {failed} failed, {skipped} skipped")
PY
[ "$status" -eq 0 ]
