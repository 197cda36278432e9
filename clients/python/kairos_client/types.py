"""Typed results: a job (from the live state or the history) as a frozen dataclass."""

from __future__ import annotations

import dataclasses
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
    # Pending: when the planner expects it to start (Unix ms; 0: no estimate) and why then.
    expected_start_ms: int = 0
    start_reason: str = ""
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
    def _of(cls, m, name: str, account: str, partition: str, gpus: int) -> "Job":
        """The fields a live job (`Job`) and a history record (`JobRecord`) share, from `m`."""
        return cls(
            id=int(m.id),
            state=_state(m.state),
            name=name,
            user=m.user,
            qos=m.qos,
            account=account,
            partition=partition,
            gpus=gpus,
            node=m.node,
            exit_code=m.exit_code if m.HasField("exit_code") else None,
            signal=m.signal,
            reason=m.reason,
            submit_time_ms=m.submit_time_ms,
            start_time_ms=m.start_time_ms,
            end_time_ms=m.end_time_ms,
            array_job_id=int(m.array_job_id) if m.array_job_id else None,
            array_task_id=m.array_task_id if m.array_job_id else None,
            purged=m.purged,
            raw=cls._raw(m),
        )

    @classmethod
    def from_pb(cls, job: job_pb2.Job) -> "Job":
        spec = job.spec
        base = cls._of(job, spec.name, spec.account, spec.partition, spec.resources.gpus)
        return dataclasses.replace(base, expected_start_ms=int(job.expected_start_ms), start_reason=job.start_reason)

    @classmethod
    def from_record(cls, r: job_pb2.JobRecord) -> "Job":
        return cls._of(r, r.name, r.account, r.partition, r.gpus)
