"""What a driver reads to build its machine and to roll a run back, and which of the attempts it
cancels provably never left it.

The shell's I/O for the machine (``orchestrator.machine``); each function reads or inspects and
returns, the machine decides:

- ``restored``: the run's machine from its snapshot, with the blobs its rows and ledger need;
- ``rollback_inputs``: the run's rows as durable now and their blobs, the compensation ledger rows
  other runs of the lineage wrote (a fork undoes an inherited node under the key of the run that
  executed it, so parent and forks share the key: ``machine.rollback.Elsewhere``), and, for a run
  parked mid-rollback (a crash loop, a damaged blob: its error overwritten by the parking's), the
  forward cause its rollback kept (``rollback_cause``, beside ``rollback_started``), and the
  ledger rows of the agent tool calls a fork inherited (``inherited_calls``: whether they took
  effect, which the rollback asks as it does of the run's own calls);
- ``never_sent``: of the attempts about to be cancelled, those still queued in the driver (a Ray
  lane, never handed to Ray), so the machine can say they took no effect (``Calls.not_sent``).
"""

from __future__ import annotations

import math
import random
from collections.abc import Callable, Iterable, Sequence
from typing import Any

from raysaga.node_key import AGENT_SEP, NodeKey
from raysaga.orchestrator.executor import Executor, Handle, RayExecutor
from raysaga.orchestrator.in_flight import InFlight
from raysaga.orchestrator.machine.agent_limits import APPROVED_EVENT
from raysaga.orchestrator.machine.outbox import Dispatch, Send
from raysaga.orchestrator.machine.rollback import RollbackReads
from raysaga.orchestrator.machine.run import CAUSE_EVENT, RunMachine
from raysaga.orchestrator.machine.type_fit import check_types
from raysaga.orchestrator.options import RunOptions
from raysaga.orchestrator.rate_gate import RateGate
from raysaga.orchestrator.workflow import Workflow
from raysaga.sagas.rollback import PARKING_ERRORS, effect_time
from raysaga.state import Batch, EffectRecord, EffectStatus, NodeRecord, NodeStatus, RunRecord, RunSnapshot, Store
from raysaga.types import is_compensation

__all__ = ["EVENTS_WINDOW", "approved_args", "at_gate", "commits_first", "inherited_calls", "lineage_undos",
           "never_sent", "read", "restored", "rollback_inputs", "started_cause", "types_fit"]

#: Reads blobs by digest, each mapped to what reads it (``Driver.blobs``: verified, or it parks).
BlobReader = Callable[[dict[str, str]], dict[str, Any]]

#: Events read at a time, newest first, looking for the last rollback's cause (``started_cause``).
EVENTS_WINDOW = 200


def restored(wf: Workflow, snap: RunSnapshot, options: RunOptions, rng: random.Random,
             blobs: BlobReader, effect_window: int | None = None) -> tuple[RunMachine, dict[str, Any]]:
    """The run's machine restored from ``snap``, and its rows' output blobs (by digest);
    ``effect_window``: the executor's, an effect fan-out's items in flight at most (``Forward``)."""
    outputs = blobs({n.output_digest: f"node {n.label}" for n in snap.nodes if n.output_digest})
    completed = {(n.node_id, n.fan_index) for n in snap.nodes if n.status == NodeStatus.COMPLETED}
    ledger = blobs({  # results a resume may hand out from the ledger instead of a call
        e.result["blob"]: f"node {e.node_id}" for e in snap.effects
        if e.status == EffectStatus.COMMITTED and isinstance(e.result, dict) and set(e.result) == {"blob"}
        and (e.node_id, e.fan_index) not in completed})
    m = RunMachine(wf, snap.run, options, rng)
    m.forward.window.window = effect_window
    m.restore(snap, outputs, ledger)
    return m, outputs


def types_fit(wf: Workflow, snap: RunSnapshot, blobs: BlobReader) -> None:
    """``DefinitionChangedError`` when what the run's completed nodes stored does not read as the
    types ``wf`` declares now (``machine.type_fit``). Asked before ``versions.pin`` writes anything,
    and only for a run recorded under other types (``versions.types_may_differ``): under its own, a
    reader that cannot read its input fails as it would have uninterrupted (invariant 1)."""
    done = [n for n in snap.nodes if n.status == NodeStatus.COMPLETED and n.node_id in wf.steps]
    values = blobs({n.output_digest: f"node {n.label}" for n in done if n.output_digest})
    check_types(wf, snap.run.run_id, {NodeKey.parse(n.node_id, n.fan_index): values[n.output_digest]
                                      if n.output_digest else n.output for n in done}, snap.run.input)


def rollback_inputs(store: Store, run: RunRecord, blobs: BlobReader
                    ) -> tuple[list[NodeRecord], dict[str, Any], RollbackReads]:
    """What ``RunMachine.begin_rollback`` takes: the run's rows as durable now, their output blobs
    (verified and parsed: a missing, altered or non-JSON one parks the run), and ``read``'s."""
    rows = store.nodes(run.run_id)
    return rows, blobs({r.output_digest: f"node {r.label}" for r in rows if r.output_digest}), read(store, run, rows)


def read(store: Store, run: RunRecord, rows: list[NodeRecord]) -> RollbackReads:
    """What the rollback of ``run`` (its node rows ``rows``) needs from the store besides them."""
    cause = None
    error = run.error
    if error is not None and error.get("type") in PARKING_ERRORS:
        cause = started_cause(store, run)
    return RollbackReads(elsewhere=tuple(lineage_undos(store, run.run_id, rows)), cause=cause,
                         approved=approved_args(store, run.run_id, rows),
                         inherited=tuple(inherited_calls(store, run.run_id, rows)))


def inherited_calls(store: Store, run_id: str, rows: Iterable[NodeRecord]) -> list[EffectRecord]:
    """The ledger rows of the agent tool calls (``step@turn.call``) among the run's inherited rows
    ``rows``: they stay with the run that executed them (``Store.inherited_effects``), so the run's
    own ledger (the snapshot's) cannot say whether such a call took effect. No query when the run
    inherited no agent's call (not a fork, or one that ran its agents again)."""
    if not any(row.origin_run_id and AGENT_SEP in row.node_id for row in rows):
        return []
    return [e for e in store.inherited_effects(run_id) if AGENT_SEP in e.node_id and not is_compensation(e.node_id)]


def approved_args(store: Store, run_id: str, rows: Iterable[NodeRecord]) -> dict[tuple[str, int], dict[str, Any]]:
    """The arguments a human approved each tool call with (``APPROVED_EVENT``), of the calls a
    rollback may undo with their outcome unknown (their rows no longer hold them: a completed
    call's result does, ``RAN_KEY``). One query per such call: those in flight when the run stopped."""
    found: dict[tuple[str, int], dict[str, Any]] = {}
    for row in rows:
        if NodeKey.parse(row.node_id, row.fan_index).call is None or effect_time(row) != math.inf:
            continue
        for event in store.node_events(run_id, row.node_id, row.fan_index):
            args = event.data.get("args") if event.kind == APPROVED_EVENT and isinstance(event.data, dict) else None
            if isinstance(args, dict):
                found[row.node_id, row.fan_index] = args  # (the latest: events come oldest first)
    return found


def lineage_undos(store: Store, run_id: str, rows: Iterable[NodeRecord]) -> list[EffectRecord]:
    """Ledger rows of compensations written by the other runs that may share a key with this
    run's: every run of the trees rooted at this run and at the runs its nodes were inherited from
    (``origin_run_id``), their forks included. A run with no fork and no inherited node costs one
    query (its children: none)."""
    roots = {run_id} | {row.origin_run_id for row in rows if row.origin_run_id}
    return [e for other in store.lineage(roots) if other != run_id
            for e in store.effects(other) if is_compensation(e.node_id)]


def started_cause(store: Store, run: RunRecord) -> Any:
    """The forward cause the run's last rollback kept (its ``rollback_cause`` event, written with
    ``rollback_started``; None if it kept none), read back a window at a time from the newest
    event: a parked run's rollback started near its end."""
    newest = run.event_seq
    while newest > 0:
        oldest = max(0, newest - EVENTS_WINDOW)
        for event in reversed(store.events(run.run_id, after_seq=oldest, limit=newest - oldest)):
            if event.kind == CAUSE_EVENT:
                return event.data.get("cause") if isinstance(event.data, dict) else None
            if event.kind == "rollback_started":
                return None  # a rollback that kept no cause (a cancel's, or one before causes were kept)
        newest = oldest
    return None


def never_sent(attempts: InFlight, executor: Executor, wf: Workflow, keys: Iterable[NodeKey]) -> list[NodeKey]:
    """Of ``keys`` (attempts about to be cancelled), those provably never sent: still queued at the
    rate gate, never admitted (``at_gate``: any attempt, an agent's tool call too, on any executor:
    nothing of it left the driver), or still queued in a Ray executor's lane (its handle neither
    ``sent`` nor holding a task), so the cancel drops them before they leave the driver. Of the
    latter, only a step's or item's own attempt, without a rate limit (a limited one's handle is
    the gate's, whose ``sent`` may lag its inner attempt's), and only on the Ray executor, which
    keeps ``sent`` exact; anything else may have started, and stays undone by a rollback as an
    attempt whose outcome is unknown."""
    keys = list(keys)
    if not keys:
        return []
    on_ray = isinstance(getattr(executor, "inner", executor), RayExecutor)
    found = []
    for key in keys:
        sent = attempts.sent.get(key)
        if sent is None:
            continue
        if at_gate(executor, sent.handle):
            found.append(key)
            continue
        spec = wf.steps.get(key.node_id)
        if (not on_ray or spec is None or key.is_agent_call or key.compensates or spec.rate_limit is not None
                or sent.handle.sent or sent.handle.ref is not None or sent.handle.outcome is not None):
            continue
        found.append(key)
    return found


def at_gate(executor: Executor, handle: Handle) -> bool:
    """Whether ``handle``'s attempt still waits at ``executor``'s rate gate for its admission: its
    inner attempt was never submitted (``RateGate`` sends it only once admitted), so it never left."""
    return isinstance(executor, RateGate) and executor.queued(handle)


def commits_first(batch: Batch, sends: Sequence[Send]) -> bool:
    """Whether ``batch`` must be durable before ``sends`` leave: its ledger 'pending' rows and
    compensated steps' 'running' rows (a rollback after a crash must know the call may have
    happened), and other nodes' 'waiting' rows (an approval asked in this round is decidable while
    an inline sibling runs at submit, not only once that returned, its timeout maybe passed).
    And anything before a ``local=True`` step (``local_steps``): it runs in this thread, maybe for
    a while, and what finished before it is durable (and serialized) before it starts."""
    if batch.effects or (not batch.empty() and any(isinstance(d, Dispatch) and d.spec.local for d in sends)):
        return True
    sent = {(d.key.node_id, d.key.fan_index) for d in sends if isinstance(d, Dispatch)}
    return any(n.status == NodeStatus.RUNNING
               or (n.status == NodeStatus.WAITING and (n.node_id, n.fan_index) not in sent) for n in batch.nodes)
