"""Checks the Python side against a running kairos cluster (started by the e2e test
`python_client` in crates/cli/tests/e2e). Exits non-zero on the first failed check.

    python check_cluster.py --addresses A,B,C --follower F --dead D --token-file FILE
"""

import argparse
import sys

import grpc

from kairos_client import Client, Job, KairosError
from kairos_client._pb.kairos.v1 import job_pb2, job_pb2_grpc


def plain_grpc_to_a_follower(follower: str, token: str) -> None:
    """A plain grpcio client (the stubs generated from proto/, no redirect code) that knows only
    a follower: every submit succeeds and every job is there."""
    metadata = (("authorization", f"Bearer {token}"),)
    stub = job_pb2_grpc.JobServiceStub(grpc.insecure_channel(follower))
    ids = []
    for i in range(25):
        spec = job_pb2.JobSpec(name=f"grpcio-{i}", argv=["true"], hold=True, resources=job_pb2.Resources(gpus=1))
        answer = stub.Submit(job_pb2.SubmitRequest(spec=spec, request_id=f"grpcio-{i}"), metadata=metadata, timeout=10)
        ids.append(answer.job_id)
    listed = stub.ListJobs(job_pb2.ListJobsRequest(all=True, name=""), metadata=metadata, timeout=10)
    names = {j.id: j.spec.name for j in listed.jobs}
    missing = [i for i in ids if i not in names]
    assert not missing, f"jobs submitted through the follower are missing: {missing}"
    assert len(set(ids)) == 25, ids
    print(f"plain grpcio through the follower: {len(ids)} submits, all listed")


def token_stays_off_plaintext_networks() -> None:
    """Without TLS the client sends its token only to this machine, unless told otherwise."""
    try:
        Client(["10.1.2.3:7001"], token="kairos_x_y")
        raise AssertionError("a plaintext client to a remote address was made")
    except ValueError as e:
        assert "in clear" in str(e), e
    Client(["10.1.2.3:7001"], token="kairos_x_y", insecure=True).close()
    Client(["127.0.0.1:7001", "[::1]:7001", "localhost:7001"], token="kairos_x_y").close()
    print("plaintext to a remote address refused unless insecure=True")


def client_library(addresses, dead: str, token_file: str) -> None:
    # A dead address first: the client moves on to the next one.
    client = Client([dead] + addresses, token_file=token_file, timeout=20)
    job_id = client.submit(["sh", "-c", "echo hello from python; exit 3"], gpus=1, name="py-client")
    job = client.wait(job_id, timeout=60)
    assert isinstance(job, Job) and job.done, job
    assert job.state == "FAILED" and job.exit_code == 3, job
    assert job.name == "py-client" and job["spec"]["name"] == "py-client", job
    assert job.gpus == 1 and job.submit_time_ms > 0 and job.end_time_ms >= job.start_time_ms > 0, job
    text = client.logs(job_id)
    assert text == "hello from python\n", repr(text)
    assert client.get(job_id)["id"] == job_id
    held = client.submit(["true"], hold=True)
    try:
        client.wait(held, timeout=1.5)
        raise AssertionError("waiting on a held job did not time out")
    except TimeoutError:
        pass
    assert held in {j.id for j in client.list()}, "the held job is listed"
    assert client.cancel(held)["state"] == "CANCELLED"
    assert client.wait(held, timeout=10)["state"] == "CANCELLED"
    # An array of three held tasks: consecutive ids from the array's; cancelling the array's id
    # cancels them all; the history lists them.
    array = client.submit(["true"], hold=True, array=[0, 1, 2], array_max_running=1)
    tasks = [j for j in client.list() if j.array_job_id == array]
    assert [t.id for t in tasks] == [array, array + 1, array + 2], tasks
    assert [t.array_task_id for t in tasks] == [0, 1, 2], tasks
    client.cancel(array)
    assert all(client.get(t).state == "CANCELLED" for t in (array, array + 1, array + 2))
    recorded = {r.id: r for r in client.history(states=["CANCELLED", "FAILED"])}
    assert {array, array + 1, array + 2, job_id} <= set(recorded), recorded
    assert recorded[job_id].exit_code == 3 and recorded[array + 2].array_task_id == 2, recorded[job_id]
    every = client.list(all=True)
    assert {job_id, held} <= {j["id"] for j in every}, every
    try:
        client.get(424242)
        raise AssertionError("an unknown job was found")
    except KairosError as e:
        assert e.code == grpc.StatusCode.NOT_FOUND, e
    client.close()
    print(f"kairos_client: submit, wait (exit 3), logs, list, cancel, timeout, arrays, history — job {job_id}")


def main() -> int:
    p = argparse.ArgumentParser()
    p.add_argument("--addresses", required=True)
    p.add_argument("--follower", required=True)
    p.add_argument("--dead", required=True)
    p.add_argument("--token-file", required=True)
    args = p.parse_args()
    with open(args.token_file, encoding="utf-8") as f:
        token = f.read().strip()
    plain_grpc_to_a_follower(args.follower, token)
    token_stays_off_plaintext_networks()
    client_library(args.addresses.split(","), args.dead, args.token_file)
    print("ok")
    return 0


if __name__ == "__main__":
    sys.exit(main())
