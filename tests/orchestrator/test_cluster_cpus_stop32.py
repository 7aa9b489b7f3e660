"""The executors of one process share the cluster's CPU count for ``CPUS_FRESH_S`` (a GCS request
each run's start paid), read again after that and for another Ray job.

A fake stands in for the ``ray`` module: what is tested is when it is asked, not Ray."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import pytest

from raysaga.orchestrator import ray_lanes


@dataclass
class FakeRay:
    """The two calls ``cluster_cpus`` makes (fake: counts the GCS reads)."""

    cpus: float = 2.0
    job: str = "01000000"
    reads: int = 0

    def cluster_resources(self) -> dict[str, float]:
        self.reads += 1
        return {"CPU": self.cpus}

    def get_runtime_context(self) -> Any:
        job = self.job

        class Context:
            def get_job_id(self) -> str:
                return job

        return Context()


@pytest.fixture(autouse=True)
def fresh_cache() -> Iterator[None]:
    ray_lanes._cpus_seen.clear()
    yield
    ray_lanes._cpus_seen.clear()


def test_reused_while_fresh_then_read_again() -> None:
    ray = FakeRay(cpus=2)
    assert ray_lanes.cluster_cpus(ray) == 2
    ray.cpus = 6  # a node joined
    assert ray_lanes.cluster_cpus(ray) == 2 and ray.reads == 1
    read_at, cpus = ray_lanes._cpus_seen[ray.job]  # the count grows old: counted again
    ray_lanes._cpus_seen[ray.job] = (read_at - ray_lanes.CPUS_FRESH_S - 0.001, cpus)
    assert ray_lanes.cluster_cpus(ray) == 6 and ray.reads == 2


def test_another_job_reads_its_own_cluster() -> None:
    first = FakeRay(cpus=2, job="01000000")
    assert ray_lanes.cluster_cpus(first) == 2
    second = FakeRay(cpus=8, job="02000000")  # ray.shutdown(), then ray.init() on another cluster
    assert ray_lanes.cluster_cpus(second) == 8 and second.reads == 1
    assert list(ray_lanes._cpus_seen) == ["02000000"]


def test_no_cpu_counts_as_one() -> None:
    assert ray_lanes.cluster_cpus(FakeRay(cpus=0)) == 1
