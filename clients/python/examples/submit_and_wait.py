"""Submit a job, wait for it, print its outcome and output.

    pip install ./clients/python
    python clients/python/examples/submit_and_wait.py --controllers 127.0.0.1:7001 -- nvidia-smi -L
"""

import argparse
import sys

from kairos_client import Client


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--controllers", default="127.0.0.1:7001", help="HOST:PORT[,HOST:PORT...]")
    p.add_argument("--token-file", help="default: KAIROS_TOKEN, KAIROS_TOKEN_FILE, ~/.config/kairos/token")
    p.add_argument("--gpus", type=int, default=1)
    p.add_argument("--qos", default="")
    p.add_argument("--timeout", type=float, default=None, help="seconds to wait (default: no limit)")
    p.add_argument("argv", nargs="+", help="the command to run")
    args = p.parse_args()
    with Client(args.controllers, token_file=args.token_file) as client:
        job_id = client.submit(args.argv, gpus=args.gpus, qos=args.qos)
        print(f"submitted job {job_id}", file=sys.stderr)
        job = client.wait(job_id, timeout=args.timeout)
        sys.stdout.write(client.logs(job_id))
        print(f"job {job_id}: {job['state']} (exit code {job.get('exit_code')})", file=sys.stderr)
        return job.get("exit_code", 1) if job["state"] in ("COMPLETED", "FAILED") else 1


if __name__ == "__main__":
    sys.exit(main())
