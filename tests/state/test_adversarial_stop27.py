"""Second adversarial round, the store: operators' text that no row can hold, on both dialects.

Each case failed inside the database driver with a raw error instead of saying what is wrong:

- a run id holding NUL (PostgreSQL's text refuses it) or a lone surrogate (not UTF-8 anywhere)
  in a look-up — ``resume``, ``cancel``, ``Client.approve``, ``raysaga.run(run_id=...)`` — raised
  psycopg's ``DataError`` or ``UnicodeEncodeError``: now ``RunNotFoundError`` (``run``: the
  ``UserError`` of a bad ``--run-id``);
- a cancel's or a pause's reason holding a lone surrogate raised ``UnicodeEncodeError`` while
  writing the run row, and the cancel failed: now the reason is stored with the escape ``\\ud800``;
- a ``decision_id`` holding NUL or longer than its column (200) was stored on SQLite and raised
  ``DataError`` on PostgreSQL: now a ``UserError`` on both; an approval node id with NUL is "not
  waiting" like any node that does not wait, and so is a ``fan_index`` beyond its 32-bit column
  (``DataError`` on PostgreSQL, ``OverflowError`` on SQLite);
- a submit's ``queue`` (200 characters) or ``workflow_ref`` (500) holding NUL or too long was
  stored on SQLite and raised ``DataError`` on PostgreSQL: now a ``UserError`` before any row;
- an approval's answer holding NaN passed its schema and was stored as null: now refused;
- a process that opened a SQLite store it already held (``Client(url)`` beside ``raysaga.run``)
  dropped its file locks (the header check's ``open()``/``close()``): the next other process
  reading the store deleted the WAL under it, and its next commits were lost without an error.
"""

from __future__ import annotations

import math
import os
import subprocess
import sys
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from pydantic import BaseModel

import raysaga
from raysaga import Client, RunOptions, Workflow
from raysaga.errors import RunNotFoundError, UserError
from raysaga.state import RunStatus, SqlStore

wf = Workflow("stop27_store")


@wf.step()
def first(input: Any) -> Any:
    return input


@wf.approval()
def review(first: Any) -> str:
    return "ship it?"


@wf.step()
def ship(review: Any) -> str:
    return "shipped"


@pytest.fixture
def client(store_url: str) -> Iterator[Client]:
    """A client on the store; afterwards this module's runs that still wait are cancelled: the
    PostgreSQL database is shared by the session, and other tests read its whole inbox."""
    with Client(store_url) as c:
        yield c
        for workflow in (wf.name, "stop27_edit"):
            for run in c.store.list_runs(limit=10_000, workflow=workflow):
                if run.status in (RunStatus.WAITING_HUMAN, RunStatus.PAUSED):
                    raysaga.cancel(run.run_id, store=c.store)


def _waiting(store_url: str) -> str:
    """A new run resting ``waiting_human`` on ``review``."""
    record = raysaga.run(wf, 1, store=store_url, executor="inline", options=RunOptions(release_after=0))
    assert record.status == RunStatus.WAITING_HUMAN
    return record.run_id


UNSTORABLE_IDS = {"nul": "order\x00-1", "lone-surrogate": "order-\ud800"}


@pytest.mark.parametrize("run_id", UNSTORABLE_IDS.values(), ids=list(UNSTORABLE_IDS))
def test_a_run_id_no_row_can_hold_is_not_found(store_url: str, client: Client, run_id: str) -> None:
    lookups: dict[str, Callable[[], Any]] = {
        "get_run": lambda: client.get_run(run_id),
        "resume": lambda: raysaga.resume(wf, run_id, store=client.store, executor="inline"),
        "cancel": lambda: raysaga.cancel(run_id, store=client.store),
        "Client.cancel": lambda: client.cancel(run_id),
        "approve": lambda: client.approve(run_id, "review", by="alice"),
        "reject": lambda: client.reject(run_id, "review", by="alice"),
    }
    for name, lookup in lookups.items():
        with pytest.raises(RunNotFoundError) as caught:
            lookup()
        assert repr(run_id) in str(caught.value), name


@pytest.mark.parametrize("run_id", UNSTORABLE_IDS.values(), ids=list(UNSTORABLE_IDS))
def test_run_refuses_an_unstorable_run_id_before_any_row(store_url: str, run_id: str) -> None:
    before = _run_count(store_url)
    with pytest.raises(UserError, match=r"--run-id must be 1 to 200 printable characters: .* holds"):
        raysaga.run(wf, 1, store=store_url, executor="inline", run_id=run_id)
    assert _run_count(store_url) == before


def _run_count(url: str) -> int:
    store = SqlStore(url)
    try:
        return len(store.list_runs(limit=100_000))
    finally:
        store.close()


def test_a_cancel_reason_with_a_lone_surrogate_cancels_the_run(store_url: str, client: Client) -> None:
    run_id = _waiting(store_url)
    record = raysaga.cancel(run_id, store=client.store, reason="customer wrote \ud800 and left")
    assert record.status == RunStatus.CANCELLED
    assert record.status_reason == "customer wrote \\ud800 and left"
    assert client.store.events(run_id)[-1].data == {"reason": "customer wrote \\ud800 and left"}

    other = _waiting(store_url)
    assert client.cancel(other, reason="bad \udcff byte").status == RunStatus.CANCELLED


def test_a_pause_reason_with_a_lone_surrogate_pauses_the_run(store_url: str, client: Client) -> None:
    run_id = _waiting(store_url)
    record = client.pause(run_id, by="ops", reason="hold \ud800 on")
    assert record.status == RunStatus.PAUSED
    assert record.status_reason == "hold \\ud800 on"


BAD_DECISION_IDS = {"nul": "req\x00-7", "too-long": "r" * 201, "not-a-str": 7}


@pytest.mark.parametrize("decision_id", BAD_DECISION_IDS.values(), ids=list(BAD_DECISION_IDS))
def test_a_decision_id_no_row_can_hold_is_refused_on_both_stores(store_url: str, client: Client,
                                                                 decision_id: Any) -> None:
    run_id = _waiting(store_url)
    with pytest.raises(UserError, match="decision id"):
        client.approve(run_id, "review", by="alice", decision_id=decision_id)
    assert client.store.pending_signals(run_id) == []  # nothing recorded
    # the approval still waits, and a good id decides it
    decision = client.approve(run_id, "review", by="alice", decision_id="r" * 200)
    assert decision.decision_id == "r" * 200


def test_an_approval_node_id_with_nul_is_not_waiting(store_url: str, client: Client) -> None:
    run_id = _waiting(store_url)
    with pytest.raises(UserError, match="is not waiting for a decision"):
        client.approve(run_id, "rev\x00iew", by="alice")
    with pytest.raises(UserError, match="is not waiting for a decision"):
        client.reject(run_id, "rev\ud800iew", by="alice")


@pytest.mark.parametrize("fan_index", [2**31, 2**70, -2])
def test_a_fan_index_no_row_can_hold_is_not_waiting(store_url: str, client: Client, fan_index: int) -> None:
    """The column is a 32-bit integer: PostgreSQL's look-up raised ``DataError`` (integer out of range)."""
    run_id = _waiting(store_url)
    with pytest.raises(UserError, match="is not waiting for a decision"):
        client.approve(run_id, "review", by="alice", fan_index=fan_index)


BAD_COLUMNS = {"queue-nul": {"queue": "orders\x00"}, "queue-long": {"queue": "q" * 201},
               "queue-surrogate": {"queue": "q\ud800"}, "ref-nul": {"workflow_ref": "flows.py:wf\x00"},
               "ref-long": {"workflow_ref": "m" * 498 + ":wf"}}


@pytest.mark.parametrize("given", BAD_COLUMNS.values(), ids=list(BAD_COLUMNS))
def test_a_submit_whose_queue_or_ref_no_row_can_hold_is_refused(store_url: str, client: Client,
                                                                given: dict[str, str]) -> None:
    """Both were stored on SQLite and raised ``DataError`` on PostgreSQL (``UnicodeEncodeError`` on both)."""
    before = _run_count(store_url)
    (name,) = given
    limit = 200 if name == "queue" else 500
    with pytest.raises(UserError, match=f"{name} must be 1 to {limit} printable characters"):
        client.submit(wf, 1, **given)  # type: ignore[arg-type]
    assert _run_count(store_url) == before
    assert client.submit(wf, 1, queue="q" * 200, workflow_ref="m" * 497 + ":w").status == RunStatus.PENDING


class Edit(BaseModel):
    amount: float


edit_wf = Workflow("stop27_edit")


@edit_wf.approval(answer=Edit)
def amend() -> str:
    return "refund how much?"


@pytest.mark.parametrize("answer", [{"amount": math.nan}, {"amount": math.inf}], ids=["nan", "inf"])
def test_an_answer_holding_nan_is_refused_not_stored_as_null(store_url: str, client: Client, answer: Any) -> None:
    """NaN passes the schema's ``number``; the decision's dump then wrote it as null (its ``answer``
    is ``Any``), so the approval carried ``{"amount": null}``: a wrong number, silently."""
    run_id = raysaga.run(edit_wf, None, store=store_url, executor="inline",
                         options=RunOptions(release_after=0)).run_id
    with pytest.raises(UserError, match=r"the answer to 'amend' is not JSON: the answer\['amount'\] is"):
        client.approve(run_id, "amend", by="alice", answer=answer)
    assert client.store.pending_signals(run_id) == []


def _decisions_seen_elsewhere(path: Path) -> int:
    """The decisions another process reads from the SQLite file (what a worker would see)."""
    code = f"import sqlite3; print(sqlite3.connect({str(path)!r}).execute('SELECT count(*) FROM raysaga_signals')" \
           ".fetchone()[0])"
    return int(subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout)


def test_a_store_opened_twice_in_a_process_keeps_its_commits_when_another_process_reads(tmp_path: Path) -> None:
    """Opening a SQLite store read its header with Python's ``open()``; closing that descriptor
    dropped every POSIX lock the process held on the file, its live SQLite connections' included.
    A process holding a store (``raysaga.run(store=url)``) that opened it again (``Client(url)``)
    then let the next other process (``raysaga list``) checkpoint and delete the -wal and -shm files
    under it: the approval it recorded next went to the deleted WAL file. ``approve`` returned a
    decision that no other process ever saw (and the following read failed, "disk I/O error")."""
    path = tmp_path / "raysaga.db"
    url = f"sqlite:///{path}"
    record = raysaga.run(wf, 1, store=url, executor="inline", options=RunOptions(release_after=0))
    with Client(url) as client:
        listed = subprocess.run([sys.executable, "-m", "raysaga", "list"], capture_output=True, text=True,
                                env={**os.environ, "RAYSAGA_DB": url})
        assert listed.returncode == 0, listed.stderr
        client.approve(record.run_id, "review", by="alice")
        assert _decisions_seen_elsewhere(path) == 1, "the decision was lost"
        resumed = raysaga.resume(wf, record.run_id, store=url, executor="inline")
    assert resumed.status == RunStatus.COMPLETED
    assert resumed.output == {"ship": "shipped"}
