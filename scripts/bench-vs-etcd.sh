#!/usr/bin/env bash
# Submit throughput against etcd on the same machine, side by side, in one run:
#   3 etcd members (Debian etcd-server, installed when missing) on loopback, then the same closed
#   loop of CLIENTS clients as puts (kairos-bench etcd-put), then kairos-bench submit on a fresh
#   3-replica kairos cluster with the same concurrency. Both are durable before they answer
#   (etcd fsyncs its WAL; kairosd its log). Prints one JSON object: both results and the ratio.
#
#   scripts/bench-vs-etcd.sh [CLIENTS] [SECONDS] [CONNS]   (defaults 64, 10, one connection per
#   client; CONNS: connections to each server, shared by the clients). Both results carry each
#   process's CPU time per operation.
set -euo pipefail
cd "$(dirname "$0")/.."
clients=${1:-64}
seconds=${2:-10}
conns=${3:-$clients}

if ! command -v etcd >/dev/null; then
  if [ "$(id -u)" -ne 0 ]; then
    echo "bench-vs-etcd: etcd is missing; run as root to install Debian's etcd-server" >&2
    exit 1
  fi
  DEBIAN_FRONTEND=noninteractive apt-get install -y -q etcd-server >/dev/null \
    || { apt-get update -q >/dev/null && DEBIAN_FRONTEND=noninteractive apt-get install -y -q etcd-server >/dev/null; }
fi
# The same build as the README's (`cargo build --release --bins`): selecting packages would resolve
# features differently and rebuild most of the workspace.
cargo build --release -q --bins --locked

work=$(mktemp -d)
pids=()
cleanup() {
  for p in "${pids[@]}"; do kill "$p" 2>/dev/null || true; done
  wait 2>/dev/null || true
  rm -rf "$work"
}
trap cleanup EXIT

# Free loopback ports: ask the kernel for six, in one go.
read -r -a ports < <(python3 -c '
import socket
s = [socket.socket() for _ in range(6)]
for x in s: x.bind(("127.0.0.1", 0))
print(" ".join(str(x.getsockname()[1]) for x in s))
for x in s: x.close()')
cluster=""
endpoints=""
for i in 0 1 2; do
  cluster+="${cluster:+,}m$i=http://127.0.0.1:${ports[$((i * 2 + 1))]}"
  endpoints+="${endpoints:+,}127.0.0.1:${ports[$((i * 2))]}"
done
for i in 0 1 2; do
  client=${ports[$((i * 2))]}
  peer=${ports[$((i * 2 + 1))]}
  ETCD_UNSUPPORTED_ARCH=${ETCD_UNSUPPORTED_ARCH:-} etcd --name "m$i" --data-dir "$work/m$i" \
    --listen-client-urls "http://127.0.0.1:$client" --advertise-client-urls "http://127.0.0.1:$client" \
    --listen-peer-urls "http://127.0.0.1:$peer" --initial-advertise-peer-urls "http://127.0.0.1:$peer" \
    --initial-cluster "$cluster" --initial-cluster-state new --initial-cluster-token bench \
    --log-level error >"$work/m$i.log" 2>&1 &
  pids+=($!)
done

etcd_json=$(./target/release/kairos-bench etcd-put --endpoints "$endpoints" --clients "$clients" --conns "$conns" --seconds "$seconds" \
  --pids "$(IFS=,; echo "${pids[*]}")")
for p in "${pids[@]}"; do kill "$p" 2>/dev/null || true; done
wait 2>/dev/null || true
pids=()
kairos_json=$(./target/release/kairos-bench submit --controllers 3 --clients "$clients" --conns "$conns" --seconds "$seconds")

ETCD="$etcd_json" KAIROS="$kairos_json" python3 -c '
import json, os
e = json.loads(os.environ["ETCD"]); k = json.loads(os.environ["KAIROS"])
print(json.dumps({
    "etcd": e, "kairos": k,
    "ratio": round(k["submits_per_s"] / max(e["puts_per_s"], 1), 2),
    "etcd_version": os.popen("etcd --version 2>/dev/null").read().split("\n")[0],
}))'
