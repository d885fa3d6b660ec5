#!/usr/bin/env bash
# zarrgate benchmark suite: raw keys vs nginx (and xpublish), slices vs tensorstore and
# zarr-python, ZOM of a 10,000-node hierarchy, compressed text answers, peak RSS. Writes
# bench/results.md.
#
#   bench/run.sh                       # everything, about 10 minutes on 2 cores once built
#
# Environment:
#   CARGO_TARGET_DIR   where the release binary is built (default: target)
#   ZARRGATE_CACHE     venvs and bench data (default: ~/.cache/zarrgate); data in bench-data/
#   BENCH_RUNS         measured runs per figure (default 5; min/median/max are reported)
#   BENCH_COLD_RUNS    run pairs of each cold 64 MiB figure, whose median ratio to tensorstore
#                      is judged against the 1.5x target (default 9; the full-cache case has
#                      eight regions to read, so at most 8)
#   BENCH_DURATION     seconds per load run (default 3)
#   BENCH_PEERS        0 to skip the xpublish peer (default 1)
#   BENCH_OUT          the report (default bench/results.md)
#
# Everything listens on 127.0.0.1 only; every process started here is stopped by its PID on exit.
set -euo pipefail

cd "$(dirname "$0")/.."
REPO="$PWD"
T_START=$(date +%s)
RUNS="${BENCH_RUNS:-5}"
COLD_RUNS="${BENCH_COLD_RUNS:-9}"
DUR="${BENCH_DURATION:-3}"
PEERS="${BENCH_PEERS:-1}"
OUT="${BENCH_OUT:-$REPO/bench/results.md}"
CACHE="${ZARRGATE_CACHE:-$HOME/.cache/zarrgate}"
DATA="$CACHE/bench-data"
TARGET="${CARGO_TARGET_DIR:-$REPO/target}"
WORK="$(mktemp -d /tmp/zarrgate-bench.XXXXXX)"
TSV="$WORK/results.tsv"
META="$WORK/meta.tsv"
: >"$TSV"
: >"$META"

PIDS=()
cleanup() {
    local p
    for p in "${PIDS[@]:-}"; do
        [ -n "$p" ] && kill "$p" 2>/dev/null && wait "$p" 2>/dev/null || true
    done
}
trap cleanup EXIT

log() { printf '[%4ds] %s\n' "$(($(date +%s) - T_START))" "$*" >&2; }
record() { printf '%s\t%s\t%s\t%s\n' "$1" "$2" "$3" "$4" >>"$TSV"; }  # section case metric value
note() { printf '%s\t%s\n' "$1" "$2" >>"$META"; }
free_port() { python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])'; }
wait_http() {  # URL: wait up to 30 s for a 2xx
    local i
    for i in $(seq 1 300); do
        curl -sf -o /dev/null --max-time 2 "$1" && return 0
        sleep 0.1
    done
    echo "run.sh: $1 did not come up" >&2
    return 1
}
forget_pid() {  # remove $1 from PIDS
    local p keep=()
    for p in "${PIDS[@]:-}"; do [ "$p" != "$1" ] && [ -n "$p" ] && keep+=("$p"); done
    PIDS=("${keep[@]:-}")
}

# ---------------------------------------------------------------------------------------------
# Tools, venvs, data, binary
# ---------------------------------------------------------------------------------------------
need_apt=()
command -v nginx >/dev/null || [ -x /usr/sbin/nginx ] || need_apt+=(nginx)
command -v wrk >/dev/null || need_apt+=(wrk)
command -v curl >/dev/null || need_apt+=(curl)
if [ "${#need_apt[@]}" -gt 0 ]; then
    log "installing ${need_apt[*]} with apt-get"
    apt-get update -qq >&2
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "${need_apt[@]}" >&2
fi
NGINX="$(command -v nginx || echo /usr/sbin/nginx)"

log "python venv (pinned zarr 3.1.6, tensorstore 0.1.86)"
VENV="$(scripts/python-env.sh bench bench/requirements.txt)"
PY="$VENV/bin/python"
log "bench data in $DATA"
"$PY" bench/make_datasets.py "$DATA"

log "building the release binary (CARGO_TARGET_DIR=$TARGET)"
T_BUILD=$(date +%s)
CARGO_TARGET_DIR="$TARGET" cargo build --release --quiet
note build_seconds "$(($(date +%s) - T_BUILD))"
BIN="$TARGET/release/zarrgate"
# The floor of the HTTP stack: a bare hyper server (bench/hyper-floor) with a static body.
cargo build --release --quiet --manifest-path bench/hyper-floor/Cargo.toml --target-dir "$TARGET/hyper-floor"
HYPER_FLOOR="$TARGET/hyper-floor/release/hyper-floor"

CAN_DROP=0
if sync && echo 3 >/proc/sys/vm/drop_caches 2>/dev/null; then CAN_DROP=1; fi
note can_drop_caches "$CAN_DROP"
drop_caches() { if [ "$CAN_DROP" = 1 ]; then sync; echo 3 >/proc/sys/vm/drop_caches; fi; }

# ---------------------------------------------------------------------------------------------
# Servers
# ---------------------------------------------------------------------------------------------
ZG_PORT="$(free_port)"
ZG="http://127.0.0.1:$ZG_PORT"
cat >"$WORK/zarrgate.toml" <<EOF
[server]
bind = "127.0.0.1:$ZG_PORT"

[limits]
max_slice_bytes = 1073741824    # the 256 MiB region must be allowed

[cache]
chunk_bytes = 536870912
shard_index_bytes = 67108864

[mounts.bench]
url = "$DATA"
EOF
ZG_PID=""
ZG_LOG_LEVEL=warn
start_zg() {
    ZARRGATE_LOG="$ZG_LOG_LEVEL" "$BIN" serve --config "$WORK/zarrgate.toml" >>"$WORK/zarrgate.out" 2>>"$WORK/zarrgate.err" &
    ZG_PID=$!
    PIDS+=("$ZG_PID")
    wait_http "$ZG/healthz"
}
stop_zg() {
    if [ -n "$ZG_PID" ]; then
        kill "$ZG_PID" 2>/dev/null || true
        wait "$ZG_PID" 2>/dev/null || true
        forget_pid "$ZG_PID"
        ZG_PID=""
    fi
}
hwm_reset() { echo 5 >"/proc/$ZG_PID/clear_refs" 2>/dev/null || true; }
hwm_kib() { awk '/^VmHWM/ {print $2}' "/proc/$ZG_PID/status"; }

NG_PORT="$(free_port)"
NG="http://127.0.0.1:$NG_PORT"
mkdir -p "$WORK/nginx/ref"
# Static files of the sizes of the one-chunk slice responses: nginx serving them is the
# reference for those (a file from the page cache is the least work a server can do for them).
head -c $((1 << 20)) /dev/zero >"$WORK/nginx/ref/1MiB"
head -c $((16 << 10)) /dev/zero >"$WORK/nginx/ref/16KiB"
# shellcheck source=bench/nginx_static.sh
. bench/nginx_static.sh  # the scripts run from the repository root
static_nginx_conf "$WORK" "$NG_PORT" "$DATA" "$WORK/nginx/ref" auto >"$WORK/nginx/nginx.conf"
"$NGINX" -p "$WORK/nginx" -c "$WORK/nginx/nginx.conf" -g 'daemon off;' 2>>"$WORK/nginx/stderr" &
NG_PID=$!
PIDS+=("$NG_PID")
wait_http "$NG/raw/c64k.zarr/zarr.json"
HF_PORT="$(free_port)"
HF="http://127.0.0.1:$HF_PORT"
"$HYPER_FLOOR" "$HF_PORT" $((16 << 10)) 2>>"$WORK/hyper-floor.err" &
PIDS+=("$!")
wait_http "$HF/"
start_zg

# ---------------------------------------------------------------------------------------------
# Load: wrk, 2 threads, 64 connections, keys round-robin
# ---------------------------------------------------------------------------------------------
WRK_LUA="$REPO/bench/wrk_keys.lua"
# wrk_run BASEURL KEYSFILE CONNS SECONDS -> "rps p50_us p99_us errors bytes"
wrk_run() {
    local out
    local threads=2
    [ "$3" -lt 2 ] && threads=1
    out="$(WRK_KEYS="$2" timeout $(($4 + 30)) wrk -t"$threads" -c"$3" -d"$4"s --timeout 10s -s "$WRK_LUA" "$1" 2>&1)" || {
        echo "wrk failed: $out" >&2
        return 1
    }
    echo "$out" | awk '/^RESULT/ {print $2, $3, $4, $5, $6}'
}
# load SECTION CASE BASEURL KEYSFILE CONNS: one measured run, recorded
load() {
    local r
    r="$(wrk_run "$3" "$4" "$5" "$DUR")"
    read -r rps p50 p99 errs bytes <<<"$r"
    record "$1" "$2" rps "$rps"
    record "$1" "$2" p50_ms "$(awk -v v="$p50" 'BEGIN {printf "%.3f", v / 1000}')"
    record "$1" "$2" p99_ms "$(awk -v v="$p99" 'BEGIN {printf "%.3f", v / 1000}')"
    record "$1" "$2" errors "$errs"
    [ "$errs" = 0 ] || log "WARNING: $1 $2: $errs errors"
}
keys() {  # PREFIX ARRAY N -> file of N*N chunk paths
    local f="$WORK/keys-$(echo "$1$2" | tr '/' '_')" i j
    : >"$f"
    for i in $(seq 0 $(($3 - 1))); do for j in $(seq 0 $(($3 - 1))); do echo "$1$2/c/$i/$j" >>"$f"; done; done
    echo "$f"
}

log "raw keys: zarrgate vs nginx, 64 connections, ${RUNS}x${DUR}s each"
declare -A KEYS
KEYS[zg_64k]="$(keys /zarr/bench/raw/ c64k.zarr 16)"
KEYS[zg_1m]="$(keys /zarr/bench/raw/ c1m.zarr 8)"
KEYS[ng_64k]="$(keys /raw/ c64k.zarr 16)"
KEYS[ng_1m]="$(keys /raw/ c1m.zarr 8)"
# sanity: byte-identical bodies
curl -sf "$ZG/zarr/bench/raw/c64k.zarr/c/3/4" | cmp -s - "$DATA/raw/c64k.zarr/c/3/4" || { echo "zarrgate raw body differs" >&2; exit 1; }
curl -sf "$NG/raw/c64k.zarr/c/3/4" | cmp -s - "$DATA/raw/c64k.zarr/c/3/4" || { echo "nginx raw body differs" >&2; exit 1; }
for size in 64k 1m; do  # warm-up (page cache, connections)
    wrk_run "$ZG" "${KEYS[zg_$size]}" 64 1 >/dev/null
    wrk_run "$NG" "${KEYS[ng_$size]}" 64 1 >/dev/null
done
hwm_reset
for run in $(seq 1 "$RUNS"); do
    for size in 64k 1m; do
        load raw "zarrgate_$size" "$ZG" "${KEYS[zg_$size]}" 64
        load raw "nginx_$size" "$NG" "${KEYS[ng_$size]}" 64
    done
done
record memory "raw_load_64conn" vmhwm_mib "$(($(hwm_kib) / 1024))"

log "raw keys: zarrgate with the default access log (info, to a file), 64 KiB"
stop_zg
ZG_LOG_LEVEL=info
start_zg
wrk_run "$ZG" "${KEYS[zg_64k]}" 64 1 >/dev/null
for run in $(seq 1 "$RUNS"); do
    load raw "zarrgate_64k_accesslog" "$ZG" "${KEYS[zg_64k]}" 64
done
stop_zg
ZG_LOG_LEVEL=warn
start_zg

# Peer server: xpublish + xpublish-zarr, time-boxed (10 minutes for install + start).
if [ "$PEERS" = 1 ]; then
    log "peer: xpublish + xpublish-zarr (install and start time-boxed to 10 minutes)"
    PEER_T0=$(date +%s)
    if PVENV="$(timeout 600 scripts/python-env.sh bench-peers bench/requirements-peers.txt)"; then
        XP_PORT="$(free_port)"
        XP="http://127.0.0.1:$XP_PORT"
        "$PVENV/bin/python" bench/peer_xpublish.py "$DATA" "$XP_PORT" >"$WORK/xpublish.log" 2>&1 &
        XP_PID=$!
        PIDS+=("$XP_PID")
        left=$((600 - ($(date +%s) - PEER_T0)))
        ok=0
        for i in $(seq 1 $((left * 5))); do
            curl -sf -o /dev/null --max-time 2 "$XP/datasets" && { ok=1; break; }
            kill -0 "$XP_PID" 2>/dev/null || break
            sleep 0.2
        done
        if [ "$ok" = 1 ]; then
            KEYS[xp_64k]="$(keys /datasets/c64k/zarr/data "" 16)"
            KEYS[xp_1m]="$(keys /datasets/c1m/zarr/data "" 8)"
            curl -sf "$XP/datasets/c64k/zarr/data/c/3/4" | cmp -s - "$DATA/raw/c64k.zarr/c/3/4" ||
                log "WARNING: xpublish body differs from the stored chunk"
            # Warm its encoded-chunk cache: every key once.
            for size in 64k 1m; do
                sed "s|^|$XP|" "${KEYS[xp_$size]}" | xargs -P 4 -I{} curl -sf -o /dev/null {}
            done
            for run in $(seq 1 "$RUNS"); do
                for size in 64k 1m; do
                    load raw "xpublish_$size" "$XP" "${KEYS[xp_$size]}" 64
                done
            done
            note peer_xpublish "measured"
        else
            note peer_xpublish "did not start within the time box (see $WORK/xpublish.log)"
        fi
        kill "$XP_PID" 2>/dev/null || true
        wait "$XP_PID" 2>/dev/null || true
        forget_pid "$XP_PID"
    else
        note peer_xpublish "pip install failed or exceeded the time box"
    fi
else
    note peer_xpublish "skipped (BENCH_PEERS=0)"
fi
note peer_zarr_http_server "zarr-http-server 0.1.0 (the only release on PyPI) requires Python >= 3.12; this machine has $(python3 --version 2>&1)"

# ---------------------------------------------------------------------------------------------
# Slices
# ---------------------------------------------------------------------------------------------
slice_url() { echo "$ZG/api/v1/slice/bench/issue9/$1?select=$2&format=bin"; }
one_url_file() {  # PATH-WITH-QUERY -> keys file with one line
    local f
    f="$(mktemp "$WORK/one.XXXXXX")"
    echo "$1" >"$f"
    echo "$f"
}
log "one-chunk slices, warm cache: 64 connections and 1 connection"
declare -A ONE
ONE[unsharded_chunk_1MiB]="/api/v1/slice/bench/issue9/unsharded.zarr?select=512:1024,512:1024&format=bin"
ONE[sharded_inner_1MiB]="/api/v1/slice/bench/issue9/sharded.zarr?select=512:1024,512:1024&format=bin"
ONE[sharded_64x64_16KiB]="/api/v1/slice/bench/issue9/sharded.zarr?select=520:584,520:584&format=bin"
for name in unsharded_chunk_1MiB sharded_inner_1MiB sharded_64x64_16KiB; do
    f="$(one_url_file "${ONE[$name]}")"
    ref="$(one_url_file "/ref/${name##*_}")"
    curl -sf -o /dev/null "$ZG${ONE[$name]}"
    wrk_run "$ZG" "$f" 64 1 >/dev/null
    wrk_run "$NG" "$ref" 64 1 >/dev/null
    hwm_reset
    for run in $(seq 1 "$RUNS"); do
        load slice_one "${name}_c64" "$ZG" "$f" 64
        load slice_one "${name}_nginx_c64" "$NG" "$ref" 64
        load slice_one "${name}_c1" "$ZG" "$f" 1
        load slice_one "${name}_nginx_c1" "$NG" "$ref" 1
        if [ "$name" = sharded_64x64_16KiB ]; then
            load slice_one "${name}_hyper_floor_c64" "$HF" "$ref" 64
            WRK_PACE_MS=2 load slice_one "${name}_c64_paced2ms" "$ZG" "$f" 64
            WRK_PACE_MS=2 load slice_one "${name}_nginx_c64_paced2ms" "$NG" "$ref" 64
        fi
    done
    record memory "slice_one_${name}_64conn" vmhwm_mib "$(($(hwm_kib) / 1024))"
done

# curl_time URL EXPECTED_BYTES -> seconds
curl_time() {
    local r code t n
    r="$(curl -s -o /dev/null --max-time 300 -w '%{http_code} %{time_total} %{size_download}' "$1")"
    read -r code t n <<<"$r"
    if [ "$code" != 200 ] || [ "$n" != "$2" ]; then
        echo "run.sh: $1 -> HTTP $code, $n bytes (expected $2)" >&2
        return 1
    fi
    echo "$t"
}

declare -A REGION
REGION[64MiB]="2048:6144,2048:6144"
REGION[256MiB]="2048:10240,2048:10240"
declare -A RBYTES
RBYTES[64MiB]=$((64 << 20))
RBYTES[256MiB]=$((256 << 20))
# tensorstore's cold reads run in one reader process kept up for a region (bench/readers.py
# --serve), one read per request, so that they interleave with zarrgate's cold runs run by run:
# the load of other tenants on this host changes within minutes, and a ratio of two blocks
# measured minutes apart moved by 1.3x-2.2x between otherwise equal runs.
TS_PID=""
ts_start() {  # ARRAY SELECT
    local drop=""
    [ "$CAN_DROP" = 1 ] && drop="--drop-caches"
    coproc TSR { exec "$PY" bench/readers.py --reader ts --array "$1" --select "$2" --mode cold --serve $drop 2>>"$WORK/readers.err"; }
    TS_PID=$TSR_PID  # bash unsets TSR_PID once the reader has exited
    PIDS+=("$TS_PID")
}
ts_cold() {  # one cold tensorstore read of the region; its seconds in TS_T
    TS_T=""
    echo run >&"${TSR[1]}"
    read -r -t 600 TS_T <&"${TSR[0]}" && [ -n "$TS_T" ] || { echo "run.sh: the tensorstore reader failed" >&2; return 1; }
}
ts_stop() {  # end of input ends the reader
    eval "exec ${TSR[1]}>&-"
    wait "$TS_PID" 2>/dev/null || true
    forget_pid "$TS_PID"
}

for ds in sharded unsharded blosc_v2; do
    for reg in 64MiB 256MiB; do
        url="$(slice_url "$ds.zarr" "${REGION[$reg]}")"
        ts_start "$DATA/issue9/$ds.zarr" "${REGION[$reg]}"
        # The 64 MiB cold figures carry the target, judged on a median of per-pair ratios: more
        # pairs for them, as one run pair in five on this shared host can be off by 1.5x.
        pairs=$RUNS
        [ "$reg" = 64MiB ] && pairs=$COLD_RUNS
        log "slice $ds $reg: zarrgate cold (restart$([ "$CAN_DROP" = 1 ] && echo ' + drop_caches')) and tensorstore cold, interleaved ($pairs pairs); zarrgate warm"
        for run in $(seq 1 "$pairs"); do
            stop_zg
            drop_caches
            start_zg
            record slice "${ds}_${reg}_cold" zarrgate_s "$(curl_time "$url" "${RBYTES[$reg]}")"
            record memory "slice_${ds}_${reg}_cold" vmhwm_mib "$(($(hwm_kib) / 1024))"
            ts_cold
            record slice "${ds}_${reg}_cold" ts_s "$TS_T"
        done
        curl_time "$url" "${RBYTES[$reg]}" >/dev/null
        for run in $(seq 1 "$RUNS"); do
            record slice "${ds}_${reg}_warm" zarrgate_s "$(curl_time "$url" "${RBYTES[$reg]}")"
        done
        record memory "slice_${ds}_${reg}_warm" vmhwm_mib "$(($(hwm_kib) / 1024))"
        # Cold in a running server: a fresh server warmed up by one slice of another array, then
        # each run reads a region of the same size that this server has not read before (the
        # page cache dropped first). Unlike the restart above, no process start-up is timed.
        log "slice $ds $reg: zarrgate cold in a running server (distinct regions) and tensorstore cold, interleaved"
        stop_zg
        start_zg
        curl -sf -o /dev/null "$ZG/api/v1/slice/bench/small/zstd.zarr?select=0:512,0:512&format=bin"
        side=$((${RBYTES[$reg]} == (64 << 20) ? 4096 : 8192))
        per_row=$((16384 / side))
        for run in $(seq 0 $((pairs - 1))); do
            [ "$run" -lt $((per_row * per_row)) ] || break
            r0=$(((run / per_row) * side))
            c0=$(((run % per_row) * side))
            drop_caches
            record slice "${ds}_${reg}_cold_running" zarrgate_s \
                "$(curl_time "$(slice_url "$ds.zarr" "$r0:$((r0 + side)),$c0:$((c0 + side))")" "${RBYTES[$reg]}")"
            ts_cold
            record slice "${ds}_${reg}_cold_running" ts_s "$TS_T"
        done
        if [ "$reg" = 64MiB ]; then
            # Cold in a running server whose chunk cache (512 MiB) is full, as it is in a server
            # that has been up for a while: filled by the eight 64 MiB regions of rows 8192-16383
            # first, then each run reads a region of rows 0-8191.
            log "slice $ds $reg: zarrgate cold in a running server with a full chunk cache and tensorstore cold, interleaved"
            stop_zg
            start_zg
            for fill in $(seq 8 15); do
                r0=$(((fill / 4) * 4096))
                c0=$(((fill % 4) * 4096))
                curl -sf -o /dev/null "$(slice_url "$ds.zarr" "$r0:$((r0 + 4096)),$c0:$((c0 + 4096))")"
            done
            for run in $(seq 0 $((pairs - 1))); do
                [ "$run" -lt 8 ] || break
                r0=$(((run / 4) * 4096))
                c0=$(((run % 4) * 4096))
                drop_caches
                record slice "${ds}_${reg}_cold_full_cache" zarrgate_s \
                    "$(curl_time "$(slice_url "$ds.zarr" "$r0:$((r0 + 4096)),$c0:$((c0 + 4096))")" "${RBYTES[$reg]}")"
                ts_cold
                record slice "${ds}_${reg}_cold_full_cache" ts_s "$TS_T"
            done
            record memory "slice_${ds}_${reg}_cold_full_cache" vmhwm_mib "$(($(hwm_kib) / 1024))"
        fi
        ts_stop
        for reader in ts zarr; do
            drop=""
            [ "$CAN_DROP" = 1 ] && drop="--drop-caches"
            modes="cold warm"
            [ "$reader" = ts ] && modes="warm"  # its cold runs were interleaved above
            log "slice $ds $reg: $reader $modes"
            for mode in $modes; do
                timeout 900 "$PY" bench/readers.py --reader "$reader" --array "$DATA/issue9/$ds.zarr" \
                    --select "${REGION[$reg]}" --mode "$mode" --runs "$RUNS" $drop >"$WORK/reader.out"
                while read -r t; do
                    record slice "${ds}_${reg}_${mode}" "${reader}_s" "$t"
                done <"$WORK/reader.out"
            done
        done
    done
done

# ---------------------------------------------------------------------------------------------
# ZOM of the 10,000-node hierarchy
# ---------------------------------------------------------------------------------------------
log "ZOM of 10,000 nodes: cold and warm"
ZOM_URL="$ZG/api/v1/zom/bench/hier/tree.zarr"
zom_time() {
    local r code t n
    r="$(curl -s -o "$WORK/zom.json" --max-time 300 -w '%{http_code} %{time_total} %{size_download}' "$ZOM_URL")"
    read -r code t n <<<"$r"
    [ "$code" = 200 ] || { echo "run.sh: ZOM -> HTTP $code" >&2; return 1; }
    echo "$t $n"
}
for run in $(seq 1 "$RUNS"); do
    stop_zg
    drop_caches
    start_zg
    read -r t n <<<"$(zom_time)"
    record zom cold s "$t"
done
note zom_bytes "$n"
note zom_nodes "$(python3 -c 'import json,sys
def count(n): return 1 + sum(count(m) for m in n.get("members", {}).values())
print(count(json.load(open(sys.argv[1]))))' "$WORK/zom.json")"
for run in $(seq 1 "$RUNS"); do
    read -r t n <<<"$(zom_time)"
    record zom warm s "$t"
done

# ---------------------------------------------------------------------------------------------
# Compressed text answers: bytes sent and wall time, as Accept-Encoding asks (warm)
# ---------------------------------------------------------------------------------------------
log "text answers: identity, gzip, zstd"
declare -A TEXT_URL=(
    [zom]="$ZOM_URL"
    [json_512x512]="$ZG/api/v1/slice/bench/issue9/sharded.zarr?select=0:512,0:512"
    [csv_2048x2048]="$ZG/api/v1/slice/bench/issue9/sharded.zarr?select=0:2048,0:2048&format=csv"
)
for case in zom json_512x512 csv_2048x2048; do
    for coding in identity gzip zstd; do
        curl -s -o /dev/null -H "Accept-Encoding: $coding" "${TEXT_URL[$case]}"
        for run in $(seq 1 "$RUNS"); do
            r="$(curl -s -o /dev/null -H "Accept-Encoding: $coding" --max-time 300 \
                -w '%{http_code} %{time_total} %{size_download}' "${TEXT_URL[$case]}")"
            read -r code t n <<<"$r"
            [ "$code" = 200 ] || { echo "run.sh: $case ($coding) -> HTTP $code" >&2; exit 1; }
            record compress "${case}_$coding" s "$t"
            record compress "${case}_$coding" bytes "$n"
        done
    done
done
stop_zg

# ---------------------------------------------------------------------------------------------
# Report
# ---------------------------------------------------------------------------------------------
note machine_cpu "$(awk -F': ' '/model name/ {print $2; exit}' /proc/cpuinfo) x $(nproc)"
note machine_mem "$(awk '/MemTotal/ {printf "%.1f GiB", $2 / 1048576}' /proc/meminfo)"
note machine_kernel "$(uname -sr)"
note zarrgate_rev "$(git rev-parse --short HEAD)$(git diff --quiet HEAD -- src Cargo.toml 2>/dev/null || echo ' + uncommitted changes')"
note rustc "$(rustc --version)"
note nginx "$("$NGINX" -v 2>&1 | sed 's/^nginx version: //')"
note wrk "$(wrk -v 2>&1 | head -1 | awk '{print $1, $2}')"
note curl "$(curl --version | head -1 | awk '{print $1, $2}')"
note python "$("$PY" --version 2>&1)"
note tensorstore "$("$PY" -c 'import importlib.metadata as m; print(m.version("tensorstore"))')"
note zarr_python "$("$PY" -c 'import zarr; print(zarr.__version__)')"
note runs "$RUNS"
note cold_64MiB_pairs "$COLD_RUNS"
note load_seconds "$DUR"
note total_seconds "$(($(date +%s) - T_START))"
note date "$(date -u '+%Y-%m-%d %H:%M UTC')"
python3 bench/report.py "$TSV" "$META" >"$OUT"
cp "$TSV" "$(dirname "$OUT")/results.tsv"
log "done in $(($(date +%s) - T_START)) s: $OUT"
