"""The chaos suite's kill-and-resume sweep over generated workflows (``tests.support.chaos_flows``).

Per DAG: a golden run goes uninterrupted in a driver process (inline executor); its record says
which fault points the run passes (``reachable``). Then each case starts a driver armed with
one fault (SIGKILL, or ``raise``), lets a new process resume the run to rest, and ``check``
compares the result with the golden run:

- the run's status, output, error and status reason equal golden, and every node's status,
  but for nodes that raced a failure (``raced``: a resume may dispatch independent nodes in
  another order than the golden run did, so one of them may have run before the failure in
  one run and not in the other); those are reported, and everything below leaves them out.
  Such a race may also decide between ``failed`` and ``compensated`` (a compensated node that
  completed before the failure in one run only): then the error must be the same, and every
  compensation only one of the runs made must be of a node that raced (``rolled_back_raced``).
  On Ray two critical failures may race too: the run may name the other one
  (``other_failure_first``: each failed, or raced, in both runs);
- the ledger holds exactly the golden keys (per node label), none left ``pending`` (``pending_rows``);
- the provider saw one *effective* call per golden key and no other key, the same effects per
  subject (on Ray, a key whose row ended ``abandoned`` in both runs may have taken effect in one
  only: its call was in flight when the failure cancelled it, ``effective_differs``); a key got
  a second *raw* call only if its ledger row was ``pending`` at the fault (the call's outcome
  was unknown); with the inline executor (nothing in flight at a fault)
  exactly the calls that had returned with their rows still ``pending`` are re-issued, once;
- compensations: the same ones ran as in the golden run, each node's only after those of every
  node downstream of it; and when the run completed its nodes in the golden order, in exactly
  the golden order (inline: on Ray independent compensations run in parallel). (Not strictly in
  reverse order of completion, as DESIGN.md words it: the
  rollback plan, ``raysaga.sagas.plan``, lets an independent node that completed earlier go
  while a later one still waits for its own dependents.)
- agents (``chaos_flows`` ``agent`` nodes, their model the ``MessagesServer`` given as ``model``):
  no model request was asked again once its answer was durable (its turn's node committed at
  the fault, completed or failed), none answered more than twice; with the inline executor
  (nothing in flight at a fault) exactly the turns answered and not yet durable at the fault
  (``lost``) are asked again, once each, when their agent goes on to complete; every agent not
  racing a failure was asked exactly the golden requests (on Ray but for those of a turn
  ``cancelled`` in flight in both runs: its request may have gone out in one only), and the run
  counted the golden tokens. Replies other than an answer are only the planned ones
  (``check_replies``: a turn's transport faults among its first arrivals, the error of a turn
  that fails for good), and a request a transport fault or such an error answered is no
  repeated answered turn: only answers count as asks, and with the inline executor every agent
  that ended as in the golden run (completed, or failed on its own) saw exactly the golden
  arrivals of each request, plus one for an answer (or the error of a turn failing for good) lost at the fault (so a
  transport fault's retry is neither lost nor repeated across a crash, and a turn failing at
  every attempt is asked no more often than its attempts allow); on Ray at most one more.

Approvals (``chaos_flows`` ``approval`` nodes) are decided the same way in every run: whenever
a driver leaves the run ``waiting_human``, the harness decides what it waits for
(``chaos_flows.decide``) and starts the next driver (``settle``), a faulted one included until
its fault fires (``until_fault``).
"""

from __future__ import annotations

import itertools
import json
import signal
import subprocess
from collections.abc import Callable, Collection
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import networkx as nx

from raysaga.node_key import AGENT_SEP
from raysaga.sagas.rollback import UNKNOWN_OUTCOME
from raysaga.state import EffectStatus, NodeStatus, RunStatus, SqlStore
from raysaga.state.item_events import item_indexes
from tests.support import chaos_flows
from tests.support import crash_driver as harness
from tests.support.kill_sweep import EFFECT_POINTS, LEASE_TTL, ledger_label
from tests.support.messages_server import MessagesServer
from tests.support.services import FakeServices

FLOWS = "tests.support.chaos_flows"
RUN_ID = "chaos-1"  # golden and faulted runs share the id and the input: their keys must match
SUFFIX = ":compensate"
RESTING = (RunStatus.RUNNING, RunStatus.COMPENSATING)

Kill = tuple[str, str]
#: How long a driver may take to bring a run to rest or to its fault (a guard against a hang, not
#: a wait): a Ray driver of a 40-step DAG on a loaded 2-core machine spent 92 s of its 120 s
#: creating its two I/O actors (load average 40), and was killed mid-run as if hung.
FINISH = {"inline": 120.0, "ray": 300.0}
Start = Callable[[str | None, bool, Path | None], subprocess.Popen[str]]


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
    executor: str = "inline"
    asked: dict[str, set[str]] = field(default_factory=dict)  # agent -> the request keys its model answered
    tokens_used: int = 0
    rests: int = 0  # how often the run rested waiting for a decision
    arrivals: dict[str, int] = field(default_factory=dict)  # model request key -> how often it arrived
    turns: dict[str, str] = field(default_factory=dict)  # model request key -> its turn's label
    raw: dict[str, int] = field(default_factory=dict)  # key -> how many calls with it reached the provider


def planned_calls(golden: Golden) -> dict[str, int]:
    """Keys whose calls reach the provider more than once by plan, and how often: a call of the
    tool whose first reply is lost (``chaos_flows.act_lost``: its first attempt takes effect, then
    raises; its retry re-sends the key, deduped) is sent ``chaos_flows.LOST_CALLS`` times in any
    run that completes it. Every other key is planned once. Only these keys, only that count."""
    steps = {s["name"]: s for s in golden.spec["steps"]}
    return {key: chaos_flows.LOST_CALLS for label, (key, _) in golden.ledger.items()
            if chaos_flows.tool_at(steps.get(label.partition("@")[0]), label) in chaos_flows.LOST}


def returned_calls(golden: Golden, pending: Collection[str], raw: dict[str, int]) -> set[str]:
    """The keys ``pending`` at a fault whose planned call had returned (``raw``: the provider's
    counts then): the call that ends the plan (its last, ``planned_calls``) reached the provider,
    so a resume re-sends it once more. A lost reply's key with only its first call sent is not
    among them: the resume's call is its planned retry."""
    planned = planned_calls(golden)
    return {key for key in pending if raw.get(key, 0) >= planned.get(key, 1)}


def reset_model(model: MessagesServer) -> None:
    """A fresh log, and the responder's arrival counts with it (``chaos_flows.ChaosModel``)."""
    model.clear()
    reset = getattr(model.responder, "reset", None)
    if reset is not None:
        reset()


def model_requests(model: MessagesServer, executor: str = "inline") -> list[Any]:
    """The requests that reached the model: those with a body. On Ray a model call runs in a
    worker, which a fault may kill while it sends its request: the server then reads a cut-off
    body and answers it 400 itself, without a turn, so it is no call of the model (inline a fault
    stops the driver between two commits, never inside a call: none may be cut off there)."""
    requests = model.requests
    if executor == "inline":
        assert all(r.body is not None for r in requests), [r.seq for r in requests if r.body is None]
    return [r for r in requests if r.body is not None]


def check_replies(requests: list[Any], kill: Kill | None = None) -> None:
    """Every reply but an answer was planned: the transport faults of its turn
    (``chaos_flows.planned_faults``) for its first arrivals since the model's reset, the error of
    a turn that fails for good (``chaos_flows.fails_for_good``); an answer otherwise."""
    seen: dict[str, int] = {}
    for r in requests:
        n = seen[r.key] = seen.get(r.key, 0) + 1
        planned = chaos_flows.planned_faults(r.body)
        if n <= len(planned):
            want = "drop" if planned[n - 1] == "drop" else "fault"
        else:
            want = "fault" if chaos_flows.fails_for_good(r.body) else "ok"
        assert r.kind == want, f"{kill}: {turn_label(r)} arrival {n} got {r.kind}, planned {want} ({planned})"


def run_view(store: SqlStore, run_id: str = RUN_ID) -> dict[str, Any]:
    """The run's status, output, error and reason; the output without the attempt counts of a
    fan-out's failures (a crash may cost an attempt), an approval's time and decision ids, a
    rejection's decision id (``chaos_flows.canonical``)."""
    run = store.get_run(run_id)
    return {"status": run.status.value, "output": chaos_flows.canonical(run.output),
            "error": None if run.error is None else chaos_flows.canonical(run.error.as_dict()),
            "status_reason": run.status_reason}


def completions(store: SqlStore, run_id: str = RUN_ID) -> list[str]:
    """Labels of completed nodes, forward and compensations, in the order they completed (a
    fan-out's plain items completed in one commit are one ``items_completed`` event, in order)."""
    labels = []
    for e in store.events(run_id):
        if e.kind == "node_completed":
            labels.append(node_label(e.node_id, e.fan_index))
        elif e.kind == "items_completed":
            labels.extend(node_label(e.node_id, i) for i in item_indexes(e.data))
    return labels


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


def golden_run(spec: dict[str, Any], folder: Path, services: FakeServices, *, executor: str = "inline",
               model: MessagesServer | None = None) -> Golden:
    """The uninterrupted run of ``spec`` (its agents asking ``model``, its approvals decided as the
    spec says whenever it rests for them) and what the faulted runs are compared with."""
    path = chaos_flows.save(spec, folder, None if model is None else model.base_url)
    db = f"sqlite:///{folder / 'golden.db'}"
    services.reset()
    chaos_flows.reset_marks(path)
    if model is not None:
        reset_model(model)

    def start(faults: str | None, resume: bool, go_file: Path | None) -> subprocess.Popen[str]:
        return harness.spawn(path, db, RUN_ID, flows=FLOWS, any_state_ok=True, lease_ttl=LEASE_TTL[executor],
                             executor=executor, resume=resume, faults=faults, go_file=go_file,
                             run_input=None if resume else chaos_flows.sample_input(services.url))

    store = SqlStore(db)
    drivers = Drivers(start, folder, spec, executor)
    try:
        _, rests = settle(drivers, store, spec, start(None, False, None))
        view = run_view(store)
        assert view["status"] in ("completed", "failed", "compensated"), view
        nodes = node_states(store)
        ledger = ledger_of(store)
        order = completions(store)
        tokens = store.get_run(RUN_ID).tokens_used
    finally:
        drivers.stop()
        store.close()
    log = services.log()
    assert set(log["effective"].values()) <= {1}, log["effective"]
    assert pending_rows(nodes, ledger) == [], f"pending ledger rows at the end: {pending_rows(nodes, ledger)}"
    asked: dict[str, set[str]] = {}
    arrivals: dict[str, int] = {}
    turns: dict[str, str] = {}
    if model is not None:
        assert model.repeated_requests() == [], "the golden run asked a model turn twice"
        requests = model_requests(model, executor)  # on Ray a cancelled call may be cut off mid-body
        check_replies(requests)
        for r in requests:
            turns[r.key] = turn_label(r)
            asked.setdefault(agent_of(turns[r.key]), set()).add(r.key)
            arrivals[r.key] = arrivals.get(r.key, 0) + 1
    undo = undo_order(log, ledger)
    return Golden(spec, path, view, nodes, ledger, log["effective"], log["by_subject"], undo,
                  [label for label in order if SUFFIX not in label], reachable(nodes, ledger), executor, asked,
                  tokens, rests, arrivals, turns, dict(log["raw"]))


class Drivers:
    """Starts the run's driver processes (``start(faults, resume, go_file)``), each next one early:
    it imports while the one before runs, and touches the run once its go file exists. A spare
    is started only where one may be needed (a run with approvals may rest for a decision)."""

    def __init__(self, start: Start, folder: Path, spec: dict[str, Any], executor: str = "inline") -> None:
        self.start = start
        self.timeout = FINISH[executor]
        self.folder = folder
        self.approvals = any(s["kind"] == "approval" for s in spec["steps"])
        self._gos = itertools.count()
        self.spares: list[tuple[subprocess.Popen[str], Path]] = []

    def early(self, faults: str | None) -> tuple[subprocess.Popen[str], Path]:
        """A resumer armed with ``faults``, waiting for its go file."""
        go = self.folder / f"go{next(self._gos)}"
        spare = (self.start(faults, True, go), go)
        self.spares.append(spare)
        return spare

    def go(self, spare: tuple[subprocess.Popen[str], Path] | None, faults: str | None) -> subprocess.Popen[str]:
        """``spare`` let go, or (none) a resumer started now."""
        if spare is None:
            return self.start(faults, True, None)
        spare[1].touch()
        return spare[0]

    def stop(self) -> None:
        for proc, _ in self.spares:
            harness.stop(proc)


def settle(drivers: Drivers, store: SqlStore, spec: dict[str, Any], first: subprocess.Popen[str]
           ) -> tuple[harness.Finished, int]:
    """Drive the run to its end from the driver ``first``: whenever a driver leaves it
    ``waiting_human``, decide what it waits for and let another go. Returns the last driver and
    how often the run so rested."""
    rests = 0
    proc = first
    while True:
        spare = drivers.early(None) if drivers.approvals else None
        done = harness.finish(proc, drivers.timeout)
        assert done.returncode == 0 and done.result is not None, done.describe()
        if done.result["status"] != RunStatus.WAITING_HUMAN.value:
            return done, rests
        rests += 1
        assert chaos_flows.decide(store, spec, RUN_ID), f"waiting for a decision, nothing to decide: {done.result}"
        proc = drivers.go(spare, None)


def until_fault(drivers: Drivers, store: SqlStore, spec: dict[str, Any], faults: str, mode: str, *,
                may_miss: bool = False) -> harness.Finished | None:
    """Start drivers armed with ``faults`` until one faults (deciding what the run rests for in
    between: a faulted run reaches the point after the same decisions as the golden run).
    ``may_miss`` (Ray: a node that raced a failure in the golden run may never run in this one):
    None if the run ended without passing the point."""
    proc = drivers.start(faults, False, None)
    while True:
        spare = drivers.early(faults) if drivers.approvals else None
        done = harness.finish(proc, drivers.timeout)
        if mode == "kill" and done.returncode == -signal.SIGKILL:
            return done
        if mode == "raise" and done.returncode == 1 and "FaultInjected: fault injected at" in done.stderr:
            return done
        assert done.returncode == 0 and done.result is not None, f"{faults} ({mode})\n{done.describe()}"
        if may_miss and done.result["status"] in ("completed", "failed", "compensated"):
            return None
        assert done.result["status"] == RunStatus.WAITING_HUMAN.value, \
            f"the run ended before {faults} fired ({mode}): {done.result}"
        assert chaos_flows.decide(store, spec, RUN_ID), f"waiting for a decision, nothing to decide: {done.result}"
        proc = drivers.go(spare, faults)


def turn_label(request: Any) -> str:
    """A model request's node label: ``<agent step>@<turn>``, ``<agent step>@<turn>[<item>]`` in a fan-out."""
    fields, _ = chaos_flows.parse_prompt(str(request.conversation))
    return f"{fields['agent']}@{request.turn}" + (f"[{fields['item']}]" if "item" in fields else "")


def agent_of(turn: str) -> str:
    """The agent node of a turn's label: ``s3@1`` -> ``s3``, ``s3@1[2]`` -> ``s3[2]``."""
    head, _, rest = turn.partition("@")
    _, bracket, item = rest.partition("[")
    return head + bracket + item


#: A node's state once a rollback undid it while its outcome was unknown (it was in flight or
#: waiting to retry: ``raysaga.orchestrator.machine.rollback.UNDONE_UNKNOWN``); as racy as before.
UNDONE = "undone"


def node_states(store: SqlStore) -> dict[str, str]:
    """Each node's status, or ``UNDONE`` for a node settled by the rollback that undid it."""
    return {n.label: UNDONE if n.error is not None and n.error.type == "Compensated" else n.status.value
            for n in store.nodes(RUN_ID)}


def pending_rows(nodes: dict[str, str], ledger: dict[str, tuple[str, str]],
                 status: EffectStatus = EffectStatus.PENDING) -> list[str]:
    """Ledger rows left ``pending`` at the end of a run: none may be (``tests/chaos/test_known_bugs.py``
    holds the two ways a finished run once kept them, both fixed). With ``status=ABANDONED``: the
    rows the store marked ``abandoned`` as the run ended (still ``pending`` then: an outcome nobody
    will settle); the sweep counts them, and a faulted run must have the golden run's."""
    return [f"{label} ({nodes.get(label)})" for label, (_, row) in ledger.items() if row == status.value]


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
    elif point == "before_commit" and key in planned_calls(golden) and label in ledger \
            and ledger[label].status == EffectStatus.PENDING:
        # a lost reply's call: the first commit after it is its first attempt's failure, which
        # took effect (one call reached the provider) and raised
        assert log["raw"].get(key) == 1, f"{kill}: the lost reply's first call: {log['raw'].get(key)} calls"
    elif point == "before_commit" and label in ledger and golden.effective.get(key) == 1:
        step = _step_of(golden, label)
        first_try_succeeds = step is not None and step.get("fate", "ok") == "ok" and step["kind"] != "map" \
            and chaos_flows.tool_at(step, label) != "act_flaky"  # its first attempt fails before the call
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


ROLLED_BACK = "; rolled back"


def rolled_back_raced(golden: Golden, view: dict[str, Any], race: Collection[str], undo: list[str],
                      kill: Kill) -> None:
    """The run ended ``compensated`` where the golden run ``failed`` (or the reverse), its error
    the same: allowed only when every compensation that ran in one and not the other undid a
    node that raced the failure (it completed before the failure was seen in one run, was never
    started in the other: nothing to undo there, so that run failed without a rollback)."""
    assert {view["status"], golden.run["status"]} == {"failed", "compensated"}, (kill, view, golden.run)
    assert (view["output"], view["error"]) == (golden.run["output"], golden.run["error"]), (kill, view, golden.run)
    assert str(view["status_reason"]).removesuffix(ROLLED_BACK) == \
        str(golden.run["status_reason"]).removesuffix(ROLLED_BACK), (kill, view, golden.run)
    differ = set(undo) ^ set(golden.undo_order)
    assert differ and {forward_label(u) for u in differ} <= set(race), \
        f"{kill}: the run ended {view['status']}, golden {golden.run['status']}, with compensations {undo} " \
        f"(golden {golden.undo_order}) not all of nodes that raced the failure ({sorted(race)})"


def other_failure_first(golden: Golden, view: dict[str, Any], nodes: dict[str, str | None],
                        race: Collection[str], kill: Kill) -> None:
    """Ray: two critical failures raced, and the run names the other one (whichever the driver
    saw first). Allowed only with the same status and output, each named node failed in the run
    that names it, and failed or raced in the other."""
    assert (view["status"], view["output"]) == (golden.run["status"], golden.run["output"]), (kill, view, golden.run)
    mine, theirs = (view["error"] or {}).get("node"), (golden.run["error"] or {}).get("node")
    for node, named_by, other in ((mine, nodes, golden.nodes), (theirs, golden.nodes, nodes)):
        assert node is not None and named_by.get(node) == NodeStatus.FAILED.value, (kill, node, view, golden.run)
        assert other.get(node) == NodeStatus.FAILED.value or node in race, \
            f"{kill}: the run failed on {mine}, golden on {theirs}, and {node} did not fail in both: {view}"


def effective_differs(golden: Golden, ledger: dict[str, tuple[str, str]], log: dict[str, Any],
                      race: Collection[str], kill: Kill, executor: str) -> list[str]:
    """The provider saw the golden run's effective keys take effect, and no other, among the keys of
    nodes that did not race a failure; returns the labels whose effect happened in one run only
    where that is allowed.

    Allowed only on Ray, and only for a row ``abandoned`` in both runs (the ledger check before
    this one holds it to the same key and status): a call in flight when the run's failure
    cancelled its node, its worker killed, the run ended with the row ``pending``. Whether the
    request reached the provider before the worker died hangs on timing (an effect without a
    compensation stays unknown: random DAG ``chaos_cfc975a5c7``, ``s16[0]`` and ``s24``, a flaky
    fan-out's retries and an effect in flight as ``s36[0]`` failed, effective in the golden run
    and not in the faulted one, every node and row status equal). Each run still sent it at most
    once (``effective`` at most 1 per key, asserted by ``check``). Inline nothing is in flight at
    a failure: there every key must match."""
    golden_keys = {key for label, (key, _) in golden.ledger.items() if forward_label(label) not in race}
    here, there = set(log["effective"]) & golden_keys, set(golden.effective) & golden_keys
    names = {key: label for label, (key, _) in {**golden.ledger, **ledger}.items()}
    abandoned = EffectStatus.ABANDONED.value
    unknown = {key for label, (key, status) in golden.ledger.items()
               if status == abandoned and ledger.get(label) == (key, status)} if executor != "inline" else set()
    assert here - there <= unknown and there - here <= unknown, \
        f"{kill}: effective here only {sorted(names[k] for k in here - there - unknown)}, " \
        f"in golden only {sorted(names[k] for k in there - here - unknown)}"
    return sorted(names[k] for k in here ^ there)


def check(golden: Golden, store: SqlStore, log: dict[str, Any], kill: Kill, uncertain: Collection[str],
          returned: Collection[str], executor: str = "inline", model: MessagesServer | None = None,
          lost: Collection[str] = (), durable: Collection[str] = (), stats: dict[str, int] | None = None) -> set[str]:
    """A faulted-and-resumed run against its golden run (see the module's docstring); returns
    the labels of nodes that raced a failure and ended otherwise than in the golden run."""
    view = run_view(store)
    nodes: dict[str, str | None] = dict(node_states(store))
    race = raced(golden, nodes)
    if view != golden.run and executor != "inline" and view["error"] != golden.run["error"]:
        other_failure_first(golden, view, nodes, race, kill)
    elif view != golden.run:  # only a rollback of nodes that raced the failure may tell them apart
        rolled_back_raced(golden, view, race, undo_order(log, ledger_of(store)), kill)
    ledger = ledger_of(store)
    same = {label for label in set(ledger) | set(golden.ledger) if forward_label(label) not in race}
    assert {k: ledger.get(k) for k in same} == {k: golden.ledger.get(k) for k in same}, (kill, ledger, golden.ledger)
    assert pending_rows({k: v for k, v in nodes.items() if v is not None}, ledger) == [], kill
    assert set(log["effective"].values()) <= {1}, (kill, log["effective"])
    assert set(log["by_subject"].values()) <= {1}, (kill, log["by_subject"])
    keys = {key for key, _ in ledger.values()}
    assert set(log["raw"]) <= keys, f"{kill}: a call carried a key the run's ledger does not hold"
    unknown = effective_differs(golden, ledger, log, race, kill, executor)
    if stats is not None:
        stats["unknown_outcomes"] = stats.get("unknown_outcomes", 0) + len(unknown)
    # a key sent more often than planned (once; a lost reply's ``planned_calls``) only if its row
    # was pending at the fault, and then once more at most
    planned = planned_calls(golden)
    repeated = {key for key, n in log["raw"].items() if n > planned.get(key, 1)}
    assert repeated <= set(uncertain), (kill, repeated, uncertain)
    assert all(log["raw"][key] <= n + 1 for key, n in planned.items() if key in log["raw"]), \
        (kill, {key: log["raw"].get(key) for key in planned})
    if executor == "inline":  # nothing is in flight at a fault: exactly the calls that had returned repeat, once
        cancelled = {golden.ledger[label][0] for label, status in golden.nodes.items()
                     if status == NodeStatus.CANCELLED.value and label in golden.ledger}  # never re-sent
        assert repeated == set(returned) - cancelled, (kill, repeated, returned)
        assert all(n <= planned.get(key, 1) + 1 for key, n in log["raw"].items()), (kill, log["raw"])
        # a lost reply's retry happened exactly as in the golden run, plus the one re-send above
        lost_calls = {label: (log["raw"].get(key, 0), golden.raw.get(key, 0), key in returned)
                      for label, (key, _) in golden.ledger.items()
                      if key in planned and forward_label(label) not in race}
        assert all(got == want + again for got, want, again in lost_calls.values()), \
            f"{kill}: calls of a lost reply's key (here, golden, re-sent at the fault): {lost_calls}"
    # compensations: the golden ones, each after those of the nodes downstream of it
    undo = undo_order(log, ledger)
    assert sorted(u for u in undo if forward_label(u) not in race) == \
        sorted(u for u in golden.undo_order if forward_label(u) not in race), (kill, undo, golden.undo_order)
    graph = chaos_flows.load(golden.path).graph
    first: dict[str, int] = {}  # step -> the position of its first and of its last undo
    last: dict[str, int] = {}
    for i, label in enumerate(undo):  # s3:compensate[1], s4@1.0:compensate (an agent's tool call): s3, s4
        first.setdefault(label.partition(":")[0].partition("@")[0], i)
        last[label.partition(":")[0].partition("@")[0]] = i
    for step, i in first.items():
        later = [d for d in nx.descendants(graph, step) if d in last and last[d] > i]
        assert not later, f"{kill}: {step} compensated before its dependents {later}: {undo}"
    forward = [label for label in completions(store) if SUFFIX not in label]
    if executor == "inline" and forward == golden.completions and not race:
        # the same completions, one call at a time: the same rollback, in the same order (on Ray,
        # independent compensations run in parallel: only the dependency order above holds)
        assert undo == golden.undo_order, (kill, undo, golden.undo_order)
    if stats is not None:
        stats["abandoned"] = stats.get("abandoned", 0) + len(pending_rows(
            {k: v for k, v in nodes.items() if v is not None}, ledger, EffectStatus.ABANDONED))
    if model is not None:
        repeats = check_model(golden, store, model, kill, race, lost, durable, executor, stats)
        if stats is not None:
            stats["model_repeats"] = stats.get("model_repeats", 0) + repeats
            stats["model_requests"] = stats.get("model_requests", 0) + len(model_requests(model, executor))
            stats["model_faults"] = stats.get("model_faults", 0) + sum(
                r.kind != "ok" for r in model_requests(model, executor))
            stats["cut_requests"] = stats.get("cut_requests", 0) + sum(r.body is None for r in model.requests)
    return race


def check_model(golden: Golden, store: SqlStore, model: MessagesServer, kill: Kill, race: Collection[str],
                lost: Collection[str], durable: Collection[str], executor: str,
                stats: dict[str, int] | None = None) -> int:
    """Invariant 3 across the fault (see the module's docstring); returns how many turns were asked again."""
    requests = model_requests(model, executor)
    check_replies(requests, kill)
    labels = {r.key: turn_label(r) for r in requests}
    repeated = {labels[key] for key in model.repeated_requests()}
    assert not repeated & set(durable), f"{kill}: model turns asked again though their answer was durable: " \
                                        f"{sorted(repeated & set(durable))}"
    if executor == "inline":
        assert repeated <= set(lost), f"{kill}: model turns asked again though not lost at the fault: " \
                                      f"{sorted(repeated - set(lost))} (lost: {sorted(lost)})"
    counts: dict[str, int] = {}  # answers per request (a transport fault's retry is no repeat)
    arrivals: dict[str, int] = {}
    for r in requests:
        arrivals[r.key] = arrivals.get(r.key, 0) + 1
        if r.kind == "ok":
            counts[r.key] = counts.get(r.key, 0) + 1
    assert max(counts.values(), default=1) <= 2, (kill, {labels[k]: n for k, n in counts.items() if n > 2})
    nodes = node_states(store)
    racing = set(race) | {agent_of(label) for label in race if AGENT_SEP in label}  # (see below)
    for agent, keys in golden.asked.items():  # faults and failures: retried as in the golden run
        if agent in racing or nodes.get(agent) != golden.nodes.get(agent) or golden.nodes.get(agent) not in (
                NodeStatus.COMPLETED.value, NodeStatus.FAILED.value):
            continue
        for key in keys:
            want = golden.arrivals[key] + (labels.get(key) in lost)
            got = arrivals.get(key, 0)
            assert got == want if executor == "inline" else got <= want, \
                f"{kill}: {labels.get(key, agent)} arrived {got} times, golden {golden.arrivals[key]}" \
                f"{' + 1 answer lost at the fault' if want > golden.arrivals[key] else ''}"
    settled = {a for a in golden.asked if a not in race and golden.nodes.get(a) == NodeStatus.COMPLETED.value}
    if executor == "inline":  # an answer lost with the driver is asked again, once, when its agent goes on
        must = {label for label in lost if agent_of(label) in settled}
        assert must <= repeated, f"{kill}: answers lost at the fault and not asked again: {sorted(must - repeated)}"
    asked: dict[str, set[str]] = {}
    for r in requests:
        asked.setdefault(agent_of(labels[r.key]), set()).add(r.key)
    # An agent a failure cut off (its status an unknown outcome in both runs) raced it when one
    # of its turns or tool calls did (``raced``: ``s4@5[0]`` is agent ``s4[0]``'s): how many turns
    # it got through before the failure was seen hangs on the dispatch order, which a resume makes
    # afresh. Its requests are then held to the rules above only (the run's tokens are compared
    # only without any race, as before).
    cut = same_requests(golden, asked, labels, nodes, racing, kill, executor)
    if stats is not None:
        stats["cut_turns"] = stats.get("cut_turns", 0) + cut
    if not race:
        assert store.get_run(RUN_ID).tokens_used == golden.tokens_used, kill
    return len(repeated)


def same_requests(golden: Golden, asked: dict[str, set[str]], labels: dict[str, str], nodes: dict[str, str],
                  racing: Collection[str], kill: Kill, executor: str) -> int:
    """Every agent not racing a failure, ending as in the golden run, was asked the golden requests
    (``asked``: agent -> request keys; ``labels``: request key -> turn label); returns how many
    turns were asked in one run only where that is allowed.

    Allowed only on Ray, and only for a turn in flight when a failure cancelled it (its node
    ``cancelled`` in both runs, its worker killed): whether its request went out before the worker
    died hangs on timing (random DAG ``chaos_cfc975a5c7``: ``s37@0[1]``, the first turn of an
    item of a best-effort agent fan-out, cut off as ``s36[0]`` failed, reached the model in the
    faulted run only). Inline nothing is in flight at a failure: every request must match."""
    cut = {label for label, status in nodes.items() if executor != "inline" and AGENT_SEP in label
           and status == NodeStatus.CANCELLED.value == golden.nodes.get(label)}
    turn_of = {**golden.turns, **labels}
    allowed: set[str] = set()
    for agent in set(golden.asked) | set(asked):
        if agent not in racing and golden.nodes.get(agent) == nodes.get(agent):
            mine, theirs = asked.get(agent, set()), golden.asked.get(agent, set())
            here, there = sorted(turn_of[k] for k in mine - theirs), sorted(turn_of[k] for k in theirs - mine)
            assert {turn_of[k] for k in mine ^ theirs} <= cut, \
                f"{kill}: {agent} was asked other requests than in the golden run: here only {here}, " \
                f"in golden only {there} (cancelled in flight in both: {sorted(cut)})"
            allowed.update(here + there)
    return len(allowed)


def fault_case(golden: Golden, kill: Kill, mode: str, services: FakeServices, folder: Path,
               model: MessagesServer | None = None, stats: dict[str, int] | None = None) -> set[str]:
    """Fault a run of ``golden``'s DAG at ``kill`` (``mode`` ``kill`` or ``raise``), resume it, check
    it; return the labels that raced a failure (``raced``). The executor is the golden run's;
    ``stats`` (if given) counts the model's requests, the turns asked again and the rests."""
    db = f"sqlite:///{folder / 'run.db'}"
    services.reset()
    chaos_flows.reset_marks(golden.path)
    if model is not None:
        reset_model(model)
    uncertain: set[str] = set()
    returned: set[str] = set()
    lost: set[str] = set()
    durable: set[str] = set()

    def start(faults: str | None, resume: bool, go_file: Path | None) -> subprocess.Popen[str]:
        run_input = None if resume else chaos_flows.sample_input(services.url)
        return harness.spawn(golden.path, db, RUN_ID, flows=FLOWS, any_state_ok=True, resume=resume,
                             run_input=run_input, lease_ttl=LEASE_TTL[golden.executor], executor=golden.executor,
                             go_file=go_file, faults=faults if faults is None or mode == "kill" else f"{faults}={mode}")

    store = SqlStore(db)
    drivers = Drivers(start, folder, golden.spec, golden.executor)
    try:
        resumer = drivers.early(None)  # imports while the faulted drivers run
        crashed = until_fault(drivers, store, golden.spec, f"{kill[0]}:{kill[1]}", mode,
                              may_miss=golden.executor != "inline")
        if crashed is None:  # the point never came: the run, unfaulted, must still end as golden
            if stats is not None:
                stats["missed"] = stats.get("missed", 0) + 1
            return check(golden, store, services.log(), kill, (), (), golden.executor, model, (), (), stats)
        snap = store.snapshot(RUN_ID)
        log = services.log()
        pending = {e.idempotency_key for e in snap.effects if e.status == EffectStatus.PENDING}
        uncertain.update(pending)
        returned.update(returned_calls(golden, pending, log["raw"]))
        check_at_fault(golden, kill, snap, log)
        # a commit may also have set the run resting for a decision (its approval now the only work),
        # or ended it (a node's outcome and the run's last transition in one commit)
        resting: tuple[RunStatus, ...] = (*RESTING, RunStatus.WAITING_HUMAN)
        if kill[0] == "after_commit":
            resting = (*resting, RunStatus.COMPLETED, RunStatus.FAILED, RunStatus.COMPENSATED)
        if mode == "kill":
            at_rest = harness.wait_lease_expired(store, RUN_ID)
            assert at_rest.status in resting, (kill, at_rest.status, at_rest.status_reason)
        else:
            assert "FaultInjected: fault injected at" in crashed.stderr, crashed.describe()
            assert snap.run.status in resting and snap.run.lease_owner is None, snap.run
        if model is not None:  # read once the lease expired: a request sent before the fault has arrived
            durable.update(n.label for n in snap.nodes if n.status in (NodeStatus.COMPLETED, NodeStatus.FAILED))
            # answers, and errors of turns failing for good, lost at the fault: a transport fault
            # is retried as its attempt was planned, and its retry is no repeat
            lost.update(turn_label(r) for r in model_requests(model, golden.executor)
                        if turn_label(r) not in durable
                        and (r.kind == "ok" or chaos_flows.fails_for_good(r.body or {})))
        _, rests = settle(drivers, store, golden.spec, drivers.go(resumer, None))
        if stats is not None:
            stats["rests"] = stats.get("rests", 0) + rests
        return check(golden, store, services.log(), kill, uncertain, returned, golden.executor, model, lost,
                     durable, stats)
    finally:
        drivers.stop()
        store.close()


def describe(golden: Golden) -> str:
    return json.dumps({"spec": golden.spec, "run": golden.run, "nodes": golden.nodes}, sort_keys=True)[:4000]
