#!/usr/bin/env bash
# Runs the whole kairos test suite on a fresh machine: installs what the tests need, builds the
# binaries the end-to-end tests start, then runs every test of the workspace.
# Binaries and tests are built in one profile (dev), so nothing is compiled twice.
set -euo pipefail
cd "$(dirname "$0")/.."

if ! command -v cargo >/dev/null 2>&1; then
  echo "test.sh: cargo is required (https://rustup.rs)" >&2
  exit 1
fi

start=$(date +%s)
# Cloud burst tests run against moto's EC2 server (a Python package, run as `python3 -m moto.server`).
if ! command -v python3 >/dev/null 2>&1; then
  echo "test.sh: python3 is required for the cloud burst tests (moto)" >&2
  exit 1
fi
if ! python3 -c 'import moto.server, boto3' >/dev/null 2>&1; then
  python3 -m pip install --quiet --disable-pip-version-check 'moto[server]>=5.1,<6'
fi
python3 -c 'import moto.server, boto3' || { echo "test.sh: installing moto failed" >&2; exit 1; }

cargo build --workspace --bins --locked
cargo test --workspace --locked -- --test-threads "${KAIROS_TEST_THREADS:-4}"
# The Terraform burst module: parses, and checkov passes.
bash scripts/check-terraform.sh
echo "test.sh: whole suite took $(( $(date +%s) - start ))s"
