#!/usr/bin/env bash
# Capacity figures (issue #49, item 6, "Capacity on paper"): what one core of one replica
# serves, and how the fleet's cache grows with the replicas. Writes bench/results-capacity.md;
# docs/operations.md ("Capacity") reasons from it.
#
#   bench/capacity.sh                                # ~5-8 minutes on 2 cores
#   ZARRGATE_BIN=/tmp/zg-bench-bin bench/capacity.sh # a binary of your own (no cargo here)
#
# 1. Raw keys, one core: zarrgate pinned to core 0 (`taskset -c 0`, server.workers = 1) and
#    nginx pinned to the same core (worker_processes 1, sendfile) serving the same files, wrk
#    pinned to core 1 (1 thread, 64 keep-alive connections, keys round-robin), interleaved run
#    by run: 256 distinct 16 KiB keys and 64 distinct 1 MiB keys from a local directory, and
#    the same keys from an S3 mount (moto) with zarrgate's raw cache warm.
# 2. Viewer tiles, one core: 256x256 uint16 slices (format=bin, 128 KiB) of a 4096x4096
#    zstd-compressed v3 array in 512x512 chunks, the decoded chunks cached: 256 distinct tiles
#    inside one chunk each, and 49 that straddle four chunks each; nginx serving a static
#    128 KiB file on the same core is the reference.
# 3. The fleet's cache: N = 1, 2, 3 replicas (tests/scaleout/topology.py, deploy's nginx conf
#    with `hash $request_uri consistent`), each with `cache.raw_bytes` = 32 MiB, reading an
#    80 MiB working set (1,280 objects of 64 KiB) from the bucket in uniform and Zipf order:
#    the fraction of requests that reached the bucket (bench/capacity.py fleet).
#
# Environment: ZARRGATE_BIN (default target/release/zarrgate, copied before use), CAP_RUNS
# (runs per figure, default 3), CAP_DURATION (seconds per load run, default 5),
# CAP_FLEET_WARM / CAP_FLEET_REQUESTS (requests per warm-up / measured fleet phase, 2000 /
# 6000), ZARRGATE_CACHE (data in $ZARRGATE_CACHE/capacity-data; venvs), CAP_OUT.
# Everything listens on 127.0.0.1; every process started here is stopped by its PID on exit.
set -euo pipefail

cd "$(dirname "$0")/.."
REPO="$PWD"
T_START=$(date +%s)
RUNS="${CAP_RUNS:-3}"
DUR="${CAP_DURATION:-5}"
OUT="${CAP_OUT:-$REPO/bench/results-capacity.md}"
CACHE="${ZARRGATE_CACHE:-$HOME/.cache/zarrgate}"
DATA="$CACHE/capacity-data"
WORK="$(mktemp -d /tmp/zarrgate-capacity.XXXXXX)"
chmod 755 "$WORK"
TSV="$WORK/results.tsv"
META="$WORK/meta.tsv"
: >"$TSV"
: >"$META"
BUCKET=cap

PIDS=()
cleanup() {
    local p
    for p in "${PIDS[@]:-}"; do
        [ -n "$p" ] && kill "$p" 2>/dev/null && wait "$p" 2>/dev/null || true
    done
    rm -f "$WORK/zarrgate"  # the copy of the binary; the rest of $WORK stays for inspection
}
trap cleanup EXIT

log() { printf '[%4ds] %s\n' "$(($(date +%s) - T_START))" "$*" >&2; }
record() { printf '%s\t%s\t%s\t%s\n' "$1" "$2" "$3" "$4" >>"$TSV"; }  # case server metric value
note() { printf '%s\t%s\n' "$1" "$2" >>"$META"; }
free_port() { python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])'; }
wait_http() {
    local i
    for i in $(seq 1 300); do
        curl -sf -o /dev/null --max-time 2 "$1" && return 0
        sleep 0.1
    done
    echo "capacity.sh: $1 did not come up" >&2
    return 1
}
forget_pid() {
    local p keep=()
    for p in "${PIDS[@]:-}"; do [ "$p" != "$1" ] && [ -n "$p" ] && keep+=("$p"); done
    PIDS=("${keep[@]:-}")
}
stop_pid() { kill "$1" 2>/dev/null || true; wait "$1" 2>/dev/null || true; forget_pid "$1"; }

# ---------------------------------------------------------------------------------------------
# Tools, binary, venvs, data, bucket
# ---------------------------------------------------------------------------------------------
need_apt=()
command -v nginx >/dev/null || [ -x /usr/sbin/nginx ] || need_apt+=(nginx)
command -v wrk >/dev/null || need_apt+=(wrk)
command -v taskset >/dev/null || need_apt+=(util-linux)
if [ "${#need_apt[@]}" -gt 0 ]; then
    log "installing ${need_apt[*]} with apt-get"
    apt-get update -qq >&2
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "${need_apt[@]}" >&2
fi
NGINX="$(command -v nginx || echo /usr/sbin/nginx)"
[ "$(nproc)" -ge 2 ] || { echo "capacity.sh: needs 2 cores (server on 0, wrk on 1)" >&2; exit 1; }

SRC_BIN="${ZARRGATE_BIN:-$REPO/target/release/zarrgate}"
[ -x "$SRC_BIN" ] || { echo "capacity.sh: no binary at $SRC_BIN (build it, or set ZARRGATE_BIN)" >&2; exit 1; }
BIN="$WORK/zarrgate"
cp "$SRC_BIN" "$BIN"  # a rebuild during the run does not swap it
# The tree at the start; the binary may be older than it (ZARRGATE_BIN): its time is noted too.
note zarrgate_rev "HEAD $(git rev-parse --short HEAD)$(git diff --quiet HEAD -- src Cargo.toml Cargo.lock 2>/dev/null || echo ' + uncommitted changes in src/'); binary $SRC_BIN of $(date -u -r "$SRC_BIN" '+%Y-%m-%d %H:%M UTC')"

log "venvs: moto, interop (zarr-python, for the tile array)"
MOTO_VENV="$(scripts/python-env.sh moto tests/remote/requirements-moto.txt)"
IVENV="$(scripts/python-env.sh interop tests/interop/requirements.txt)"

log "data in $DATA"
python3 bench/capacity.py data "$DATA"
"$IVENV/bin/python" bench/capacity.py tiles "$DATA"

MOTO_PORT="$(free_port)"
MOTO="http://127.0.0.1:$MOTO_PORT"
MOTO_LOG="$WORK/moto.log"
"$MOTO_VENV/bin/moto_server" -H 127.0.0.1 -p "$MOTO_PORT" >"$MOTO_LOG" 2>&1 &
MOTO_PID=$!
PIDS+=("$MOTO_PID")
wait_http "$MOTO/"
log "filling the bucket"
python3 bench/capacity.py fill "$MOTO" "$BUCKET" "$DATA"
export AWS_ACCESS_KEY_ID=testing AWS_SECRET_ACCESS_KEY=testing AWS_DEFAULT_REGION=us-east-1 AWS_EC2_METADATA_DISABLED=true

note loadavg_before "$(cut -d' ' -f1-3 /proc/loadavg)"

# ---------------------------------------------------------------------------------------------
# One core: zarrgate and nginx pinned to core 0
# ---------------------------------------------------------------------------------------------
mkdir -p "$WORK/ref"
head -c $((128 << 10)) /dev/zero >"$WORK/ref/128KiB"

ZG_PORT="$(free_port)"
ZG="http://127.0.0.1:$ZG_PORT"
cat >"$WORK/zarrgate.toml" <<EOF
[server]
bind = "127.0.0.1:$ZG_PORT"
workers = 1

[cache]
raw_bytes = 268435456           # every raw key of the S3 mount fits (68 MiB)

[mounts.local]
url = "$DATA/raw"

[mounts.tiles]
url = "$DATA/tiles"

[mounts.s3]
url = "s3://$BUCKET/raw"
endpoint = "$MOTO"
region = "us-east-1"
allow_http = true
immutable = true
cache_control = "public, max-age=31536000, immutable"
EOF
ZARRGATE_LOG=warn taskset -c 0 "$BIN" serve --config "$WORK/zarrgate.toml" >"$WORK/zarrgate.out" 2>"$WORK/zarrgate.err" &
ZG_PID=$!
PIDS+=("$ZG_PID")
wait_http "$ZG/healthz"

NG_PORT="$(free_port)"
NG="http://127.0.0.1:$NG_PORT"
mkdir -p "$WORK/nginx"
# shellcheck source=bench/nginx_static.sh
. bench/nginx_static.sh  # the scripts run from the repository root
static_nginx_conf "$WORK" "$NG_PORT" "$DATA" "$WORK/ref" 1 >"$WORK/nginx/nginx.conf"
taskset -c 0 "$NGINX" -p "$WORK/nginx" -c "$WORK/nginx/nginx.conf" -g 'daemon off;' 2>>"$WORK/nginx/stderr" &
NG_PID=$!
PIDS+=("$NG_PID")
wait_http "$NG/raw/c16k.zarr/zarr.json"

WRK_LUA="$REPO/bench/wrk_keys.lua"
# wrk_run BASEURL KEYSFILE SECONDS -> "rps p50_us p99_us errors bytes", wrk on core 1
wrk_run() {
    local out
    out="$(WRK_KEYS="$2" timeout $(($3 + 30)) /usr/bin/time -f 'WRKCPU %U %S' -o "$WORK/wrk.time" \
        taskset -c 1 wrk -t1 -c64 -d"$3"s --timeout 10s -s "$WRK_LUA" "$1" 2>&1)" || {
        echo "wrk failed: $out" >&2
        return 1
    }
    echo "$out" | awk '/^RESULT/ {print $2, $3, $4, $5, $6}'
}
cpu_ticks() {  # PID: utime + stime of it and its children (nginx's worker), in clock ticks
    local p t=0 kids
    kids="$(cat /proc/"$1"/task/*/children 2>/dev/null || true)"
    for p in "$1" $kids; do
        [ -r "/proc/$p/stat" ] || continue
        t=$((t + $(awk '{sub(/^.*\) /, ""); print $12 + $13}' "/proc/$p/stat")))
    done
    echo "$t"
}
cpu0_idle() { awk '/^cpu0 / {print $5 + $6}' /proc/stat; }  # idle + iowait ticks of core 0
HZ="$(getconf CLK_TCK)"
# load CASE SERVER PID BASEURL KEYSFILE: one measured run, recorded
load() {
    local r c0 c1 t0 t1
    c0="$(cpu_ticks "$3")"
    i0="$(cpu0_idle)"
    t0="$(date +%s.%N)"
    r="$(wrk_run "$4" "$5" "$DUR")"
    t1="$(date +%s.%N)"
    i1="$(cpu0_idle)"
    c1="$(cpu_ticks "$3")"
    read -r rps p50 p99 errs bytes <<<"$r"
    record "$1" "$2" rps "$rps"
    record "$1" "$2" p50_ms "$(awk -v v="$p50" 'BEGIN {printf "%.3f", v / 1000}')"
    record "$1" "$2" errors "$errs"
    # CPU share of the core over the run (wall time includes wrk's start, a few ms)
    record "$1" "$2" cpu "$(awk -v a="$c0" -v b="$c1" -v hz="$HZ" -v s="$t0" -v e="$t1" 'BEGIN {printf "%.3f", (b - a) / hz / (e - s)}')"
    # core 0 left idle, and wrk's own CPU on core 1, as shares of the run's wall time: a
    # server short of 100% with core 0 idle was held back by the client, not by its core
    record "$1" "$2" core0_idle "$(awk -v a="$i0" -v b="$i1" -v hz="$HZ" -v s="$t0" -v e="$t1" 'BEGIN {printf "%.3f", (b - a) / hz / (e - s)}')"
    record "$1" "$2" wrk_cpu "$(awk -v s="$t0" -v e="$t1" '/^WRKCPU/ {printf "%.3f", ($2 + $3) / (e - s)}' "$WORK/wrk.time")"
    [ "$errs" = 0 ] || log "WARNING: $1 $2: $errs errors"
}
keys() {  # NAME PREFIX COUNT [SUFFIX] -> file of PREFIX{0..COUNT-1}SUFFIX
    local f="$WORK/keys-$1" i
    : >"$f"
    for i in $(seq 0 $(($3 - 1))); do echo "$2$i${4:-}" >>"$f"; done
    echo "$f"
}
upstream_total() {
    curl -sf "$ZG/metrics" | awk '/^zarrgate_upstream_requests_total\{mount="s3"/ {s += $2} END {print s + 0}'
}

declare -A KEYS
KEYS[zg_16k_local]="$(keys zg_16k_local /zarr/local/c16k.zarr/c/ 256)"
KEYS[zg_1m_local]="$(keys zg_1m_local /zarr/local/c1m.zarr/c/ 64)"
KEYS[zg_16k_s3]="$(keys zg_16k_s3 /zarr/s3/c16k.zarr/c/ 256)"
KEYS[zg_1m_s3]="$(keys zg_1m_s3 /zarr/s3/c1m.zarr/c/ 64)"
KEYS[ng_16k]="$(keys ng_16k /raw/c16k.zarr/c/ 256)"
KEYS[ng_1m]="$(keys ng_1m /raw/c1m.zarr/c/ 64)"
for k in local s3; do  # byte-identical bodies, and every S3 key read once (raw cache warm)
    curl -sf "$ZG/zarr/$k/c16k.zarr/c/7" | cmp -s - "$DATA/raw/c16k.zarr/c/7" || { echo "zarrgate $k body differs" >&2; exit 1; }
done
curl -sf "$NG/raw/c1m.zarr/c/7" | cmp -s - "$DATA/raw/c1m.zarr/c/7" || { echo "nginx body differs" >&2; exit 1; }
cat "${KEYS[zg_16k_s3]}" "${KEYS[zg_1m_s3]}" | sed "s|^|$ZG|" | xargs -P 4 -n 16 curl -sf >/dev/null
UP0="$(upstream_total)"

log "one core, raw keys: zarrgate vs nginx, ${RUNS}x${DUR}s each, interleaved"
for size in 16k 1m; do  # warm-up (page cache, connections)
    wrk_run "$ZG" "${KEYS[zg_${size}_local]}" 1 >/dev/null
    wrk_run "$ZG" "${KEYS[zg_${size}_s3]}" 1 >/dev/null
    wrk_run "$NG" "${KEYS[ng_$size]}" 1 >/dev/null
done
for run in $(seq 1 "$RUNS"); do
    for size in 16k 1m; do
        load "raw_${size}_local" zarrgate "$ZG_PID" "$ZG" "${KEYS[zg_${size}_local]}"
        load "raw_${size}_local" nginx "$NG_PID" "$NG" "${KEYS[ng_$size]}"
        load "raw_${size}_s3" zarrgate "$ZG_PID" "$ZG" "${KEYS[zg_${size}_s3]}"
        load "raw_${size}_s3" nginx "$NG_PID" "$NG" "${KEYS[ng_$size]}"
    done
done
record raw_s3 zarrgate upstream_during_load "$(($(upstream_total) - UP0))"

log "one core, viewer tiles (256x256 uint16, 128 KiB): zarrgate slices vs nginx's 128 KiB file"
TILES_ALIGNED="$WORK/keys-tiles-aligned"
TILES_4="$WORK/keys-tiles-4chunks"
: >"$TILES_ALIGNED"
: >"$TILES_4"
for i in $(seq 0 15); do for j in $(seq 0 15); do
    echo "/api/v1/slice/tiles/tiles.zarr?select=$((i * 256)):$((i * 256 + 256)),$((j * 256)):$((j * 256 + 256))&format=bin" >>"$TILES_ALIGNED"
done; done
for i in $(seq 0 6); do for j in $(seq 0 6); do
    r=$((384 + i * 512)); c=$((384 + j * 512))
    echo "/api/v1/slice/tiles/tiles.zarr?select=$r:$((r + 256)),$c:$((c + 256))&format=bin" >>"$TILES_4"
done; done
REF128="$WORK/keys-ref128"
echo /ref/128KiB >"$REF128"
curl -sf "$ZG$(head -1 "$TILES_ALIGNED")" | cmp -s - "$DATA/tiles/tile_0_0.bin" || { echo "tile 0:256,0:256 differs from zarr-python's" >&2; exit 1; }
# decode every chunk once (all 64 fit in the default 512 MiB chunk cache), then warm the paths
sed "s|^|$ZG|" "$TILES_ALIGNED" | xargs -P 2 -n 16 curl -sf >/dev/null
wrk_run "$ZG" "$TILES_ALIGNED" 1 >/dev/null
wrk_run "$ZG" "$TILES_4" 1 >/dev/null
wrk_run "$NG" "$REF128" 1 >/dev/null
DEC0="$(curl -sf "$ZG/metrics" | awk '/^zarrgate_chunks_decoded_total/ {print $2}')"
for run in $(seq 1 "$RUNS"); do
    load tile_aligned zarrgate "$ZG_PID" "$ZG" "$TILES_ALIGNED"
    load tile_aligned nginx "$NG_PID" "$NG" "$REF128"
    load tile_4chunks zarrgate "$ZG_PID" "$ZG" "$TILES_4"
    load tile_4chunks nginx "$NG_PID" "$NG" "$REF128"
done
DEC1="$(curl -sf "$ZG/metrics" | awk '/^zarrgate_chunks_decoded_total/ {print $2}')"
note note_decodes "Chunks decoded during the tile load runs: $((${DEC1%.*} - ${DEC0%.*})) (0: every tile from cached decoded chunks)."
stop_pid "$ZG_PID"
stop_pid "$NG_PID"

# ---------------------------------------------------------------------------------------------
# The fleet's cache, N = 1, 2, 3
# ---------------------------------------------------------------------------------------------
log "fleet: 1, 2, 3 replicas behind nginx, 32 MiB raw cache each, 80 MiB working set in the bucket"
CAP_WORK="$WORK" python3 bench/capacity.py fleet "$BIN" "$MOTO" "$MOTO_LOG" "$BUCKET" "$DATA" "$WORK/fleet.json"
stop_pid "$MOTO_PID"

# ---------------------------------------------------------------------------------------------
# Report
# ---------------------------------------------------------------------------------------------
note loadavg_after "$(cut -d' ' -f1-3 /proc/loadavg)"
note machine_cpu "$(awk -F': ' '/model name/ {print $2; exit}' /proc/cpuinfo) x $(nproc)"
note machine_mem "$(awk '/MemTotal/ {printf "%.1f GiB", $2 / 1048576}' /proc/meminfo)"
note machine_kernel "$(uname -sr)"
note nginx "$("$NGINX" -v 2>&1 | sed 's/^nginx version: //')"
note wrk "$(wrk -v 2>&1 | head -1 | awk '{print $1, $2}')"
note moto "$("$MOTO_VENV/bin/python" -c 'import importlib.metadata as m; print(m.version("moto"))')"
note runs "$RUNS"
note load_seconds "$DUR"
note note_host "2 cores shared: core 0 also runs the kernel's network work for both ends of loopback and whatever else the host runs; the ratios are paired within the run, the absolute figures move with the host's load."
note total_seconds "$(($(date +%s) - T_START))"
note date "$(date -u '+%Y-%m-%d %H:%M UTC')"
python3 bench/capacity.py report "$TSV" "$META" "$WORK/fleet.json" >"$OUT"
cp "$TSV" "${OUT%.md}.tsv"
cp "$WORK/fleet.json" "${OUT%.md}-fleet.json"
log "done in $(($(date +%s) - T_START)) s: $OUT (raw values in $WORK)"
