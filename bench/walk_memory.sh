#!/usr/bin/env bash
# Memory of repeated hierarchy walks: serves the bench data's 10,000-node hierarchy with a
# hierarchy cache too small to hold it (so every request walks it again), asks for its
# consolidated zarr.json N times, PAR at once, and prints the server's peak and final RSS.
#
#   bench/walk_memory.sh [BIN]        # default target/release/zarrgate
#   N=160 PAR=8 bench/walk_memory.sh  # (defaults)
#
# Needs the bench data (bench/run.sh makes it, or bench/make_datasets.py).
set -euo pipefail
HERE=$(cd "$(dirname "$0")" && pwd)
BIN=${1:-$HERE/../target/release/zarrgate}
DATA=${ZARRGATE_CACHE:-$HOME/.cache/zarrgate}/bench-data/hier
[ -d "$DATA/tree.zarr" ] || { echo "no bench data at $DATA (run bench/run.sh once)"; exit 1; }
WORK=$(mktemp -d /tmp/zarrgate-walks.XXXXXX)
PORT=$(python3 -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')
cat > "$WORK/config.toml" <<TOML
[server]
bind = "127.0.0.1:$PORT"
[cache]
hierarchy_bytes = 1000000
[mounts.h]
url = "$DATA"
TOML
ZARRGATE_LOG=warn "$BIN" serve --config "$WORK/config.toml" >"$WORK/log" 2>&1 &
PID=$!
trap 'kill $PID 2>/dev/null; wait $PID 2>/dev/null; rm -rf "$WORK"' EXIT
for _ in $(seq 100); do curl -sf "http://127.0.0.1:$PORT/healthz" >/dev/null && break; sleep 0.1; done
start=$(date +%s.%N)
seq "${N:-160}" | xargs -P "${PAR:-8}" -I{} curl -s -o /dev/null "http://127.0.0.1:$PORT/zarr/h/tree.zarr/zarr.json"
end=$(date +%s.%N)
hwm=$(awk '/VmHWM/ {print int($2 / 1024)}' "/proc/$PID/status")
rss=$(awk '/VmRSS/ {print int($2 / 1024)}' "/proc/$PID/status")
echo "walks ${N:-160} (${PAR:-8} at once): peak RSS $hwm MiB, RSS after $rss MiB, $(echo "$end - $start" | bc) s"
