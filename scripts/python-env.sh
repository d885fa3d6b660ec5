#!/usr/bin/env bash
# Usage: scripts/python-env.sh NAME REQFILE
#
# Creates (idempotently) a Python virtual environment at
#   ${ZARRGATE_CACHE:-$HOME/.cache/zarrgate}/venv-NAME
# installs the pinned requirements from REQFILE into it, and prints the venv path
# on stdout (all other output goes to stderr). The install is skipped when the
# stamp file inside the venv records the same hash of REQFILE.
#
# Example:
#   venv="$(scripts/python-env.sh fixtures tests/fixtures/requirements.txt)"
#   "$venv/bin/python" tests/fixtures/make_fixtures.py
set -euo pipefail

if [ "$#" -ne 2 ]; then
    echo "usage: $0 NAME REQFILE" >&2
    exit 2
fi
name="$1"
reqfile="$2"
if [ ! -f "$reqfile" ]; then
    echo "python-env: requirements file not found: $reqfile" >&2
    exit 2
fi
case "$name" in
    *[!A-Za-z0-9._-]*|'') echo "python-env: bad venv name: $name" >&2; exit 2 ;;
esac

python="${PYTHON:-python3}"
cache="${ZARRGATE_CACHE:-$HOME/.cache/zarrgate}"
venv="$cache/venv-$name"
stamp="$venv/.zarrgate-requirements.sha256"

hash="$( { "$python" --version 2>&1; cat "$reqfile"; } | sha256sum | cut -d' ' -f1)"

if [ -x "$venv/bin/python" ] && [ -f "$stamp" ] && [ "$(cat "$stamp")" = "$hash" ]; then
    echo "$venv"
    exit 0
fi

mkdir -p "$cache"
if [ ! -x "$venv/bin/python" ]; then
    echo "python-env: creating $venv" >&2
    "$python" -m venv "$venv" >&2
fi
rm -f "$stamp"
echo "python-env: installing $reqfile into $venv" >&2
"$venv/bin/python" -m pip install --quiet --upgrade pip >&2 || true
"$venv/bin/python" -m pip install --quiet -r "$reqfile" >&2
echo "$hash" > "$stamp"
echo "$venv"
