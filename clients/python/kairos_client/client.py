"""The kairos client: jobs as typed results over gRPC, with failover across controller addresses."""

from __future__ import annotations

import time
import uuid
from typing import Dict, Iterable, List, Optional, Sequence

import grpc

from kairos_client._pb.kairos.v1 import job_pb2, job_pb2_grpc
from kairos_client.config import resolve
from kairos_client.types import TERMINAL_STATES, Job

#: Calls answered with these codes are tried again on the next address.
_RETRYABLE = (grpc.StatusCode.UNAVAILABLE,)

#: How a watch stream that lost its controller ends, and how often in a row it is reopened.
_STREAM_LOST = (grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.CANCELLED, grpc.StatusCode.INTERNAL)
_STREAM_REOPENS_MAX = 50

#: The longest one attempt at one address may take to answer (a paused controller accepts
#: connections but never answers: the client moves on), as the CLI's.
_ATTEMPT_S = 8.0


class KairosError(Exception):
    """A call the cluster refused or could not answer; `code` is the gRPC status code."""

    def __init__(self, code: grpc.StatusCode, message: str):
        super().__init__(f"{code.name}: {message}")
        self.code = code
        self.message = message


class Unreachable(KairosError):
    """No controller answered at any address for `connect_timeout` seconds."""

    def __init__(self, addresses: Sequence[str], waited: float, last: str):
        super().__init__(
            grpc.StatusCode.UNAVAILABLE,
            f"no controller answered at {', '.join(addresses)} within {waited:g}s ({last})",
        )


def _not_answered(e: grpc.RpcError) -> bool:
    """Whether the call never reached a controller (nothing listening, unreachable), as
    opposed to a controller answering UNAVAILABLE (an election under way)."""
    if e.code() != grpc.StatusCode.UNAVAILABLE:
        return False
    details = (e.details() or "").lower()
    return any(s in details for s in ("failed to connect", "connection refused", "dns resolution", "unreachable"))


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

    Found like the `kairos` CLI finds it (`kairos_client.config`): `addresses` (HOST:PORT
    strings, a list or one comma-separated string), else KAIROS_CONTROLLERS, else the CLI's
    context (`context=`, KAIROS_CONTEXT, or the current one), else 127.0.0.1:7001; the token
    from `token` / `token_file`, else KAIROS_TOKEN_FILE, KAIROS_TOKEN, the context's token file,
    ~/.config/kairos/token; `ca` (TLS; `cert`/`key` for mutual TLS) likewise, or KAIROS_CA….
    `timeout`: seconds each call may take, failover included; `connect_timeout`: seconds after
    which a call that reached no controller at all fails (`Unreachable`). Without TLS the token
    travels in clear, so that is allowed only to loopback addresses unless `insecure=True` (a
    trusted network).
    """

    def __init__(
        self,
        addresses: Optional[Sequence[str] | str] = None,
        token: Optional[str] = None,
        token_file: Optional[str] = None,
        ca: Optional[str] = None,
        cert: Optional[str] = None,
        key: Optional[str] = None,
        timeout: float = 30.0,
        insecure: bool = False,
        context: Optional[str] = None,
        connect_timeout: float = 3.0,
    ):
        settings = resolve(addresses, token, token_file, ca, cert, key, context)
        if not settings.ca and not insecure:
            remote = [a for a in settings.addresses if not _loopback(a)]
            if remote:
                raise ValueError(
                    f"refusing to send the API token in clear to {remote[0]}: pass ca= (TLS), "
                    "or insecure=True on a network you trust"
                )
        self._addresses: List[str] = settings.addresses
        self._token = settings.token
        self._timeout = timeout
        self._connect_timeout = connect_timeout
        self._credentials = None
        if settings.ca:
            read = lambda p: open(p, "rb").read() if p else None  # noqa: E731
            self._credentials = grpc.ssl_channel_credentials(read(settings.ca), read(settings.key), read(settings.cert))
        self._channels: Dict[str, grpc.Channel] = {}
        self._current = 0

    @property
    def addresses(self) -> List[str]:
        """The controller addresses this client uses."""
        return list(self._addresses)

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
        answers UNAVAILABLE (a replica down, an election), until the deadline; raises
        `Unreachable` once no address has answered for `connect_timeout` seconds."""
        deadline = deadline or time.monotonic() + self._timeout
        last: Optional[grpc.RpcError] = None
        silent_since: Optional[float] = None
        pause = 0.05
        while True:
            address = self._addresses[self._current % len(self._addresses)]
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                break
            try:
                rpc = getattr(self._stub(address), method)
                return rpc(request, metadata=self._metadata(), timeout=min(remaining, _ATTEMPT_S))
            except grpc.RpcError as e:  # noqa: PERF203 - a retry loop
                timed_out = e.code() == grpc.StatusCode.DEADLINE_EXCEEDED and deadline - time.monotonic() > 0
                if e.code() not in _RETRYABLE and not timed_out:
                    raise KairosError(e.code(), e.details() or "") from None
                last = e
                if _not_answered(e) or timed_out:
                    silent_since = silent_since or time.monotonic()
                    if time.monotonic() - silent_since >= self._connect_timeout:
                        raise Unreachable(self._addresses, self._connect_timeout, e.details() or "") from None
                else:
                    silent_since = None
                self._current += 1
                if self._current % len(self._addresses) == 0:
                    time.sleep(min(pause, max(0.0, deadline - time.monotonic())))
                    pause = min(pause * 2, 0.5)
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
        reservation: str = "",
    ) -> int:
        """Submits a job and returns its id. Retries are safe: every attempt of one call carries
        the same request id, so the cluster creates at most one job. With `array` (indices,
        e.g. `range(8)`), one job per index and the array's id is returned; at most
        `array_max_running` of them run at once (0: no limit). With `reservation`, it runs only
        in that reservation's window, on its resources."""
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
            reservation=reservation,
        )
        if requeue is not None:
            spec.requeue = requeue
        request = job_pb2.SubmitRequest(spec=spec, request_id=request_id or uuid.uuid4().hex)
        return int(self._call("Submit", request).job_id)

    def get(self, job_id: int) -> Job:
        """The job (`state` as a name such as "RUNNING"; `exit_code` once it ran)."""
        return Job.from_pb(self._call("GetJob", job_pb2.GetJobRequest(job_id=job_id)))

    def list(self, all: bool = False, user: str = "", qos: str = "", name: str = "") -> List[Job]:  # noqa: A002
        """Jobs, every page followed: pending and running ones, or every job with `all=True`."""
        jobs: List[Job] = []
        token = ""
        while True:
            page = self._call(
                "ListJobs",
                job_pb2.ListJobsRequest(all=all, user=user, qos=qos, name=name, page_token=token),
            )
            jobs.extend(Job.from_pb(j) for j in page.jobs)
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
    ) -> List[Job]:
        """Accounting (like sacct): jobs live in [since_ms, until_ms] (Unix ms; 0: unbounded),
        finished ones included after they left the live state (`purged`), every page."""
        numbers = [job_pb2.JobState.Value("JOB_STATE_" + s.upper()) for s in states]
        records: List[Job] = []
        token = ""
        while True:
            page = self._call(
                "ListHistory",
                job_pb2.ListHistoryRequest(
                    since_ms=since_ms, until_ms=until_ms, user=user, account=account, states=numbers, page_token=token
                ),
            )
            records.extend(Job.from_record(r) for r in page.records)
            token = page.next_page_token
            if not token:
                return records

    def cancel(self, job_id: int) -> Job:
        """Cancels a job; returns it."""
        return Job.from_pb(self._call("CancelJob", job_pb2.CancelJobRequest(job_id=job_id)))

    def wait(self, job_id: int, timeout: Optional[float] = None) -> Job:
        """Waits until the job has ended and returns it; raises TimeoutError after `timeout`
        seconds (None: no limit). An array's id stands for the whole array, as in `kairos wait`:
        it waits for every task and returns the first task that did not complete, else the last
        task. Survives controller failover: a lost stream is opened again at another controller;
        `Unreachable` when none answers for `connect_timeout`."""
        deadline = None if timeout is None else time.monotonic() + timeout
        head = self._wait_one(job_id, deadline, timeout)
        count = int(head.raw.get("array_task_count", 0) or 0)
        if head.array_job_id != job_id or count <= 1:
            return head
        ended = [head]
        # Tasks have consecutive ids from the array's.
        for task in range(job_id + 1, job_id + count):
            ended.append(self._wait_one(task, deadline, timeout))
        failed = [t for t in ended if t.state != "COMPLETED"]
        return failed[0] if failed else ended[-1]

    def _wait_one(self, job_id: int, deadline: Optional[float], timeout: Optional[float]) -> Job:
        lost = 0
        while True:
            remaining = None if deadline is None else deadline - time.monotonic()
            if remaining is not None and remaining <= 0:
                raise TimeoutError(f"job {job_id} did not end within {timeout}s")
            call_deadline = time.monotonic() + (self._timeout if remaining is None else min(remaining, self._timeout))
            job = Job.from_pb(self._call("GetJob", job_pb2.GetJobRequest(job_id=job_id), call_deadline))
            if job.done:
                return job
            address = self._addresses[self._current % len(self._addresses)]
            try:
                stream = self._stub(address).WatchJob(
                    job_pb2.WatchJobRequest(job_id=job_id), metadata=self._metadata(), timeout=remaining
                )
                for update in stream:
                    if _state_name(update.state) in TERMINAL_STATES:
                        return Job.from_pb(update)
            except grpc.RpcError as e:
                if e.code() == grpc.StatusCode.DEADLINE_EXCEEDED:
                    raise TimeoutError(f"job {job_id} did not end within {timeout}s") from None
                # A controller that went away mid-stream ends it UNAVAILABLE, CANCELLED or
                # INTERNAL (a reset HTTP/2 stream): the next one (GetJob fails over first).
                lost += 1
                if e.code() not in _STREAM_LOST or lost > _STREAM_REOPENS_MAX:
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


def _state_name(number: int) -> str:
    return job_pb2.JobState.Name(number).removeprefix("JOB_STATE_")
