"""What a chaos-suite run left, read back for the oracle (``tests.support.chaos_oracle``): the
golden run's record (``Golden``), the run's view, its nodes, ledger, completions and compensation
order, the model's requests, and the calls each key is planned to send (``planned_calls``).

Not a test module; ``tests.support.chaos_sweep`` re-exports what the tests import from it.
"""

from __future__ import annotations

import re
from collections.abc import Collection
from dataclasses import dataclass, field
from typing import Any

from raysaga.state import EffectStatus, NodeStatus, SqlStore
from raysaga.state.item_events import item_indexes
from tests.support import chaos_flows, chaos_model
from tests.support.kill_sweep import EFFECT_POINTS, ledger_label
from tests.support.messages_server import MessagesServer

RUN_ID = "chaos-1"  # golden and faulted runs share the id and the input: their keys must match
SUFFIX = ":compensate"

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
    executor: str = "inline"
    asked: dict[str, set[str]] = field(default_factory=dict)  # agent -> the request keys its model answered
    tokens_used: int = 0
    rests: int = 0  # how often the run rested waiting for a decision
    arrivals: dict[str, int] = field(default_factory=dict)  # model request key -> how often it arrived
    turns: dict[str, str] = field(default_factory=dict)  # model request key -> its turn's label
    raw: dict[str, int] = field(default_factory=dict)  # key -> how many calls with it reached the provider
    executions: dict[str, int] = field(default_factory=dict)  # node label -> how often it completed


def planned_calls(golden: Golden, ledger: dict[str, tuple[str, str]] | None = None) -> dict[str, int]:
    """Keys whose calls reach the provider more than once by plan, and how often: a call of the
    tool whose first reply is lost (``chaos_flows.act_lost``: its first attempt takes effect, then
    raises; its retry re-sends the key, deduped) is sent ``chaos_flows.LOST_CALLS`` times in any
    run that completes it. Every other key is planned once. Only these keys, only that count.

    The calls are those of the golden run's ledger and of ``ledger`` (another run's, label ->
    (key, status)): a node that raced a failure may have run in that run only (random DAG
    ``chaos_3046f0e762`` on Ray: ``s6@0.0[0]``, ``s11@0.0``, ...). A label's key is the same in
    every run of the DAG (``check`` asserts it for the labels both ledgers hold)."""
    steps = {s["name"]: s for s in golden.spec["steps"]}
    return {key: chaos_flows.LOST_CALLS for label, (key, _) in {**(ledger or {}), **golden.ledger}.items()
            if chaos_flows.tool_at(steps.get(label.partition("@")[0]), label) in chaos_flows.LOST}


def returned_calls(golden: Golden, pending: Collection[str], raw: dict[str, int],
                   ledger: dict[str, tuple[str, str]] | None = None) -> set[str]:
    """The keys ``pending`` at a fault whose planned call had returned (``raw``: the provider's
    counts then; ``ledger``: the run's at the fault): the call that ends the plan (its last,
    ``planned_calls``) reached the provider, so a resume re-sends it once more. A lost reply's key
    with only its first call sent is not among them: the resume's call is its planned retry."""
    planned = planned_calls(golden, ledger)
    return {key for key in pending if raw.get(key, 0) >= planned.get(key, 1)}


def reset_model(model: MessagesServer) -> None:
    """A fresh log, and the responder's arrival counts with it (``chaos_model.ChaosModel``)."""
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
    (``chaos_model.planned_faults``) for its first arrivals since the model's reset, the error of
    a turn that fails for good (``chaos_model.fails_for_good``); an answer otherwise."""
    seen: dict[str, int] = {}
    for r in requests:
        n = seen[r.key] = seen.get(r.key, 0) + 1
        planned = chaos_model.planned_faults(r.body)
        if n <= len(planned):
            want = {"drop": "drop", "stall": "timeout"}.get(planned[n - 1], "fault")
        else:
            want = "fault" if chaos_model.fails_for_good(r.body) else "ok"
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


def ledger_at(snap: Any) -> dict[str, tuple[str, str]]:
    """``ledger_of`` a run's snapshot (``store.snapshot``: at a fault)."""
    return {ledger_label(e): (e.idempotency_key, e.status.value) for e in snap.effects}



def turn_label(request: Any) -> str:
    """A model request's node label: ``<agent step>@<turn>``, ``<agent step>@<turn>[<item>]`` in a fan-out."""
    fields, _ = chaos_model.parse_prompt(str(request.conversation))
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


def step_of(golden: Golden, label: str) -> dict[str, Any] | None:
    name = label.partition("[")[0]
    return next((s for s in golden.spec["steps"] if s["name"] == name), None)



def forward_label(label: str) -> str:
    """``s4:compensate[2]`` -> ``s4[2]``; a forward label stays as it is."""
    head, _, item = label.partition("[")
    return head.removesuffix(SUFFIX) + (f"[{item}" if item else "")



def explain(golden_db: str, run_db: str, limit: int = 40) -> str:
    """What a failed oracle check leaves the next reader: both stores' paths (kept in pytest's
    tmp folders) and, for each step whose ledger rows or node statuses differ between the golden
    run and the faulted one, both runs' rows of that step (label, status, error type, reason and
    message) and events: the Ray sweep's open ``FlakyFailure`` (``chaos_bbb549af2e``) had only the
    ledgers to go on."""
    read: dict[str, tuple[dict[str, tuple[str, str]], list[Any], list[Any]]] = {}
    for name, db in (("golden", golden_db), ("faulted", run_db)):
        store = SqlStore(db)
        try:
            read[name] = (ledger_of(store), store.nodes(RUN_ID), store.events(RUN_ID))
        finally:
            store.close()
    (ledger_g, nodes_g, _), (ledger_f, nodes_f, _) = read["golden"], read["faulted"]
    states_g, states_f = ({n.label: n.status.value for n in nodes} for nodes in (nodes_g, nodes_f))
    differ = {_step(label) for label in set(ledger_g) ^ set(ledger_f)}
    differ |= {_step(label) for label in set(states_g) | set(states_f) if states_g.get(label) != states_f.get(label)}
    lines = [f"golden store: {golden_db}", f"faulted store: {run_db}", f"steps that differ: {sorted(differ)}"]
    for name, (_, nodes, events) in read.items():
        rows = [n for n in nodes if _step(n.label) in differ]
        lines.append(f"{name}: {len(rows)} rows")
        for n in rows[:limit]:
            err = n.error
            lines.append(f"  {n.label} {n.status.value}" + ("" if err is None else
                         f" {err.type}: {err.reason or ''} {str(err.message or '')[:160]!r}"))
        lines += [f"  event {e.seq} {e.kind} {e.node_id}[{e.fan_index}]"
                  for e in [e for e in events if _step(e.node_id or "") in differ][:limit]]
    return "\n".join(lines)


def _step(label: str) -> str:
    """The step of a node or ledger label (``s13`` of ``s13@0.1[2]:compensate``)."""
    return re.split(r"[@\[:]", label, maxsplit=1)[0]
