"""Fork, replay and workflow versions (docs/fork.md), on real stores, driven inline.

- The 3-agent research example on the real ``anthropic`` SDK against the local Messages server:
  a fork from the writer asks the model only the writer's turn (0 requests for the planner and
  the researchers); a fork from a researcher's third turn asks only that turn and the writer
  (turns 1-2 of that researcher are not re-requested); no report is filed again.
- The order saga: a fork from ``send_email`` calls the deduping provider once (the email, under
  the fork's key); the charge is inherited (0 calls), its ledger row visible as inherited.
- A fork of a live run is refused; an unknown node is named with the nodes there are.
- Replay makes 0 outside calls and reports a changed step's differing output.
- A definition change between a crash and the resume is refused naming the changed step;
  ``allow_changed`` completes the run.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

import raysaga
from examples.agents_research import script
from examples.agents_research import workflow as research_example
from examples.order import workflow as order_example
from raysaga import RunOptions, StepContext, Workflow
from raysaga.agents import AnthropicModel
from raysaga.errors import DefinitionChangedError, ForkError
from raysaga.state import NodeStatus, RunStatus, SqlStore
from raysaga.testing import CrashAt, FakeProvider, SimulatedCrash, drive_inline
from tests.support import messages_server as ms
from tests.support.services import FakeServices

QUESTION = research_example.DEFAULT_QUESTION
SUBS = script.sub_questions(QUESTION)
REPORTS = [script.findings(sub) for sub in SUBS]
KEY = "test-key"


# ---------------------------------------------------------------------- agents: the Messages server counts


def _scripts() -> dict[str, list[Any]]:
    def as_reply(response: Any) -> Any:
        blocks = [ms.text_block(b["text"]) if b["type"] == "text" else ms.tool_use_block(b["name"], b["input"])
                  for b in response.content]
        return ms.reply(blocks, usage=(response.usage.input_tokens, response.usage.output_tokens))

    return {prompt: [as_reply(r) for r in turns] for prompt, turns in script.conversations(QUESTION).items()}


def _by_conversation(srv: ms.MessagesServer) -> dict[str, list[int]]:
    """The turns asked of each conversation (by its prompt), in arrival order."""
    asked: dict[str, list[int]] = {}
    for r in srv.requests:
        if r.body is not None and r.path == "/v1/messages":
            asked.setdefault(str(ms.conversation_of(r.body)), []).append(ms.turn_of(r.body))
    return asked


@pytest.fixture
def research(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Any:
    """A completed run of the research example through the SDK; yields (workflow, store, server, provider)."""
    monkeypatch.setenv("ANTHROPIC_API_KEY", KEY)
    db = f"sqlite:///{tmp_path / 'research.db'}"
    with ms.MessagesServer(ms.ScriptedResponder(_scripts()), api_key=KEY) as srv, FakeServices() as services:
        wf = research_example.build(AnthropicModel("claude-haiku-4-5", base_url=srv.base_url), services.url)
        parent = raysaga.run(wf, {"question": QUESTION}, store=db, run_id="ar-parent", executor="inline")
        assert parent.status == RunStatus.COMPLETED, parent.status_reason
        assert len(srv.requests) == 1 + 3 * len(SUBS) + 1  # planner, 3 turns per researcher, writer
        srv.clear()
        services.reset()
        store = SqlStore(db)
        try:
            yield wf, store, srv, services, parent
        finally:
            store.close()


def test_fork_from_the_writer_asks_the_model_only_for_the_writer(research: Any) -> None:
    wf, store, srv, services, parent = research
    child = raysaga.fork(wf, "ar-parent", from_node="write", store=store, new_run_id="ar-w", executor="inline")
    assert child.status == RunStatus.COMPLETED, child.status_reason
    assert child.output == parent.output
    writer = research_example.writer_prompt(QUESTION, SUBS, REPORTS)
    assert _by_conversation(srv) == {writer: [0]}  # 0 requests for the planner and the researchers
    assert srv.repeated_requests() == []
    assert services.log()["raw"] == {}  # no report filed again
    assert (child.parent_run_id, child.forked_from) == ("ar-parent", "write")
    inherited = {n.label for n in store.nodes("ar-w") if n.origin_run_id == "ar-parent"}
    assert {"planner", "plan", "research", "research[0]", "research@2[3]"} <= inherited
    assert "write" not in inherited and "write@0" not in inherited
    filed = [e for e in store.inherited_effects("ar-w") if e.effect_name == "tool:file_report"]
    assert sorted(e.fan_index for e in filed) == [0, 1, 2, 3] and {e.run_id for e in filed} == {"ar-parent"}
    assert store.effects("ar-w") == []  # the fork executed no effect
    assert [(c["run_id"], c["forked_from"]) for c in store.children("ar-parent")] == [("ar-w", "write")]


def test_fork_from_a_researchers_third_turn_keeps_its_first_two(research: Any) -> None:
    wf, store, srv, services, parent = research
    child = raysaga.fork(wf, "ar-parent", from_node="research@2[1]", store=store, new_run_id="ar-r",
                         executor="inline")
    assert child.status == RunStatus.COMPLETED, child.status_reason
    assert child.output == parent.output
    researcher_1 = research_example.researcher_prompt(QUESTION, SUBS[1])
    writer = research_example.writer_prompt(QUESTION, SUBS, REPORTS)
    # turns 0 and 1 of researcher 1 are not asked again, nor any other researcher or the planner
    assert _by_conversation(srv) == {researcher_1: [2], writer: [0]}
    assert services.log()["raw"] == {}  # its report (turn 1's tool call) was inherited, not filed again
    rows = {n.label: n for n in store.nodes("ar-r")}
    assert rows["research@1[1]"].origin_run_id == "ar-parent" and rows["research@1.0[1]"].origin_run_id == "ar-parent"
    assert rows["research@2[1]"].origin_run_id is None and rows["research[1]"].origin_run_id is None
    assert rows["research[0]"].origin_run_id == "ar-parent"


def test_a_turn_that_does_not_exist_is_named_with_the_turns_there_are(research: Any) -> None:
    wf, store, *_ = research
    with pytest.raises(ForkError, match=r"has no node 'research@7\[1\]'.*research\[0\.\.3\] \(turns research@0\.\.2\)"):
        raysaga.fork(wf, "ar-parent", from_node="research@7[1]", store=store, executor="inline")
    with pytest.raises(ForkError, match="fork from its turn, 'research@1\\[1\\]'"):
        raysaga.fork(wf, "ar-parent", from_node="research@1.0[1]", store=store, executor="inline")


# ---------------------------------------------------------------------- the order saga: the deduping provider counts


def test_fork_of_the_order_saga_reissues_only_what_is_downstream(store_url: str) -> None:
    with FakeServices() as services:
        wf = order_example.wf
        parent = raysaga.run(wf, order_example.sample_input(services.url), store=store_url, run_id="o-parent",
                             executor="inline")
        assert parent.status == RunStatus.COMPLETED
        parent_keys = dict(services.log()["raw"])
        services.reset()
        child = raysaga.fork(wf, "o-parent", from_node="send_email", store=store_url, new_run_id="o-child",
                             executor="inline")
        log = services.log()
    assert child.status == RunStatus.COMPLETED, child.status_reason
    store = SqlStore(store_url)
    try:
        own = store.effects("o-child")
        inherited = store.inherited_effects("o-child")
        assert [(e.node_id, e.run_id) for e in own] == [("send_email", "o-child")]
        assert [(e.node_id, e.run_id) for e in inherited] == [("charge_card", "o-parent")]
        # the charge: 0 calls; the email: once, under the fork's own key (a new key, not the parent's)
        assert log["raw"] == {own[0].idempotency_key: 1} == log["effective"]
        assert own[0].idempotency_key not in parent_keys and inherited[0].idempotency_key in parent_keys
        assert child.output["ship"]["charge_id"] == parent.output["ship"]["charge_id"]
        assert child.output["ship"]["receipt_id"] != parent.output["ship"]["receipt_id"]
        events = [e.kind for e in store.events("o-child")]
        assert events[:2] == ["run_created", "run_forked"]
    finally:
        store.close()


def test_an_input_patch_reaches_the_nodes_that_run_afresh(sqlite_url: str) -> None:
    with FakeServices() as services:
        wf = order_example.wf
        raysaga.run(wf, order_example.sample_input(services.url), store=sqlite_url, run_id="p", executor="inline")
        services.reset()
        child = raysaga.fork(wf, "p", from_node="send_email", input_patch={"email": "grace@example.com"},
                             store=sqlite_url, new_run_id="c", executor="inline")
        log = services.log()
    assert child.status == RunStatus.COMPLETED
    assert child.input["email"] == "grace@example.com" and child.input["sku"] == "BOOK-42"
    # charge_card reads the input and is an effect: with the input changed it runs again, under the fork's key
    assert sorted(log["kinds"].values()) == ["charge", "email"]


def test_a_live_run_is_refused_and_an_unknown_node_named(sqlite_url: str) -> None:
    with FakeServices() as services:
        wf = order_example.wf
        raysaga.create_run(wf, order_example.sample_input(services.url), store=sqlite_url, run_id="live")
        with pytest.raises(ForkError, match="'live' is pending: only a run at rest"):
            raysaga.fork(wf, "live", from_node="ship", store=sqlite_url, executor="inline")
        raysaga.resume(wf, "live", store=sqlite_url, executor="inline")
        with pytest.raises(ForkError, match=r"has no node 'shipp'.*reserve_stock, charge_card, send_email, ship"):
            raysaga.fork(wf, "live", from_node="shipp", store=sqlite_url, executor="inline")


# ---------------------------------------------------------------------- a failed saga, forked after the fix

ATTEMPTS: dict[str, int] = {}


def _flaky_flow(broken: bool) -> Workflow:
    wf = Workflow("fork_fix")

    @wf.step()
    def fetch(input: dict[str, Any]) -> int:
        ATTEMPTS["fetch"] = ATTEMPTS.get("fetch", 0) + 1
        return int(input["n"])

    @wf.step()
    def double(fetch: int) -> int:
        ATTEMPTS["double"] = ATTEMPTS.get("double", 0) + 1
        if broken:
            raise raysaga.Permanent("a bug")
        return fetch * 2

    return wf


def test_a_failed_run_is_fixed_by_a_fork_without_redoing_what_succeeded(sqlite_url: str) -> None:
    ATTEMPTS.clear()
    failed = raysaga.run(_flaky_flow(True), {"n": 21}, store=sqlite_url, run_id="bad", executor="inline")
    assert failed.status == RunStatus.FAILED
    fixed = raysaga.fork(_flaky_flow(False), "bad", from_node="double", store=sqlite_url, new_run_id="good",
                         executor="inline")
    assert fixed.status == RunStatus.COMPLETED and fixed.output == {"double": 42}
    assert ATTEMPTS == {"fetch": 1, "double": 2}  # fetch inherited, not run again


# ---------------------------------------------------------------------- replay


def _order_with(ship_prefix: str) -> Workflow:
    """The order example with ``ship`` changed (its tracking prefix): same definition hash."""
    wf = Workflow("order", version="1")
    src = order_example.wf.steps
    for name in ("reserve_stock", "charge_card", "send_email"):
        spec = src[name]
        wf.step(spec.fn, name=name, effect=spec.effect, retry=spec.retry)

    @wf.step()
    def ship(input: order_example.OrderIn, reserve_stock: order_example.Reservation,
             charge_card: order_example.Charge, send_email: order_example.Receipt) -> order_example.Shipment:
        shipped = order_example.ship(input, reserve_stock, charge_card, send_email)
        return shipped.model_copy(update={"tracking_number": ship_prefix + shipped.tracking_number[3:]})

    return wf


def test_replay_calls_nothing_outside_and_reports_a_changed_step(sqlite_url: str) -> None:
    with FakeServices() as services:
        raysaga.run(order_example.wf, order_example.sample_input(services.url), store=sqlite_url, run_id="r",
                    executor="inline")
        services.reset()
        same = raysaga.replay(order_example.wf, "r", store=sqlite_url)
        changed_wf = _order_with("PKG")
        assert changed_wf.definition_hash == order_example.wf.definition_hash  # a body change only
        changed = raysaga.replay(changed_wf, "r", store=sqlite_url)
        upto = raysaga.replay(changed_wf, "r", store=sqlite_url, until="charge_card")
        log = services.log()
    assert log["raw"] == {}  # 0 calls at the provider
    assert {n.label: n.verdict for n in same.nodes} == {"reserve_stock": "same", "charge_card": "ledger",
                                                        "send_email": "ledger", "ship": "same"}
    assert same.differing == []
    assert [n.label for n in changed.differing] == ["ship"]
    assert "TRK-" in changed.differing[0].detail and "PKG-" in changed.differing[0].detail
    assert [n.label for n in upto.nodes] == ["reserve_stock", "charge_card"]


def test_replay_of_agents_asks_the_model_nothing(research: Any) -> None:
    wf, store, srv, services, _ = research
    report = raysaga.replay(wf, "ar-parent", store=store)
    assert srv.requests == [] and services.log()["raw"] == {}
    verdicts = {n.label: n.verdict for n in report.nodes}
    assert verdicts["planner"] == verdicts["write"] == verdicts["research[2]"] == verdicts["plan"] == "same"
    assert report.differing == []


# ---------------------------------------------------------------------- versions


def _versioned(extra_retry: bool) -> Workflow:
    wf = Workflow("versioned")

    @wf.step()
    def first(input: int) -> int:
        return input + 1

    @wf.step(retry=raysaga.RetryPolicy(max_attempts=7) if extra_retry else None)
    def second(first: int) -> int:
        return first * 10

    @wf.step()
    def third(second: int, ctx: StepContext) -> int:
        return second + 1

    return wf


def test_a_definition_change_between_crash_and_resume(store_url: str) -> None:
    before = _versioned(False)
    raysaga.create_run(before, 4, store=store_url, run_id="v")
    with pytest.raises(SimulatedCrash):
        drive_inline(before, "v", store=store_url, crash_at=CrashAt("after_commit", "first"))
    after = _versioned(True)
    with pytest.raises(DefinitionChangedError, match=r"steps changed: second;.*--allow-changed"):
        raysaga.resume(after, "v", store=store_url, executor="inline")
    done = raysaga.resume(after, "v", store=store_url, executor="inline", options=RunOptions(allow_changed=True))
    assert done.status == RunStatus.COMPLETED and done.output == {"third": 51}
    store = SqlStore(store_url)
    try:
        changed = [e for e in store.events("v") if e.kind == "definition_changed"]
        assert len(changed) == 1 and changed[0].data["changed"] == ["second"]
        assert store.get_run("v").definition_hash == after.definition_hash  # pinned to the new definition
        assert {n.label: n.status for n in store.nodes("v")}["first"] == NodeStatus.COMPLETED
    finally:
        store.close()


def test_a_fork_reruns_the_steps_whose_definition_changed(sqlite_url: str) -> None:
    raysaga.run(_versioned(False), 4, store=sqlite_url, run_id="vp", executor="inline")
    child = raysaga.fork(_versioned(True), "vp", from_node="third", store=sqlite_url, new_run_id="vc",
                         executor="inline")
    assert child.status == RunStatus.COMPLETED
    store = SqlStore(sqlite_url)
    try:
        origins = {n.label: n.origin_run_id for n in store.nodes("vc")}
        assert origins == {"first": "vp", "second": None, "third": None}  # second changed: it ran again
    finally:
        store.close()


# ---------------------------------------------------------------------- a fork's rollback of what it inherited

PROVIDER = FakeProvider()
SHIP_FAILS: list[bool] = [False]


def _saga() -> Workflow:
    wf = Workflow("fork_saga")

    def refund(ctx: StepContext, output: dict[str, Any]) -> None:
        PROVIDER.call("refund", ctx.idempotency_key, {"charge": output["id"]})

    @wf.step(effect=True, compensate=refund)
    def pay(ctx: StepContext, input: dict[str, Any]) -> dict[str, Any]:
        return PROVIDER.call("charge", ctx.idempotency_key, {"amount": input["amount"]})

    @wf.step()
    def ship(pay: dict[str, Any]) -> str:
        if SHIP_FAILS[0]:
            raise raysaga.Permanent("the warehouse is closed")
        return "shipped"

    return wf


def test_forks_rolling_back_undo_an_inherited_effect_once(sqlite_url: str) -> None:
    """Two forks of one completed run both fail and roll back: the inherited charge is refunded
    under its origin run's compensation key, so the provider sees one refund take effect."""
    wf = _saga()
    SHIP_FAILS[0] = False
    assert raysaga.run(wf, {"amount": 5}, store=sqlite_url, run_id="s", executor="inline").status == \
        RunStatus.COMPLETED
    for child in ("s-1", "s-2"):  # both forked before either rolls back: each inherits the charge
        raysaga.fork(wf, "s", from_node="ship", store=sqlite_url, new_run_id=child, drive=False)
    SHIP_FAILS[0] = True
    try:
        for child in ("s-1", "s-2"):
            done = raysaga.resume(wf, child, store=sqlite_url, executor="inline")
            assert done.status == RunStatus.COMPENSATED, done.status_reason
    finally:
        SHIP_FAILS[0] = False
    charges, refunds = PROVIDER.effects("charge"), PROVIDER.effects("refund")
    assert len(charges) == 1  # the forks never charged again
    assert len(refunds) == 1 and refunds[0].key == charges[0].key + ":compensate"
    # the second fork finds the key committed by the first: answered from the ledger, never called
    assert [c.duplicate for c in PROVIDER.calls if c.kind == "refund"] == [False]

    # a fork of a compensated run: what its rollback undid is not inherited, it runs again (a new charge)
    fixed = raysaga.fork(wf, "s-1", from_node="ship", store=sqlite_url, new_run_id="s-3", executor="inline")
    assert fixed.status == RunStatus.COMPLETED and fixed.output == {"ship": "shipped"}
    assert len(PROVIDER.effects("charge")) == 2 and len(PROVIDER.effects("refund")) == 1
    store = SqlStore(sqlite_url)
    try:
        assert {n.label: n.origin_run_id for n in store.nodes("s-3")} == {"pay": None, "ship": None}
    finally:
        store.close()


def test_a_wide_fork_copies_every_inherited_row_inside_the_store(store_url: str) -> None:
    """More rows than one copy statement takes: all of them, with their outputs, none re-run."""
    wf = Workflow("wide_fork")
    calls: list[int] = []

    @wf.step()
    def items(input: int) -> list[int]:
        return list(range(input))

    @wf.map("items")
    def square(items: int) -> int:
        calls.append(items)
        return items * items

    @wf.step()
    def total(square: list[int]) -> int:
        return sum(square)

    done = raysaga.run(wf, 1000, store=store_url, run_id="wide", executor="inline")
    assert done.status == RunStatus.COMPLETED
    calls.clear()
    child = raysaga.fork(wf, "wide", from_node="total", store=store_url, new_run_id="wide-c", executor="inline")
    assert child.output == done.output and calls == []
    store = SqlStore(store_url)
    try:
        rows = store.nodes("wide-c")
        assert len([r for r in rows if r.origin_run_id == "wide"]) == 1000 + 2  # items, square and its 1000 items
        assert {r.output for r in rows if r.node_id == "square" and r.fan_index == 999} == {999 * 999}
    finally:
        store.close()


def test_an_unreachable_cluster_leaves_no_pending_fork(sqlite_url: str) -> None:
    with FakeServices() as services:
        raysaga.run(order_example.wf, order_example.sample_input(services.url), store=sqlite_url, run_id="u",
                    executor="inline")
    with pytest.raises(raysaga.RaySagaError):
        raysaga.fork(order_example.wf, "u", from_node="ship", store=sqlite_url, executor="ray",
                     address="127.0.0.1:9")
    store = SqlStore(sqlite_url)
    try:
        assert store.children("u") == []
    finally:
        store.close()
