#!/usr/bin/env bash
# zarrgate load test: builds the release binary, serves the demo, the test fixtures and a
# synthetic 1 GiB array on 127.0.0.1 with a 256 MiB chunk cache, and drives it with wrk for 60 s
# over 256 connections: raw keys (whole and ranged), cached slices, uncached slices of random
# regions, and ZOM calls. Samples the server's RSS every second. Fails (exit 1) on any 5xx, on
# socket errors or timeouts, on unexpected WARN/ERROR lines in the server log, on an RSS peak
# above cache + 128 MiB, or on RSS drift above 64 MiB between the first 10 s after warm-up and
# the last 10 s.
#
#   load/run.sh
#   LOAD_SECONDS=120 LOAD_CONNECTIONS=512 load/run.sh
#
# Environment: LOAD_SECONDS (60), LOAD_CONNECTIONS (256), LOAD_CACHE_MB (256), LOAD_WARMUP (15,
# seconds of load before the first RSS window), LOAD_RSS_HEADROOM_MB (128), LOAD_RSS_DRIFT_MB
# (64), LOAD_EXPECTED_LOG (a grep -E pattern of WARN/ERROR lines that do not fail the run),
# LOAD_SERVER_ENV (extra environment of the server, e.g. MALLOC_ARENA_MAX=2), CARGO_TARGET_DIR
# (the release build; default target/), ZARRGATE_BIN (skip the build),
# LOAD_KEEP=1 keeps the work directory (logs, RSS samples, wrk output).
set -euo pipefail

HERE=$(cd "$(dirname "$0")" && pwd)
REPO=$(dirname "$HERE")
DURATION=${LOAD_SECONDS:-60}
CONNS=${LOAD_CONNECTIONS:-256}
CACHE_MB=${LOAD_CACHE_MB:-256}
export LOAD_WARMUP=${LOAD_WARMUP:-15} LOAD_RSS_HEADROOM_MB=${LOAD_RSS_HEADROOM_MB:-128}
export LOAD_RSS_DRIFT_MB=${LOAD_RSS_DRIFT_MB:-64} LOAD_EXPECTED_LOG=${LOAD_EXPECTED_LOG:-}

if [ -z "${ZARRGATE_BIN:-}" ]; then
    echo "== building the release binary (target dir ${CARGO_TARGET_DIR:-$REPO/target})"
    (cd "$REPO" && cargo build --release --quiet)
    ZARRGATE_BIN="${CARGO_TARGET_DIR:-$REPO/target}/release/zarrgate"
fi
if ! command -v wrk >/dev/null; then
    echo "== installing wrk (Debian)"
    if [ "$(id -u)" = 0 ]; then apt-get install -y -q wrk >/dev/null; else sudo apt-get install -y -q wrk >/dev/null; fi
fi

WORK=$(mktemp -d /tmp/zarrgate-load.XXXXXX)
SERVER_PID=""
SAMPLER_PID=""
WRK_PIDS=()
cleanup() {
    for p in "${WRK_PIDS[@]}" $SAMPLER_PID; do kill "$p" 2>/dev/null || true; done
    if [ -n "$SERVER_PID" ] && kill -0 "$SERVER_PID" 2>/dev/null; then
        kill -TERM "$SERVER_PID" 2>/dev/null || true
        for _ in $(seq 50); do kill -0 "$SERVER_PID" 2>/dev/null || break; sleep 0.2; done
        kill -KILL "$SERVER_PID" 2>/dev/null || true
    fi
    if [ "${LOAD_KEEP:-0}" = 1 ]; then echo "work directory kept: $WORK"; else rm -rf "$WORK"; fi
}
trap cleanup EXIT

PORT=$(python3 -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')
BASE="http://127.0.0.1:$PORT"
echo "== preparing $WORK (synthetic array, config, URL lists)"
python3 "$HERE/prepare.py" "$WORK" "$PORT" $((CACHE_MB << 20))

echo "== starting zarrgate on $BASE (chunk cache $CACHE_MB MiB)"
# LOAD_SERVER_ENV: extra environment of the server, e.g. "MALLOC_ARENA_MAX=2".
env ${LOAD_SERVER_ENV:-} ZARRGATE_LOG=warn "$ZARRGATE_BIN" serve --config "$WORK/config.toml" >"$WORK/server.log" 2>&1 &
SERVER_PID=$!
for _ in $(seq 150); do
    curl -sf -o /dev/null "$BASE/healthz" && break
    kill -0 "$SERVER_PID" 2>/dev/null || { cat "$WORK/server.log"; exit 1; }
    sleep 0.2
done
curl -sf -o /dev/null "$BASE/healthz" || { echo "server did not come up"; cat "$WORK/server.log"; exit 1; }

# One request per URL first: statuses of the whole URL set (and a warm metadata cache).
echo "== preflight: one request per URL"
: >"$WORK/preflight.txt"
for list in raw slices zom; do
    while read -r path; do
        printf '%s %s\n' "$(curl -g -s -o /dev/null -w '%{http_code}' --max-time 30 "$BASE$path")" "$path" >>"$WORK/preflight.txt"
    done <"$WORK/$list.txt"
done
while read -r path; do
    printf '%s %s\n' "$(curl -g -s -o /dev/null -w '%{http_code}' --max-time 30 -H 'Range: bytes=-16' "$BASE$path")" "$path" >>"$WORK/preflight.txt"
done <"$WORK/ranged.txt"

rss_kb() { awk '/^VmRSS/ {print $2}' "/proc/$SERVER_PID/status" 2>/dev/null || echo 0; }
echo "rss before load: $(( $(rss_kb) / 1024 )) MiB"
(
    while kill -0 "$SERVER_PID" 2>/dev/null; do
        echo "$(date +%s.%N) $(rss_kb) $(awk '/^Threads/ {print $2}' "/proc/$SERVER_PID/status" 2>/dev/null)"
        sleep 1
    done
) >"$WORK/rss.txt" &
SAMPLER_PID=$!

# Connection shares per kind (percent); the last kind takes the rounding remainder.
KINDS=(raw ranged slice_cached slice_uncached zom)
SHARES=(30 15 20 25 10)
echo "== load: ${DURATION}s, $CONNS connections"
date +%s.%N >"$WORK/load_start"
left=$CONNS
for i in "${!KINDS[@]}"; do
    kind=${KINDS[$i]}
    if [ "$i" -eq $((${#KINDS[@]} - 1)) ]; then c=$left; else c=$((CONNS * SHARES[i] / 100)); fi
    left=$((left - c))
    [ "$c" -ge 1 ] || continue
    echo "   $kind: $c connections"
    timeout --kill-after=10 $((DURATION + 60)) wrk -t1 -c"$c" -d"${DURATION}s" --timeout 30s --latency \
        -s "$HERE/mix.lua" "$BASE" -- "$WORK" "$kind" >"$WORK/wrk-$kind.txt" 2>&1 &
    WRK_PIDS+=($!)
done
wrk_failed=0
for p in "${WRK_PIDS[@]}"; do wait "$p" || wrk_failed=1; done
WRK_PIDS=()
date +%s.%N >"$WORK/load_end"
sleep 2
kill "$SAMPLER_PID" 2>/dev/null || true
wait "$SAMPLER_PID" 2>/dev/null || true
SAMPLER_PID=""
curl -s "$BASE/metrics" >"$WORK/metrics.txt" || true
alive=1
kill -0 "$SERVER_PID" 2>/dev/null || alive=0

set +e
python3 "$HERE/summarize.py" "$WORK" "$CACHE_MB" "$alive" "$wrk_failed"
rc=$?
set -e
exit $rc
