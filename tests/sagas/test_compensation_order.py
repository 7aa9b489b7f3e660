"""Invariant 5's order: compensations run in reverse dependency order, and only where they must.

Flows from ``tests.support.saga_flows``: every forward effect calls the fake provider (kind ``do``)
and every compensation calls it too (kind ``undo``), so the provider's ordered call log is
the order the world saw the undos in. For each rollback the test checks, against networkx on
the workflow's own graph:

- the run ends ``compensated``; every compensation ran exactly once, under its own key;
- the set of compensated nodes is exactly the completed (or outcome-unknown) nodes of the
  steps that declare a compensation: effects, fan-out items one by one, and a plain step
  with a compensation; plain steps without one, and a step that failed permanently, are not;
- for every pair where step X is an ancestor of step Y, Y's undo reached the provider before
  X's (a valid reverse topological order of the compensated nodes);
- each compensation received the step's committed output, or ``None`` when the step's
  outcome was unknown: a sibling in flight on Ray when the critical step failed (its ledger
  row still ``pending``), or an effect whose retries ran out on transient errors after its
  call had landed.
"""

from __future__ import annotations

from collections.abc import Iterator, Set
from pathlib import Path
from typing import Any

import networkx as nx
import pytest

import raysaga
from raysaga.state import EffectStatus, NodeStatus, RunStatus, SqlStore
from tests.support import saga_driver as harness
from tests.support.services import FakeServices

flows = harness.load_flows()
SUFFIX = flows.COMPENSATE_SUFFIX
RUN_ID = "order-1"

Node = tuple[str, int]


def label(node: Node) -> str:
    return node[0] if node[1] < 0 else f"{node[0]}[{node[1]}]"


@pytest.fixture
def services() -> Iterator[Any]:
    with FakeServices() as fake:
        yield fake


@pytest.fixture
def db(tmp_path: Path) -> Iterator[tuple[str, SqlStore]]:
    url = f"sqlite:///{tmp_path / 'order.db'}"
    store = SqlStore(url)
    yield url, store
    store.close()


def undo_order(store: SqlStore, run_id: str, log: dict[str, Any]) -> list[Node]:
    """The compensated nodes, in the order their undo first reached the provider."""
    by_key = {e.idempotency_key: (e.node_id, e.fan_index) for e in store.effects(run_id)}
    order: list[Node] = []
    for call in log["calls"]:
        if call["kind"] != "undo":
            continue
        comp_step, index = by_key[call["key"]]
        assert comp_step.endswith(SUFFIX), f"an undo under a forward node's key: {comp_step}"
        node = (comp_step.removesuffix(SUFFIX), index)
        if node not in order:
            order.append(node)
    return order


def check_rollback(wf: raysaga.Workflow, store: SqlStore, run_id: str, log: dict[str, Any],
                   expected: set[Node], unknown: Set[Node] = frozenset(), *, serial: bool = True) -> list[Node]:
    """Everything the module docstring promises, for one finished rollback. Returns the order.
    ``serial``: the undos ran one at a time (inline), so the provider saw them in the order they
    were handed out; on Ray undos free at once run together and reach it in any order."""
    run = store.get_run(run_id)
    assert run.status == RunStatus.COMPENSATED, (run.status, run.status_reason, run.error)
    rows = {(n.node_id, n.fan_index): n for n in store.nodes(run_id)}

    # exactly the nodes that had to be undone were undone, each once under its own key
    order = undo_order(store, run_id, log)
    assert set(order) == expected, f"compensated {sorted(map(label, order))}, expected {sorted(map(label, expected))}"
    assert len(order) == len(expected)
    comp_rows = {(k[0].removesuffix(SUFFIX), k[1]): r for k, r in rows.items() if k[0].endswith(SUFFIX)}
    assert set(comp_rows) == expected, "a compensation node exists that should not (or one is missing)"
    assert {r.status for r in comp_rows.values()} == {NodeStatus.COMPLETED}
    comp_keys = {e.idempotency_key for e in store.effects(run_id) if e.node_id.endswith(SUFFIX)}
    assert len(comp_keys) == len(expected)
    assert all(log["effective"].get(k) == 1 and log["raw"].get(k) == 1 for k in comp_keys), log
    for (step, index), row in rows.items():  # nothing else was compensated
        if step.endswith(SUFFIX) or (step, index) in expected:
            continue
        spec = wf.steps[step]
        assert (wf.compensation_for(step) is None or row.status == NodeStatus.FAILED
                or (spec.map_over is not None and index < 0)), f"{label((step, index))} was not compensated"

    # reverse dependency order: a node only after every compensated node downstream of it
    position = {node: i for i, node in enumerate(order)}
    pairs = 0
    for x in order:
        below = nx.descendants(wf.graph, x[0])
        for y in order:
            if y[0] in below:
                pairs += 1
                assert position[y] < position[x], (
                    f"{label(x)} was undone before {label(y)}, which depends on it: {list(map(label, order))}")
    assert pairs > 0, "the flow gave the order nothing to prove"

    # reverse completion order where the DAG leaves it open: of two nodes with no path between
    # them, both completed, the later-completed one was undone first (DESIGN, invariant 5)
    done: dict[Node, float] = {n: at for n in order if n not in unknown and rows[n].status == NodeStatus.COMPLETED
                               and (at := rows[n].finished_at) is not None}
    for x in (done if serial else ()):
        for y in done:
            apart = x[0] != y[0] and y[0] not in nx.descendants(wf.graph, x[0]) and \
                x[0] not in nx.descendants(wf.graph, y[0])
            if (apart or x[0] == y[0]) and x != y and done[x] < done[y]:  # (items of one fan-out too)
                assert position[y] < position[x], (
                    f"{label(x)} completed before {label(y)} but was undone first: {list(map(label, order))}")

    # each compensation got the step's committed output, or None when its outcome was unknown
    for node, comp in comp_rows.items():
        if node in unknown:
            assert comp.output["had_output"] is False and comp.output["got"] is None, label(node)
        else:
            assert rows[node].status == NodeStatus.COMPLETED
            assert comp.output["had_output"] is True and comp.output["got"] == rows[node].output, label(node)
    return order


def run_inline(flow: str, url: str, services: Any) -> None:
    record = raysaga.run(flows.FLOWS[flow], flows.sample_input(flow, services.url), store=url, run_id=RUN_ID,
                         executor="inline")
    assert record.status == RunStatus.COMPENSATED, (record.status_reason, record.error)


def test_diamond_compensates_b_and_c_before_a(services: Any, db: tuple[str, SqlStore]) -> None:
    url, store = db
    run_inline("diamond", url, services)
    expected = {("a", -1), ("b", -1), ("c", -1)}  # d failed permanently before its call: nothing to undo
    order = check_rollback(flows.diamond, store, RUN_ID, services.log(), expected)
    assert order[-1] == ("a", -1)
    events = [e.kind for e in store.events(RUN_ID)]
    assert events.index("rollback_started") < len(events) - 1


def test_ten_step_dag_with_an_effect_fan_out(services: Any, db: tuple[str, SqlStore]) -> None:
    url, store = db
    run_inline("wide10", url, services)
    wf = flows.wide10
    assert len(wf.steps) == 10
    expected = {("a", -1), ("b", -1), ("c", -1), ("stamp", -1), ("notify", -1),
                *{("work", i) for i in range(flows.WORK_ITEMS)}}
    order = check_rollback(wf, store, RUN_ID, services.log(), expected)
    # plain steps without a compensation, the fan-out's parent and the failed step: no undo
    names = {n.node_id for n in store.nodes(RUN_ID)}
    assert not names & {"plan:compensate", "merge:compensate", "audit:compensate", "finish:compensate"}
    assert ("work", -1) not in order
    assert order[0] == ("notify", -1) and order[-1] == ("a", -1)


def test_outcome_unknown_after_transient_exhaustion_is_compensated(services: Any,
                                                                    db: tuple[str, SqlStore]) -> None:
    """b's call landed but every attempt lost its reply: b failed with a transient error, its
    outcome unknown; it is compensated (output None), before a."""
    url, store = db
    run_inline("unknown", url, services)
    rows = {n.label: n for n in store.nodes(RUN_ID)}
    assert rows["b"].error is not None
    assert rows["b"].status == NodeStatus.FAILED and rows["b"].error["transient"] is True
    order = check_rollback(flows.unknown, store, RUN_ID, services.log(), {("a", -1), ("b", -1)},
                           unknown={("b", -1)})
    assert order == [("b", -1), ("a", -1)]


# ---------------------------------------------------------------------- on Ray


def _run_on_ray(flow: str, url: str, services: Any, control: Path | None = None) -> Any:
    done = harness.run_driver(flow, url, RUN_ID, executor="ray", timeout=180,
                              run_input=flows.sample_input(flow, services.url, str(control) if control else None))
    assert done.returncode == 0, done.describe()
    return done


@pytest.mark.ray
def test_diamond_on_ray(ray_address: str, services: Any, db: tuple[str, SqlStore]) -> None:
    """b's and c's undos may run at the same time on Ray; a's still waits for both."""
    url, store = db
    _run_on_ray("diamond", url, services)
    order = check_rollback(flows.diamond, store, RUN_ID, services.log(), {("a", -1), ("b", -1), ("c", -1)},
                           serial=False)
    assert order[-1] == ("a", -1)


@pytest.mark.ray
def test_sibling_in_flight_at_the_failure_is_compensated(ray_address: str, services: Any,
                                                          db: tuple[str, SqlStore], tmp_path: Path) -> None:
    """c fails while b (an effect whose call landed) is still running on a Ray worker: the
    driver cancels b, and b is compensated with output=None (its outcome unknown), before a;
    when the run ends, b's ledger row, still pending, is ``abandoned`` (nothing stays ``pending``)."""
    url, store = db
    control = tmp_path / "control"
    control.mkdir()
    try:
        _run_on_ray("inflight", url, services, control)
    finally:
        (control / "release").touch()  # a b that somehow outlived its cancellation returns now
    rows = {n.label: n for n in store.nodes(RUN_ID)}
    assert rows["c"].status == NodeStatus.FAILED
    assert rows["b"].status in (NodeStatus.CANCELLED, NodeStatus.RUNNING), rows["b"]
    ledger = {e.node_id: e for e in store.effects(RUN_ID)}
    assert ledger["b"].status == EffectStatus.ABANDONED, ledger["b"]
    log = services.log()
    order = check_rollback(flows.inflight, store, RUN_ID, log, {("a", -1), ("b", -1)}, unknown={("b", -1)},
                           serial=False)
    assert order == [("b", -1), ("a", -1)]
    assert [c["kind"] for c in log["calls"]] == ["do", "do", "undo", "undo"]
