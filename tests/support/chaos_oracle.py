"""The chaos suite's oracle: a faulted-and-resumed run against its golden run (``check``).

Per DAG (``tests.support.chaos_sweep``): a golden run goes uninterrupted in a driver process; its
record (``tests.support.chaos_record.Golden``) says which fault points the run passes
(``reachable``). Each case faults a driver at one of them (SIGKILL, or ``raise``), a new process
resumes the run to rest, and ``check`` compares the result with the golden run:

- the run's status, output, error and status reason equal golden, and every node's status,
  but for nodes that raced a failure (``raced``: a resume may dispatch independent nodes in
  another order than the golden run did, so one of them may have run before the failure in
  one run and not in the other); those are reported, and everything below leaves them out.
  Such a race may also decide between ``failed`` and ``compensated`` (a compensated node that
  completed before the failure in one run only): then the error must be the same, and every
  compensation only one of the runs made must be of a node that raced (``rolled_back_raced``).
  On Ray two critical failures may race too: the run may name the other one
  (``other_failure_first``: each failed, or raced, in both runs);
- every node (forward and compensation) completed as often as in the golden run, but for those
  that raced (``node_completed`` and ``items_completed`` events, ``kill_sweep.completion_counts``:
  each commits with its node's row, so a node in flight at the fault completes once, after the
  resume; a step committed completed at the fault and run again shows here only, its output
  and status the same);
- the ledger holds exactly the golden keys (per node label), none left ``pending`` (``pending_rows``);
- the provider saw one *effective* call per golden key and no other key, the same effects per
  subject (on Ray, a key whose row ended ``abandoned`` in both runs may have taken effect in one
  only: its call was in flight when the failure cancelled it, ``effective_differs``); a key got
  a second *raw* call only if its ledger row was ``pending`` at the fault (the call's outcome
  was unknown); with the inline executor (nothing in flight at a fault)
  exactly the calls that had returned with their rows still ``pending`` are re-issued, once.
  One tool's calls reach the provider twice by plan (``chaos_flows.act_lost``: its first attempt
  takes effect, then raises, its reply lost; the retry re-sends the key and the provider
  dedupes): for exactly those keys (``chaos_record.planned_calls``, from the spec: the calls of
  that tool, in either run's ledger: a node that raced may have run in one only) "once" reads
  ``chaos_flows.LOST_CALLS`` times, a re-send is a call beyond them, and
  "had returned" means the planned last call had (``returned_calls``: a fault after the lost
  reply only is followed by the planned retry, not by a re-send). Inline, such a key saw exactly
  the golden run's calls plus that one re-send; on any executor at most one more than planned;
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

"""

from __future__ import annotations

from collections.abc import Collection
from typing import Any

import networkx as nx

from raysaga.node_key import AGENT_SEP
from raysaga.sagas.rollback import UNKNOWN_OUTCOME
from raysaga.state import EffectStatus, NodeStatus, SqlStore
from tests.support import chaos_flows
from tests.support.chaos_record import (
    RUN_ID,
    SUFFIX,
    UNDONE,
    Golden,
    Kill,
    agent_of,
    check_replies,
    completions,
    forward_label,
    ledger_of,
    model_requests,
    node_states,
    pending_rows,
    planned_calls,
    run_view,
    step_of,
    turn_label,
    undo_order,
)
from tests.support.kill_sweep import completion_counts, differing_counts, ledger_label
from tests.support.messages_server import MessagesServer


def check_at_fault(golden: Golden, kill: Kill, snap: Any, log: dict[str, Any]) -> None:
    """The fault point meant what it says: what was durable, and what the provider saw, then.

    ``after_commit`` names a node whose state after the commit is an outcome (``Driver._flush``,
    ``faults.commit_labels``), on every executor: a batch holding a failed attempt and the start
    of its retry due at once (on Ray: random DAG ``chaos_3046f0e762``, ``after_commit:s7[0]``)
    names it no more, so the node is never ``running`` there (``test_regressions_pass6.py``)."""
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
        step = step_of(golden, label)
        first_try_succeeds = step is not None and step.get("fate", "ok") == "ok" and step["kind"] != "map" \
            and chaos_flows.tool_at(step, label) != "act_flaky"  # its first attempt fails before the call
        if first_try_succeeds and ledger[label].status == EffectStatus.PENDING:
            assert log["raw"].get(key) == 1, f"{kill}: the call should have returned"


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
    executions = completion_counts(store, RUN_ID)
    counted = {label for label in set(executions) | set(golden.executions) if forward_label(label) not in race}
    differ = differing_counts(executions, golden.executions, among=counted)
    assert not differ, f"{kill}: nodes completed other than as in the golden run (here, golden): {differ}"
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
    planned = planned_calls(golden, ledger)  # this run's ledger too: a node that raced may have run here only
    repeated = {key for key, n in log["raw"].items() if n > planned.get(key, 1)}
    assert repeated <= set(uncertain), (kill, repeated, uncertain)
    assert all(log["raw"][key] <= n + 1 for key, n in planned.items() if key in log["raw"]), \
        (kill, {key: log["raw"].get(key) for key in planned})
    if stats is not None:  # how often the allowance mattered: a lost reply's key sent twice, not uncertain
        # (the rule without the allowance would have failed), or uncertain at the fault with only
        # its first call sent (the resume sent its planned retry), or re-sent once more (returned)
        many = {key for key in planned if log["raw"].get(key, 0) > 1}
        stats["lost_planned"] = stats.get("lost_planned", 0) + len(many - set(uncertain))
        stats["lost_retried_across"] = stats.get("lost_retried_across", 0) + len(
            many & set(uncertain) - set(returned))
        stats["lost_resent"] = stats.get("lost_resent", 0) + len(repeated & set(planned))
    if executor == "inline":  # nothing is in flight at a fault: exactly the calls that had returned repeat, once
        cancelled = {golden.ledger[label][0] for label, status in golden.nodes.items()
                     if status == NodeStatus.CANCELLED.value and label in golden.ledger}  # never re-sent
        assert repeated == set(returned) - cancelled, (kill, repeated, returned)
        assert all(n <= planned.get(key, 1) + 1 for key, n in log["raw"].items()), (kill, log["raw"])
        # a lost reply's retry happened exactly as in the golden run, plus the one re-send above
        lost_calls = {label: (log["raw"].get(key, 0), golden.raw.get(key, 0), key in set(returned) - cancelled)
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
            stats["stalled_requests"] = stats.get("stalled_requests", 0) + sum(
                r.kind == "timeout" for r in model_requests(model, executor))
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
    faulted run only). Inline nothing is in flight at a failure, but an agent cut off by it
    (``cancelled`` in both runs) may have got further in one: its retry backoffs are wall-clock
    timers racing the failure, and a resume finds them run out (random DAG ``chaos_6f4b7c1e45``:
    ``s15[0]``, an item of a best-effort agent fan-out retrying 500s, asked its third turn before
    ``s11`` failed in the golden run, not in one resumed after a kill). Its requests then differ
    only by the turns one run asked after the other stopped: one set holds the other."""
    cut = {label for label, status in nodes.items() if executor != "inline" and AGENT_SEP in label
           and status == NodeStatus.CANCELLED.value == golden.nodes.get(label)}
    turn_of = {**golden.turns, **labels}
    allowed: set[str] = set()
    for agent in set(golden.asked) | set(asked):
        if agent not in racing and golden.nodes.get(agent) == nodes.get(agent):
            mine, theirs = asked.get(agent, set()), golden.asked.get(agent, set())
            here, there = sorted(turn_of[k] for k in mine - theirs), sorted(turn_of[k] for k in theirs - mine)
            if nodes.get(agent) == NodeStatus.CANCELLED.value and (mine <= theirs or theirs <= mine):
                allowed.update(here + there)
                continue
            assert {turn_of[k] for k in mine ^ theirs} <= cut, \
                f"{kill}: {agent} was asked other requests than in the golden run: here only {here}, " \
                f"in golden only {there} (cancelled in flight in both: {sorted(cut)})"
            allowed.update(here + there)
    return len(allowed)

