"""A decision's comment is bounded (``decisions.MAX_COMMENT``) where the store records it, so every
path (``SqlStore.decide``, ``Client``, the CLI; the dashboard decides through ``Client``) refuses
an oversized one with the limit named, and nothing is stored: no signal, no event, the node still
waiting. Before, a 20 MB comment was stored twice (the signal and its event)."""

from __future__ import annotations

import uuid
from typing import Any

import pytest
from sqlalchemy import func, select

import raysaga
from raysaga import Ask, Client, Workflow
from raysaga.errors import UserError
from raysaga.state import RunStatus, SqlStore
from raysaga.state.decisions import MAX_COMMENT
from raysaga.state.schema import events, signals
from tests.support.cli import invoke, one_line_error


def _flow() -> Workflow:
    wf = Workflow(f"comment_stop28_{uuid.uuid4().hex[:8]}")

    @wf.approval()
    def review() -> Ask:
        return Ask(prompt="ship it?")

    @wf.step()
    def ship(review: Any) -> str:
        return "shipped"

    return wf


def _rows(store: SqlStore, run_id: str) -> tuple[int, int]:
    with store.engine.connect() as conn:
        n_signals = conn.execute(select(func.count()).select_from(signals).where(signals.c.run_id == run_id))
        n_events = conn.execute(select(func.count()).select_from(events).where(events.c.run_id == run_id))
        return n_signals.scalar_one(), n_events.scalar_one()


def test_an_oversized_comment_is_refused_on_every_path_and_nothing_is_stored(store_url: str) -> None:
    rested = raysaga.run(_flow(), store=store_url, executor="inline")
    assert rested.status == RunStatus.WAITING_HUMAN
    run_id = rested.run_id
    store = SqlStore(store_url)
    try:
        before = _rows(store, run_id)
        huge = "x" * (MAX_COMMENT + 1)
        limit = f"at most {MAX_COMMENT:,} characters, this one has {MAX_COMMENT + 1:,}"
        client = Client(store)
        for verdict in ("approve", "reject"):
            with pytest.raises(UserError, match=limit):
                store.decide(run_id, "review", verdict, by="ann", comment=huge)
        with pytest.raises(UserError, match=f"at most {MAX_COMMENT:,} characters, this one has 20,000,000"):
            client.approve(run_id, "review", by="ann", comment="y" * 20_000_000)
        with pytest.raises(UserError, match=limit):
            client.reject(run_id, "review", by="ann", comment=huge, decision_id="d-1")
        with pytest.raises(UserError, match="comment is text"):
            client.approve(run_id, "review", by="ann", comment=b"bytes")  # type: ignore[arg-type]
        for verb in ("approve", "reject"):
            code, _, err = invoke(verb, run_id, "review", "--by", "ann", "--comment", huge, "--db", store_url)
            one_line_error(code, err, limit)
        assert _rows(store, run_id) == before
        assert [w.run_id for w in store.waiting_approvals(run_id=run_id)] == [run_id]
        # at the limit it is taken, whole, in the signal and the event
        decision = store.decide(run_id, "review", "approve", by="ann", comment="z" * MAX_COMMENT)
        assert decision.comment == "z" * MAX_COMMENT
        assert _rows(store, run_id) == (before[0] + 1, before[1] + 1)
        [event] = [e for e in store.events(run_id) if e.kind == "decision"]
        assert event.data["comment"] == "z" * MAX_COMMENT
    finally:
        store.close()


@pytest.mark.parametrize("by", ["A" * 201, "ada\x1b[2J", "ada\nmallory", "ada\ud800"])
def test_who_decides_is_a_name_on_every_path(store_url: str, by: str) -> None:
    """``by`` was checked by the CLI only: through ``Client`` (the dashboard's way) any size, control
    characters included, was recorded in the signal and the event, and a lone surrogate failed the
    decision with a ``NotJSONableError``."""
    rested = raysaga.run(_flow(), store=store_url, executor="inline")
    store = SqlStore(store_url)
    try:
        before = _rows(store, rested.run_id)
        with pytest.raises(UserError, match=r"by \(who decides\) must be 1 to 200 printable characters"):
            Client(store).approve(rested.run_id, "review", by=by)
        assert _rows(store, rested.run_id) == before
        # settled, so no approval of this test is left waiting for another test's inbox
        assert Client(store).reject(rested.run_id, "review", by="ann").by == "ann"
    finally:
        store.close()


def test_a_lone_surrogate_in_a_comment_is_stored_as_its_escape(store_url: str) -> None:
    rested = raysaga.run(_flow(), store=store_url, executor="inline")
    store = SqlStore(store_url)
    try:
        decision = Client(store).reject(rested.run_id, "review", by="ann", comment="no \ud800 thanks")
        assert decision.comment == "no \\ud800 thanks"
        [event] = [e for e in store.events(rested.run_id) if e.kind == "decision"]
        assert event.data["comment"] == "no \\ud800 thanks"
        with pytest.raises(UserError, match="at most 10,000 characters, this one has 60,000"):
            Client(store).approve(rested.run_id, "review", by="bob", comment="\ud800" * 10_000)  # escaped: 6 each
    finally:
        store.close()
