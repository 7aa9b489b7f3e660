"""The approvals inbox (``decisions.waiting``) reads the decisions so far of every waiting approval
in one query, where it ran one signals query per approval: with a backlog of approvals the inbox
grew by a query each (200 waiting approvals: 202 queries).

Checked on SQLite and PostgreSQL: what it returns is what the per-approval version gave (kept here
as the oracle) over many approvals across runs (plain and fan-out items, quorums half met, settled
ones, rejections, approvers, decisions on other nodes and items), and the number of statements it
sends to the reader does not grow with the number of approvals."""

from __future__ import annotations

import random
from collections.abc import Iterator
from typing import Any

import pytest
from sqlalchemy import event, select

from raysaga.state import SqlStore, decisions
from raysaga.state.decisions import WaitingApproval, request_of, settles
from raysaga.state.decoding import reading
from raysaga.state.models import NodeRecord
from raysaga.state.schema import nodes, runs
from tests.state.test_waiting_index_stop31 import _ask, _mixed, _run, _sleep


@pytest.fixture
def store(own_store_url: str) -> Iterator[SqlStore]:
    """A database of this file's own: it leaves waiting approvals that a later test's whole-store
    inbox (``waiting_approvals()`` with no run) would show."""
    opened = SqlStore(own_store_url)
    yield opened
    opened.close()

def _per_approval(store: SqlStore, approver: str | None = None, run_id: str | None = None) -> list[WaitingApproval]:
    """The inbox as schema 14 first read it: the same two index reads, then one signals query per
    waiting approval (``decisions._decisions``)."""
    holding = select(nodes.c.run_key).where(decisions._IS_WAITING)
    decidable = select(runs.c.run_key, runs.c.run_id, runs.c.workflow_name).where(
        runs.c.status.in_(decisions._DECIDABLE), runs.c.run_key.in_(holding))
    rows = select(*decisions._WAITING_COLUMNS).where(decisions._IS_WAITING)
    if run_id is not None:
        decidable = decidable.where(runs.c.run_id == run_id)
        rows = rows.where(nodes.c.run_key == select(runs.c.run_key).where(runs.c.run_id == run_id).scalar_subquery())
    found: list[WaitingApproval] = []
    with store.reader.connect() as conn:
        named = {key: (rid, workflow) for key, rid, workflow in conn.execute(decidable).all()}
        if not named:
            return []
        for row in conn.execute(rows).all():
            values = row._asdict()
            run = named.get(values.pop("run_key"))
            if run is None:
                continue
            values["run_id"], workflow = run
            with reading(values["run_id"], nodes.name):
                record = NodeRecord.model_validate(values)
            request = request_of(record)
            if request is None:
                continue
            deciders = request.deciders()
            if approver is not None and deciders is not None and approver not in deciders:
                continue
            so_far = decisions._decisions(conn, record.run_id, record.node_id, record.fan_index)
            if settles(request, so_far) is not None:
                continue
            found.append(WaitingApproval(run_id=record.run_id, workflow=workflow, node=record.node_id,
                                         fan_index=record.fan_index, request=request,
                                         approvals=[d.by for d in so_far if d.verdict == "approve"]))
    return sorted(found, key=lambda w: (w.request.asked_at, w.run_id, w.node))


def _backlog(store: SqlStore, runs_count: int, seed: int) -> list[str]:
    """``runs_count`` runs of five approvals each (a plain one, four items of a fan-out: one with
    a quorum of two), some decided: half a quorum, a settled item, a rejection, and decisions on
    a plain node and an item sharing a node name (their fan indexes must keep them apart)."""
    rng = random.Random(seed)
    made: list[str] = []
    for n in range(runs_count):
        asked = float(rng.randrange(50))  # ties on asked_at: the order falls to run id and node
        writes = [_ask("sign", -1, asked, rng.choice([None, ["ann"], ["ann", "bob"]])),
                  _ask("item", 0, asked + 1, None, quorum=2), _ask("item", 1, asked + 1, ["bob"]),
                  _ask("item", 2, asked + 2), _ask("item", 3, asked + 0.5, ["ann", "bob"], quorum=2)]
        if n % 4 == 0:
            writes.append(_sleep("nap"))
        status = ("waiting_human", "running", "paused", "waiting_timer", "completed")[n % 5]
        run_id = _run(store, status, writes, rng)
        made.append(run_id)
        if status == "completed":
            continue  # at rest: a decision is refused
        store.decide(run_id, "item", "approve", by="ann", fan_index=0)  # one of two
        if n % 2:
            store.decide(run_id, "item", "approve", by="bob", fan_index=1)  # settled: not shown
        if n % 3 == 0:
            store.decide(run_id, "item", "reject", by="ann", fan_index=2)  # settled
        if n % 3 == 1:
            store.decide(run_id, "item", "approve", by="bob", fan_index=3)
            store.decide(run_id, "sign", "approve", by="ann")  # settles a plain node
    return made


def _statements(store: SqlStore, approver: str | None = None,
                run_id: str | None = None) -> tuple[list[WaitingApproval], list[str]]:
    sent: list[str] = []

    def catch(conn: object, cursor: object, statement: str, *args: Any) -> None:
        sent.append(statement)

    event.listen(store.reader, "before_cursor_execute", catch)
    try:
        got = store.waiting_approvals(approver, run_id)
    finally:
        event.remove(store.reader, "before_cursor_execute", catch)
    return got, sent


@pytest.mark.parametrize("seed", [1, 2])
def test_the_inbox_is_what_the_per_approval_version_gave(store: SqlStore, seed: int) -> None:
    made = _backlog(store, 40, seed) + _mixed(store)
    for approver in (None, "ann", "bob", "nobody"):
        assert store.waiting_approvals(approver) == _per_approval(store, approver), approver
    for run_id in (*made[:12], *made[-7:], "no-such-run"):
        for approver in (None, "bob"):
            assert store.waiting_approvals(approver, run_id) == _per_approval(store, approver, run_id), run_id
    mine = [w for w in store.waiting_approvals() if w.run_id in made]
    assert len(mine) > 100, len(mine)  # the backlog is there: a test of an empty inbox proves nothing
    assert any(w.approvals == ["ann"] for w in mine) and any(not w.approvals for w in mine)


def test_the_inbox_sends_as_many_statements_for_many_approvals_as_for_few(store: SqlStore) -> None:
    """Counted on the reader engine: the few approvals of one run, then that run among 120 more."""
    first = _backlog(store, 2, 3)
    few, few_sent = _statements(store)
    _backlog(store, 24, 4)
    many, many_sent = _statements(store)
    assert len(many) >= len(few) + 60, (len(few), len(many))
    assert len(many_sent) == len(few_sent) <= 3, many_sent
    _, one_sent = _statements(store, run_id=first[0])
    assert len(one_sent) <= 3, one_sent

