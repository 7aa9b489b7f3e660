"""A prune cut short between two batches (stop 51).

Batches went oldest first, so a parent was deleted in one transaction and its fork in a later one:
a prune stopped in between (Ctrl-C, a crash, a SIGKILL) left a fork whose parent was gone, and a
fork reads the ledger rows of the runs it inherits from to roll back (an inherited payment then
read as never sent, its refund skipped: stop 50). The undoer rule had its own order, origins
first, which a fork that refunded its parent's charge contradicts. Now the prunable runs forks link
go in the same transaction as the run a batch takes.

On SQLite and PostgreSQL; the prune is stopped after its first transaction by wrapping
``pruning._one_batch`` (the edge this test is not about: where a real interruption would land).
"""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from typing import Any

import pytest

from raysaga.errors import RunNotFoundError
from raysaga.state import Batch, NewRun, RunStatus, RunUpdate, SqlStore, pruning


def _new(run_id: str, parent: str | None = None) -> NewRun:
    return NewRun(run_id=run_id, workflow_name="w", workflow_version="1", definition_hash="0" * 64,
                  trace_id=uuid.uuid4().hex, input={"n": 1}, parent_run_id=parent,
                  forked_from="a" if parent else None, step_hashes={"a": "1" * 16})


def _complete(store: SqlStore, run_id: str) -> None:
    lease = store.claim(run_id, "me", 30)
    store.commit(lease, Batch(run=RunUpdate(status=RunStatus.RUNNING)))
    store.commit(lease, Batch(run=RunUpdate(status=RunStatus.COMPLETED)))
    store.release(lease)


@pytest.fixture
def store(own_store_url: str) -> Iterator[SqlStore]:
    """A store of this test's own: which run is oldest is what the first batch takes."""
    opened = SqlStore(own_store_url)
    yield opened
    opened.close()


class Stop(Exception):
    """Where the interruption lands: after the first transaction committed."""


def _exists(store: SqlStore, run_id: str) -> bool:
    try:
        store.get_run(run_id)
    except RunNotFoundError:
        return False
    return True


def test_a_prune_stopped_after_one_batch_leaves_no_fork_without_its_parent(store: SqlStore,
                                                                           monkeypatch: pytest.MonkeyPatch) -> None:
    tag = uuid.uuid4().hex[:6]
    parent, child, grandchild, lone = f"p-{tag}", f"p-{tag}-c", f"p-{tag}-g", f"l-{tag}"
    store.create_run(_new(parent))
    _complete(store, parent)
    store.fork_run(_new(child, parent), [], {})
    store.fork_run(_new(grandchild, child), [], {})
    store.create_run(_new(lone))
    for run_id in (child, grandchild, lone):  # the parent is the oldest: the first batch takes it
        _complete(store, run_id)
    real = pruning._one_batch
    calls: list[int] = []

    def first_only(*args: Any, **kwargs: Any) -> bool:
        if calls:
            raise Stop()
        calls.append(1)
        return real(*args, **kwargs)

    monkeypatch.setattr(pruning, "_one_batch", first_only)
    with pytest.raises(Stop):
        store.prune(older_than=0.0, statuses=[RunStatus.COMPLETED], batch_size=1)
    gone = [r for r in (parent, child, grandchild) if not _exists(store, r)]
    assert gone == [parent, child, grandchild]  # one transaction: the family whole
    monkeypatch.setattr(pruning, "_one_batch", real)
    store.prune(older_than=0.0, statuses=[RunStatus.COMPLETED], batch_size=1)
    assert not _exists(store, lone)


def test_a_fork_still_running_keeps_its_family_out_of_every_batch(store: SqlStore) -> None:
    tag = uuid.uuid4().hex[:6]
    parent, child, grandchild = f"p-{tag}", f"p-{tag}-c", f"p-{tag}-g"
    store.create_run(_new(parent))
    _complete(store, parent)
    store.fork_run(_new(child, parent), [], {})
    _complete(store, child)
    store.fork_run(_new(grandchild, child), [], {})  # pending: it stays, and so do the runs it inherits from
    report = store.prune(older_than=0.0, statuses=[RunStatus.COMPLETED], batch_size=1)
    assert {parent, child} <= set(report.kept)
    assert all(_exists(store, r) for r in (parent, child, grandchild))
