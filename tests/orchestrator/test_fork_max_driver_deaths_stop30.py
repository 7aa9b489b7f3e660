"""Stop 30: a run records its own ``max_driver_deaths`` (schema 13), and the limit of whatever
drives it applies only when it has none. A fork recorded none (NULL): forked from a run that
asked to be parked after one death, the fork went on under the fleet's limit. A fork now keeps
its parent's, unless it is given its own."""

from __future__ import annotations

from pathlib import Path

import raysaga
from raysaga import RunOptions, RunStatus, Workflow
from raysaga.state import SqlStore

wf = Workflow("fork_deaths_stop30")


@wf.step
def first(input: int) -> int:
    return input + 1


@wf.step
def second(first: int) -> int:
    return first * 2


def test_a_fork_keeps_its_parent_s_limit_or_records_its_own(tmp_path: Path) -> None:
    store = SqlStore(f"sqlite:///{tmp_path / 'runs.db'}")
    try:
        parent = raysaga.run(wf, 1, store=store, executor="inline", options=RunOptions(max_driver_deaths=1))
        assert parent.status == RunStatus.COMPLETED and parent.max_driver_deaths == 1
        kept = raysaga.fork(wf, parent.run_id, from_node="second", store=store, executor="inline")
        assert kept.status == RunStatus.COMPLETED
        assert store.get_run(kept.run_id).max_driver_deaths == 1
        own = raysaga.fork(wf, parent.run_id, from_node="second", store=store, executor="inline",
                           options=RunOptions(max_driver_deaths=7))
        assert store.get_run(own.run_id).max_driver_deaths == 7
        plain = raysaga.run(wf, 1, store=store, executor="inline")
        assert plain.max_driver_deaths is None
        assert store.get_run(raysaga.fork(wf, plain.run_id, from_node="second", store=store,
                                          executor="inline").run_id).max_driver_deaths is None
    finally:
        store.close()


def test_a_fork_given_the_default_limit_drops_its_parent_s(tmp_path: Path) -> None:
    """Stop 33: ``max_driver_deaths=3`` (``raysaga fork --max-driver-deaths 3``) is heard: the
    fork records no limit of its own (the driving process's applies), not the parent's 5;
    ``RunOptions(max_driver_deaths=3)`` cannot say so (it is the default)."""
    store = SqlStore(f"sqlite:///{tmp_path / 'runs.db'}")
    try:
        parent = raysaga.run(wf, 1, store=store, executor="inline", options=RunOptions(max_driver_deaths=5))
        assert parent.max_driver_deaths == 5
        reset = raysaga.fork(wf, parent.run_id, from_node="second", store=store, executor="inline",
                             max_driver_deaths=3)
        assert store.get_run(reset.run_id).max_driver_deaths is None
        own = raysaga.fork(wf, parent.run_id, from_node="second", store=store, executor="inline",
                           max_driver_deaths=9, options=RunOptions(max_driver_deaths=7))
        assert store.get_run(own.run_id).max_driver_deaths == 9
    finally:
        store.close()
