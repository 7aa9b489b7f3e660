"""The error of an output above the cap names where the cap is set (review, stop 49).

``raysaga run`` of a step returning 51 MB failed with ``... raise RunOptions.max_output_bytes``, an
option the command has no flag for. The message now says it is set in Python, per drive, naming
``RunOptions(max_output_bytes=N)`` of ``raysaga.run`` / ``resume`` / ``retry`` or a
``raysaga.Worker``, and that the command has no option for it; a ``retry`` given a larger cap, as
advised, completes the step. Real SQLite and PostgreSQL stores, the step run by real Ray.
"""

from __future__ import annotations

import pytest

import raysaga
from raysaga import RunOptions, RunStatus, Workflow
from raysaga.state import NodeStatus, SqlStore

pytestmark = pytest.mark.ray


def test_the_cap_error_says_where_the_cap_is_set_and_a_retry_with_a_larger_one_completes(
        store_url: str, ray_address: str) -> None:
    wf = Workflow("output_cap_hint_stop49")

    @wf.step()
    def make(input: int) -> str:
        return "x" * input

    failed = raysaga.run(wf, 5000, store=store_url, address=ray_address, options=RunOptions(max_output_bytes=1000))
    assert failed.status == RunStatus.FAILED
    store = SqlStore(store_url)
    try:
        [node] = [n for n in store.nodes(failed.run_id) if n.node_id == "make"]
    finally:
        store.close()
    assert node.status == NodeStatus.FAILED and node.error is not None
    message = node.error["message"]
    assert "output of step 'make' is 5002 bytes, above the cap of 1000" in message, message
    assert "in Python (the raysaga command has no option for it): options=RunOptions(max_output_bytes=N) of " \
           "raysaga.run / resume / retry, or of the raysaga.Worker that drives it" in message, message
    done = raysaga.retry(wf, failed.run_id, store=store_url, address=ray_address,
                         options=RunOptions(max_output_bytes=10_000))
    assert done.status == RunStatus.COMPLETED and done.output == {"make": "x" * 5000}
