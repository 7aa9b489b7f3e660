"""Code changed under runs in flight (stop 42 deploys review).

What was wrong:
- A resume under code declaring a type a completed step's stored output does not fit was not
  refused: the reader failed for good and the run rolled back an approved order. Now the restore
  checks the stored outputs against the types declared now (``machine.type_fit``). Adding an
  ``input`` parameter to a step, an agent's tool contracts (its tools' keys, effects, undos,
  approvals) and a fan-out policy's threshold were not hashed.
- A committed effect call of an agent tool the new code no longer has was skipped by a rollback
  without a word: the charge stood and the run ended ``failed``.
- ``retry`` under another definition reopened the run (``running``, no driver) before the refusal;
  ``cancel --compensate`` queued its signal before it; the CLI ``retry``/``cancel`` had no
  ``--allow-changed``.
- A renamed workflow was described as "the compensations registered changed", and once allowed
  the run kept the old name (no worker of the new code claimed it); it kept the old version and
  module ref too.
- A waiting approval the new code removed stayed ``waiting`` for ever (offered in the inbox).
- Removing a completed effect step, or its compensation, under ``--allow-changed`` left its charge
  standing on rollback with nothing said.

Each test uses a real SQLite file and the inline executor. The hash scheme changes keep the hash of
a workflow using none of the new fields, and a run recorded under the earlier scheme's hash of the
same code resumes (and is pinned to the current hash).
"""

from __future__ import annotations

import importlib
import sys
import textwrap
from pathlib import Path
from typing import Annotated, Any

import pytest
from pydantic import AfterValidator, BaseModel
from sqlalchemy import create_engine, update

import raysaga
from raysaga import Permanent, RetryPolicy, RunOptions, StepContext, Transient, Workflow
from raysaga.agents import Agent, ScriptedModel, text_reply, tool, tool_reply
from raysaga.errors import DefinitionChangedError
from raysaga.orchestrator import versions
from raysaga.state import NodeStatus, RunStatus, SqlStore
from raysaga.state.schema import runs
from tests.support.cli import invoke


class Quote(BaseModel):
    cents: int


def _store(tmp_path: Path) -> str:
    return f"sqlite:///{tmp_path / 's.db'}"


def _priced(read_as: Any) -> Workflow:
    wf = Workflow("priced")

    @wf.step()
    def quote() -> int:
        return 500

    @wf.approval()
    def ok(quote: int) -> str:
        return "go?"

    def charge(quote: int, ok: raysaga.Approval) -> Any:
        return quote

    charge.__annotations__ = {"quote": read_as, "ok": raysaga.Approval, "return": Any}  # what the deploy reads
    wf.step()(charge)
    return wf


def test_a_type_the_stored_output_does_not_fit_is_refused_naming_the_steps(tmp_path: Path) -> None:
    url = _store(tmp_path)
    run = raysaga.run(_priced(int), None, store=url, run_id="t", executor="inline",
                      options=RunOptions(release_after=0))
    assert run.status == RunStatus.WAITING_HUMAN
    raysaga.Client(url).approve("t", "ok", by="ada")
    with pytest.raises(DefinitionChangedError, match="step 'charge' cannot read the stored output of step 'quote'"):
        raysaga.resume(_priced(Quote), "t", store=url, executor="inline", options=RunOptions(allow_changed=True))
    store = SqlStore(url)
    try:
        run = store.get_run("t")
        assert run.status == RunStatus.WAITING_HUMAN and run.lease_owner is None
        assert [n.node_id for n in store.nodes("t") if n.status == NodeStatus.FAILED] == []
    finally:
        store.close()
    # a type the stored output still fits (int -> float) is no change: the run goes on
    done = raysaga.resume(_priced(float), "t", store=url, executor="inline")
    assert done.status == RunStatus.COMPLETED and done.output == {"charge": 500.0}


def test_a_reader_of_the_wrong_type_under_the_run_s_own_code_fails_as_uninterrupted(tmp_path: Path) -> None:
    """The type check is for a resume under other types only: under the run's own code, a step
    that cannot read its input fails for good after a rest as it does without one (invariant 1),
    where a check on every restore refused the resume as a definition change, for ever."""
    url = _store(tmp_path)
    straight = raysaga.run(_priced(Quote), None, store=url, run_id="straight", executor="inline")
    assert straight.status == RunStatus.WAITING_HUMAN
    raysaga.Client(url).approve("straight", "ok", by="ada")
    resumed = raysaga.resume(_priced(Quote), "straight", store=url, executor="inline")
    assert resumed.status == RunStatus.FAILED, (resumed.status, resumed.status_reason)
    assert "cannot read the output of step 'quote' as Quote" in (resumed.status_reason or ""), resumed.status_reason


def _plain(with_input: bool) -> Workflow:
    wf = Workflow("plain")
    if with_input:
        @wf.step()
        def a(input: Any) -> Any:
            return input
    else:
        @wf.step()
        def a() -> Any:  # type: ignore[misc]
            return 1

    @wf.step()
    def b(a: Any) -> Any:
        return a
    return wf


def test_new_fields_are_hashed_only_when_used_and_the_earlier_scheme_is_recognised() -> None:
    untouched = _plain(False)  # no input, no types: its hash is the earlier scheme's
    assert versions.legacy_hash(untouched) == untouched.definition_hash
    used = _plain(True)
    assert versions.legacy_hash(used) != used.definition_hash
    changed = versions.step_hashes(used)
    assert changed["b"] == versions.step_hashes(untouched)["b"] and changed["a"] != versions.step_hashes(untouched)["a"]


def test_a_run_recorded_under_the_earlier_hash_scheme_resumes_and_is_repinned(tmp_path: Path) -> None:
    url = _store(tmp_path)
    wf = _plain(True)
    raysaga.create_run(wf, 3, store=url, run_id="old")
    legacy_steps = {name: versions._step_hashes(wf, legacy=True)[name] for name in wf.steps}
    engine = create_engine(url)
    with engine.begin() as conn:  # as an earlier raysaga recorded it
        conn.execute(update(runs).where(runs.c.run_id == "old").values(
            definition_hash=versions.legacy_hash(wf), step_hashes=legacy_steps))
    engine.dispose()
    done = raysaga.resume(wf, "old", store=url, executor="inline")
    assert done.status == RunStatus.COMPLETED and done.output == {"b": 3}
    assert done.definition_hash == wf.definition_hash and done.step_hashes == versions.step_hashes(wf)


def test_a_step_gaining_the_input_is_a_change_not_an_upgrade(tmp_path: Path) -> None:
    """The scheme-1 hash of the new code equals the (scheme-2) hash the run recorded: the run's
    scheme mark tells them apart."""
    url = _store(tmp_path)
    raysaga.create_run(_plain(False), None, store=url, run_id="r")
    assert versions.legacy_hash(_plain(True)) == _plain(False).definition_hash
    with pytest.raises(DefinitionChangedError, match="steps changed: a;"):
        raysaga.resume(_plain(True), "r", store=url, executor="inline")


def _buyer(tools: str) -> Workflow:
    def refund(ctx: StepContext, output: str, card: str) -> None:
        return None

    def charge(card: str) -> str:
        """Charge the card."""
        return "ch-9"

    charge_tool = tool(effect=True, compensate=None if tools == "no-undo" else refund)(charge)

    @tool
    def lookup(q: str) -> str:
        return "x"

    model = ScriptedModel(default=(tool_reply(("charge", {"card": "4242"})), text_reply("done")))
    wf = Workflow("buyer")

    @wf.agent(Agent("buyer", model, tools=(lookup,) if tools == "lookup" else (charge_tool, lookup)))
    def buy(input: Any) -> str:
        return "buy"

    @wf.approval()
    def ok(buy: str) -> str:
        return "ship?"

    @wf.step()
    def ship(ok: raysaga.Approval) -> str:
        return "shipped"
    return wf


def test_a_tool_that_lost_its_undo_names_the_charge_a_rollback_leaves_standing(tmp_path: Path) -> None:
    """A tool kept under its name but without ``compensate=`` now: the refusal (and, allowed, the
    ``definition_changed`` event) names the committed call a rollback will not undo."""
    url = _store(tmp_path)
    first = raysaga.run(_buyer("both"), {}, store=url, run_id="b", executor="inline",
                        options=RunOptions(release_after=0))
    assert first.status == RunStatus.WAITING_HUMAN
    with pytest.raises(DefinitionChangedError, match=r"completed effects that will not be compensated: buy@0\.0"):
        raysaga.resume(_buyer("no-undo"), "b", store=url, executor="inline")


def test_a_rollback_parks_on_a_committed_tool_call_whose_tool_is_gone(tmp_path: Path) -> None:
    url = _store(tmp_path)
    first = raysaga.run(_buyer("both"), {}, store=url, run_id="b", executor="inline",
                        options=RunOptions(release_after=0))
    assert first.status == RunStatus.WAITING_HUMAN
    with pytest.raises(DefinitionChangedError, match="steps changed: buy"):  # the tool contracts are hashed
        raysaga.resume(_buyer("lookup"), "b", store=url, executor="inline")
    raysaga.Client(url).reject("b", "ok", by="ada", comment="no")
    done = raysaga.resume(_buyer("lookup"), "b", store=url, executor="inline",
                          options=RunOptions(allow_changed=True))
    assert done.status == RunStatus.COMPENSATION_FAILED, (done.status, done.status_reason)
    assert "buy@0.0" in str(done.error) and "no longer has a tool 'charge'" in str(done.error)
    assert "`raysaga retry b --compensations`" in str(done.error)  # the run named, not RUN


def _two(v2: bool) -> Workflow:
    wf = Workflow("two", version="2" if v2 else "1")

    @wf.step()
    def a() -> int:
        return 1

    @wf.step()
    def b(a: int) -> int:
        if not v2:
            raise raysaga.Permanent("flaky")
        return a + 1

    if v2:
        @wf.step()
        def c(b: int) -> int:
            return b
    return wf


def test_a_refused_retry_leaves_the_run_failed_and_the_cli_retry_allows_the_change(tmp_path: Path) -> None:
    url = _store(tmp_path)
    assert raysaga.run(_two(False), None, store=url, run_id="r", executor="inline").status == RunStatus.FAILED
    with pytest.raises(DefinitionChangedError, match="steps added: c"):
        raysaga.retry(_two(True), "r", store=url, executor="inline")
    store = SqlStore(url)
    try:
        run = store.get_run("r")
        assert run.status == RunStatus.FAILED and run.lease_owner is None
    finally:
        store.close()
    done = raysaga.retry(_two(True), "r", store=url, executor="inline", options=RunOptions(allow_changed=True))
    assert done.status == RunStatus.COMPLETED and done.workflow_version == "2"


def test_the_cli_retry_takes_allow_changed(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    (tmp_path / "stop42_two.py").write_text(textwrap.dedent('''
        import os
        import raysaga
        from raysaga import Workflow
        V2 = os.environ.get("STOP42_V2") == "1"
        wf = Workflow("two")

        @wf.step()
        def a() -> int:
            if not V2:
                raise raysaga.Permanent("flaky")
            return 1

        if V2:
            @wf.step()
            def b(a: int) -> int:
                return a
    '''))
    monkeypatch.syspath_prepend(str(tmp_path))
    url = _store(tmp_path)
    code, out, err = invoke("run", "stop42_two:wf", "--db", url, "--run-id", "r", "--executor", "inline", "-q")
    assert code == 1, (out, err)
    monkeypatch.setenv("STOP42_V2", "1")
    sys.modules.pop("stop42_two", None)
    code, out, err = invoke("retry", "r", "--db", url, "--executor", "inline", "-q")
    assert code != 0 and "steps added: b" in err, (out, err)
    store = SqlStore(url)
    try:
        assert store.get_run("r").status == RunStatus.FAILED
    finally:
        store.close()
    sys.modules.pop("stop42_two", None)
    code, out, err = invoke("retry", "r", "--db", url, "--executor", "inline", "-q", "--allow-changed")
    assert code == 0, (out, err)


def _gated(v2: bool, name: str = "gated") -> Workflow:
    wf = Workflow(name)

    @wf.step(effect=True)
    def charge(ctx: StepContext) -> str:
        return "ch"

    if not v2:
        @wf.compensation("charge")
        def refund(ctx: StepContext, output: str) -> None:
            return None

    @wf.approval()
    def ok(charge: str) -> str:
        return "go?"

    @wf.step()
    def ship(ok: raysaga.Approval) -> str:
        return "shipped"
    return wf


def test_a_refused_compensating_cancel_queues_nothing(tmp_path: Path) -> None:
    url = _store(tmp_path)
    raysaga.run(_gated(False), None, store=url, run_id="g", executor="inline", options=RunOptions(release_after=0))
    with pytest.raises(DefinitionChangedError, match="completed effects that will not be compensated: charge"):
        raysaga.cancel("g", store=url, compensate=True, workflow=_gated(True), executor="inline")
    store = SqlStore(url)
    try:
        assert store.get_run("g").status == RunStatus.WAITING_HUMAN
        assert store.pending_signals("g") == []
    finally:
        store.close()


def test_a_renamed_workflow_is_described_and_repinned_by_name(tmp_path: Path) -> None:
    url = _store(tmp_path)
    raysaga.run(_gated(False), None, store=url, run_id="n", executor="inline", options=RunOptions(release_after=0))
    renamed = _gated(False, name="gated_v2")
    with pytest.raises(DefinitionChangedError, match="workflow renamed gated -> gated_v2"):
        raysaga.resume(renamed, "n", store=url, executor="inline")
    run = raysaga.resume(renamed, "n", store=url, executor="inline",
                         options=RunOptions(allow_changed=True, release_after=0))
    assert run.workflow_name == "gated_v2" and versions.definition_known(run, renamed)


def test_allowed_change_records_the_new_version_and_module(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    (tmp_path / "stop42_moved.py").write_text(textwrap.dedent('''
        import raysaga
        from raysaga import Workflow
        flow = Workflow("moved", version="2")

        @flow.step()
        def a() -> int:
            return 1
    '''))
    monkeypatch.syspath_prepend(str(tmp_path))
    url = _store(tmp_path)
    old = Workflow("moved", version="1")

    @old.approval()
    def wait() -> str:
        return "go?"

    raysaga.run(old, None, store=url, run_id="m", executor="inline", options=RunOptions(release_after=0))
    moved = importlib.import_module("stop42_moved").flow
    done = raysaga.resume(moved, "m", store=url, executor="inline", options=RunOptions(allow_changed=True))
    assert done.status == RunStatus.COMPLETED
    assert (done.workflow_version, done.workflow_ref) == ("2", "stop42_moved:flow")


def _waiting(v2: bool) -> Workflow:
    wf = Workflow("waiting")

    @wf.step()
    def a() -> int:
        return 1

    if not v2:
        @wf.approval()
        def ok(a: int) -> str:
            return "go?"

        @wf.step()
        def b(a: int, ok: raysaga.Approval) -> int:
            return a + 1
    else:
        @wf.step()
        def b(a: int) -> int:  # type: ignore[misc]
            return a + 1
    return wf


def test_a_removed_waiting_approval_is_closed_with_the_repin(tmp_path: Path) -> None:
    url = _store(tmp_path)
    raysaga.run(_waiting(False), None, store=url, run_id="w", executor="inline", options=RunOptions(release_after=0))
    done = raysaga.resume(_waiting(True), "w", store=url, executor="inline", options=RunOptions(allow_changed=True))
    assert done.status == RunStatus.COMPLETED
    store = SqlStore(url)
    try:
        [ok] = [n for n in store.nodes("w") if n.node_id == "ok"]
        assert ok.status == NodeStatus.CANCELLED and ok.error == {"reason": "step removed by a definition change"}
        [event] = [e.data for e in store.events("w") if e.kind == "definition_changed"]
        assert event["closed"] == ["ok"] and event["removed"] == ["ok"]
    finally:
        store.close()
    assert raysaga.Client(url).inbox() == []


def _fanned(read_as: Any) -> Workflow:
    wf = Workflow("fanned")

    @wf.step()
    def items() -> list[int]:
        return [1, 2]

    @wf.map("items")
    def double(items: int) -> int:
        return items * 2

    @wf.approval()
    def ok(double: list[int]) -> str:
        return "go?"

    def total(double: list[int], ok: raysaga.Approval) -> Any:
        return len(double)

    total.__annotations__ = {"double": read_as, "ok": raysaga.Approval, "return": Any}
    wf.step()(total)
    return wf


def test_a_fan_out_whose_items_no_longer_fit_their_reader_is_refused(tmp_path: Path) -> None:
    url = _store(tmp_path)
    raysaga.run(_fanned(list[int]), None, store=url, run_id="f", executor="inline",
                options=RunOptions(release_after=0))
    raysaga.Client(url).approve("f", "ok", by="ada")
    with pytest.raises(DefinitionChangedError, match="step 'total' cannot read the stored output of step 'double'"):
        raysaga.resume(_fanned(list[Quote]), "f", store=url, executor="inline")
    done = raysaga.resume(_fanned(list[float]), "f", store=url, executor="inline")
    assert done.status == RunStatus.COMPLETED and done.output == {"total": 2}


# ---------------------------------------------------------------- a second review of these fixes

BOOK: dict[str, str] = {}  # the provider's book: key -> what it charged (it dedupes by key)


def _billing(priced: bool, effect_name: str = "pay") -> Workflow:
    wf = Workflow("billing42")

    @wf.step(critical=False, on_failure="pass")
    def amount() -> int:
        if not priced:
            raise Permanent("the pricing service is down")
        return 30

    @wf.step(effect=True, effect_name=effect_name, retry=RetryPolicy(max_attempts=1))
    def charge(ctx: StepContext, amount: Any) -> str:
        cents = amount if isinstance(amount, int) else 0  # no price: the minimum
        key = ctx.idempotency_key
        assert key is not None  # (an effect's)
        if key not in BOOK:
            BOOK[key] = f"charged {cents}"
            if cents == 0:
                raise Transient("a gateway timeout after the charge")  # it took effect; the reply was lost
        return BOOK[key]

    return wf


def test_an_operator_retry_under_the_same_code_calls_with_its_own_key(tmp_path: Path) -> None:
    """Under the code a run started with, a key that differs from the one in doubt means other
    arguments: the call is another effect. The in-doubt key was reused (the provider answered the
    first charge of 0, and the 30 was never charged)."""
    BOOK.clear()
    url = _store(tmp_path)
    assert raysaga.run(_billing(False), None, store=url, run_id="r", executor="inline").status == RunStatus.FAILED
    done = raysaga.retry(_billing(True), "r", store=url, executor="inline")
    assert done.status == RunStatus.COMPLETED and done.output == {"charge": "charged 30"}, done.output
    assert sorted(BOOK.values()) == ["charged 0", "charged 30"]


def test_an_effect_renamed_while_its_attempt_is_in_doubt_keeps_its_key(tmp_path: Path) -> None:
    """The in-doubt attempt is found by its node, whatever its effect is named now: a deploy
    renaming the effect (allowed) charged twice."""
    BOOK.clear()
    url = _store(tmp_path)
    assert raysaga.run(_billing(False), None, store=url, run_id="r", executor="inline").status == RunStatus.FAILED
    with pytest.raises(DefinitionChangedError, match="steps changed: charge"):
        raysaga.retry(_billing(False, "payment"), "r", store=url, executor="inline")
    done = raysaga.retry(_billing(False, "payment"), "r", store=url, executor="inline",
                         options=RunOptions(allow_changed=True))
    assert done.status == RunStatus.COMPLETED, (done.status, done.status_reason)
    assert list(BOOK.values()) == ["charged 0"], BOOK  # one charge: the same key went out again


def test_a_worker_claims_its_code_s_runs_an_earlier_raysaga_recorded_and_no_other_code_s(tmp_path: Path) -> None:
    """Runs recorded under the earlier hash scheme of a worker's code are claimed (the driver repins
    them); a scheme-2 run of other code whose hash equals that earlier-scheme hash is not."""
    url = _store(tmp_path)
    new = _plain(True)  # reads the input: its scheme-1 hash is the scheme-2 hash of _plain(False)
    raysaga.create_run(new, 3, store=url, run_id="old")
    raysaga.create_run(_plain(False), None, store=url, run_id="other")
    legacy_steps = {name: versions._step_hashes(new, legacy=True)[name] for name in new.steps}
    engine = create_engine(url)
    with engine.begin() as conn:  # "old" as an earlier raysaga recorded it, and both queued for workers
        conn.execute(update(runs).where(runs.c.run_id == "old").values(
            definition_hash=versions.legacy_hash(new), step_hashes=legacy_steps))
        conn.execute(update(runs).values(queue="default"))
    engine.dispose()
    store = SqlStore(url)
    try:
        digests = {new.name: (new.definition_hash, versions.legacy_hash(new))}
        first = store.claim_next("worker-42", 30, digests)
        assert first is not None and first.lease.run_id == "old"
        assert store.claim_next("worker-42", 30, digests) is None  # "other" is not this code's
        assert versions.definition_known(store.get_run("old"), new)
        assert not versions.definition_known(store.get_run("other"), new)
    finally:
        store.close()


def _stripped_undo() -> Workflow:
    def strip(value: str) -> str:  # a new function object (another address) each time
        return value.strip()

    def release(ctx: StepContext, output: str) -> None:
        return None

    # evaluated, as in a module without ``from __future__ import annotations``: the validator's
    # repr (its address) is in the annotation
    release.__annotations__ = {"ctx": StepContext, "output": Annotated[str, AfterValidator(strip)], "return": None}

    wf = Workflow("stripped42")
    wf.step(compensate=release)(_hold)
    return wf


def _hold() -> str:
    return " held "


def test_the_types_digest_is_the_same_for_the_same_code_in_another_process() -> None:
    """A validator's repr holds its address: every resume took the types for changed and checked
    (and could refuse) the stored outputs of a run under its own code."""
    assert versions.types_digest(_stripped_undo()) == versions.types_digest(_stripped_undo())
