#!/usr/bin/env bash
# Interop suite: real Zarr clients read from a running zarrgate.
#
#   tests/interop/run.sh                               # builds target/release/zarrgate first (or under $CARGO_TARGET_DIR)
#   ZARRGATE_BIN=/path/to/zarrgate tests/interop/run.sh   # uses that binary, no cargo build
#
# Serves the demo (config.toml), the repo's fixtures (fx), arrays above the size at which
# slice responses stream (large, written by make_large.py) and, when present,
# ../shared/fixtures/zarrita (zarrita) on 127.0.0.1, then runs, against that one server:
#   1. the zarr 3 venv (requirements.txt): every test_*.py but test_v2_* and the access log;
#   2. the zarr 2.18 venv (requirements-zarr2.txt): test_v2_*.py;
#   3. tests/interop/browser/run_browser.sh and tests/interop/webpage/run_webpage.sh
#      "$ZARRGATE_URL", when they exist and are executable (the browser suite with its
#      neuroglancer cases unless ZARRGATE_NEUROGLANCER=0; they are skipped, not failed, when
#      neuroglancer cannot be installed);
#   4. the zarr 3 venv again: test_zz_access_log.py, over the access log of everything above.
# Stops the server by PID, prints one line per suite, and ends with ONE line
# "N passed, N failed, N skipped" summing all suites; exits non-zero if anything failed.
# Venvs are made by scripts/python-env.sh under ${ZARRGATE_CACHE:-~/.cache/zarrgate}.
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
fail_setup() { echo "interop: $1"; echo "0 passed, 1 failed"; exit 1; }
export PYTHONDONTWRITEBYTECODE=1
start=$(date +%s)

venv="$(scripts/python-env.sh interop tests/interop/requirements.txt)" \
  || fail_setup "could not install the zarr 3 Python clients (tests/interop/requirements.txt)"
venv2="$(scripts/python-env.sh interop-zarr2 tests/interop/requirements-zarr2.txt)" \
  || fail_setup "could not install the zarr 2 Python clients (tests/interop/requirements-zarr2.txt)"

bin="$(scripts/zarrgate-bin.sh)" || fail_setup "no zarrgate binary (scripts/zarrgate-bin.sh)"

port="$("$venv/bin/python" -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])')"
# Arrays larger than a streamed slice's first band, written by zarr-python (test_large_slices.py).
"$venv/bin/python" tests/interop/make_large.py "$work/large" \
  || fail_setup "tests/interop/make_large.py could not write its arrays"
# The documents of tests/fixtures/consolidation_cases.json, as a v2 and a v3 group
# (test_consolidated.py, test_v2_zarr2.py).
"$venv/bin/python" tests/interop/consolidation_groups.py "$work/consolidation" \
  || fail_setup "tests/interop/consolidation_groups.py could not write its groups"
mounts=(--mount "fx=$repo/tests/fixtures/data" --mount "large=$work/large" --mount "cases=$work/consolidation")
zarrita="$repo/../shared/fixtures/zarrita"
if [ -d "$zarrita" ]; then
  mounts+=(--mount "zarrita=$zarrita")
else
  echo "interop: ../shared/fixtures/zarrita absent, its cases are skipped"
fi
# The demo's config, its mount made absolute, with the reference mounts of
# tests/fixtures/references (test_references.py), which need settings --mount cannot give.
sed "s#^url = \"./data/demo\"#url = \"$repo/data/demo\"#" config.toml >"$work/interop.toml"
for refs in refs_templates refs_h5_v0; do
  printf '\n[mounts.%s]\nurl = "%s"\nformat = "references"\n' \
    "$refs" "$repo/tests/fixtures/references/$refs.json" >>"$work/interop.toml"
done
# The Icechunk repository of tests/fixtures/icechunk (test_icechunk.py); its virtual chunks'
# placeholder prefix file:///zarrgate-fixtures/ stands for tests/fixtures/.
printf '\n[mounts.ice]\nurl = "%s"\nformat = "icechunk"\n[mounts.ice.virtual_locations]\n"file:///zarrgate-fixtures/" = "%s"\n' \
  "$repo/tests/fixtures/icechunk/repo" "$repo/tests/fixtures/" >>"$work/interop.toml"
ZARRGATE_LOG=info "$bin" serve --config "$work/interop.toml" --bind "127.0.0.1:$port" "${mounts[@]}" \
  >"$work/server.out" 2>"$work/access.log" &
server_pid=$!
up=""
for _ in $(seq 1 200); do
  if curl -fs "http://127.0.0.1:$port/healthz" >/dev/null 2>&1; then up=1; break; fi
  kill -0 "$server_pid" 2>/dev/null || break
  sleep 0.1
done
if [ -z "$up" ]; then
  tail -20 "$work/access.log" "$work/server.out"
  fail_setup "the server did not come up on 127.0.0.1:$port"
fi
echo "interop: zarrgate ($bin) on 127.0.0.1:$port"

export ZARRGATE_URL="http://127.0.0.1:$port"
export ZARRGATE_REPO="$repo"
export ZARRGATE_ACCESS_LOG="$work/access.log"
export ZARRGATE_LARGE="$work/large"
pytest_args=(-q -p no:cacheprovider -rfE --tb=short)

echo "== zarr 3 clients: zarr-python (fsspec, obstore), xarray, tensorstore, pydantic-zarr, slice API"
timeout 720 "$venv/bin/python" -m pytest "${pytest_args[@]}" --junitxml="$work/1-zarr3.xml" \
  --ignore=tests/interop/test_zz_access_log.py tests/interop
echo $? >"$work/1-zarr3.rc"

echo "== zarr 2.18 clients (test_v2_*.py)"
timeout 300 "$venv2/bin/python" -m pytest "${pytest_args[@]}" --junitxml="$work/2-zarr2.xml" tests/interop
echo $? >"$work/2-zarr2.rc"

# Neuroglancer (browser/neuroglancer.cjs) runs by default: about 10 s once its venv is cached.
export ZARRGATE_NEUROGLANCER="${ZARRGATE_NEUROGLANCER:-1}"
# Node suites in headless Chromium: zarrita.js, then the web page. Each prints
# "<name>: N passed, N failed[, N skipped]" as its last line.
for suite in browser webpage; do
  runner="tests/interop/$suite/run_$suite.sh"
  if [ -x "$runner" ]; then
    echo "== $suite ($runner)"
    timeout 600 "$runner" "$ZARRGATE_URL" 2>&1 | tee "$work/$suite.out"
    echo "${PIPESTATUS[0]}" >"$work/$suite.rc"
  fi
done

echo "== access log"
timeout 120 "$venv/bin/python" -m pytest "${pytest_args[@]}" --junitxml="$work/4-access.xml" \
  tests/interop/test_zz_access_log.py
echo $? >"$work/4-access.rc"

kill "$server_pid" 2>/dev/null; wait "$server_pid" 2>/dev/null; server_pid=""

"$venv/bin/python" - "$work" "$(( $(date +%s) - start ))" <<'PY'
import collections, pathlib, re, sys, xml.etree.ElementTree as ET

work, seconds = pathlib.Path(sys.argv[1]), sys.argv[2]
rows = []  # (suite, passed, failed, skipped)


def junit(xml, rc_file):
    rc = int(rc_file.read_text().strip() or 1) if rc_file.exists() else 1
    counts = collections.OrderedDict()
    try:
        root = ET.parse(xml).getroot()
        for tc in root.iter("testcase"):
            name = tc.get("classname", "").split(".")[-1] or "collection"
            c = counts.setdefault(name + ".py", [0, 0, 0])
            if tc.find("failure") is not None or tc.find("error") is not None:
                c[1] += 1
            elif tc.find("skipped") is not None:
                c[2] += 1
            else:
                c[0] += 1
    except Exception as e:  # no report: pytest itself failed
        print(f"interop: no test report {xml.name} ({e})")
    if rc not in (0, 1) and not any(c[1] for c in counts.values()):
        # 2 interrupted, 3 internal error, 4 usage error, 5 no tests, 124 timeout
        counts[f"{xml.stem} (pytest exit {rc})"] = [0, 1, 0]
    rows.extend((k, *v) for k, v in counts.items())


junit(work / "1-zarr3.xml", work / "1-zarr3.rc")
junit(work / "2-zarr2.xml", work / "2-zarr2.rc")
for suite in ("browser", "webpage"):
    out = work / f"{suite}.out"
    if not out.exists():
        continue
    rc_file = work / f"{suite}.rc"
    rc = int(rc_file.read_text().strip() or 1) if rc_file.exists() else 1
    lines = [l for l in out.read_text(errors="replace").splitlines() if l.strip()]
    m = re.match(rf"\s*{suite}:\s*(\d+) passed, (\d+) failed(?:, (\d+) skipped)?\s*$", lines[-1] if lines else "")
    if m:
        p, f, s = int(m[1]), int(m[2]), int(m[3] or 0)
        if rc != 0 and f == 0:
            f = 1
    else:
        print(f"interop: run_{suite}.sh printed no '{suite}: N passed, N failed' last line (exit {rc})")
        p, f, s = 0, 1, 0
    rows.append((suite, p, f, s))
junit(work / "4-access.xml", work / "4-access.rc")

print(f"== interop summary ({seconds} s)")
for name, p, f, s in rows:
    print(f"suite {name}: {p} passed, {f} failed, {s} skipped")
P, F, S = (sum(r[i] for r in rows) for i in (1, 2, 3))
if not rows:
    F = 1
print(f"{P} passed, {F} failed, {S} skipped")
sys.exit(1 if F else 0)
PY
