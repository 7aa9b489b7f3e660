"""Review of fork (stop 44): what a fork starts with when its lineage changed since.

- Pruning a fork whose rollback refunded its parent's charge erased the refund: a later fork of
  the parent inherited the refunded charge and shipped on it. Now prune keeps such a fork while
  a run that may inherit the charge is kept, and says so (``PruneReport.kept``).
- A fork of an agent run that used shared memory started with an empty blackboard, though it
  inherited the turns that wrote it. Now the inherited writes are in the fork's memory.
- A fork was refused for an in-doubt tool call of an agent node it would inherit, not run again.
- An input patch of a ``Secret`` field merged into its stored form and failed showing it.
"""

from __future__ import annotations

import time
from typing import Any

import pytest
from pydantic import BaseModel
from sqlalchemy import update

import raysaga
from raysaga import Permanent, RetryPolicy, Secret, StepContext, Transient, Workflow
from raysaga.agents import Agent, ScriptedModel, text_reply, tool, tool_reply
from raysaga.errors import InvalidInputError
from raysaga.state import RunStatus, SqlStore
from raysaga.state.pruning import prune
from raysaga.state.schema import runs
from raysaga.testing import FakeProvider
from tests.support.cli import invoke
from tests.support.shop_flows import shop
from tests.support.store_rows import nodes_of


def _labels(store_url: str, run_id: str) -> dict[str, tuple[str, str | None]]:
    return {label: (n.status.value, n.origin_run_id) for label, n in nodes_of(store_url, run_id).items()}


# ---------------------------------------------------------------------- 1. prune and a sibling's refund


def _shop(provider: FakeProvider, fails: dict[str, bool]) -> Workflow:
    return shop("stop44_shop", provider, fails)


def test_prune_keeps_a_fork_whose_rollback_refunded_its_parents_charge(own_store_url: str) -> None:
    provider = FakeProvider()
    fails = {"ship": False}
    wf = _shop(provider, fails)
    assert raysaga.run(wf, {"amount": 5}, store=own_store_url, run_id="p", executor="inline").status == \
        RunStatus.COMPLETED
    fails["ship"] = True
    f1 = raysaga.fork(wf, "p", from_node="ship", store=own_store_url, new_run_id="f1", executor="inline")
    assert f1.status == RunStatus.COMPENSATED
    assert len(provider.effects("refund")) == 1  # the parent's charge, refunded under its key
    fails["ship"] = False
    store = SqlStore(own_store_url)
    try:
        later = time.time() + 3600
        dry = prune(store, 0, statuses=["compensated"], dry_run=True, now=later)
        report = prune(store, 0, statuses=["compensated"], now=later)
        assert store.get_run("f1", lenient=True).status == RunStatus.COMPENSATED
    finally:
        store.close()
    # a later fork of the parent does not ship on the refunded charge: it charges again
    f2 = raysaga.fork(wf, "p", from_node="ship", store=own_store_url, new_run_id="f2", executor="inline")
    assert f2.status == RunStatus.COMPLETED, f2.status_reason
    assert _labels(own_store_url, "f2")["charge"] == ("completed", None)
    assert len(provider.effects("charge")) == 2
    assert (dry.runs, dry.kept) == (0, ["f1"])
    assert (report.runs, report.kept) == (0, ["f1"])
    # the CLI says which it kept and why; ``raysaga.prune`` takes the store's URL as well
    store = SqlStore(own_store_url)
    try:  # made old enough for the CLI's --older-than
        with store.engine.begin() as conn:
            conn.execute(update(runs).where(runs.c.run_id == "f1").values(updated_at=time.time() - 60))
    finally:
        store.close()
    code, out, err = invoke("prune", "--older-than", "10s", "--status", "compensated", "--db", own_store_url)
    assert code == 0 and "kept 1 run(s) that runs still in the store need" in out \
        and "forks whose rollback undid nodes of runs still in the store" in out \
        and out.rstrip().endswith("f1"), (out, err)
    by_url = raysaga.prune(own_store_url, 0, statuses=["compensated"], now=time.time() + 3600, dry_run=True)
    assert (by_url.runs, by_url.kept) == (0, ["f1"])
    # pruned together with every run of the tree, the fork goes too (the parent first, in one call)
    store = SqlStore(own_store_url)
    try:
        dry = prune(store, 0, now=time.time() + 3600, dry_run=True)
        assert (dry.runs, dry.kept) == (3, [])
        report = prune(store, 0, now=time.time() + 3600)
        assert (report.runs, report.kept) == (3, [])
    finally:
        store.close()


def test_prune_keeps_the_forks_between_a_kept_undoer_and_the_run_it_undid(own_store_url: str) -> None:
    """p <- m <- {a (rolled back: refunded p's charge), b}: pruning p and m but not b deleted m,
    a later fork of b no longer found a's refund (looked for down p's forks) and built on it. (Since
    stop 50 p and m stay anyway while b does: b inherits from them.)"""
    provider = FakeProvider()
    fails = {"ship": False}
    wf = _shop(provider, fails)
    raysaga.run(wf, {"amount": 5}, store=own_store_url, run_id="p", executor="inline")
    raysaga.fork(wf, "p", from_node="ship", store=own_store_url, new_run_id="m", executor="inline")
    raysaga.fork(wf, "m", from_node="ship", store=own_store_url, new_run_id="b", executor="inline")
    fails["ship"] = True
    assert raysaga.fork(wf, "m", from_node="ship", store=own_store_url, new_run_id="a",
                        executor="inline").status == RunStatus.COMPENSATED
    fails["ship"] = False
    assert len(provider.effects("charge")) == 1 and len(provider.effects("refund")) == 1
    assert _labels(own_store_url, "b")["charge"] == ("completed", "p")  # b holds p's (now refunded) charge
    store = SqlStore(own_store_url)
    try:
        with store.engine.begin() as conn:  # b is recent: not prunable
            conn.execute(update(runs).where(runs.c.run_id == "b").values(updated_at=time.time() + 86_400))
        later = time.time() + 3600
        dry = prune(store, 0, now=later, dry_run=True)
        report = prune(store, 0, now=later)
    finally:
        store.close()
    # p stays too since stop 50: b inherits p's charge and reads p's ledger row of it (it went before)
    assert (dry.runs, dry.kept) == (report.runs, report.kept) == (0, ["a", "m", "p"])
    c = raysaga.fork(wf, "b", from_node="ship", store=own_store_url, new_run_id="c", executor="inline")
    assert c.status == RunStatus.COMPLETED and _labels(own_store_url, "c")["charge"] == ("completed", None)
    assert len(provider.effects("charge")) == 2  # charged again, not shipped on the refunded charge


def test_two_forks_that_refunded_one_charge_do_not_keep_each_other(own_store_url: str) -> None:
    provider = FakeProvider()
    fails = {"ship": False}
    wf = _shop(provider, fails)
    raysaga.run(wf, {"amount": 5}, store=own_store_url, run_id="p", executor="inline")
    for run_id in ("a", "b"):  # both hold p's charge, then both are rolled back: p's charge refunded (once)
        raysaga.fork(wf, "p", from_node="ship", store=own_store_url, new_run_id=run_id, drive=False)
    for run_id in ("a", "b"):
        assert raysaga.cancel(run_id, store=own_store_url, compensate=True, workflow=wf,
                              executor="inline").status == RunStatus.COMPENSATED
    assert len(provider.effects("charge")) == len(provider.effects("refund")) == 1
    store = SqlStore(own_store_url)
    try:
        later = time.time() + 3600
        dry = prune(store, 0, now=later, dry_run=True)
        report = prune(store, 0, now=later)
    finally:
        store.close()
    assert (dry.runs, dry.kept) == (report.runs, report.kept) == (3, [])


# ---------------------------------------------------------------------- 2. shared memory


def _blackboard(seen: list[str]) -> Workflow:
    class Recording(ScriptedModel):
        def complete(self, request: Any) -> Any:
            last = request.messages[-1]
            if isinstance(last.get("content"), list) and last["role"] == "user":
                seen.append(str(last["content"][0].get("content")))
            return super().complete(request)

    model = Recording({
        "writer": [tool_reply(("memory_write", {"key": "plan", "value": {"step": "A"}, "expected_version": 0})),
                   text_reply("wrote")],
        "reader": [tool_reply(("memory_read", {"key": "plan"})), text_reply("read")],
    })
    wf = Workflow("stop44_memory")

    @wf.agent(Agent("writer", model, shared_memory=True, max_turns=4))
    def w() -> str:
        return "writer"

    @wf.agent(Agent("reader", model, shared_memory=True, max_turns=4), after=["w"])
    def r() -> str:
        return "reader"

    return wf


def test_a_fork_starts_with_the_memory_its_inherited_agents_wrote(own_store_url: str) -> None:
    seen: list[str] = []
    wf = _blackboard(seen)
    assert raysaga.run(wf, None, store=own_store_url, run_id="p", executor="inline").status == RunStatus.COMPLETED
    child = raysaga.fork(wf, "p", from_node="r", store=own_store_url, new_run_id="c", executor="inline")
    assert child.status == RunStatus.COMPLETED, child.status_reason
    assert _labels(own_store_url, "c")["w@0.0"] == ("completed", "p")
    # the reader, run again, reads what the inherited writer wrote, at the version it wrote
    assert '"value": {"step": "A"}, "version": 1' in seen[-1]
    store = SqlStore(own_store_url)
    try:
        parent, fork = store.memory_get("p", "plan"), store.memory_get("c", "plan")
        assert (fork.value, fork.version, fork.writer) == (parent.value, 1, parent.writer)
        # forked from the writer, nothing it wrote is inherited: it writes again, from version 0
        again = raysaga.fork(wf, "p", from_node="w", store=own_store_url, new_run_id="c2", executor="inline")
        assert again.status == RunStatus.COMPLETED, again.status_reason
        entry = store.memory_get("c2", "plan")
        assert (entry.value, entry.version) == ({"step": "A"}, 1) and entry.writer != parent.writer
    finally:
        store.close()


# ---------------------------------------------------------------------- 3. an in-doubt call the fork inherits


def test_an_in_doubt_tool_call_of_an_inherited_agent_does_not_refuse_the_fork(sqlite_url: str) -> None:
    calls: list[tuple[str, str | None]] = []
    fails = {"report": False}

    def unpay(ctx: StepContext, output: Any, item: str) -> None:
        calls.append(("unpay", ctx.idempotency_key))

    @tool(effect=True, compensate=unpay, retry=RetryPolicy(max_attempts=2, base=0.01, cap=0.02))
    def pay(item: str, idempotency_key: str) -> str:
        """Pay."""
        calls.append(("pay", idempotency_key))
        raise Transient("gateway timeout after the charge")

    model = ScriptedModel({"buy": [tool_reply(("pay", {"item": "book"})), text_reply("gave up")]})
    wf = Workflow("stop44_in_doubt")

    @wf.agent(Agent("buyer", model, tools=(pay,), max_turns=4))
    def buyer() -> str:
        return "buy"

    @wf.step()
    def report(buyer: str) -> str:
        if fails["report"]:
            raise Permanent("report failed")
        return buyer

    assert raysaga.run(wf, None, store=sqlite_url, run_id="p", executor="inline").status == RunStatus.COMPLETED
    store = SqlStore(sqlite_url)
    try:
        assert [(e.node_id, e.status.value) for e in store.effects("p")] == [("buyer@0.0", "abandoned")]
    finally:
        store.close()
    paid = calls[0][1]
    child = raysaga.fork(wf, "p", from_node="report", store=sqlite_url, new_run_id="c", executor="inline")
    assert child.status == RunStatus.COMPLETED, child.status_reason
    assert _labels(sqlite_url, "c")["buyer@0.0"] == ("failed", "p")  # inherited: never called again
    assert [c for c in calls if c[0] == "pay"] == [("pay", paid)] * 2  # the parent's two attempts only
    # forked at the turn after the call, the call is inherited too: the model is asked again, no pay
    later = raysaga.fork(wf, "p", from_node="buyer@1", store=sqlite_url, new_run_id="c2", executor="inline")
    assert later.status == RunStatus.COMPLETED, later.status_reason
    assert _labels(sqlite_url, "c2")["buyer@0.0"] == ("failed", "p")
    assert len([c for c in calls if c[0] == "pay"]) == 2


# ---------------------------------------------------------------------- 4. a patch of a Secret field


class _Order(BaseModel):
    amount: int
    token: Secret


def test_an_input_patch_replaces_a_secret_field_whole(sqlite_url: str, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("STOP44_OLD_TOKEN", "old-token-value")
    monkeypatch.setenv("STOP44_NEW_TOKEN", "new-token-value")
    used: list[str] = []
    wf = Workflow("stop44_secret")

    @wf.step(effect=True)
    def pay(ctx: StepContext, input: _Order) -> str:
        used.append(input.token.get())
        return "paid"

    raysaga.run(wf, {"amount": 1, "token": {"env": "STOP44_OLD_TOKEN"}}, store=sqlite_url, run_id="p",
                executor="inline")
    child = raysaga.fork(wf, "p", from_node="pay", input_patch={"token": {"env": "STOP44_NEW_TOKEN"}},
                         store=sqlite_url, new_run_id="c", executor="inline")
    assert child.status == RunStatus.COMPLETED, child.status_reason
    assert used == ["old-token-value", "new-token-value"]
    with pytest.raises(InvalidInputError) as refused:  # a wrong patch: the error shows the patch, not the stored form
        raysaga.fork(wf, "p", from_node="pay", input_patch={"token": {"envv": "X"}}, store=sqlite_url,
                     new_run_id="c2", executor="inline")
    assert "$secret" not in str(refused.value) and "STOP44_OLD_TOKEN" not in str(refused.value)
