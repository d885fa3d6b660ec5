#!/usr/bin/env bash
# Runs every fuzz target for a bounded time, then minimizes its corpus (cargo fuzz cmin), and
# prints executions and findings per target. Exits non-zero when a target found something
# (the inputs are under fuzz/artifacts/<target>/).
#
#   fuzz/run.sh                      # every target, 60 s each
#   FUZZ_SECONDS=300 fuzz/run.sh shard codecs
#
# Environment: FUZZ_SECONDS (default 60), CARGO_TARGET_DIR (default fuzz/target),
# ZARRGATE_CACHE (where cargo-fuzz is installed; default ~/.cache/zarrgate). One fuzzing
# process at a time, targets one after another.
set -euo pipefail

HERE=$(cd "$(dirname "$0")" && pwd)
REPO=$(dirname "$HERE")
SECONDS_EACH=${FUZZ_SECONDS:-60}
CACHE=${ZARRGATE_CACHE:-$HOME/.cache/zarrgate}
TARGET_DIR=${CARGO_TARGET_DIR:-$HERE/target}
ALL="metadata_v2 metadata_v3 selection codecs shard varlen path"
TARGETS=${*:-$ALL}
CARGO_FUZZ_VERSION=0.13.2

# cargo-fuzz needs nightly-only rustc flags (-Zsanitizer=address, sanitizer coverage); on the
# stable toolchain RUSTC_BOOTSTRAP=1 allows them. A nightly toolchain works too.
export RUSTC_BOOTSTRAP=1
export PATH="$CACHE/cargo-fuzz/bin:$PATH"
if ! cargo fuzz --version 2>/dev/null | grep -q "$CARGO_FUZZ_VERSION"; then
    echo "== installing cargo-fuzz $CARGO_FUZZ_VERSION into $CACHE/cargo-fuzz"
    cargo install cargo-fuzz --version "$CARGO_FUZZ_VERSION" --locked --root "$CACHE/cargo-fuzz"
fi

cd "$REPO"
echo "== building the fuzz targets (target dir $TARGET_DIR)"
cargo fuzz build --target-dir "$TARGET_DIR"
BIN_DIR="$TARGET_DIR/$(rustc -vV | sed -n 's/^host: //p')/release"

# Seeds from the fixtures join the committed corpus (cmin drops the redundant ones again).
SEEDS=$(mktemp -d)
trap 'rm -rf "$SEEDS"' EXIT
python3 "$HERE/make_seeds.py" "$SEEDS"

declare -A EXECS FINDS STATUS
failed=0
for t in $TARGETS; do
    corpus="$HERE/corpus/$t"
    artifacts="$HERE/artifacts/$t"
    mkdir -p "$corpus" "$artifacts"
    cp -n "$SEEDS/$t"/* "$corpus"/ 2>/dev/null || true
    before=$(find "$artifacts" -type f | wc -l)
    log="$TARGET_DIR/fuzz-$t.log"
    echo "== $t: ${SECONDS_EACH}s (log $log)"
    dict=()
    case $t in
        metadata_v2 | metadata_v3) dict=(-dict="$HERE/dict/metadata.dict") ;;
        selection | path) dict=(-dict="$HERE/dict/$t.dict") ;;
    esac
    set +e
    # The binary cargo fuzz built, run directly: nothing is rebuilt inside the time budget.
    # -timeout: one input may take 10 s; -rss_limit_mb: also the largest single allocation.
    timeout --kill-after=30 $((SECONDS_EACH + 60)) "$BIN_DIR/$t" "$corpus" \
        -artifact_prefix="$artifacts/" -max_total_time="$SECONDS_EACH" -timeout=10 \
        -rss_limit_mb=2048 -print_final_stats=1 "${dict[@]}" >"$log" 2>&1
    rc=$?
    set -e
    EXECS[$t]=$(grep -o 'stat::number_of_executed_units: [0-9]*' "$log" | tail -1 | grep -o '[0-9]*$' || echo "?")
    FINDS[$t]=$(( $(find "$artifacts" -type f | wc -l) - before ))
    if [ "$rc" -ne 0 ] || [ "${FINDS[$t]}" -gt 0 ]; then
        STATUS[$t]="FAIL (exit $rc)"
        failed=1
        grep -E -m5 'panicked at|ERROR: libFuzzer|SUMMARY|==ERROR' "$log" || true
    else
        STATUS[$t]=ok
    fi
    echo "== $t: minimizing the corpus"
    before_n=$(find "$corpus" -type f | wc -l)
    # cargo fuzz cmin, without the rebuild: merge into an empty directory, then swap.
    merged=$(mktemp -d)
    if timeout 600 "$BIN_DIR/$t" -merge=1 -timeout=10 -rss_limit_mb=2048 "$merged" "$corpus" \
        >"$TARGET_DIR/cmin-$t.log" 2>&1; then
        rm -rf "$corpus" && mv "$merged" "$corpus" && chmod 755 "$corpus"
    else
        rm -rf "$merged"
        echo "   cmin failed, see $TARGET_DIR/cmin-$t.log"
    fi
    echo "   corpus: $before_n -> $(find "$corpus" -type f | wc -l) inputs"
done

echo
printf '%-12s %14s %8s %9s  %s\n' target executions seconds findings status
for t in $TARGETS; do
    printf '%-12s %14s %8s %9s  %s\n' "$t" "${EXECS[$t]}" "$SECONDS_EACH" "${FINDS[$t]}" "${STATUS[$t]}"
done
echo "corpus total: $(du -sh --apparent-size "$HERE/corpus" | cut -f1) in $(find "$HERE/corpus" -type f | wc -l) files"
exit $failed
