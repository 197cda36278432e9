#!/usr/bin/env bash
# The NVML check, for a machine with a real NVIDIA GPU (not part of the test suite or CI): the
# agent finds the GPUs (and MIG instances, if a GPU is already in MIG mode: the mode is never
# changed here) through NVML and registers its health watcher; a job runs a real kernel
# (scripts/device-kernel.py, driver API only) and the agent's metrics carry NVML's utilisation
# and memory while it runs; dcgm-exporter's job-mapping file names the job. Uses release binaries in
# target/release (kairosd, kairos-agent, kairos; B=DIR for others); writes what it saw under
# $OUT. With IMAGE=oci:/PATH:TAG (a busybox layout), a container job also runs on the GPU as a
# real user (its devices, capabilities and processes as its user namespace leaves them).
set -u
OUT=${OUT:-$(mktemp -d)}
B=${B:-target/release}
D=$(mktemp -d)
get() { # HTTP GET on loopback without curl: get PORT PATH
  exec 3<>"/dev/tcp/127.0.0.1/$1" && printf 'GET %s HTTP/1.0\r\n\r\n' "$2" >&3 && cat <&3; exec 3<&-
}
nvidia-smi -L > "$OUT/nvidia-smi.txt" 2>&1
"$B/kairosd" --id 1 --addr 127.0.0.1:7001 --data-dir "$D/c" --metrics-addr 127.0.0.1:9001 > "$OUT/kairosd.log" 2>&1 &
ctl=$!
sleep 2
"$B/kairos-agent" --controllers 127.0.0.1:7001 --addr 127.0.0.1:7101 --state-dir "$D/a" --name gpu-node \
  --gpu-backend nvml --join-token-file "$D/c/join.token" --run-as agent \
  --metrics-addr 127.0.0.1:9101 --hpc-job-mapping-dir "$D/map" --usage-interval 1s > "$OUT/agent.log" 2>&1 &
agent=$!
sleep 3
export KAIROS_TOKEN_FILE="$D/c/admin.token"
# Nothing of the caller's own kairos configuration (contexts, default token) is read.
export HOME="$D/home" XDG_CONFIG_HOME="$D/home/.config"
unset KAIROS_CONTEXT KAIROS_TOKEN KAIROS_CA KAIROS_CERT KAIROS_KEY
K() { "$B/kairos" --controllers 127.0.0.1:7001 "$@"; }
K nodes --json > "$OUT/nodes.json" 2>&1
kernel=$(realpath scripts/device-kernel.py)
id=$(K submit --gpus 1 -- sh -c "echo CUDA_VISIBLE_DEVICES=\$CUDA_VISIBLE_DEVICES CUDA_DEVICE_ORDER=\$CUDA_DEVICE_ORDER; nvidia-smi --query-gpu=index,uuid,pci.bus_id --format=csv; python3 $kernel 12")
echo "job $id" > "$OUT/job.txt"
sleep 8
get 9101 /metrics > "$OUT/agent-metrics.txt" 2>&1
get 9001 /metrics > "$OUT/kairosd-metrics.txt" 2>&1
{ ls -l "$D/map"; for f in "$D"/map/*; do echo "$f: $(cat "$f")"; done; } > "$OUT/job-mapping.txt" 2>&1
# What nvidia-smi sees of the GPU's memory while the job runs, beside what kairos measured.
nvidia-smi --query-gpu=index,utilization.gpu,memory.used --format=csv,noheader,nounits -lms 500 > "$OUT/smi-during-run.txt" 2>&1 &
smi=$!
K top "$id" --once > "$OUT/top.txt" 2>&1
K wait "$id" >> "$OUT/job.txt" 2>&1; echo "wait exit $?" >> "$OUT/job.txt"
kill "$smi" 2>/dev/null
K logs "$id" >> "$OUT/job.txt" 2>&1
# Issue 52: GPU_UTIL > 50 % for a real kernel, GPU_MEM_MAX within 5 % of nvidia-smi's peak.
K history --format id,GPU_UTIL,GPU_UTIL_MAX,GPU_MEM_MAX,CPU_EFF > "$OUT/usage.txt" 2>&1
K history --json > "$OUT/history.json" 2>&1
K eff "$id" > "$OUT/eff.txt" 2>&1
if [ -n "${IMAGE:-}" ]; then
  # A container job on the real GPU as a real user (IMAGE: an OCI layout with busybox): it
  # enters its user, mount and PID namespaces as that user, its GPU's device nodes bound in
  # and openable, no capability left, its own processes only.
  K drain gpu-node --reason "the container check runs on gpu-node-c" >/dev/null 2>&1
  kill "$agent"; wait "$agent" 2>/dev/null
  useradd -m kgpu >/dev/null 2>&1
  chmod 755 "$D"
  echo "gpuuser = kgpu" > "$D/users.map"
  "$B/kairos-agent" --controllers 127.0.0.1:7001 --addr 127.0.0.1:7102 --state-dir "$D/a2" --name gpu-node-c \
    --gpu-backend nvml --join-token-file "$D/c/join.token" --run-as submitter --user-map "$D/users.map" \
    > "$OUT/agent-container.log" 2>&1 &
  agent=$!
  sleep 3
  probe='id; grep -E "^(NoNewPrivs|CapEff|CapBnd)" /proc/self/status; ls -l /dev/nvidia*; \
    for d in /dev/nvidia[0-9]* /dev/nvidiactl; do if exec 3<"$d"; then echo "open $d ok"; exec 3<&-; else echo "open $d failed"; fi; done; \
    echo visible=$CUDA_VISIBLE_DEVICES; ps -o pid,comm'
  cid=$(K --as gpuuser submit --gpus 1 --container-image "$IMAGE" -- sh -c "$probe")
  { echo "container job $cid"; K wait "$cid"; echo "wait exit $?"; K logs "$cid"; K show "$cid"; } > "$OUT/container.txt" 2>&1
  echo "container job on the GPU:"; cat "$OUT/container.txt"
fi
kill "$agent" "$ctl"; wait
grep -c 'kairos_agent_gpu_utilization_ratio{' "$OUT/agent-metrics.txt"
echo "utilisation while the kernel ran:"; grep 'kairos_agent_gpu_utilization_ratio{' "$OUT/agent-metrics.txt"
echo "health watcher:"; grep -i 'health events\|health watcher' "$OUT/agent.log"
echo "MIG (nvidia-smi -L, then the GPUs the controller was told):"; grep -i mig "$OUT/nvidia-smi.txt"
grep -ho '"model": *"[^"]*"' "$OUT/nodes.json" | sort | uniq -c
grep -h 'gpu_backend\|"model"' "$OUT/nodes.json" | head -5
cat "$OUT/job.txt" "$OUT/job-mapping.txt"
