"""The chaos suite's kill-and-resume sweep over generated workflows (``tests.support.chaos_flows``).

Per DAG: a golden run goes uninterrupted in a driver process (inline executor); its record says
which fault points the run passes (``reachable``). Then each case starts a driver armed with
one fault (SIGKILL, or ``raise``), lets a new process resume the run to rest, and ``check``
compares the result with the golden run:

- the run's status, output, error and status reason equal golden, and every node's status,
  but for nodes that raced a failure (``raced``: a resume may dispatch independent nodes in
  another order than the golden run did, so one of them may have run before the failure in
  one run and not in the other); those are reported, and everything below leaves them out;
- the ledger holds exactly the golden keys (per node label), none left ``pending`` (``pending_rows``);
- the provider saw one *effective* call per golden key and no other key, the same effects per
  subject; a key got a second *raw* call only if its ledger row was ``pending`` at the fault
  (the call's outcome was unknown); with the inline executor (nothing in flight at a fault)
  exactly the calls that had returned with their rows still ``pending`` are re-issued, once;
- compensations: the same ones ran as in the golden run, each node's only after those of every
  node downstream of it; and when the run completed its nodes in the golden order, in exactly
  the golden order. (Not strictly in reverse order of completion, as DESIGN.md words it: the
  rollback plan, ``raysaga.sagas.plan``, lets an independent node that completed earlier go
  while a later one still waits for its own dependents.)
"""

from __future__ import annotations

import json
import signal
import subprocess
from collections.abc import Callable, Collection
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import networkx as nx

from raysaga.sagas.rollback import UNKNOWN_OUTCOME
from raysaga.state import EffectStatus, NodeStatus, RunStatus, SqlStore
from tests.support import chaos_flows
from tests.support import crash_driver as harness
from tests.support.kill_sweep import EFFECT_POINTS, LEASE_TTL, kill_and_resume, ledger_label
from tests.support.services import FakeServices

FLOWS = "tests.support.chaos_flows"
RUN_ID = "chaos-1"  # golden and faulted runs share the id and the input: their keys must match
SUFFIX = ":compensate"
RESTING = (RunStatus.RUNNING, RunStatus.COMPENSATING)

Kill = tuple[str, str]


@dataclass
class Golden:
    spec: dict[str, Any]
    path: str
    run: dict[str, Any]
    nodes: dict[str, str]
    ledger: dict[str, tuple[str, str]]  # label -> (key, status)
    effective: dict[str, int]
    by_subject: dict[str, int]
    undo_order: list[str]  # compensation labels in the order their calls reached the provider
    completions: list[str]  # forward node labels in the order they completed
    reachable: list[Kill] = field(default_factory=list)


def run_view(store: SqlStore, run_id: str = RUN_ID) -> dict[str, Any]:
    """The run's status, output, error and reason; the output without the attempt counts of a
    fan-out's failures (a crash may cost an attempt: ``chaos_flows.canonical``)."""
    run = store.get_run(run_id)
    return {"status": run.status.value, "output": chaos_flows.canonical(run.output),
            "error": None if run.error is None else run.error.as_dict(), "status_reason": run.status_reason}


def completions(store: SqlStore, run_id: str = RUN_ID) -> list[str]:
    """Labels of completed nodes, forward and compensations, in the order they completed."""
    return [node_label(e.node_id, e.fan_index) for e in store.events(run_id) if e.kind == "node_completed"]


def node_label(node_id: str | None, fan_index: int | None) -> str:
    return str(node_id) if fan_index is None or fan_index < 0 else f"{node_id}[{fan_index}]"


def undo_order(log: dict[str, Any], ledger: dict[str, tuple[str, str]]) -> list[str]:
    """Compensation labels (``s3:compensate``, ``s4:compensate[2]``) in the order their first
    call reached the provider (the ledger names each key's node)."""
    labels = {key: label for label, (key, _) in ledger.items()}
    seen: dict[str, None] = {}
    for call in log["calls"]:
        if call["kind"] == "undo" and not call.get("refused"):
            seen.setdefault(labels.get(call["key"], f"<unknown key {call['key']}>"), None)
    return list(seen)


def reachable(nodes: dict[str, str], ledger: dict[str, tuple[str, str]]) -> list[Kill]:
    """The (point, label) pairs a run like the golden one passes: the pending points of every
    ledger row, the commit points of every node with an outcome, and the status transitions."""
    points = [(p, label) for label in ledger for p in EFFECT_POINTS[:2]]
    points += [(p, label) for label, status in nodes.items() if status != NodeStatus.RUNNING.value
               for p in ("before_commit", "after_commit")]
    points.append(("before_transition", "*"))
    return sorted(set(points))


def ledger_of(store: SqlStore, run_id: str = RUN_ID) -> dict[str, tuple[str, str]]:
    return {ledger_label(e): (e.idempotency_key, e.status.value) for e in store.effects(run_id)}


def golden_run(spec: dict[str, Any], folder: Path, services: FakeServices) -> Golden:
    path = chaos_flows.save(spec, folder)
    db = f"sqlite:///{folder / 'golden.db'}"
    services.reset()
    done = harness.run_driver(path, db, RUN_ID, flows=FLOWS, any_state_ok=True, lease_ttl=LEASE_TTL["inline"],
                              run_input=chaos_flows.sample_input(services.url))
    assert done.returncode == 0 and done.result is not None, done.describe()
    store = SqlStore(db)
    try:
        view = run_view(store)
        assert view["status"] in ("completed", "failed", "compensated"), view
        nodes = node_states(store)
        ledger = ledger_of(store)
        order = completions(store)
    finally:
        store.close()
    log = services.log()
    assert set(log["effective"].values()) <= {1}, log["effective"]
    assert pending_rows(nodes, ledger) == [], f"pending ledger rows at the end: {pending_rows(nodes, ledger)}"
    undo = undo_order(log, ledger)
    return Golden(spec, path, view, nodes, ledger, log["effective"], log["by_subject"], undo,
                  [label for label in order if SUFFIX not in label], reachable(nodes, ledger))


#: A node's state once a rollback undid it while its outcome was unknown (it was in flight or
#: waiting to retry: ``raysaga.orchestrator.machine.rollback.UNDONE_UNKNOWN``); as racy as before.
UNDONE = "undone"


def node_states(store: SqlStore) -> dict[str, str]:
    """Each node's status, or ``UNDONE`` for a node settled by the rollback that undid it."""
    return {n.label: UNDONE if n.error is not None and n.error.type == "Compensated" else n.status.value
            for n in store.nodes(RUN_ID)}


def pending_rows(nodes: dict[str, str], ledger: dict[str, tuple[str, str]]) -> list[str]:
    """Ledger rows left ``pending`` at the end of a run: none may be (``tests/chaos/test_known_bugs.py``
    holds the two ways a finished run once kept them, both fixed)."""
    return [f"{label} ({nodes.get(label)})" for label, (_, status) in ledger.items()
            if status == EffectStatus.PENDING.value]


def _step_of(golden: Golden, label: str) -> dict[str, Any] | None:
    name = label.partition("[")[0]
    return next((s for s in golden.spec["steps"] if s["name"] == name), None)


def check_at_fault(golden: Golden, kill: Kill, snap: Any, log: dict[str, Any]) -> None:
    """The fault point meant what it says: what was durable, and what the provider saw, then."""
    point, label = kill
    nodes = {n.label: n.status for n in snap.nodes}
    ledger = {ledger_label(e): e for e in snap.effects}
    key = golden.ledger.get(label, ("", ""))[0]
    if point == "before_pending":
        assert label not in ledger and key not in log["raw"], kill
    elif point == "after_pending":
        assert ledger[label].status == EffectStatus.PENDING and key not in log["raw"], kill
    elif point == "after_commit":
        assert label in nodes and nodes[label] != NodeStatus.RUNNING, (kill, nodes.get(label))
    elif point == "before_commit" and label in ledger and golden.effective.get(key) == 1:
        step = _step_of(golden, label)
        first_try_succeeds = step is not None and step.get("fate", "ok") == "ok" and step["kind"] != "map"
        if first_try_succeeds and ledger[label].status == EffectStatus.PENDING:
            assert log["raw"].get(key) == 1, f"{kill}: the call should have returned"


def forward_label(label: str) -> str:
    """``s4:compensate[2]`` -> ``s4[2]``; a forward label stays as it is."""
    head, _, item = label.partition("[")
    return head.removesuffix(SUFFIX) + (f"[{item}" if item else "")


def raced(golden: Golden, nodes: dict[str, str | None]) -> set[str]:
    """Forward labels whose status differs from golden in a way a race explains, else fail.

    When a run rolls back, fails, or a fan-out fails fast, independent nodes in flight race the
    failure: which of them ran first hangs on the order the driver dispatched them, and a resume
    dispatches afresh (a crash may let a flaky node's retry, or a sibling item, run before the
    failure is seen). Such a node may end otherwise than in the golden run, but only between
    "outcome unknown or never started" (``cancelled``, ``retrying``, ``running``, no row) and
    an outcome. Nothing else may differ."""
    racy = {status.value for status in UNKNOWN_OUTCOME} | {UNDONE, None}
    diff = {forward_label(label) for label in set(golden.nodes) | set(nodes)
            if golden.nodes.get(label) != nodes.get(label)}
    if not diff:
        return diff
    racing_end = golden.run["status"] != "completed" or any(v in racy for v in golden.nodes.values())
    wrong = {label: (golden.nodes.get(label), nodes.get(label)) for label in diff
             if not racing_end or (golden.nodes.get(label) not in racy and nodes.get(label) not in racy)}
    assert not wrong, f"node statuses differ from golden (golden, this run): {wrong}"
    return diff


def check(golden: Golden, store: SqlStore, log: dict[str, Any], kill: Kill, uncertain: Collection[str],
          returned: Collection[str], executor: str = "inline") -> set[str]:
    """A faulted-and-resumed run against its golden run (see the module's docstring); returns
    the labels of nodes that raced a failure and ended otherwise than in the golden run."""
    assert run_view(store) == golden.run, (kill, run_view(store), golden.run)
    nodes: dict[str, str | None] = dict(node_states(store))
    race = raced(golden, nodes)
    ledger = ledger_of(store)
    same = {label for label in set(ledger) | set(golden.ledger) if forward_label(label) not in race}
    assert {k: ledger.get(k) for k in same} == {k: golden.ledger.get(k) for k in same}, (kill, ledger, golden.ledger)
    assert pending_rows({k: v for k, v in nodes.items() if v is not None}, ledger) == [], kill
    assert set(log["effective"].values()) <= {1}, (kill, log["effective"])
    assert set(log["by_subject"].values()) <= {1}, (kill, log["by_subject"])
    keys = {key for key, _ in ledger.values()}
    assert set(log["raw"]) <= keys, f"{kill}: a call carried a key the run's ledger does not hold"
    golden_keys = {key for label, (key, _) in golden.ledger.items() if forward_label(label) not in race}
    assert set(log["effective"]) & golden_keys == set(golden.effective) & golden_keys, kill
    repeated = {key for key, n in log["raw"].items() if n > 1}
    assert repeated <= set(uncertain), (kill, repeated, uncertain)
    if executor == "inline":  # nothing is in flight at a fault: exactly the calls that had returned repeat, once
        cancelled = {golden.ledger[label][0] for label, status in golden.nodes.items()
                     if status == NodeStatus.CANCELLED.value and label in golden.ledger}  # never re-sent
        assert repeated == set(returned) - cancelled, (kill, repeated, returned)
        assert max(log["raw"].values(), default=1) <= 2, (kill, log["raw"])
    # compensations: the golden ones, each after those of the nodes downstream of it
    undo = undo_order(log, ledger)
    assert sorted(u for u in undo if forward_label(u) not in race) == \
        sorted(u for u in golden.undo_order if forward_label(u) not in race), (kill, undo, golden.undo_order)
    graph = chaos_flows.load(golden.path).graph
    first: dict[str, int] = {}  # step -> the position of its first and of its last undo
    last: dict[str, int] = {}
    for i, label in enumerate(undo):
        first.setdefault(label.partition(":")[0], i)
        last[label.partition(":")[0]] = i
    for step, i in first.items():
        later = [d for d in nx.descendants(graph, step) if d in last and last[d] > i]
        assert not later, f"{kill}: {step} compensated before its dependents {later}: {undo}"
    forward = [label for label in completions(store) if SUFFIX not in label]
    if forward == golden.completions and not race:  # the same completions: the same rollback, in the same order
        assert undo == golden.undo_order, (kill, undo, golden.undo_order)
    return race


Start = Callable[[str | None, bool, Path | None], subprocess.Popen[str]]


def fault_case(golden: Golden, kill: Kill, mode: str, services: FakeServices, folder: Path) -> set[str]:
    """Fault a run of ``golden``'s DAG at ``kill`` (``mode`` ``kill`` or ``raise``), resume it, check
    it; return the labels that raced a failure (``raced``)."""
    db = f"sqlite:///{folder / 'run.db'}"
    services.reset()
    uncertain: set[str] = set()
    returned: set[str] = set()

    def start(faults: str | None, resume: bool, go_file: Path | None) -> subprocess.Popen[str]:
        run_input = None if resume else chaos_flows.sample_input(services.url)
        return harness.spawn(golden.path, db, RUN_ID, flows=FLOWS, any_state_ok=True, resume=resume,
                             go_file=go_file, run_input=run_input, lease_ttl=LEASE_TTL["inline"],
                             faults=faults if faults is None or mode == "kill" else f"{faults}={mode}")

    def at_fault(kill: Kill, snap: Any) -> None:
        log = services.log()
        pending = {e.idempotency_key for e in snap.effects if e.status == EffectStatus.PENDING}
        uncertain.update(pending)
        returned.update(pending & set(log["raw"]))
        check_at_fault(golden, kill, snap, log)

    if mode == "kill":
        with kill_and_resume(start, db, RUN_ID, [kill], folder, at_kill=at_fault, resting=RESTING) as (_, store):
            return check(golden, store, services.log(), kill, uncertain, returned)
    assert mode == "raise", mode
    store = SqlStore(db)
    try:
        crashed = harness.finish(start(f"{kill[0]}:{kill[1]}", False, None))
        assert crashed.returncode == 1 and crashed.returncode != -signal.SIGKILL, crashed.describe()
        assert "FaultInjected: fault injected at" in crashed.stderr, crashed.describe()
        snap = store.snapshot(RUN_ID)
        assert snap.run.status in RESTING and snap.run.lease_owner is None, snap.run
        at_fault(kill, snap)
        resumed = harness.finish(start(None, True, None))
        assert resumed.returncode == 0, resumed.describe()
        return check(golden, store, services.log(), kill, uncertain, returned)
    finally:
        store.close()


def describe(golden: Golden) -> str:
    return json.dumps({"spec": golden.spec, "run": golden.run, "nodes": golden.nodes}, sort_keys=True)[:4000]
