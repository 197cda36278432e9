#!/usr/bin/env bash
# Runs the whole kairos test suite on a fresh machine: installs what the tests need, builds the
# binaries the end-to-end tests start, then runs every test of the workspace.
# Binaries and tests are built in one profile (dev), so nothing is compiled twice.
set -euo pipefail
cd "$(dirname "$0")/.."
# The tests read none of the caller's own kairos configuration: every CLI they start gets a HOME
# of the tests' own (crates/cli/tests/e2e/harness.rs: kairos_in), and these, which would point
# it (or the Python client) at another cluster or context, are dropped here.
unset KAIROS_CONTEXT KAIROS_CONTROLLERS KAIROS_TOKEN KAIROS_TOKEN_FILE KAIROS_CA KAIROS_CERT KAIROS_KEY

if ! command -v cargo >/dev/null 2>&1; then
  echo "test.sh: cargo is required (https://rustup.rs)" >&2
  exit 1
fi

start=$(date +%s)
# No modules import each other in a cycle, at any level of a crate; no production function runs
# past 100 lines (issue 33), and at most 10 past TIGER_STYLE's 70 (issue 51). The gate scripts
# first catch the violations planted in scripts/gates/test_gates.py.
python3 scripts/gates/test_gates.py
for src in crates/*/src tests/chaos/src; do python3 scripts/module-cycles.py "$src"; done
python3 scripts/long-functions.py crates/*/src
LONG_FUNCTION_LINES=70 MAX_FOUND=10 python3 scripts/long-functions.py crates/*/src
# Python packages of the tests — moto's EC2 server for the cloud burst tests; grpcio and the
# kairos_client package (clients/python, its stubs generated from proto/) for the Python client
# tests — are installed into their own environment under target/ (a venv, or a --target
# directory where Python has no venv module), so nothing of the machine's Python is changed;
# the tests find it through KAIROS_TEST_PYTHON. kairos_client is reinstalled on every run (the
# protos may have changed); the rest only when missing.
if ! command -v python3 >/dev/null 2>&1; then
  echo "test.sh: python3 is required for the cloud burst (moto) and Python client tests" >&2
  exit 1
fi
# selenium drives Chromium in the web UI test; openapi-spec-validator checks /api/v1/openapi.json.
py_pkgs=('moto[server]>=5.1,<6' 'boto3' 'grpcio>=1.60' 'grpcio-tools>=1.60' 'setuptools>=61' 'wheel'
  'selenium>=4.20' 'openapi-spec-validator>=0.7')
py_check='import moto.server, boto3, grpc, grpc_tools, setuptools, selenium, openapi_spec_validator'
pip_quiet=(--quiet --disable-pip-version-check)
if [ -z "${KAIROS_TEST_NO_VENV:-}" ] && { [ -x target/tools/moto/bin/python ] || python3 -m venv target/tools/moto >/dev/null 2>&1; }; then
  export KAIROS_TEST_PYTHON="$PWD/target/tools/moto/bin/python"
  py_target=()
  py_into=()
else
  export PYTHONPATH="$PWD/target/tools/moto-lib${PYTHONPATH:+:$PYTHONPATH}"
  export KAIROS_TEST_PYTHON=python3
  py_target=(--target target/tools/moto-lib --upgrade)
  py_into=(--target target/tools/moto-lib)
fi
# Installed beside the build (only the tests need them); waited for before the tests.
py_log=$(mktemp)
(
  set -e
  if ! "$KAIROS_TEST_PYTHON" -c "$py_check" >/dev/null 2>&1; then
    "$KAIROS_TEST_PYTHON" -m pip install "${pip_quiet[@]}" "${py_into[@]}" "${py_pkgs[@]}"
  fi
  "$KAIROS_TEST_PYTHON" -c "$py_check" || { echo "test.sh: installing the tests' Python packages failed"; exit 1; }
  "$KAIROS_TEST_PYTHON" -m pip install "${pip_quiet[@]}" --no-build-isolation --no-deps --force-reinstall \
    "${py_target[@]}" ./clients/python
  "$KAIROS_TEST_PYTHON" -c 'import kairos_client' || { echo "test.sh: installing clients/python failed"; exit 1; }
) >"$py_log" 2>&1 &
py_pid=$!

# Debian packages the tests use, installed when missing (as root, with apt), beside the build:
# - iproute2, iptables: the chaos tests build separate hosts from network namespaces;
# - prometheus (with promtool): the observability tests scrape the daemons and lint rules;
# - systemd (systemd-analyze): the deployment test verifies the unit files in deploy/systemd;
# - chromium, chromium-driver: the web UI test drives headless Chromium;
# - umoci, busybox-static: the container tests build their image (an OCI layout of busybox).
missing=()
command -v ip >/dev/null 2>&1 || missing+=(iproute2)
command -v iptables >/dev/null 2>&1 || missing+=(iptables)
{ command -v prometheus >/dev/null 2>&1 && command -v promtool >/dev/null 2>&1; } || missing+=(prometheus)
command -v systemd-analyze >/dev/null 2>&1 || missing+=(systemd)
{ [ -x /usr/bin/chromium ] && [ -x /usr/bin/chromedriver ]; } || missing+=(chromium chromium-driver)
command -v umoci >/dev/null 2>&1 || missing+=(umoci)
dpkg -s busybox-static >/dev/null 2>&1 || missing+=(busybox-static)
debs_log=$(mktemp)
debs_pid=
if [ "${#missing[@]}" -gt 0 ]; then
  if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then
    # Niced: the build beside it comes first (the tests, which need them, come after it).
    ( export DEBIAN_FRONTEND=noninteractive
      nice -n 10 apt-get update -qq && nice -n 10 apt-get install -y -qq --no-install-recommends "${missing[@]}" ) >"$debs_log" 2>&1 &
    debs_pid=$!
  else
    echo "test.sh: the tests need the Debian packages ${missing[*]}, and root to use them" >&2
    exit 1
  fi
fi

# The Terraform burst module (parses, checkov passes) needs only Python tools: checked beside
# the build.
tf_log=$(mktemp)
nice -n 15 bash scripts/check-terraform.sh >"$tf_log" 2>&1 &
tf_pid=$!
# Where the time goes (printed as each phase ends: seconds since the start).
phase() { echo "test.sh: $1 at +$(( $(date +%s) - start ))s"; }
cargo build --workspace --bins --locked
phase "binaries built"
# The deterministic simulation of the control plane (issue 14): seeded fault schedules from a
# fresh seed each run (printed first; a failing schedule prints the command that replays it),
# on one thread beside the test build and the tests, most of which wait on real time — niced,
# so that it takes the CPU they leave and never slows the ones that measure time.
# 100 per run (was 200): after issue 51 a debug schedule costs about twice what it did, and the
# simulation became the suite's critical path; the release run of 1,000 is the real gate.
sim_log=$(mktemp)
nice -n 15 ./target/debug/kairos-chaos --schedules "${KAIROS_SIM_SCHEDULES:-100}" --threads 1 >"$sim_log" 2>&1 &
sim_pid=$!
cargo test --workspace --locked --no-run
phase "tests built"
if [ -n "$debs_pid" ] && ! wait "$debs_pid"; then
  cat "$debs_log"
  echo "test.sh: installing the Debian packages ${missing[*]} failed" >&2
  exit 1
fi
rm -f "$debs_log"
if ! wait "$py_pid"; then
  cat "$py_log"
  echo "test.sh: installing the tests' Python packages failed" >&2
  exit 1
fi
rm -f "$py_log"
phase "packages installed"
# The chaos suite (separate hosts in network namespaces, ~3 minutes mostly spent waiting on its
# faults and workload) runs beside the rest of the tests rather than after them.
suite_bin=$(cargo test -p kairos-chaos --test suite --locked --no-run 2>&1 |
  sed -n 's/.*(\(target\/[^)]*\/suite-[0-9a-f]*\)).*/\1/p' | tail -1)
if [ -z "$suite_bin" ]; then
  echo "test.sh: cannot find the chaos suite's test binary" >&2
  exit 1
fi
suite_log=$(mktemp)
( cd tests/chaos && "../../$suite_bin" --test-threads 1 >"$suite_log" 2>&1 ) &
suite_pid=$!
rest=0
cargo test --workspace --locked -- --test-threads "${KAIROS_TEST_THREADS:-4}" --skip chaos_suite --skip scale:: || rest=$?
phase "workspace tests done"
# A thousand agents (crates/cli/tests/e2e/scale.rs) on their own, once the other tests are done:
# beside four other tests on debug builds, heartbeats wait seconds for a CPU and the run
# measures the machine's contention, not the cluster.
cargo test -p kairos-cli --test e2e --locked -- scale:: --test-threads 1 || rest=$?
phase "scale test done"
suite=0
wait "$suite_pid" || suite=$?
echo "test.sh: the chaos suite (tests/chaos/tests/suite.rs):"
cat "$suite_log"
phase "chaos suite done"
sim=0
wait "$sim_pid" || sim=$?
phase "simulation done"
echo "test.sh: the deterministic simulation (kairos-chaos):"
cat "$sim_log"
tf=0
wait "$tf_pid" || tf=$?
echo "test.sh: the Terraform module (scripts/check-terraform.sh):"
cat "$tf_log"
rm -f "$suite_log" "$sim_log" "$tf_log"
if [ "$rest" -ne 0 ] || [ "$suite" -ne 0 ] || [ "$sim" -ne 0 ] || [ "$tf" -ne 0 ]; then
  echo "test.sh: tests failed (workspace: exit $rest; chaos suite: exit $suite; simulation: exit $sim; terraform: exit $tf)" >&2
  exit 1
fi
echo "test.sh: whole suite took $(( $(date +%s) - start ))s"
