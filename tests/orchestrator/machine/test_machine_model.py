"""The run machine on its own, driven by hypothesis: no Ray, no database, no threads.

Random workflows (``model_world.cases``: steps, effects, fan-outs with every policy,
compensations, non-critical steps, an agent with scripted turns calling tools) are driven by a
test shell (``shell.MachineShell``, the driver's loop with a fake clock) whose executor is a
``FateWorld``: each attempt's outcome is decided by the test. Hypothesis picks the completion
orders, the failures, the crashes (drop the machine and everything uncommitted, restore from the
writes so far) and the operator's cancel signals. Checked:

1. resume equals uninterrupted: with the same fates and the same completion priorities, a run
   with crashes ends like the run without (status, reason, output, error, the nodes that
   completed and their outputs, the failed and skipped ones, the ledger, the tokens);
2. an effect's key is handed out again only while its ledger row is 'pending' (the shell checks
   every dispatch against the durable ledger: never after 'committed', never before 'pending' is
   durable), and an effect node never gets a fresh key while an earlier one may have taken effect;
3. compensations go latest first, downstream before upstream, only for nodes that completed or
   may have, and every node the world saw take effect is compensated when the run rolls back;
4. once a batch puts the run at rest (completed, compensated, cancelled, failed,
   compensation_failed, paused), the machine writes, sends and asks nothing more.

The ``test_oracle_bites_*`` tests break the machine on purpose (monkeypatched, in the test only)
and check that each checker notices. The ``test_found_*`` tests are bugs these properties found,
each reduced to a minimal example and fixed; they stay as regression tests.

The properties run in ~10 s (300 examples each); the ``slow`` variants (``RAYSAGA_FULL_SWEEP=1``)
run 2,000 examples of larger workflows (~1 min); ``RAYSAGA_MODEL_EXAMPLES=N`` sets the count (and
skips the example database) for a longer hunt.
"""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Sequence
from typing import Any

import pytest
from hypothesis import HealthCheck, event, given, note, settings
from hypothesis import strategies as st

from raysaga.node_key import NodeKey
from raysaga.orchestrator import keys
from raysaga.orchestrator.machine.calls import Attempt, Calls
from raysaga.orchestrator.machine.doubt import InDoubt
from raysaga.orchestrator.machine.forward import Forward
from raysaga.orchestrator.machine.run import RunMachine
from raysaga.sagas import rollback as sagas_rollback
from raysaga.sagas.plan import RollbackPlan
from raysaga.state import Batch, NodeStatus, NodeWrite, RunRecord, RunStatus, RunUpdate, jsoncodec
from tests.orchestrator.machine.memory_run import MemoryRun
from tests.orchestrator.machine.model_world import (
    AGENT,
    TURN_TOKENS,
    Fate,
    FateWorld,
    Plan,
    StepPlan,
    build_workflow,
    cases,
    drained_items,
    human,
    new_fold,
    projection,
)
from tests.orchestrator.machine.shell import InvariantViolation, MachineShell

# ---------------------------------------------------------------------- schedules


class PrioritySchedule:
    """The attempt in flight with the lowest priority (a salted hash of its node) finishes next,
    one at a time; crashes at given commit numbers; at most one cancel signal.

    The order depends on the nodes only, so a run restored after a crash, which has the same
    nodes in flight as the run that did not crash had at that commit, goes on in the same order.
    The signal is sent once a step's (or item's) attempt is committed completed and at least ``threshold``
    forward nodes are durable as completed; that set of nodes is kept (``wanted``), and a
    schedule given it sends the signal at the first such moment where all of them are durable:
    the same point of a run that follows the same order with crashes. (A durable count alone is
    not: a restored run commits in other groups; nor is any commit: the run that did not crash
    goes on to a completion before it looks at signals again, the restored one does not; nor is
    any commit of what finished: a transient failure the run without crashes retried may never
    happen in the run with them, whose crash used that attempt up.)"""

    def __init__(self, salt: int, *, crashes: dict[int, str] | None = None, overlap: bool = False,
                 signal: tuple[int, bool] | None = None, wanted: frozenset[str] | None = None) -> None:
        self.salt = salt
        self.crashes = crashes or {}
        self._overlap = overlap
        self.signal = signal
        self.wanted = wanted
        self.signalled = False

    def pick(self, inflight: Sequence[NodeKey], now: float, timer: float | None) -> list[NodeKey]:
        return [min(inflight, key=lambda k: jsoncodec.fingerprint([self.salt, k.label]))]

    def crash(self, when: str, commit_no: int, batch: Batch) -> bool:
        return self.crashes.get(commit_no) == when

    def overlap(self) -> bool:
        return self._overlap

    def signals(self, moment: str, fold: MemoryRun, now: float) -> list[dict[str, Any]]:
        if self.signal is None or self.signalled or moment != "completed" or fold.run.status != RunStatus.RUNNING:
            return []
        threshold, compensate = self.signal
        done = forward_done(fold)
        if self.wanted is None and len(done) >= threshold:
            self.wanted = frozenset(done)
        if self.wanted is None or not self.wanted <= done:
            return []
        self.signalled = True
        return [{"reason": "operator", "compensate": compensate}]


def forward_done(fold: MemoryRun) -> set[str]:
    """The steps and items durable as completed (not model turns, tool calls or compensations)."""
    drained = drained_items(fold)
    return {r.label for r in fold.nodes.values() if r.status == NodeStatus.COMPLETED
            and not NodeKey.parse(r.node_id).compensates and NodeKey.parse(r.node_id).turn is None
            and (r.node_id, r.fan_index) not in drained}


class RandomSchedule:
    """Everything drawn by hypothesis as the run goes: which attempts finish together (or that
    time passes), whether new attempts overlap a commit, crashes before or after any commit, and
    cancel signals (with or without compensation) at any moment, while the run waits too. (Each
    rare event is the largest draw, so a failing example shrinks towards fewer of them.)"""

    def __init__(self, data: st.DataObject, *, max_crashes: int = 3, max_signals: int = 1) -> None:
        self.data = data
        self.crashes_left = max_crashes
        self.signals_left = max_signals if data.draw(st.integers(0, 2), label="signals?") == 2 else 0

    def pick(self, inflight: Sequence[NodeKey], now: float, timer: float | None) -> list[NodeKey]:
        if self.data.draw(st.integers(0, 7), label="tick") == 7:
            return []
        indexes = self.data.draw(st.lists(st.integers(0, len(inflight) - 1), min_size=1,
                                          max_size=min(3, len(inflight)), unique=True), label="finish")
        return [inflight[i] for i in indexes]

    def crash(self, when: str, commit_no: int, batch: Batch) -> bool:
        if self.crashes_left and self.data.draw(st.integers(0, 15), label=f"crash {when} {commit_no}") == 15:
            self.crashes_left -= 1
            return True
        return False

    def overlap(self) -> bool:
        return self.data.draw(st.booleans(), label="overlap")

    def signals(self, moment: str, fold: MemoryRun, now: float) -> list[dict[str, Any]]:
        if self.signals_left and self.data.draw(st.integers(0, 30), label=f"signal {moment}") == 30:
            self.signals_left -= 1
            return [{"reason": "operator", "compensate": self.data.draw(st.booleans(), label="compensate")}]
        return []


# ---------------------------------------------------------------------- running a plan


def drive(plan: Plan, world: FateWorld, schedule: Any) -> tuple[RunRecord, MachineShell]:
    """Run ``plan`` to rest."""
    wf = build_workflow(plan)
    shell = MachineShell(wf, new_fold(wf, plan), world, schedule, decide=human(plan))
    record = shell.run()
    return record, shell


def check_resume_equals_uninterrupted(plan: Plan, data: st.DataObject) -> None:
    note(plan.describe())
    world = FateWorld(plan, data.draw)
    salt = data.draw(st.integers(0, 2**16), label="salt")
    overlap = data.draw(st.booleans(), label="overlap")
    signal = data.draw(st.none() | st.tuples(st.integers(0, 6), st.booleans()), label="signal")
    first = PrioritySchedule(salt, overlap=overlap, signal=signal)
    _, reference = drive(plan, world, first)
    crashes = data.draw(st.dictionaries(st.integers(1, reference.commit_no), st.sampled_from(["before", "after"]),
                                        min_size=1, max_size=3), label="crashes")
    _, crashed = drive(plan, world, PrioritySchedule(salt, crashes=crashes, overlap=overlap, signal=signal,
                                                     wanted=first.wanted))
    note(f"fates: {world.fates}")
    note(f"reference dispatched: {[label for _, label, _ in reference.journal.dispatched]}")
    note(f"crashed ({crashed.journal.crashes} crashes) dispatched: {crashed.journal.dispatched}")
    describe_run("reference", reference)
    describe_run("crashed", crashed)
    compare_runs(reference, crashed)
    check_nothing_left_running(reference, "reference")
    check_nothing_left_running(crashed, "crashed")


def compare_runs(reference: MachineShell, crashed: MachineShell) -> None:
    """Invariant 1: the crashed run ends as the reference did (``projection``)."""
    expected, got = projection(reference.fold), projection(crashed.fold)
    for part in expected:
        assert got[part] == expected[part], f"{part} differs after {crashed.journal.crashes} crash(es)"


#: Run states after which nothing of the run is under way any more.
FINISHED = (RunStatus.COMPLETED, RunStatus.FAILED, RunStatus.CANCELLED, RunStatus.COMPENSATED,
            RunStatus.COMPENSATION_FAILED)


def check_nothing_left_running(shell: MachineShell, name: str = "run") -> None:
    """A finished run shows no forward node as 'running': an attempt it stopped says 'cancelled'
    (or what it ended with). A row left 'running' would show in ``raysaga status`` and the
    dashboard as under way, for ever, on a run that is over."""
    if shell.fold.run.status not in FINISHED:
        return
    running = sorted(r.label for r in shell.fold.nodes.values()
                     if r.status == NodeStatus.RUNNING and not NodeKey.parse(r.node_id).compensates)
    assert not running, f"{name}: run ended {shell.fold.run.status.value} with {running} still 'running'"


def describe_run(name: str, shell: MachineShell) -> None:
    """Statistics (``pytest --hypothesis-show-statistics``): what the examples exercised."""
    journal = shell.journal
    event(f"{name}: ends {shell.fold.run.status.value}")
    event(f"{name}: crashes={min(journal.crashes, 3)}")
    event(f"{name}: compensations sent={min(len(journal.compensations), 3)}")
    labels = [label for _, label, _ in journal.dispatched]
    event(f"{name}: agent turns sent={min(sum(1 for label in labels if '@' in label and '.' not in label), 4)}")
    event(f"{name}: effect keys re-sent={any(n > 1 for n in _counts(journal.dispatched).values())}")


def _counts(dispatched: list[tuple[int, str, str | None]]) -> dict[str, int]:
    counts: dict[str, int] = {}
    for _, _, key in dispatched:
        if key is not None:
            counts[key] = counts.get(key, 0) + 1
    return counts


# ---------------------------------------------------------------------- the properties

#: ``RAYSAGA_MODEL_EXAMPLES=N`` runs N examples of each property (a longer hunt).
EXAMPLES = int(os.environ.get("RAYSAGA_MODEL_EXAMPLES", "0"))
_HUNT: dict[str, Any] = {"database": None} if EXAMPLES else {}  # a hunt does not replay saved examples
FAST = settings(max_examples=EXAMPLES or 300, deadline=None, suppress_health_check=[HealthCheck.too_slow], **_HUNT)
FULL = settings(max_examples=EXAMPLES or 2000, deadline=None, suppress_health_check=[HealthCheck.too_slow], **_HUNT)
#: The slow variants run with ``RAYSAGA_FULL_SWEEP=1`` (as the crash sweeps do) or in a hunt.
SWEEP = os.environ.get("RAYSAGA_FULL_SWEEP") == "1" or bool(EXAMPLES)
slow = pytest.mark.skipif(not SWEEP, reason="the larger sweep runs with RAYSAGA_FULL_SWEEP=1")


@FAST
@given(cases(), st.data())
def test_resume_equals_uninterrupted(plan: Plan, data: st.DataObject) -> None:
    check_resume_equals_uninterrupted(plan, data)


@FAST
@given(cases(backoff=True), st.data())
def test_random_interleavings_keep_the_invariants(plan: Plan, data: st.DataObject) -> None:
    note(plan.describe())
    world = FateWorld(plan, data.draw)
    record, shell = drive(plan, world, RandomSchedule(data))
    note(f"fates: {world.fates}")
    note(f"dispatched: {shell.journal.dispatched}")
    describe_run("random", shell)
    check_nothing_left_running(shell)
    assert record.status in (RunStatus.COMPLETED, RunStatus.COMPENSATED, RunStatus.COMPENSATION_FAILED,
                             RunStatus.FAILED, RunStatus.CANCELLED, RunStatus.PAUSED)


@pytest.mark.slow
@slow
@FULL
@given(cases(max_steps=7), st.data())
def test_resume_equals_uninterrupted_full(plan: Plan, data: st.DataObject) -> None:
    check_resume_equals_uninterrupted(plan, data)


@pytest.mark.slow
@slow
@FULL
@given(cases(max_steps=7, backoff=True), st.data())
def test_random_interleavings_keep_the_invariants_full(plan: Plan, data: st.DataObject) -> None:
    world = FateWorld(plan, data.draw)
    _, shell = drive(plan, world, RandomSchedule(data, max_crashes=5, max_signals=2))
    check_nothing_left_running(shell)


# ---------------------------------------------------------------------- fixed examples

class Scripted(PrioritySchedule):
    """Priority order, plus crashes where ``crash_when(when, batch, fold)`` says (once each), and
    cancel signals when ``signal_when(moment, fold)`` gives a payload (once)."""

    def __init__(self, *, crash_when: Any = None, signal_when: Any = None, max_crashes: int = 1) -> None:
        super().__init__(0)
        self.crash_when = crash_when
        self.signal_when = signal_when
        self.crashes_left = max_crashes

    def crash(self, when: str, commit_no: int, batch: Batch) -> bool:
        if self.crashes_left and self.crash_when is not None and self.crash_when(when, batch):
            self.crashes_left -= 1
            return True
        return False

    def signals(self, moment: str, fold: MemoryRun, now: float) -> list[dict[str, Any]]:
        if self.signalled or self.signal_when is None:
            return []
        payload = self.signal_when(moment, fold)
        if payload is None:
            return []
        self.signalled = True
        return [payload]


def fixed_world(plan: Plan, fates: dict[str, Fate]) -> FateWorld:
    """A world whose every fate is given (a missing one is ``ok``)."""
    world = FateWorld(plan, lambda strategy: Fate(0, "ok"))
    world.fates.update(fates)
    return world


def completes(label: str) -> Any:
    """A crash point: after the commit that makes ``label`` durable as completed."""
    def when(moment: str, batch: Batch) -> bool:
        return moment == "after" and any(
            n.status == NodeStatus.COMPLETED and NodeKey.parse(n.node_id, n.fan_index).label == label
            for n in batch.node_writes())
    return when


def rests_or_rolls_back(moment: str, batch: Batch) -> bool:
    return moment == "after" and batch.run is not None and batch.run.status == RunStatus.COMPENSATING


CHAIN = Plan(steps=(StepPlan("s0", effect=True, compensated=True, max_attempts=1),
                    StepPlan("s1", deps=("s0",), compensated=True, max_attempts=1),
                    StepPlan("s2", deps=("s1",), max_attempts=1)), fail_rate=0)
#: s0 and s1 undo in that order (s1 first); s2 fails for good and rolls the run back
FAILING_CHAIN = {"s2": Fate(0, "permanent")}


def test_fixed_chain_rolls_back_in_reverse() -> None:
    record, shell = drive(CHAIN, fixed_world(CHAIN, FAILING_CHAIN), Scripted())
    assert record.status == RunStatus.COMPENSATED
    assert shell.journal.compensations == [("s1", -1), ("s0", -1)]


def test_fixed_chain_resumes_after_every_crash_point() -> None:
    """Every commit of the chain, crashed before and after, ends as the uninterrupted run."""
    world = fixed_world(CHAIN, FAILING_CHAIN)
    _, reference = drive(CHAIN, world, PrioritySchedule(0))
    for n in range(1, reference.commit_no + 1):
        for when in ("before", "after"):
            _, crashed = drive(CHAIN, world, PrioritySchedule(0, crashes={n: when}))
            assert crashed.journal.crashes == 1
            compare_runs(reference, crashed)


# ---------------------------------------------------------------------- the oracles bite
#
# Each breaks the machine on purpose (monkeypatched here, never in its source) and checks that
# the checker notices: an assertion that cannot fail proves nothing.


def test_oracle_bites_a_committed_key_sent_again(monkeypatch: pytest.MonkeyPatch) -> None:
    """A machine that forgets its ledger (and its effects' rows) on restore re-sends a committed key."""
    original = RunMachine.restore

    def forgetful(self: RunMachine, snap: Any, outputs: Any, ledger_blobs: Any) -> None:
        original(self, snap, outputs, ledger_blobs)
        self.calls.ledger.clear()
        for key in [k for k in self.forward.restored if self.wf.steps[k.step].effect]:
            del self.forward.restored[key]
            self.forward.outputs.pop(key, None)

    monkeypatch.setattr(RunMachine, "restore", forgetful)
    plan = dataclasses.replace(CHAIN, steps=CHAIN.steps[:2])
    with pytest.raises(InvariantViolation, match="sent while its durable ledger row is committed"):
        drive(plan, fixed_world(plan, {}), Scripted(crash_when=completes("s0")))


def test_oracle_bites_a_fresh_key_after_a_crash(monkeypatch: pytest.MonkeyPatch) -> None:
    """A machine whose keys are not a function of the effect alone re-sends it under another key."""
    incarnations = iter(range(1_000))
    original = RunMachine.__init__

    def salted(self: RunMachine, *args: Any) -> None:
        original(self, *args)
        salt = str(next(incarnations))
        monkeypatch.setattr("raysaga.orchestrator.machine.forward.effect_key",
                            lambda *parts: keys.effect_key(*parts) + salt)

    monkeypatch.setattr(RunMachine, "__init__", salted)
    # and no in-doubt attempt keeps its recorded key (machine/doubt.py): the oracle faces a machine
    # that sends fresh keys
    monkeypatch.setattr(InDoubt, "key_for", lambda self, node_id, fan_index, effect_name, derived, ledger: derived)

    def while_s0_runs(moment: str, batch: Batch) -> bool:
        return moment == "before" and any(n.node_id == "s0" and n.status == NodeStatus.COMPLETED
                                          for n in batch.node_writes())

    with pytest.raises(InvariantViolation, match="sent with a fresh key"):
        drive(CHAIN, fixed_world(CHAIN, {}), Scripted(crash_when=while_s0_runs))


def test_oracle_bites_an_effect_sent_before_its_pending_row(monkeypatch: pytest.MonkeyPatch) -> None:
    """A shell (or machine) that sends an effect before its 'pending' row is durable is caught."""
    original = MachineShell._send

    def hasty(self: MachineShell, dispatches: list[Any]) -> None:
        pending = self._machine().out.batch.effects
        self._machine().out.batch.effects = []  # the pending rows are held back until after the calls
        try:
            original(self, dispatches)
        finally:
            self._machine().out.batch.effects[:0] = pending

    monkeypatch.setattr(MachineShell, "_send", hasty)
    with pytest.raises(InvariantViolation, match="sent while its durable ledger row is absent"):
        drive(CHAIN, fixed_world(CHAIN, {}), Scripted())


def test_oracle_bites_an_upstream_undo_sent_first(monkeypatch: pytest.MonkeyPatch) -> None:
    """A plan that ignores the DAG undoes s0 while s1 (downstream) is not undone yet."""
    monkeypatch.setattr(RollbackPlan, "_free", lambda self, key: self._blockers[key] == 0)
    with pytest.raises(InvariantViolation, match="must be undone first"):
        drive(CHAIN, fixed_world(CHAIN, FAILING_CHAIN), Scripted())


def test_oracle_bites_undos_not_latest_first(monkeypatch: pytest.MonkeyPatch) -> None:
    """Two independent undos handed out together must go latest-completed first."""
    original = RollbackPlan.ready
    monkeypatch.setattr(RollbackPlan, "ready", lambda self: list(reversed(original(self))))
    plan = Plan(steps=(StepPlan("s0", compensated=True, max_attempts=1),
                       StepPlan("s1", compensated=True, max_attempts=1),
                       StepPlan("s2", deps=("s0", "s1"), max_attempts=1)), fail_rate=0)
    with pytest.raises(InvariantViolation, match="not latest first"):
        drive(plan, fixed_world(plan, {"s2": Fate(0, "permanent")}), Scripted())


def test_oracle_bites_a_skipped_undo(monkeypatch: pytest.MonkeyPatch) -> None:
    """A rollback that leaves out a completed node is caught at the end."""
    original = sagas_rollback.step_targets  # what the machine's rollback module imported
    monkeypatch.setattr("raysaga.orchestrator.machine.rollback.step_targets",
                        lambda rows, undoable: original(rows, undoable)[1:])
    with pytest.raises(InvariantViolation, match=r"not every target is undone|without a rollback"):
        drive(CHAIN, fixed_world(CHAIN, FAILING_CHAIN), Scripted())


def test_oracle_bites_an_undo_of_what_never_happened(monkeypatch: pytest.MonkeyPatch) -> None:
    """Undoing a node that failed for good (it took no effect) is caught."""
    monkeypatch.setattr(sagas_rollback, "effect_time", lambda row: row.finished_at or 0.0)
    with pytest.raises(InvariantViolation, match="neither completed nor may have"):
        drive(CHAIN, fixed_world(CHAIN, {"s1": Fate(0, "permanent")}), Scripted())


TWO = Plan(steps=(StepPlan("s0", max_attempts=1), StepPlan("s1", max_attempts=1)), fail_rate=0)


def cancel_at_once() -> Scripted:
    """A cancel (no compensation) while both steps of ``TWO`` are in flight: one is cancelled."""
    return Scripted(signal_when=lambda moment, fold: {"reason": "stop"} if moment == "waiting" else None)


def test_oracle_bites_cancelled_attempts_kept_in_flight(monkeypatch: pytest.MonkeyPatch) -> None:
    """A machine that keeps cancelled attempts in flight after the run ended is caught."""
    def keep(self: Calls, keys: list[NodeKey], reason: str, *, write: bool = True) -> None:
        self.out.cancel.extend(k for k in keys if k in self.inflight)  # the shell drops them, the machine does not

    monkeypatch.setattr(Calls, "cancel", keep)
    with pytest.raises(InvariantViolation, match="rests cancelled with attempts in flight"):
        drive(TWO, fixed_world(TWO, {}), cancel_at_once())


def test_oracle_bites_a_late_report_recorded_after_the_end(monkeypatch: pytest.MonkeyPatch) -> None:
    """A machine that records a cancelled attempt reporting late writes after the run ended."""
    original = RunMachine.absorb

    def credulous(self: RunMachine, finished: Any, now: float) -> None:
        finished = list(finished)
        for key, _ in finished:
            if key not in self.calls.inflight:
                self.calls.inflight[key] = Attempt(self.wf.steps[key.step], 1, now, True)
        original(self, finished, now)

    monkeypatch.setattr(RunMachine, "absorb", credulous)
    with pytest.raises(InvariantViolation, match="after the run rested cancelled the machine produced writes"):
        drive(TWO, fixed_world(TWO, {}), cancel_at_once())


def test_the_fold_refuses_a_write_to_a_resting_run() -> None:
    """The fold's own guard: no batch reaches a run at rest (short of a resume's transition)."""
    record, shell = drive(TWO, fixed_world(TWO, {}), Scripted())
    assert record.status == RunStatus.COMPLETED
    late = Batch(nodes=[NodeWrite(node_id="s0", status=NodeStatus.FAILED)])
    with pytest.raises(InvariantViolation, match="after the run rested completed"):
        shell.fold.commit(late, shell.now)
    with pytest.raises(InvariantViolation, match="after the run rested completed"):
        shell.fold.commit(Batch(run=RunUpdate(status=RunStatus.RUNNING)), shell.now)


def test_oracle_bites_a_resume_that_differs(monkeypatch: pytest.MonkeyPatch) -> None:
    """A restore that hands a dependent another value than the one committed ends otherwise."""
    original = Forward.restore

    def tampered(self: Forward, row: Any, output: Any) -> None:
        original(self, row, {"tampered": True} if row.node_id == "s0" else output)

    world = fixed_world(CHAIN, {})
    _, reference = drive(CHAIN, world, PrioritySchedule(0))
    monkeypatch.setattr(Forward, "restore", tampered)
    _, crashed = drive(CHAIN, world, Scripted(crash_when=completes("s0")))
    with pytest.raises(AssertionError, match="differs after 1 crash"):
        compare_runs(reference, crashed)


# ---------------------------------------------------------------------- bugs found, fixed (regressions)


def fails(label: str) -> Any:
    """A crash point: after the commit that records ``label`` failed for good."""
    def when(moment: str, batch: Batch) -> bool:
        return moment == "after" and any(
            n.status == NodeStatus.FAILED and NodeKey.parse(n.node_id, n.fan_index).label == label
            for n in batch.node_writes()) and batch.run is None
    return when


def test_found_resume_blames_the_failed_item_not_its_fan_out() -> None:
    """A crash between the commit recording a critical fan-out item's failure and the run's
    transition: the resumed run blames the item, with its own error, as the uninterrupted one
    did (its parent row once said only 'item 0 failed', and the resume blamed the fan-out)."""
    plan = Plan(steps=(StepPlan("s0", items=1), StepPlan("s1", deps=("s0",), map_over="s0", max_attempts=1)),
                fail_rate=0)
    world = fixed_world(plan, {"s1[0]": Fate(0, "permanent")})
    _, reference = drive(plan, world, PrioritySchedule(0))
    assert reference.fold.run.status == RunStatus.FAILED
    assert reference.fold.run.error is not None and reference.fold.run.error["node"] == "s1[0]"
    _, crashed = drive(plan, world, Scripted(crash_when=fails("s1[0]")))
    assert crashed.journal.crashes == 1
    compare_runs(reference, crashed)


def test_found_resumed_rollback_keeps_a_passed_failure() -> None:
    """A rollback resumed after a crash compensates a step that depends on a non-critical
    on_failure='pass' step that failed: the StepFailed record its compensation is given is
    rebuilt from the failed row (it once raised KeyError: a rollback prepares no step)."""
    plan = Plan(steps=(StepPlan("s0", critical=False, on_failure="pass", max_attempts=1),
                       StepPlan("s1", deps=("s0",), compensated=True, max_attempts=1),
                       StepPlan("s2", deps=("s1",), max_attempts=1)), fail_rate=0)
    world = fixed_world(plan, {"s0": Fate(0, "permanent"), "s2": Fate(0, "permanent")})
    record, reference = drive(plan, world, PrioritySchedule(0))
    assert record.status == RunStatus.COMPENSATED
    record, shell = drive(plan, world, Scripted(crash_when=rests_or_rolls_back))
    assert shell.journal.crashes == 1
    assert record.status == RunStatus.COMPENSATED
    compare_runs(reference, shell)


def test_found_resumed_rollback_keeps_a_fan_out_s_passed_failure() -> None:
    """The same for an ALL fan-out that passes its failed item's record on: a rollback resumed
    after a crash compensates its dependent with that record (a fan-out's row is restored as its
    items' list otherwise, and the failed item has no output: KeyError)."""
    plan = Plan(steps=(StepPlan("s0", items=1),
                       StepPlan("s1", deps=("s0",), map_over="s0", critical=False, on_failure="pass",
                                max_attempts=1),
                       StepPlan("s2", deps=("s1",), compensated=True, max_attempts=1),
                       StepPlan("s3", deps=("s2",), max_attempts=1)), fail_rate=0)
    world = fixed_world(plan, {"s1[0]": Fate(0, "permanent"), "s3": Fate(0, "permanent")})
    record, reference = drive(plan, world, PrioritySchedule(0))
    assert record.status == RunStatus.COMPENSATED
    record, shell = drive(plan, world, Scripted(crash_when=rests_or_rolls_back))
    assert shell.journal.crashes == 1
    compare_runs(reference, shell)


def test_found_resume_keeps_a_policy_s_compensate_verdict() -> None:
    """A non-critical fan-out whose policy answers Compensate rolls the run back; a crash right
    after the commit that records the verdict resumes into the same rollback (the row's
    ``verdict`` forces it), not into skipping the step's dependents."""
    plan = Plan(steps=(StepPlan("s0", compensated=True, items=1),
                       StepPlan("s1", deps=("s0",), map_over="s0", policy="retry_round", critical=False,
                                max_attempts=1),
                       StepPlan("s2", deps=("s1",), max_attempts=1)), fail_rate=0)
    world = fixed_world(plan, {"s1[0]": Fate(0, "permanent")})
    record, reference = drive(plan, world, PrioritySchedule(0))
    assert record.status == RunStatus.COMPENSATED

    def verdict_committed(moment: str, batch: Batch) -> bool:
        return moment == "after" and any(n.node_id == "s1" and n.fan_index < 0 and n.status == NodeStatus.FAILED
                                         for n in batch.node_writes())

    record, shell = drive(plan, world, Scripted(crash_when=verdict_committed))
    assert shell.journal.crashes == 1
    compare_runs(reference, shell)


def test_a_compensation_retried_past_1024_attempts_does_not_overflow() -> None:
    plan = Plan(steps=(StepPlan("s0", compensated=True, undo_retry=False, max_attempts=1),
                       StepPlan("s1", deps=("s0",), max_attempts=1)), fail_rate=0)
    world = fixed_world(plan, {"s1": Fate(0, "permanent"), "s0:compensate": Fate(1100, "ok")})
    record, _ = drive(plan, world, Scripted())
    assert record.status == RunStatus.COMPENSATED


def signal_compensate_at_once(moment: str, fold: MemoryRun) -> dict[str, Any] | None:
    return {"reason": "operator", "compensate": True} if moment == "waiting" else None


def crash_before_completion(moment: str, batch: Batch) -> bool:
    return moment == "before" and any(n.status == NodeStatus.COMPLETED for n in batch.node_writes())


ONE_UNDOABLE = Plan(steps=(StepPlan("s0", compensated=True, max_attempts=1),), fail_rate=0)


def test_found_compensated_step_is_undone_after_a_kill_before_its_result() -> None:
    """A compensated step (no effect) is sent, the process dies before its result is durable,
    and a cancel-and-compensate signal is pending: the resumed rollback knows the step may have
    run (its 'running' row was committed before the call, as the driver does) and undoes it."""
    schedule = Scripted(crash_when=crash_before_completion, signal_when=signal_compensate_at_once)
    record, shell = drive(ONE_UNDOABLE, fixed_world(ONE_UNDOABLE, {}), schedule)
    assert shell.journal.crashes == 1
    assert record.status == RunStatus.COMPENSATED and shell.journal.compensations == [("s0", -1)]


class Together(Scripted):
    """Everything in flight finishes at once (one batch of completions)."""

    def pick(self, inflight: Sequence[NodeKey], now: float, timer: float | None) -> list[NodeKey]:
        return list(inflight)


#: an agent whose budget stops it after its first turn; s1 fails for good in the round that
#: answers the agent's tool calls, and the run rolls s0 back
PAUSING = Plan(steps=(StepPlan("s0", compensated=True, max_attempts=1),
                      StepPlan(AGENT, kind="agent", on_budget="pause"),
                      StepPlan("s1", deps=("s0",), max_attempts=1)), fail_rate=0, token_budget=TURN_TOKENS)


def test_a_resumed_rollback_does_not_pause() -> None:
    world = fixed_world(PAUSING, {"s1": Fate(0, "permanent")})
    record, _ = drive(PAUSING, world, Together())
    assert record.status == RunStatus.COMPENSATED
    record, shell = drive(PAUSING, world, Together(crash_when=fails("s1")))
    assert shell.journal.crashes == 1
    assert record.status == RunStatus.COMPENSATED


def test_found_resume_passes_the_same_failure_record() -> None:
    """A non-critical on_failure='pass' fan-out whose item fails hands its dependents a StepFailed
    record of the item's error; after a crash while the dependent effect is in flight, the resume
    hands them the same record, so the effect is re-sent under its first key (the shell checks
    every key against the ledger). It once got 'item 1 failed' from the parent row: other inputs,
    a fresh key, an effect the service could not dedupe."""
    plan = Plan(steps=(StepPlan("s0", items=2),
                       StepPlan("s1", deps=("s0",), map_over="s0", critical=False, on_failure="pass", max_attempts=1),
                       StepPlan("s2", deps=("s1",), effect=True, max_attempts=1)), fail_rate=0)
    world = fixed_world(plan, {"s1[1]": Fate(0, "permanent")})

    def while_s2_runs(moment: str, batch: Batch) -> bool:  # s2 was sent: crash before its result is durable
        return moment == "before" and any(n.node_id == "s2" and n.status == NodeStatus.COMPLETED
                                          for n in batch.node_writes())

    _, reference = drive(plan, world, PrioritySchedule(0))
    _, crashed = drive(plan, world, Scripted(crash_when=while_s2_runs))
    assert crashed.journal.crashes == 1
    keys = [key for _, label, key in crashed.journal.dispatched if label == "s2"]
    assert len(keys) == 2 and keys[0] == keys[1], keys  # sent again after the kill, under its first key
    compare_runs(reference, crashed)


def test_found_effects_drained_at_a_crash_land_after_the_resume() -> None:
    """A non-critical effect fan-out: an item fails for good, its siblings in flight are let land
    (drained, their ledger rows 'pending'), and the driver dies right after the failure's commit.
    The resume sends them again under their keys (reconciling), so they end completed as in the
    uninterrupted run; they used to stay unsent and end 'abandoned' (found by the hypothesis hunt)."""
    plan = Plan(steps=(StepPlan("s0", items=3),
                       StepPlan("s1", deps=("s0",), map_over="s0", effect=True, critical=False, max_attempts=1)),
                fail_rate=0)
    world = fixed_world(plan, {"s1[2]": Fate(0, "permanent")})  # s1[2] finishes first (salt 0), the others fly
    _, reference = drive(plan, world, PrioritySchedule(0))
    landed = {k for k, n in reference.fold.nodes.items() if n.status == NodeStatus.COMPLETED}
    assert {("s1", 0), ("s1", 1)} <= landed
    _, crashed = drive(plan, world, Scripted(crash_when=fails("s1[2]")))
    assert crashed.journal.crashes == 1
    assert [label for _, label, key in crashed.journal.dispatched if key][-2:] == ["s1[0]", "s1[1]"]  # sent again
    compare_runs(reference, crashed)
