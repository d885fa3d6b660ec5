#!/usr/bin/env bash
# Profiles the paths where bench/run.sh shows zarrgate lagging, with perf (cpu-clock: this VM
# has no hardware counters) and strace -c, and writes text summaries to $PROFILE_OUT
# (default /tmp/zarrgate-profile). Needs the bench data (bench/run.sh makes it) and root for
# drop_caches. About 3 minutes.
#
#   CARGO_TARGET_DIR=/work/target-bench bench/profile.sh
#
# Parts: raw 64 KiB GETs under 64 connections; warm one-chunk slices (1 MiB and 16 KiB) under
# 64 connections; a 256 MiB slice with the chunk cache off (page cache warm, so decode and
# assembly dominate); the criterion decode bench (zstd, uncompressed).
set -euo pipefail

cd "$(dirname "$0")/.."
REPO="$PWD"
OUT="${PROFILE_OUT:-/tmp/zarrgate-profile}"
CACHE="${ZARRGATE_CACHE:-$HOME/.cache/zarrgate}"
DATA="$CACHE/bench-data"
TARGET="${CARGO_TARGET_DIR:-$REPO/target}"
mkdir -p "$OUT"
command -v perf >/dev/null || { echo "profile.sh: needs perf (apt-get install linux-perf)" >&2; exit 1; }
command -v strace >/dev/null || DEBIAN_FRONTEND=noninteractive apt-get install -y -qq strace >&2
CARGO_TARGET_DIR="$TARGET" cargo build --release --quiet
BIN="$TARGET/release/zarrgate"

PIDS=()
cleanup() { for p in "${PIDS[@]:-}"; do [ -n "$p" ] && kill "$p" 2>/dev/null && wait "$p" 2>/dev/null || true; done; }
trap cleanup EXIT
port() { python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])'; }

# start_zg CHUNK_CACHE_BYTES -> sets ZG_PID, ZG
start_zg() {
    local p
    p="$(port)"
    cat >"$OUT/zg.toml" <<EOF
[server]
bind = "127.0.0.1:$p"
[limits]
max_slice_bytes = 1073741824
[cache]
chunk_bytes = $1
[mounts.bench]
url = "$DATA"
EOF
    ZARRGATE_LOG=warn "$BIN" serve --config "$OUT/zg.toml" >"$OUT/zg.log" 2>&1 &
    ZG_PID=$!
    PIDS+=("$ZG_PID")
    ZG="http://127.0.0.1:$p"
    for _ in $(seq 1 100); do curl -sf -o /dev/null "$ZG/healthz" && return 0; sleep 0.1; done
    return 1
}
stop_zg() { kill "$ZG_PID"; wait "$ZG_PID" 2>/dev/null || true; }

# summarize NAME: top symbols and the callers of the usual suspects
summarize() {
    local d="$OUT/$1.data"
    {
        echo "### $1: top symbols (self)"
        perf report -i "$d" --no-children --no-inline --stdio --percent-limit 1.5 -g none --sort dso,sym 2>/dev/null |
            grep -v '^#' | grep -v '^$' | head -20
        perf script -i "$d" --no-inline 2>/dev/null >"$OUT/$1.script"
        for m in finish_task_switch _raw_spin_unlock_irqrestore asm_exc_page_fault __memset __memmove ZSTD_decompress _copy_from_iter ksys_read; do
            echo
            python3 bench/perf_callers.py "$m" <"$OUT/$1.script"
        done
        rm -f "$OUT/$1.script"
    } >"$OUT/$1.txt"
    echo "wrote $OUT/$1.txt" >&2
}

# load_profile NAME KEYSFILE: wrk 64 connections for 7 s, perf on the server for 4 s of it
load_profile() {
    WRK_KEYS="$2" wrk -t2 -c64 -d1s -s bench/wrk_keys.lua "$ZG" >/dev/null
    (WRK_KEYS="$2" timeout 30 wrk -t2 -c64 -d7s -s bench/wrk_keys.lua "$ZG" | grep RESULT >"$OUT/$1.wrk") &
    local w=$!
    sleep 1
    perf record -e cpu-clock -F 1000 -g --call-graph dwarf,16384 -p "$ZG_PID" -o "$OUT/$1.data" -- sleep 4 >/dev/null 2>&1
    wait "$w"
    summarize "$1"
}

start_zg 536870912
for i in $(seq 0 15); do for j in $(seq 0 15); do echo "/zarr/bench/raw/c64k.zarr/c/$i/$j"; done; done >"$OUT/k64"
load_profile raw64k "$OUT/k64"

# Syscalls per raw-key request: 200 sequential GETs under strace -c.
for u in $(head -200 "$OUT/k64"); do printf 'url = "%s%s"\noutput = /dev/null\n' "$ZG" "$u"; done >"$OUT/curl200"
echo "server threads after the 64-connection load: $(ls /proc/$ZG_PID/task | wc -l)" >"$OUT/raw64k.threads"
strace -f -c -o "$OUT/raw64k.strace" -p "$ZG_PID" 2>/dev/null &
SP=$!
sleep 1
curl -s -K "$OUT/curl200"
sleep 0.5
kill -INT "$SP"
wait "$SP" 2>/dev/null || true
echo "wrote $OUT/raw64k.strace (200 requests)" >&2

echo "/api/v1/slice/bench/issue9/unsharded.zarr?select=512:1024,512:1024&format=bin" >"$OUT/one1m"
echo "/api/v1/slice/bench/issue9/sharded.zarr?select=520:584,520:584&format=bin" >"$OUT/one16k"
load_profile slice_one_1MiB "$OUT/one1m"
load_profile slice_one_16KiB "$OUT/one16k"
stop_zg

# 256 MiB slice, chunk cache off: decode + assembly + HTTP on every request.
start_zg 0
U="$ZG/api/v1/slice/bench/issue9/unsharded.zarr?select=2048:10240,2048:10240&format=bin"
curl -s -o /dev/null "$U"
perf record -e cpu-clock -F 1000 -g --call-graph dwarf,16384 -p "$ZG_PID" -o "$OUT/slice256_nocache.data" -- sleep 8 >/dev/null 2>&1 &
PP=$!
sleep 0.5
for _ in 1 2 3 4 5; do curl -s -o /dev/null -w '%{time_total}\n' "$U"; done >"$OUT/slice256_nocache.times"
wait "$PP"
summarize slice256_nocache
stop_zg

# The criterion bench binary (decode + assemble in-process).
CARGO_TARGET_DIR="$TARGET" cargo bench --bench decode --no-run --quiet 2>/dev/null
B="$(ls -t "$TARGET"/release/deps/decode-* | grep -v '\.d$' | head -1)"
for c in zstd uncompressed; do
    perf record -e cpu-clock -F 1000 -g --call-graph dwarf,16384 -o "$OUT/criterion_$c.data" -- \
        "$B" --bench --profile-time 6 "region_64MiB/$c\$" >/dev/null 2>&1
    summarize "criterion_$c"
done
rm -f "$OUT"/*.data
echo "profiles in $OUT" >&2
