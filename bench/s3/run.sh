#!/usr/bin/env bash
# One-chunk sharded slice on S3 (moto): zarrgate cold/warm vs zarr-python + obstore.
# Writes bench/s3/results.md. ZARRGATE_BIN skips the release build.
set -euo pipefail
cd "$(dirname "$0")/../.."
moto="$(scripts/python-env.sh moto tests/remote/requirements-moto.txt)"
py="$(scripts/python-env.sh interop tests/interop/requirements.txt)"
bin="${ZARRGATE_BIN:-}"
if [ -z "$bin" ]; then
  cargo build --release --bin zarrgate
  bin=target/release/zarrgate
fi
"$py/bin/python" bench/s3/s3_slice.py "$bin" "$moto/bin/moto_server" bench/s3/results.md
