"""What a fork reads to tell which of its parent's agent calls owe an undo costs a few queries, not
one per call (docs/fork.md, "Which runs"; ``fork_refusals._Calls``).

``call_undo`` reads a completed call's result (an error result owes nothing). The fork refusal
read it row by row (``Store.node_row`` and its blob per call): a ``compensation_failed`` parent
whose agent made 2,000 payments took 10-33 s to refuse, where the refusal had cost ~6 queries.
The results are now read in bulk, only those of calls of tools with an undo: the same queries
whatever the number of calls.
"""

from __future__ import annotations

import uuid
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import event

import raysaga
from raysaga.errors import ForkError
from raysaga.state import RunStatus, SqlStore
from raysaga.testing import FakeProvider
from tests.support.undo_target_flows import scripted, switch, undo_shop


def _refusal_queries(store_url: str, control: Path, calls: int) -> int:
    """The queries of a refused fork of a parent whose agent's one turn made ``calls`` payments
    (and as many reads, whose results are never read), all owed."""
    provider = FakeProvider()
    asks = [("pay", {"item": f"book-{k}"}) for k in range(calls)] + [("look", {"item": f"pen-{k}"})
                                                                     for k in range(calls)]
    wf = undo_shop(f"undo49b_reads_{uuid.uuid4().hex[:6]}", scripted(asks), provider.call, control)
    switch(control, ship_fails=True, refuse=True)
    run_id = f"p-{uuid.uuid4().hex[:8]}"
    assert raysaga.run(wf, None, store=store_url, run_id=run_id, executor="inline").status == \
        RunStatus.COMPENSATION_FAILED
    switch(control, ship_fails=False, refuse=False)
    store = SqlStore(store_url)
    count = [0]

    def counted(*_: Any, **__: Any) -> None:
        count[0] += 1

    try:
        for engine in {store.engine, store.reader}:
            event.listen(engine, "before_cursor_execute", counted)
        with pytest.raises(ForkError, match=rf"has {calls} compensation\(s\) that did not complete"):
            raysaga.fork(wf, run_id, from_node="charge", store=store, executor="inline")
    finally:
        store.close()
    assert len(provider.effects("pay")) == calls
    return count[0]


def test_refusing_a_fork_reads_the_same_whatever_the_number_of_calls(store_url: str, tmp_path: Path) -> None:
    control = tmp_path / "control"
    control.mkdir()
    few, many = _refusal_queries(store_url, control, 2), _refusal_queries(store_url, control, 40)
    assert few == many, (few, many)  # (it read one row and its blob per call: +76 queries)
