"""The chaos suite's kill-and-resume sweep over generated workflows (``tests.support.chaos_flows``).

Per DAG: a golden run goes uninterrupted in a driver process (``golden_run``); its record says
which fault points the run passes (``reachable``). Then each case (``fault_case``) starts a driver
armed with one fault (SIGKILL, or ``raise``), lets a new process resume the run to rest, and
``tests.support.chaos_oracle.check`` compares the result with the golden run (its docstring says
what the oracle holds). What a run left is read back by ``tests.support.chaos_record``.

Approvals (``chaos_flows`` ``approval`` nodes) are decided the same way in every run: whenever
a driver leaves the run ``waiting_human``, the harness decides what it waits for
(``chaos_flows.decide``) and starts the next driver (``settle``), a faulted one included until
its fault fires (``until_fault``).
"""

from __future__ import annotations

import contextlib
import itertools
import json
import signal
import subprocess
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

from raysaga import Client
from raysaga.state import EffectStatus, NodeStatus, RunStatus, SqlStore
from tests.support import chaos_flows, chaos_model
from tests.support import crash_driver as harness
from tests.support.chaos_oracle import check as check
from tests.support.chaos_oracle import check_at_fault as check_at_fault
from tests.support.chaos_oracle import check_model as check_model
from tests.support.chaos_oracle import effective_differs as effective_differs
from tests.support.chaos_oracle import raced as raced
from tests.support.chaos_oracle import same_requests as same_requests
from tests.support.chaos_record import RUN_ID as RUN_ID
from tests.support.chaos_record import SUFFIX as SUFFIX
from tests.support.chaos_record import Golden as Golden
from tests.support.chaos_record import Kill as Kill
from tests.support.chaos_record import agent_of as agent_of
from tests.support.chaos_record import check_replies as check_replies
from tests.support.chaos_record import completions as completions
from tests.support.chaos_record import explain
from tests.support.chaos_record import ledger_at as ledger_at
from tests.support.chaos_record import ledger_of as ledger_of
from tests.support.chaos_record import model_requests as model_requests
from tests.support.chaos_record import node_states as node_states
from tests.support.chaos_record import pending_rows as pending_rows
from tests.support.chaos_record import planned_calls as planned_calls
from tests.support.chaos_record import reachable as reachable
from tests.support.chaos_record import reset_model as reset_model
from tests.support.chaos_record import returned_calls as returned_calls
from tests.support.chaos_record import run_view as run_view
from tests.support.chaos_record import turn_label as turn_label
from tests.support.chaos_record import undo_order as undo_order
from tests.support.kill_sweep import LEASE_TTL, completion_counts
from tests.support.messages_server import MessagesServer
from tests.support.services import FakeServices
from tests.support.store_template import copy_template

FLOWS = "tests.support.chaos_flows"
RESTING = (RunStatus.RUNNING, RunStatus.COMPENSATING)
#: How long a driver may take to bring a run to rest or to its fault (a guard against a hang, not
#: a wait): a Ray driver of a 40-step DAG on a loaded 2-core machine spent 92 s of its 120 s
#: creating its two I/O actors (load average 40), and was killed mid-run as if hung.
FINISH = {"inline": 120.0, "ray": 300.0}
Start = Callable[[str | None, bool, Path | None], subprocess.Popen[str]]


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

    copy_template(db)  # an empty store (no driver is started yet)
    store = SqlStore(db)
    drivers = Drivers(start, folder, spec, executor)
    try:
        _, rests = settle(drivers, store, spec, start(None, False, None))
        view = run_view(store)
        assert view["status"] in ("completed", "failed", "compensated"), view
        nodes = node_states(store)
        ledger = ledger_of(store)
        order = completions(store)
        executions = dict(completion_counts(store, RUN_ID))
        # the oracle compares these with a resumed run's: none counted (an event renamed) would pass it vacuously
        plain = [label for label, state in nodes.items() if state == "completed" and "@" not in label]
        assert all(executions.get(label, 0) >= 1 for label in plain), (plain, executions)
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
                  tokens, rests, arrivals, turns, dict(log["raw"]), executions)


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
    ``waiting_human``, decide what it waits for, or ``paused`` (an agent's loop), unpause it
    (``answer_rest``), and let another go. Returns the last driver and how often the run so rested."""
    rests = 0
    proc = first
    while True:
        spare = drivers.early(None) if drivers.approvals else None
        done = harness.finish(proc, drivers.timeout)
        assert done.returncode == 0 and done.result is not None, done.describe()
        if done.result["status"] not in REST_ANSWERED:
            return done, rests
        rests += 1
        answer_rest(store, spec, done.result)
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
        assert done.result["status"] in REST_ANSWERED, f"the run ended before {faults} fired ({mode}): {done.result}"
        answer_rest(store, spec, done.result)
        proc = drivers.go(spare, faults)


#: The rests the harness answers, as every run of the DAG is answered: a decision, an unpause.
REST_ANSWERED = (RunStatus.WAITING_HUMAN.value, RunStatus.PAUSED.value)


def answer_rest(store: SqlStore, spec: dict[str, Any], result: dict[str, Any]) -> None:
    """Decide what a ``waiting_human`` run waits for (``chaos_flows.decide``), or unpause a run an
    agent's loop paused (``loop_pause``), as an operator's ``raysaga unpause`` does."""
    if result["status"] == RunStatus.PAUSED.value:
        Client(store).unpause(RUN_ID, by=chaos_flows.DECIDER)  # (the store stays open: the caller's)
        return
    assert chaos_flows.decide(store, spec, RUN_ID), f"waiting for a decision, nothing to decide: {result}"


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

    copy_template(db)  # an empty store (no driver is started yet)
    store = SqlStore(db)
    drivers = Drivers(start, folder, golden.spec, golden.executor)
    try:
        resumer = drivers.early(None)  # imports while the faulted drivers run
        crashed = until_fault(drivers, store, golden.spec, f"{kill[0]}:{kill[1]}", mode,
                              may_miss=golden.executor != "inline")
        if crashed is None:  # the point never came: the run, unfaulted, must still end as golden
            if stats is not None:
                stats["missed"] = stats.get("missed", 0) + 1
            with explained(golden, db):
                return check(golden, store, services.log(), kill, (), (), golden.executor, model, (), (), stats)
        snap = store.snapshot(RUN_ID)
        log = services.log()
        pending = {e.idempotency_key for e in snap.effects if e.status == EffectStatus.PENDING}
        uncertain.update(pending)
        returned.update(returned_calls(golden, pending, log["raw"], ledger_at(snap)))
        check_at_fault(golden, kill, snap, log)
        # a commit may also have set the run resting for a decision (its approval now the only work),
        # or ended it (a node's outcome and the run's last transition in one commit)
        resting: tuple[RunStatus, ...] = (*RESTING, RunStatus.WAITING_HUMAN, RunStatus.PAUSED)
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
                        and (r.kind == "ok" or chaos_model.fails_for_good(r.body or {})))
            if stats is not None:  # turns the rule "no model re-roll" holds at this fault
                stats["durable_turns"] = stats.get("durable_turns", 0) + sum(map(is_turn, durable))
                stats["lost_turns"] = stats.get("lost_turns", 0) + len(lost)
        _, rests = settle(drivers, store, golden.spec, drivers.go(resumer, None))
        if stats is not None:
            stats["rests"] = stats.get("rests", 0) + rests
        with explained(golden, db):
            return check(golden, store, services.log(), kill, uncertain, returned, golden.executor, model, lost,
                         durable, stats)
    finally:
        drivers.stop()
        store.close()


@contextlib.contextmanager
def explained(golden: Golden, db: str) -> Iterator[None]:
    """A failed oracle check, noted with both runs' rows of the steps whose ledgers or nodes differ
    (``chaos_record.explain``): a flaky failure may not come back when hypothesis reruns it."""
    try:
        yield
    except AssertionError as exc:
        golden_db = f"sqlite:///{Path(golden.path).parent / 'golden.db'}"
        with contextlib.suppress(Exception):  # the note must never hide the failure itself
            exc.add_note(explain(golden_db, db))
        raise


def is_turn(label: str) -> bool:
    """A model turn's node label (``s2@1``, ``s1@0[1]``), not a tool call's (``s2@0.1``) nor a step's."""
    _, at, rest = label.partition("@")
    return bool(at) and "." not in rest.partition("[")[0] and ":" not in rest


def describe(golden: Golden) -> str:
    return json.dumps({"spec": golden.spec, "run": golden.run, "nodes": golden.nodes}, sort_keys=True)[:4000]
