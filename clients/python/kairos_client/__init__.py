"""Python client for kairos, the GPU cluster scheduler.

    from kairos_client import Client

    client = Client(["10.0.0.1:7001", "10.0.0.2:7001", "10.0.0.3:7001"], token_file="~/.config/kairos/token", ca="ca.pem")
    job_id = client.submit(["python", "train.py"], gpus=2, qos="batch")
    job = client.wait(job_id, timeout=3600)
    print(job["state"], job.get("exit_code"), client.logs(job_id))

Any replica serves any call (followers pass writes to the leader), so one reachable address
is enough; the client moves on to the next address when one does not answer.
"""

from kairos_client.client import Client, KairosError, TERMINAL_STATES

__all__ = ["Client", "KairosError", "TERMINAL_STATES"]
