"""A sink's output at the depth limit ends its run (stop 38's review).

Each node output may be nested ``jsoncodec.MAX_DEPTH`` (100) levels deep, and was checked and
committed as such; the run's output wraps the sinks' outputs in one more level (``{sink: out}``),
which the store refused when the run ended: the run stayed ``running`` with no driver, every
resume refused the same way, ``status --watch`` waiting for ever. The run output is now the sink
outputs' own checked JSON, wrapped, on both stores, inline and as a blob.
"""

from __future__ import annotations

from typing import Any

import pytest

import raysaga
from raysaga import RunStatus, Workflow
from raysaga.state import SqlStore
from raysaga.state.jsoncodec import MAX_DEPTH


def nested(depth: int, leaf: Any) -> Any:
    value = leaf
    for _ in range(depth):
        value = [value]
    return value


@pytest.mark.parametrize("leaf", ["x", "y" * 5000], ids=["inline", "blob"])
def test_sinks_at_the_depth_limit_end_the_run_with_their_outputs(store_url: str, leaf: str) -> None:
    wf = Workflow("deep_sinks")

    @wf.step()
    def deep() -> Any:
        return nested(MAX_DEPTH, leaf)

    @wf.step()
    def other() -> int:
        return 1

    store = SqlStore(store_url)
    try:
        run = raysaga.run(wf, None, store=store, executor="inline")
        assert run.status == RunStatus.COMPLETED
        assert run.output == {"deep": nested(MAX_DEPTH, leaf), "other": 1}
        assert store.get_run(run.run_id).output == run.output  # as read back by another reader
    finally:
        store.close()


def test_a_single_deep_sink_is_its_output(store_url: str) -> None:
    wf = Workflow("one_deep_sink")

    @wf.step()
    def deep() -> Any:
        return nested(MAX_DEPTH, 7)

    store = SqlStore(store_url)
    try:
        run = raysaga.run(wf, None, store=store, executor="inline")
        assert run.status == RunStatus.COMPLETED and run.output == {"deep": nested(MAX_DEPTH, 7)}
    finally:
        store.close()
