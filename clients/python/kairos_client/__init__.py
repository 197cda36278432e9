"""Python client for kairos, the GPU cluster scheduler.

    from kairos_client import Client

    client = Client()          # the cluster the `kairos` CLI talks to (KAIROS_CONTROLLERS, its context)
    job_id = client.submit(["python", "train.py"], gpus=2, qos="batch")
    job = client.wait(job_id, timeout=3600)
    print(job.state, job.exit_code, client.logs(job_id))

Any replica serves any call (followers pass writes to the leader), so one reachable address
is enough; the client moves on to the next address when one does not answer, and fails with
`Unreachable` when none answers.
"""

from kairos_client.client import Client, KairosError, Unreachable
from kairos_client.types import TERMINAL_STATES, Job

__all__ = ["Client", "Job", "KairosError", "TERMINAL_STATES", "Unreachable"]
