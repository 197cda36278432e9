"""Submit a job, wait for it, print its outcome and output.

    pip install ./clients/python
    python clients/python/examples/submit_and_wait.py -- nvidia-smi -L

The cluster is the one the `kairos` CLI talks to: --controllers, else KAIROS_CONTROLLERS, else
the CLI's current context (`kairos context list`); the token likewise (--token-file,
KAIROS_TOKEN_FILE, KAIROS_TOKEN, the context's). Exits with the job's exit code; 69 when no
controller answers.
"""

import argparse
import sys

from kairos_client import Client, Unreachable

#: Exit code when no controller answers (EX_UNAVAILABLE, as the CLI's).
EXIT_UNREACHABLE = 69


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--controllers", default=None, help="HOST:PORT[,HOST:PORT...] (default: as the CLI)")
    p.add_argument("--token-file", help="default: as the CLI (KAIROS_TOKEN_FILE, KAIROS_TOKEN, the context)")
    p.add_argument("--gpus", type=int, default=1)
    p.add_argument("--qos", default="")
    p.add_argument("--timeout", type=float, default=None, help="seconds to wait (default: no limit)")
    p.add_argument("argv", nargs="+", help="the command to run")
    args = p.parse_args()
    try:
        with Client(args.controllers, token_file=args.token_file) as client:
            job_id = client.submit(args.argv, gpus=args.gpus, qos=args.qos)
            print(f"submitted job {job_id}", file=sys.stderr)
            job = client.wait(job_id, timeout=args.timeout)
            sys.stdout.write(client.logs(job_id))
            print(f"job {job_id}: {job.state} (exit code {job.exit_code})", file=sys.stderr)
            return job.exit_code if job.exit_code is not None and job.state in ("COMPLETED", "FAILED") else 1
    except Unreachable as e:
        print(f"submit_and_wait: {e.message}", file=sys.stderr)
        return EXIT_UNREACHABLE
    except ValueError as e:  # no cluster or token found
        print(f"submit_and_wait: {e}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
