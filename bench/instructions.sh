#!/usr/bin/env bash
# User-space instructions a request (callgrind), for a warm request repeated: the one measure of
# per-request work that this shared 2-core VM does not blur (requests/s move by 1.5x between
# runs of the same binary; instruction counts by well under 1%).
#
#   bench/instructions.sh                # the suite's 16 KiB tile (needs the bench data)
#   bench/instructions.sh PATH?QUERY     # any GET served by the same config (mount `bench`)
#
# Without the bench data (bench/make_datasets.py, made by bench/run.sh), the default request is
# a 32x32 tile of the demo's sharded `volume` (mount `demo`), whose counts are not comparable
# with the tile's.
#
# Environment:
#   ZARRGATE_BIN       the binary (default: the release build, built if missing)
#   CARGO_TARGET_DIR   where the release binary is built (default: target)
#   ZARRGATE_CACHE     where the bench data is (default: ~/.cache/zarrgate; data in bench-data/)
#   INSTR_SECONDS      seconds measured (default 5), after 3 s of warm-up
#   INSTR_TOP          also list this many functions by their own instructions a request
#
# Under valgrind 3.19 (Debian 12) `openat2` is an unknown system call, so local files are read
# by the blocking path (the pool, `realpath`), never by the one that does not wait
# (src/store/nowait.rs): counts for raw keys or cold reads are of that path, not of what the
# server does outside valgrind. A warm slice touches no file, so its count is the server's.
#
# It prints the requests counted and the instructions a request (all threads of the server,
# warm-up excluded: callgrind's counters are zeroed after it). Load: wrk, one thread, four
# connections. valgrind and wrk are installed with apt-get when missing. Everything listens on
# 127.0.0.1; the server is stopped by its PID on exit.
set -euo pipefail
REPO="$(cd "$(dirname "$0")/.." && pwd)"
cd "$REPO"
CACHE="${ZARRGATE_CACHE:-$HOME/.cache/zarrgate}"
DATA="$CACHE/bench-data"
TARGET="${CARGO_TARGET_DIR:-$REPO/target}"
SECONDS_MEASURED="${INSTR_SECONDS:-5}"
TOP="${INSTR_TOP:-0}"
WORK="$(mktemp -d /tmp/zarrgate-instr.XXXXXX)"
VG_PID=""
cleanup() {
    if [ -n "$VG_PID" ]; then kill "$VG_PID" 2>/dev/null && wait "$VG_PID" 2>/dev/null || true; fi
    rm -rf "$WORK"
}
trap cleanup EXIT

need_apt=()
command -v valgrind >/dev/null || need_apt+=(valgrind)
command -v callgrind_annotate >/dev/null || need_apt+=(valgrind)
command -v wrk >/dev/null || need_apt+=(wrk)
command -v curl >/dev/null || need_apt+=(curl)
if [ "${#need_apt[@]}" -gt 0 ]; then
    echo "instructions.sh: installing ${need_apt[*]} with apt-get" >&2
    apt-get update -qq >&2
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "${need_apt[@]}" >&2
fi

BIN="${ZARRGATE_BIN:-$TARGET/release/zarrgate}"
if [ -z "${ZARRGATE_BIN:-}" ] && [ ! -x "$BIN" ]; then
    CARGO_TARGET_DIR="$TARGET" cargo build --release --quiet
fi

PORT="$(python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])')"
if [ -d "$DATA/issue9/sharded.zarr" ]; then
    MOUNT="[mounts.bench]
url = \"$DATA\""
    DEFAULT="/api/v1/slice/bench/issue9/sharded.zarr?select=520:584,520:584&format=bin"
else
    MOUNT="[mounts.demo]
url = \"$REPO/data/demo\""
    DEFAULT="/api/v1/slice/demo/v3.zarr/volume?select=0,0:32,0:32&format=bin"
fi
REQUEST="${1:-$DEFAULT}"
cat >"$WORK/zarrgate.toml" <<EOF
[server]
bind = "127.0.0.1:$PORT"

[limits]
max_slice_bytes = 1073741824

[cache]
chunk_bytes = 536870912
shard_index_bytes = 67108864

$MOUNT
EOF

ZARRGATE_LOG=warn valgrind --tool=callgrind --callgrind-out-file="$WORK/callgrind.out.%p" \
    "$BIN" serve --config "$WORK/zarrgate.toml" >"$WORK/server.out" 2>"$WORK/valgrind.err" &
VG_PID=$!
for _ in $(seq 1 600); do
    curl -sf -o /dev/null --max-time 2 "http://127.0.0.1:$PORT/healthz" && break
    kill -0 "$VG_PID" 2>/dev/null || { echo "instructions.sh: the server exited" >&2; cat "$WORK/valgrind.err" >&2; exit 1; }
    sleep 0.2
done
status="$(curl -s -o /dev/null -w '%{http_code}' "http://127.0.0.1:$PORT$REQUEST")"
if [ "$status" != 200 ]; then
    echo "instructions.sh: $REQUEST -> HTTP $status" >&2
    exit 1
fi
# Bytes a response takes on the wire (head and body), to count the requests wrk made.
PER="$(curl -s -i "http://127.0.0.1:$PORT$REQUEST" | wc -c)"
echo "$REQUEST" >"$WORK/keys"
load() { WRK_KEYS="$WORK/keys" wrk -t1 -c4 -d"$1"s -s "$REPO/bench/wrk_keys.lua" "http://127.0.0.1:$PORT"; }
load 3 >/dev/null
callgrind_control -z "$VG_PID" >/dev/null
RESULT="$(load "$SECONDS_MEASURED" | grep '^RESULT')"
callgrind_control -d "$VG_PID" >/dev/null
kill "$VG_PID" 2>/dev/null && wait "$VG_PID" 2>/dev/null || true
VG_PID=""

# RESULT rps p50 p99 errors bytes (bench/wrk_keys.lua)
read -r _ _ _ _ errors bytes <<<"$RESULT"
[ "$errors" = 0 ] || { echo "instructions.sh: $errors errors under load" >&2; exit 1; }
DUMP="$(ls "$WORK"/callgrind.out.*.1 | head -1)"
TOTAL="$(grep -E '^(summary|totals):' "$DUMP" | head -1 | awk '{print $2}')"
python3 - "$TOTAL" "$bytes" "$PER" "$REQUEST" <<'EOF'
import sys
total, received, per, request = int(sys.argv[1]), int(sys.argv[2]), int(sys.argv[3]), sys.argv[4]
n = received / per
print(f"{request}\nrequests {n:.0f}  instructions a request {total / n:.0f}")
EOF
if [ "$TOP" -gt 0 ]; then
    # Self cost, largest first. Thread entry points show the whole program (callgrind counts
    # their cycle of calls as theirs): entries over half the total are left out.
    callgrind_annotate --auto=no --threshold=100 "$DUMP" 2>/dev/null |
        python3 -c '
import re, sys
total, n, top = int(sys.argv[1]), int(sys.argv[2]) / int(sys.argv[3]), int(sys.argv[4])
rows = []
for line in sys.stdin:
    m = re.match(r"^ *([0-9,]+) \( *[0-9.]+%\)  (\S.*)$", line)
    if m and "PROGRAM TOTALS" not in line:
        v = int(m.group(1).replace(",", ""))
        if v <= total / 2:
            rows.append((v, m.group(2)))
print("self instructions a request, largest first:")
for v, what in sorted(rows, reverse=True)[:top]:
    print(f"{v / n:8.0f}  {what[:180]}")
' "$TOTAL" "$bytes" "$PER" "$TOP"
fi
