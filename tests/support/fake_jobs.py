"""A fake of Ray's Job API client (``JobSubmissionClient``): the edge a launch test is not about.

``get_job_info`` and ``submit_job`` answer as Ray's SDK does (a 404 for a job that is not there,
a refusal for a submission id already taken); what was submitted and how often the working
directory would have been uploaded are recorded for the test to check.
"""

from __future__ import annotations

from pathlib import Path

import pytest


class FakeJobInfo:
    """What ``JobSubmissionClient.get_job_info`` answers (the fields a launch reads)."""

    def __init__(self, status: str, run_id: str) -> None:
        self.status, self.message, self.driver_info = status, None, None
        self.metadata = {"raysaga_run_id": run_id}


class FakeJobs:
    """A Job API with ``jobs`` already there (none by default)."""

    def __init__(self, jobs: dict[str, FakeJobInfo] | None = None) -> None:
        self.jobs: dict[str, FakeJobInfo] = {} if jobs is None else jobs
        self.submitted: list[str] = []
        self.uploads = 0
        self.connects = 0  # launches that asked for this cluster (``launch.connect``)

    def get_job_info(self, sid: str) -> FakeJobInfo:
        if sid not in self.jobs:
            raise RuntimeError(f"Request failed with status code 404: Job {sid} does not exist.")
        return self.jobs[sid]

    def submit_job(self, *, submission_id: str, metadata: dict[str, str], **_: object) -> str:
        if submission_id in self.jobs:
            raise RuntimeError(f"Job with submission_id {submission_id} already exists.")
        self.jobs[submission_id] = FakeJobInfo("PENDING", metadata["raysaga_run_id"])
        self.submitted.append(submission_id)
        return submission_id

    def _upload_working_dir_if_needed(self, env: dict[str, object]) -> None:
        self.uploads += 1


def project_cluster(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, module: str, flow: str) -> FakeJobs:
    """The fake cluster every launch of a test connects to, from a project folder of its own:
    ``module``.py holding ``flow``, the working directory and importable."""
    from raysaga.orchestrator import launch as lx
    from tests.support.cli import project_folder

    project_folder(tmp_path, monkeypatch, module, flow)
    fake = FakeJobs()

    def connect(address: str) -> FakeJobs:
        fake.connects += 1
        return fake

    monkeypatch.setattr(lx, "connect", connect)
    return fake
