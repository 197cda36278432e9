"""The kairos client: jobs as plain dicts over gRPC, with failover across controller addresses."""

from __future__ import annotations

import os
import time
import uuid
from typing import Dict, Iterable, List, Optional, Sequence

import grpc
from google.protobuf import json_format

from kairos_client._pb.kairos.v1 import job_pb2, job_pb2_grpc

#: Job states after which a job never changes again.
TERMINAL_STATES = frozenset({"COMPLETED", "FAILED", "CANCELLED", "TIMEOUT", "NODE_FAIL"})

#: Calls answered with these codes are tried again on the next address.
_RETRYABLE = (grpc.StatusCode.UNAVAILABLE,)


class KairosError(Exception):
    """A call the cluster refused or could not answer; `code` is the gRPC status code."""

    def __init__(self, code: grpc.StatusCode, message: str):
        super().__init__(f"{code.name}: {message}")
        self.code = code
        self.message = message


def _job_dict(job: job_pb2.Job) -> dict:
    d = json_format.MessageToDict(job, preserving_proto_field_name=True, use_integers_for_enums=False)
    d["id"] = int(job.id)
    d["state"] = job_pb2.JobState.Name(job.state).removeprefix("JOB_STATE_")
    if job.HasField("exit_code"):
        d["exit_code"] = job.exit_code
    return d


def _read_token(token: Optional[str], token_file: Optional[str]) -> str:
    if token:
        return token.strip()
    if os.environ.get("KAIROS_TOKEN"):
        return os.environ["KAIROS_TOKEN"].strip()
    path = token_file or os.environ.get("KAIROS_TOKEN_FILE") or "~/.config/kairos/token"
    with open(os.path.expanduser(path), encoding="utf-8") as f:
        return f.read().strip()


def _loopback(address: str) -> bool:
    """Whether HOST:PORT names this machine (127.0.0.0/8, ::1, localhost)."""
    import ipaddress

    host = address.rsplit(":", 1)[0].strip("[]")
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


class Client:
    """A client of one kairos cluster.

    `addresses`: the controllers, as HOST:PORT strings (a list, or one comma-separated string).
    `token` / `token_file`: the API token (default: KAIROS_TOKEN, KAIROS_TOKEN_FILE, then
    ~/.config/kairos/token). `ca`: a PEM file to talk TLS (`cert`/`key` for mutual TLS).
    `timeout`: seconds each call may take, failover included. Without `ca` the token travels
    in clear, so that is allowed only to loopback addresses unless `insecure=True` (a trusted
    network).
    """

    def __init__(
        self,
        addresses: Sequence[str] | str,
        token: Optional[str] = None,
        token_file: Optional[str] = None,
        ca: Optional[str] = None,
        cert: Optional[str] = None,
        key: Optional[str] = None,
        timeout: float = 30.0,
        insecure: bool = False,
    ):
        if isinstance(addresses, str):
            addresses = [a.strip() for a in addresses.split(",") if a.strip()]
        if not addresses:
            raise ValueError("addresses: at least one controller address (HOST:PORT) is needed")
        if not ca and not insecure:
            remote = [a for a in addresses if not _loopback(a)]
            if remote:
                raise ValueError(
                    f"refusing to send the API token in clear to {remote[0]}: pass ca= (TLS), "
                    "or insecure=True on a network you trust"
                )
        self._addresses: List[str] = list(addresses)
        self._token = _read_token(token, token_file)
        self._timeout = timeout
        self._credentials = None
        if ca:
            read = lambda p: open(p, "rb").read() if p else None  # noqa: E731
            self._credentials = grpc.ssl_channel_credentials(read(ca), read(key), read(cert))
        self._channels: Dict[str, grpc.Channel] = {}
        self._current = 0

    # -- plumbing ---------------------------------------------------------------------------

    def _stub(self, address: str) -> job_pb2_grpc.JobServiceStub:
        channel = self._channels.get(address)
        if channel is None:
            if self._credentials is not None:
                channel = grpc.secure_channel(address, self._credentials)
            else:
                channel = grpc.insecure_channel(address)
            self._channels[address] = channel
        return job_pb2_grpc.JobServiceStub(channel)

    def _metadata(self):
        return (("authorization", f"Bearer {self._token}"),)

    def _call(self, method: str, request, deadline: Optional[float] = None):
        """Calls `method` on the current address, moving on to the next one while the cluster
        answers UNAVAILABLE (a replica down, an election), until the deadline."""
        deadline = deadline or time.monotonic() + self._timeout
        last: Optional[grpc.RpcError] = None
        pause = 0.05
        while True:
            address = self._addresses[self._current % len(self._addresses)]
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                break
            try:
                rpc = getattr(self._stub(address), method)
                return rpc(request, metadata=self._metadata(), timeout=remaining)
            except grpc.RpcError as e:  # noqa: PERF203 - a retry loop
                if e.code() not in _RETRYABLE:
                    raise KairosError(e.code(), e.details() or "") from None
                last = e
                self._current += 1
                if self._current % len(self._addresses) == 0:
                    time.sleep(min(pause, max(0.0, deadline - time.monotonic())))
                    pause = min(pause * 2, 1.0)
        if last is not None:
            raise KairosError(last.code(), last.details() or "") from None
        raise KairosError(grpc.StatusCode.DEADLINE_EXCEEDED, f"no controller answered within {self._timeout}s")

    # -- jobs -------------------------------------------------------------------------------

    def submit(
        self,
        argv: Sequence[str],
        gpus: int = 1,
        qos: str = "",
        name: str = "",
        partition: str = "",
        account: str = "",
        env: Optional[Dict[str, str]] = None,
        workdir: str = "",
        time_limit_s: int = 0,
        tasks: int = 0,
        gpu_model: str = "",
        requeue: Optional[bool] = None,
        after_ok: Iterable[int] = (),
        hold: bool = False,
        request_id: Optional[str] = None,
        array: Iterable[int] = (),
        array_max_running: int = 0,
    ) -> int:
        """Submits a job and returns its id. Retries are safe: every attempt of one call carries
        the same request id, so the cluster creates at most one job. With `array` (indices,
        e.g. `range(8)`), one job per index and the array's id is returned; at most
        `array_max_running` of them run at once (0: no limit)."""
        spec = job_pb2.JobSpec(
            name=name,
            argv=list(argv),
            env=dict(env or {}),
            workdir=workdir,
            qos=qos,
            partition=partition,
            account=account,
            resources=job_pb2.Resources(gpus=gpus, tasks=tasks, gpu_model=gpu_model),
            time_limit_s=time_limit_s,
            after_ok=list(after_ok),
            hold=hold,
            array_indices=sorted(set(array)),
            array_max_running=array_max_running,
        )
        if requeue is not None:
            spec.requeue = requeue
        request = job_pb2.SubmitRequest(spec=spec, request_id=request_id or uuid.uuid4().hex)
        return int(self._call("Submit", request).job_id)

    def get(self, job_id: int) -> dict:
        """The job as a dict (`state` as a name such as "RUNNING"; `exit_code` once it ran)."""
        return _job_dict(self._call("GetJob", job_pb2.GetJobRequest(job_id=job_id)))

    def list(self, all: bool = False, user: str = "", qos: str = "", name: str = "") -> List[dict]:  # noqa: A002
        """Jobs, every page followed: pending and running ones, or every job with `all=True`."""
        jobs: List[dict] = []
        token = ""
        while True:
            page = self._call(
                "ListJobs",
                job_pb2.ListJobsRequest(all=all, user=user, qos=qos, name=name, page_token=token),
            )
            jobs.extend(_job_dict(j) for j in page.jobs)
            token = page.next_page_token
            if not token:
                return jobs

    def history(
        self,
        since_ms: int = 0,
        until_ms: int = 0,
        user: str = "",
        account: str = "",
        states: Iterable[str] = (),
    ) -> List[dict]:
        """Accounting (like sacct): jobs live in [since_ms, until_ms] (Unix ms; 0: unbounded),
        finished ones included after they left the live state (`purged`), every page."""
        numbers = [job_pb2.JobState.Value("JOB_STATE_" + s.upper()) for s in states]
        records: List[dict] = []
        token = ""
        while True:
            page = self._call(
                "ListHistory",
                job_pb2.ListHistoryRequest(
                    since_ms=since_ms, until_ms=until_ms, user=user, account=account, states=numbers, page_token=token
                ),
            )
            for r in page.records:
                d = json_format.MessageToDict(r, preserving_proto_field_name=True)
                d["id"] = int(r.id)
                d["state"] = job_pb2.JobState.Name(r.state).removeprefix("JOB_STATE_")
                if r.HasField("exit_code"):
                    d["exit_code"] = r.exit_code
                records.append(d)
            token = page.next_page_token
            if not token:
                return records

    def cancel(self, job_id: int) -> dict:
        """Cancels a job; returns it."""
        return _job_dict(self._call("CancelJob", job_pb2.CancelJobRequest(job_id=job_id)))

    def wait(self, job_id: int, timeout: Optional[float] = None) -> dict:
        """Waits until the job has ended and returns it; raises TimeoutError after `timeout`
        seconds (None: no limit). Survives controller failover."""
        deadline = None if timeout is None else time.monotonic() + timeout
        while True:
            remaining = None if deadline is None else deadline - time.monotonic()
            if remaining is not None and remaining <= 0:
                raise TimeoutError(f"job {job_id} did not end within {timeout}s")
            job = self.get(job_id)
            if job["state"] in TERMINAL_STATES:
                return job
            address = self._addresses[self._current % len(self._addresses)]
            try:
                stream = self._stub(address).WatchJob(
                    job_pb2.WatchJobRequest(job_id=job_id), metadata=self._metadata(), timeout=remaining
                )
                for update in stream:
                    if job_pb2.JobState.Name(update.state).removeprefix("JOB_STATE_") in TERMINAL_STATES:
                        return _job_dict(update)
            except grpc.RpcError as e:
                if e.code() == grpc.StatusCode.DEADLINE_EXCEEDED:
                    raise TimeoutError(f"job {job_id} did not end within {timeout}s") from None
                if e.code() not in _RETRYABLE:
                    raise KairosError(e.code(), e.details() or "") from None
                self._current += 1
                time.sleep(0.1)

    def logs(self, job_id: int) -> str:
        """The job's output so far (stdout and stderr), as text."""
        deadline = time.monotonic() + self._timeout
        while True:
            address = self._addresses[self._current % len(self._addresses)]
            try:
                stream = self._stub(address).StreamLogs(
                    job_pb2.LogsRequest(job_id=job_id),
                    metadata=self._metadata(),
                    timeout=max(0.0, deadline - time.monotonic()),
                )
                return b"".join(chunk.data for chunk in stream).decode("utf-8", errors="replace")
            except grpc.RpcError as e:
                if e.code() not in _RETRYABLE or time.monotonic() >= deadline:
                    raise KairosError(e.code(), e.details() or "") from None
                self._current += 1
                time.sleep(0.1)

    def close(self) -> None:
        for channel in self._channels.values():
            channel.close()
        self._channels.clear()

    def __enter__(self) -> "Client":
        return self

    def __exit__(self, *exc) -> None:
        self.close()
