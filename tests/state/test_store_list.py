"""``list_runs`` is bounded: summary columns only, an index range scan newest first, keyset pages.

A page never reads a run's input, output or error (5 runs with 20 MB inputs used to cost 800 MB
to list), never sorts the whole table (an index on (created_at, run_id)), and the next page
starts after the last row's ``cursor`` however deep it is.
"""

from __future__ import annotations

import uuid
from typing import Any

import pytest
from sqlalchemy import event, insert

from raysaga.errors import UserError
from raysaga.state import NewRun, RunStatus, SqlStore
from raysaga.state.models import RunSummary
from raysaga.state.schema import runs


def bulk_runs(store: SqlStore, n: int, *, at: float, tag: str, status: str = "completed",
              workflow: str = "wf") -> list[str]:
    """``n`` runs inserted at once, all created at the same instant (ties broken by run_id)."""
    ids = [f"{tag}-{i:05d}" for i in range(n)]
    rows = [{"run_id": r, "workflow_name": workflow, "workflow_version": "1", "definition_hash": "d" * 64,
             "status": status, "version": 0, "fence": 0, "event_seq": 0, "retries_used": 0, "tokens_used": 0,
             "cost_used": 0.0, "trace_id": "t", "created_at": at, "updated_at": at, "input": {"i": r}}
            for r in ids]
    with store.engine.begin() as conn:
        conn.execute(insert(runs), rows)
    return ids


def test_keyset_pages_cover_every_run_once_newest_first(store: SqlStore) -> None:
    tag = uuid.uuid4().hex[:8]
    at = 4_000_000_000.0 + uuid.uuid4().int % 1000  # later than any other test's runs in a shared database
    tied = bulk_runs(store, 23, at=at, tag=f"{tag}-tie")
    older = bulk_runs(store, 7, at=at - 1, tag=f"{tag}-old")
    expected = sorted(tied, reverse=True) + sorted(older, reverse=True)

    pages: list[list[RunSummary]] = []
    before = None
    while True:
        page = store.list_runs(limit=5, before=before)
        page = [r for r in page if r.run_id.startswith(tag)]
        if not page:
            break
        pages.append(page)
        before = page[-1].cursor
    got = [r.run_id for p in pages for r in p]
    assert got == expected
    assert all(len(p) == 5 for p in pages)
    first = pages[0][0]
    assert (first.workflow_name, first.workflow_version, first.status, first.corrupt) == (
        "wf", "1", RunStatus.COMPLETED, None)
    assert first.input == {"i": first.run_id}  # read on demand, for this run only


def test_filters_by_status_and_workflow(store: SqlStore) -> None:
    tag = uuid.uuid4().hex[:8]
    at = 4_100_000_000.0 + uuid.uuid4().int % 1000
    done = bulk_runs(store, 3, at=at, tag=f"{tag}-done", workflow=f"w-{tag}")
    failed = bulk_runs(store, 2, at=at, tag=f"{tag}-failed", status="failed", workflow=f"w-{tag}")
    other = bulk_runs(store, 2, at=at, tag=f"{tag}-other", workflow=f"x-{tag}")
    mine = store.list_runs(limit=100, workflow=f"w-{tag}")
    assert [r.run_id for r in mine] == sorted(done + failed, reverse=True)
    assert [r.run_id for r in store.list_runs(RunStatus.FAILED, 100, workflow=f"w-{tag}")] == sorted(
        failed, reverse=True)
    assert [r.run_id for r in store.list_runs(status=RunStatus.COMPLETED, limit=100, workflow=f"x-{tag}")] == \
        sorted(other, reverse=True)


@pytest.mark.parametrize("limit", [0, -1, 100_001, True, 2.5, "10"])
def test_limit_must_be_a_sane_whole_number(store: SqlStore, limit: Any) -> None:
    with pytest.raises(UserError, match="list limit"):
        store.list_runs(limit=limit)


def test_a_page_reads_no_input_output_or_error(store: SqlStore) -> None:
    run_id = f"big-{uuid.uuid4().hex[:8]}"
    store.create_run(NewRun(run_id=run_id, workflow_name="wf", workflow_version="1", definition_hash="d" * 64,
                            trace_id="t", input={"text": "x" * 300_000}))
    statements: list[str] = []

    def seen(_conn: Any, _cursor: Any, statement: str, *_args: Any) -> None:
        statements.append(statement)

    event.listen(store.reader, "before_cursor_execute", seen)
    try:
        page = store.list_runs(limit=50)
    finally:
        event.remove(store.reader, "before_cursor_execute", seen)
    assert run_id in {r.run_id for r in page}
    statements = [s for s in statements if s.strip().upper() != "BEGIN"]
    assert len(statements) == 1
    selected = statements[0].split("FROM")[0].lower()
    for column in ("input", "output", "error", "raysaga_blobs"):
        assert f"raysaga_runs.{column}," not in selected and f"raysaga_runs.{column} " not in selected
    assert "raysaga_blobs" not in statements[0]


@pytest.mark.parametrize(("status", "index"), [(None, "ix_raysaga_runs_created"),
                                               (RunStatus.FAILED, "ix_raysaga_runs_status_created")])
def test_sqlite_pages_by_index_without_sorting(sqlite_url: str, status: RunStatus | None, index: str) -> None:
    """The plan of the very statement ``list_runs`` sends: an index range, no sort of the table."""
    store = SqlStore(sqlite_url)
    try:
        bulk_runs(store, 50, at=1.0, tag="a")
        sent: list[tuple[str, Any]] = []

        def seen(_conn: Any, _cursor: Any, statement: str, parameters: Any, *_args: Any) -> None:
            sent.append((statement, parameters))

        event.listen(store.reader, "before_cursor_execute", seen)
        try:
            store.list_runs(status, 10, before=(2.0, "z"))
        finally:
            event.remove(store.reader, "before_cursor_execute", seen)
        ((statement, parameters),) = [(s, p) for s, p in sent if s.strip().upper() != "BEGIN"]
        with store.reader.connect() as conn:
            plan = " | ".join(str(r[-1]) for r in conn.exec_driver_sql("EXPLAIN QUERY PLAN " + statement, parameters))
        assert index in plan and "TEMP B-TREE" not in plan, plan
    finally:
        store.close()
