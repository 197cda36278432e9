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
cargo build --workspace --bins --locked
cargo test --workspace --locked -- --test-threads "${KAIROS_TEST_THREADS:-4}"
echo "test.sh: whole suite took $(( $(date +%s) - start ))s"
