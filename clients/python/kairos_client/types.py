"""Typed results: a job (from the live state or the history) as a frozen dataclass."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Optional

from google.protobuf import json_format

from kairos_client._pb.kairos.v1 import job_pb2

#: Job states after which a job never changes again.
TERMINAL_STATES = frozenset({"COMPLETED", "FAILED", "CANCELLED", "TIMEOUT", "NODE_FAIL"})


def _state(number: int) -> str:
    return job_pb2.JobState.Name(number).removeprefix("JOB_STATE_")


@dataclass(frozen=True)
class Job:
    """One job. `state` is a name such as "RUNNING"; `exit_code` is None until it ran;
    times are Unix ms (0: not yet). `raw` is every field the cluster sent, as a dict (also
    reachable as `job["spec"]`, `job.get("events")`)."""

    id: int
    state: str
    name: str = ""
    user: str = ""
    qos: str = ""
    account: str = ""
    partition: str = ""
    gpus: int = 0
    node: str = ""
    exit_code: Optional[int] = None
    signal: int = 0
    reason: str = ""
    submit_time_ms: int = 0
    start_time_ms: int = 0
    end_time_ms: int = 0
    array_job_id: Optional[int] = None
    array_task_id: Optional[int] = None
    purged: bool = False
    raw: dict = field(default_factory=dict, repr=False, compare=False)

    @property
    def done(self) -> bool:
        """Whether the job has ended for good."""
        return self.state in TERMINAL_STATES

    def __getitem__(self, key: str) -> Any:
        return self.raw[key]

    def get(self, key: str, default: Any = None) -> Any:
        return self.raw.get(key, default)

    @staticmethod
    def _raw(message) -> dict:
        d = json_format.MessageToDict(message, preserving_proto_field_name=True)
        d["id"] = int(message.id)
        d["state"] = _state(message.state)
        if message.HasField("exit_code"):
            d["exit_code"] = message.exit_code
        return d

    @classmethod
    def from_pb(cls, job: job_pb2.Job) -> "Job":
        return cls(
            id=int(job.id),
            state=_state(job.state),
            name=job.spec.name,
            user=job.user,
            qos=job.qos,
            account=job.spec.account,
            partition=job.spec.partition,
            gpus=job.spec.resources.gpus,
            node=job.node,
            exit_code=job.exit_code if job.HasField("exit_code") else None,
            signal=job.signal,
            reason=job.reason,
            submit_time_ms=job.submit_time_ms,
            start_time_ms=job.start_time_ms,
            end_time_ms=job.end_time_ms,
            array_job_id=int(job.array_job_id) if job.array_job_id else None,
            array_task_id=job.array_task_id if job.array_job_id else None,
            purged=job.purged,
            raw=cls._raw(job),
        )

    @classmethod
    def from_record(cls, r: job_pb2.JobRecord) -> "Job":
        return cls(
            id=int(r.id),
            state=_state(r.state),
            name=r.name,
            user=r.user,
            qos=r.qos,
            account=r.account,
            partition=r.partition,
            gpus=r.gpus,
            node=r.node,
            exit_code=r.exit_code if r.HasField("exit_code") else None,
            signal=r.signal,
            reason=r.reason,
            submit_time_ms=r.submit_time_ms,
            start_time_ms=r.start_time_ms,
            end_time_ms=r.end_time_ms,
            array_job_id=int(r.array_job_id) if r.array_job_id else None,
            array_task_id=r.array_task_id if r.array_job_id else None,
            purged=r.purged,
            raw=cls._raw(r),
        )
