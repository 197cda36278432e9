"""Measures whether a controller's state stays bounded over a long run of short jobs.

Starts one kairosd (and an agent with fake GPUs) from target/debug, then runs ROUNDS rounds of
JOBS jobs that end at once (submitted held, then cancelled) through the Python client, and after
each round prints the controller's RSS, its snapshot file's size, and the live and history job
counts as one JSON line. Run it with and without retention to compare:

    target/tools/moto/bin/python scripts/bounded-state.py --retention 1s --history-max-jobs 2000
    target/tools/moto/bin/python scripts/bounded-state.py --retention 1000d
"""

import argparse
import json
import os
import signal
import socket
import subprocess
import sys
import tempfile
import time

from kairos_client import Client


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def rss_kib(pid: int) -> int:
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1])
    return 0


def main() -> int:
    p = argparse.ArgumentParser()
    p.add_argument("--retention", default="1s")
    p.add_argument("--history-max-jobs", default="2000")
    p.add_argument("--rounds", type=int, default=10)
    p.add_argument("--jobs", type=int, default=2000)
    args = p.parse_args()
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    bins = os.path.join(root, "target", "debug")
    work = tempfile.mkdtemp(prefix="kairos-bounded-")
    addr = f"127.0.0.1:{free_port()}"
    data = os.path.join(work, "c1")
    kairosd = subprocess.Popen(
        [f"{bins}/kairosd", "--addr", addr, "--data-dir", data, "--job-retention", args.retention,
         "--history-max-jobs", args.history_max_jobs, "--snapshot-logs", "1000",
         "--submit-rate-per-user", "0", "--max-jobs-per-user", "100000"],
        stdout=subprocess.DEVNULL, stderr=open(os.path.join(work, "kairosd.log"), "w"))
    agent = None
    try:
        deadline = time.time() + 30
        while not os.path.exists(os.path.join(data, "join.token")):
            if time.time() > deadline:
                raise SystemExit("kairosd did not start")
            time.sleep(0.1)
        agent = subprocess.Popen(
            [f"{bins}/kairos-agent", "--controllers", addr, "--addr", f"127.0.0.1:{free_port()}",
             "--gpu-backend", "fake", "--fake-gpus", "8", "--run-as", "agent", "--state-dir",
             os.path.join(work, "agent"), "--join-token-file", os.path.join(data, "join.token")],
            stdout=subprocess.DEVNULL, stderr=open(os.path.join(work, "agent.log"), "w"))
        client = Client([addr], token_file=os.path.join(data, "admin.token"), timeout=60)
        while True:
            try:
                client.list()
                break
            except Exception:  # noqa: BLE001 - waiting for the controller
                time.sleep(0.2)
        time.sleep(2)  # the node registers
        for round_ in range(1, args.rounds + 1):
            ids = [client.submit(["true"], hold=True) for _ in range(args.jobs)]
            for i in ids:
                client.cancel(i)
            time.sleep(3)  # past a 1 s retention, and a purge round
            live = len(client.list(all=True))
            snapshot = os.path.join(data, "snapshot")
            size = os.path.getsize(snapshot) if os.path.exists(snapshot) else 0
            print(json.dumps({"round": round_, "jobs_so_far": round_ * args.jobs, "live_jobs": live,
                              "rss_kib": rss_kib(kairosd.pid), "snapshot_bytes": size}), flush=True)
    finally:
        for proc in (agent, kairosd):
            if proc is not None:
                proc.send_signal(signal.SIGTERM)
                try:
                    proc.wait(timeout=10)
                except subprocess.TimeoutExpired:
                    proc.kill()
        subprocess.run(["rm", "-rf", work], check=False)
    return 0


if __name__ == "__main__":
    sys.exit(main())
