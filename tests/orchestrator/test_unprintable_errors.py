"""A step's exception is user code: reading it must not crash the driver that records it.

An exception whose ``__str__`` raises, or whose ``status_code`` / ``retry_after`` property
raises, crashed the driver while it built the failure record (``retry.describe``,
``is_transient``, ``retry_after``): the run stayed ``running`` with the node never recorded, and
every resume crashed the same way. Now the step fails like any other, its message saying what
could not be read; inline and on Ray (where the record is built on the worker).
"""

from __future__ import annotations

import sys
import uuid
from pathlib import Path
from typing import Any

import pytest

import raysaga
from raysaga import RetryPolicy, RunStatus, Workflow
from raysaga.state import NodeStatus, SqlStore


class Unprintable(Exception):
    def __str__(self) -> str:
        raise RuntimeError("str failed")


class NulInMessage(Exception):
    """A C library's message, a binary protocol's reply: PostgreSQL's text columns refuse NUL."""

    def __str__(self) -> str:
        return "bad\x00byte"


class Unclassifiable(Exception):
    """Looks like an HTTP error, but reading what it carries raises."""

    @property
    def status_code(self) -> int:
        raise RuntimeError("status_code failed")

    @property
    def retry_after(self) -> float:
        raise RuntimeError("retry_after failed")


def _workflow(raised: type[Exception]) -> Workflow:
    wf = Workflow(f"unprintable_{raised.__name__.lower()}", version="1")

    @wf.step()
    def first() -> int:
        return 1

    @wf.step(retry=RetryPolicy(max_attempts=2, base=0.01, cap=0.01))
    def second(first: int) -> int:
        raise raised()

    return wf


@pytest.fixture(scope="module", autouse=True)
def _pickle_this_module_by_value() -> None:
    cloudpickle = pytest.importorskip("ray.cloudpickle")
    cloudpickle.register_pickle_by_value(sys.modules[__name__])


def _run(tmp_path: Path, raised: type[Exception], executor: str, url: str | None = None) -> tuple[Any, dict[str, Any]]:
    store = SqlStore(url or f"sqlite:///{tmp_path / 'raysaga.db'}")
    try:
        record = raysaga.run(_workflow(raised), None, store=store, executor=executor, run_id=f"u-{uuid.uuid4().hex}")
        rows = {n.node_id: n for n in store.nodes(record.run_id)}
    finally:
        store.close()
    return record, rows


@pytest.mark.parametrize("raised", [Unprintable, Unclassifiable])
def test_an_exception_that_cannot_be_read_fails_its_step_inline(tmp_path: Path, raised: type[Exception]) -> None:
    record, rows = _run(tmp_path, raised, "inline")
    assert record.status == RunStatus.FAILED
    assert rows["first"].status == NodeStatus.COMPLETED and rows["first"].output == 1
    failed = rows["second"]
    assert failed.status == NodeStatus.FAILED and failed.error is not None
    assert failed.error["type"] == raised.__name__
    assert failed.attempt == 1  # neither is known to be transient: permanent, not retried
    if raised is Unprintable:
        assert failed.error["message"] == ("<the message of this Unprintable could not be read: "
                                           "str() raised RuntimeError>")
    assert "retry_after" not in failed.error


@pytest.mark.ray
def test_an_exception_that_cannot_be_read_fails_its_step_on_ray(ray_address: str, tmp_path: Path) -> None:
    record, rows = _run(tmp_path, Unprintable, "ray")
    assert record.status == RunStatus.FAILED
    failed = rows["second"]
    assert failed.status == NodeStatus.FAILED and failed.error is not None
    assert (failed.error["type"], failed.attempt) == ("Unprintable", 1)
    assert "could not be read" in failed.error["message"]


def test_a_message_holding_nul_fails_the_run_on_either_store(tmp_path: Path, store_url: str) -> None:
    """The run's reason quotes the message; PostgreSQL's text columns refuse NUL (the write
    crashed the driver, and every resume the same way): it is stored as ``\\x00``."""
    record, rows = _run(tmp_path, NulInMessage, "inline", store_url)
    assert record.status == RunStatus.FAILED
    assert record.status_reason is not None and "bad\\x00byte" in record.status_reason
    assert rows["second"].status == NodeStatus.FAILED and rows["second"].error is not None
    assert rows["second"].error["message"] == "bad\x00byte"  # the error itself is JSON: kept exactly
