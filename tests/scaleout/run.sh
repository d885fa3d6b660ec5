#!/usr/bin/env bash
# Scale-out topology test (issue #49): three zarrgate replicas behind nginx with the balancer's
# own config (deploy/nginx/zarrgate-lb.conf, rewritten to 127.0.0.1 ports and a temporary
# prefix), all as processes on 127.0.0.1; no Docker, no Kubernetes.
#
#   tests/scaleout/run.sh                                  # builds target/release/zarrgate first
#   ZARRGATE_BIN=/path/to/zarrgate tests/scaleout/run.sh   # uses that binary, no cargo build
#   ZARRGATE_LB_CONF=other.conf ...                        # another nginx conf (default: deploy's)
#
# Installs nginx with apt-get when absent, and the pinned Python packages
# (tests/scaleout/requirements.txt) with scripts/python-env.sh. Runs test_scaleout.py with
# pytest; every process it starts is stopped by its PID, here too if the tests could not.
# Ends with ONE line "N passed, N failed, N skipped"; exits non-zero if anything failed.
set -uo pipefail
cd "$(dirname "$0")/../.."
work="$(mktemp -d /tmp/zarrgate-scaleout.XXXXXX)"
chmod 755 "$work"  # nginx's workers (another user when run as root) write temp files below it
cleanup() {
  # The tests stop what they start; a test process that was killed leaves its PIDs in
  # $work/run/pids. Each is stopped only if its command line names $work (so it is one of ours).
  local pid kind
  if [ -f "$work/run/pids" ]; then
    while read -r pid kind; do
      [ -n "$pid" ] || continue
      if tr '\0' ' ' <"/proc/$pid/cmdline" 2>/dev/null | grep -qF -- "$work"; then
        echo "scaleout: stopping $kind (PID $pid) left running"
        if [ "$kind" = nginx ]; then kill -TERM "$pid" 2>/dev/null; else kill -KILL "$pid" 2>/dev/null; fi
      fi
    done <"$work/run/pids"
    sleep 0.5
  fi
  rm -rf "$work"
}
trap cleanup EXIT
fail_setup() { echo "scaleout: $1"; echo "0 passed, 1 failed, 0 skipped"; exit 1; }
export PYTHONDONTWRITEBYTECODE=1
start=$(date +%s)

if ! command -v nginx >/dev/null && [ ! -x /usr/sbin/nginx ]; then
  echo "scaleout: installing nginx with apt-get"
  { apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq nginx; } >&2 \
    || fail_setup "nginx is not installed and apt-get could not install it"
fi
PATH="$PATH:/usr/sbin"

venv="$(scripts/python-env.sh scaleout tests/scaleout/requirements.txt)" \
  || fail_setup "could not install tests/scaleout/requirements.txt"

bin="$(scripts/zarrgate-bin.sh)" || fail_setup "no zarrgate binary (scripts/zarrgate-bin.sh)"
conf="${ZARRGATE_LB_CONF:-deploy/nginx/zarrgate-lb.conf}"
[ -f "$conf" ] || fail_setup "no nginx conf at $conf"
echo "scaleout: $bin, nginx $(nginx -v 2>&1 | sed 's/.*\///'), $conf"

ZARRGATE_BIN="$bin" ZARRGATE_LB_CONF="$conf" ZARRGATE_SCALEOUT_WORK="$work/run" \
  timeout 300 "$venv/bin/python" -m pytest -q -p no:cacheprovider -rfE --tb=short --durations=0 \
  --junitxml="$work/junit.xml" tests/scaleout/test_scaleout.py
rc=$?

"$venv/bin/python" - "$work/junit.xml" "$rc" "$(( $(date +%s) - start ))" <<'PY'
import sys, xml.etree.ElementTree as ET

xml, rc, seconds = sys.argv[1], int(sys.argv[2]), sys.argv[3]
p = f = s = 0
try:
    for tc in ET.parse(xml).getroot().iter("testcase"):
        if tc.find("failure") is not None or tc.find("error") is not None:
            f += 1
        elif tc.find("skipped") is not None:
            s += 1
        else:
            p += 1
except Exception as e:  # no report: pytest itself failed
    print(f"scaleout: no test report ({e})")
if rc != 0 and f == 0:  # 2 interrupted, 3 internal error, 4 usage, 5 no tests, 124 timeout
    print(f"scaleout: pytest exited {rc}")
    f = 1
if p + f + s == 0:
    f = 1
print(f"== scaleout ({seconds} s)")
print(f"{p} passed, {f} failed, {s} skipped")
sys.exit(1 if f else 0)
PY
