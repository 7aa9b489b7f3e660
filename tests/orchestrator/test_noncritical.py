"""Non-critical steps: a failure for good is recorded and handed on, never rolls the run back.

``critical=False`` (``on_failure="skip"``, the default) skips every step downstream of the
failed one, with a reason naming it; ``on_failure="pass"`` runs the dependents and hands them
``{"failed": True, "step", "error_type", "message"}`` in place of the output. Either way the
branches that do not depend on it complete and the run ends ``completed``. Inline executor:
the steps run in this process, so a module-level list sees what each step received.
"""

from __future__ import annotations

from typing import Any, Literal

import pytest

import raysaga
from raysaga import (
    BEST_EFFORT,
    Permanent,
    RetryPolicy,
    RunStatus,
    StepContext,
    Workflow,
    quorum,
)
from raysaga.state import EventRecord, NodeRecord, NodeStatus, SqlStore

SEEN: list[tuple[str, Any]] = []  # (step, what it received)
UNDONE: list[str] = []
FAST = RetryPolicy(max_attempts=2, base=0.01, cap=0.01)


@pytest.fixture(autouse=True)
def _fresh_logs() -> None:
    SEEN.clear()
    UNDONE.clear()


def _facts(url: str, run_id: str) -> tuple[dict[str, NodeRecord], list[EventRecord]]:
    store = SqlStore(url)
    try:
        return {n.label: n for n in store.nodes(run_id)}, store.events(run_id)
    finally:
        store.close()


ERRORS = {
    "permanent": (Permanent("enrichment quota exceeded"), "Permanent", "enrichment quota exceeded", 1),
    "exhausted": (ConnectionError("enrichment service unreachable"), "ConnectionError",
                  "enrichment service unreachable", 2),
}


def _flow(name: str, on_failure: Literal["skip", "pass"], error: BaseException) -> Workflow:
    """charge (compensable effect) → enrich (non-critical, fails) → use → report; charge → core → report."""
    wf = Workflow(name)

    def refund(output: str) -> None:
        UNDONE.append(output)

    @wf.step(effect=True, compensate=refund)
    def charge(ctx: StepContext, input: int) -> str:
        return f"charge-{input}"

    @wf.step(critical=False, on_failure=on_failure, retry=FAST)
    def enrich(charge: str) -> dict[str, str]:
        SEEN.append(("enrich", charge))
        raise error

    @wf.step()
    def use(enrich: Any) -> str:
        SEEN.append(("use", enrich))
        return "fallback" if isinstance(enrich, dict) and enrich.get("failed") else "enriched"

    @wf.step()
    def core(charge: str) -> str:
        SEEN.append(("core", charge))
        return charge.upper()

    @wf.step()
    def report(use: str, core: str) -> str:
        SEEN.append(("report", (use, core)))
        return f"{use}/{core}"

    return wf


@pytest.mark.parametrize("error", sorted(ERRORS))
def test_skip_skips_every_dependent_and_the_rest_completes(store_url: str, error: str) -> None:
    exc, error_type, message, attempts = ERRORS[error]
    record = raysaga.run(_flow("nc-skip", "skip", exc), 7, store=store_url, executor="inline")
    nodes, events = _facts(store_url, record.run_id)
    assert record.status == RunStatus.COMPLETED, record.status_reason
    assert record.output == {}  # the only sink, 'report', was skipped
    enrich = nodes["enrich"]
    assert (enrich.status, enrich.attempt) == (NodeStatus.FAILED, attempts)
    assert enrich.error is not None
    assert (enrich.error["type"], enrich.error["message"]) == (error_type, message)
    for skipped in ("use", "report"):
        assert nodes[skipped].status == NodeStatus.SKIPPED
        assert nodes[skipped].error == {"reason": "upstream step 'enrich' failed"}
    assert {e.node_id: e.data for e in events if e.kind == "node_skipped"} == {
        "use": {"because": "enrich"}, "report": {"because": "enrich"}}
    assert (nodes["core"].status, nodes["core"].output) == (NodeStatus.COMPLETED, "CHARGE-7")
    assert sorted(step for step, _ in SEEN) == ["core"] + ["enrich"] * attempts  # skipped steps never ran
    # a non-critical failure is no reason to undo anything
    assert UNDONE == []
    assert "rollback_started" not in {e.kind for e in events}


@pytest.mark.parametrize("error", sorted(ERRORS))
def test_pass_hands_the_dependents_a_failure_record(store_url: str, error: str) -> None:
    exc, error_type, message, attempts = ERRORS[error]
    record = raysaga.run(_flow("nc-pass", "pass", exc), 7, store=store_url, executor="inline")
    nodes, events = _facts(store_url, record.run_id)
    assert record.status == RunStatus.COMPLETED, record.status_reason
    assert record.output == {"report": "fallback/CHARGE-7"}
    failed_record = {"failed": True, "step": "enrich", "error_type": error_type, "message": message}
    assert ("use", failed_record) in SEEN
    assert ("report", ("fallback", "CHARGE-7")) in SEEN
    assert nodes["enrich"].status == NodeStatus.FAILED and nodes["enrich"].attempt == attempts
    assert {label: n.status for label, n in nodes.items() if label != "enrich"} == {
        label: NodeStatus.COMPLETED for label in ("charge", "use", "core", "report")}
    assert not [e for e in events if e.kind == "node_skipped"]
    assert UNDONE == []


def _fan_out_flow(name: str, **options: Any) -> Workflow:
    """plan → item (5 items, item 1 fails for good) → gather; plan → count → total (independent)."""
    wf = Workflow(name)

    @wf.step()
    def plan(input: int) -> list[int]:
        return list(range(input))

    @wf.map("plan", critical=False, **options)
    def item(plan: int) -> int:
        if plan == 1:
            raise Permanent(f"item {plan} refused")
        return plan * 10

    @wf.step()
    def gather(item: Any) -> str:
        SEEN.append(("gather", item))
        return "gathered"

    @wf.step()
    def after_gather(gather: str) -> str:
        return gather

    @wf.step()
    def count(plan: list[int]) -> int:
        return len(plan)

    @wf.step()
    def total(count: int) -> int:
        return count * 100

    return wf


def test_non_critical_fan_out_item_failure_skips_only_its_dependents(store_url: str) -> None:
    record = raysaga.run(_fan_out_flow("nc-fanout"), 5, store=store_url, executor="inline")
    nodes, events = _facts(store_url, record.run_id)
    assert record.status == RunStatus.COMPLETED, record.status_reason
    assert record.output == {"total": 500}
    assert nodes["item[1]"].status == NodeStatus.FAILED
    assert nodes["item[1]"].error is not None
    assert nodes["item[1]"].error["message"] == "item 1 refused"
    assert nodes["item"].status == NodeStatus.FAILED
    for skipped in ("gather", "after_gather"):
        assert nodes[skipped].status == NodeStatus.SKIPPED
        assert nodes[skipped].error == {"reason": "upstream step 'item' failed"}
    assert (nodes["count"].status, nodes["total"].status) == (NodeStatus.COMPLETED, NodeStatus.COMPLETED)
    assert SEEN == []
    assert "fanout_decision" not in {e.kind for e in events}  # ALL: no policy is asked


def test_non_critical_fan_out_with_pass_hands_on_the_item_failure(sqlite_url: str) -> None:
    record = raysaga.run(_fan_out_flow("nc-fanout-pass", on_failure="pass"), 5, store=sqlite_url,
                         executor="inline")
    nodes, _ = _facts(sqlite_url, record.run_id)
    assert record.status == RunStatus.COMPLETED, record.status_reason
    assert record.output == {"after_gather": "gathered", "total": 500}
    assert SEEN == [("gather", {"failed": True, "step": "item", "error_type": "Permanent",
                                "message": "item 1 refused"})]
    assert nodes["item"].status == NodeStatus.FAILED


def test_non_critical_fan_out_whose_policy_fails_skips_its_dependents(sqlite_url: str) -> None:
    record = raysaga.run(_fan_out_flow("nc-quorum", policy=quorum(5)), 5, store=sqlite_url, executor="inline")
    nodes, events = _facts(sqlite_url, record.run_id)
    assert record.status == RunStatus.COMPLETED, record.status_reason
    assert record.output == {"total": 500}
    [decision] = [e.data for e in events if e.kind == "fanout_decision"]
    assert (decision["verdict"], decision["successes"], decision["failures"]) == ("fail", 4, [1])
    assert nodes["item"].status == NodeStatus.FAILED
    assert nodes["item"].error is not None
    assert nodes["item"].error["message"] == "quorum not met: 4 of 5 succeeded, 5 needed"
    assert {nodes[f"item[{i}]"].status for i in (0, 2, 3, 4)} == {NodeStatus.COMPLETED}
    assert nodes["gather"].status == nodes["after_gather"].status == NodeStatus.SKIPPED
    assert SEEN == []


def test_non_critical_fan_out_whose_policy_continues_feeds_its_dependents(sqlite_url: str) -> None:
    record = raysaga.run(_fan_out_flow("nc-best", policy=BEST_EFFORT), 5, store=sqlite_url, executor="inline")
    assert record.status == RunStatus.COMPLETED, record.status_reason
    assert record.output == {"after_gather": "gathered", "total": 500}
    [(_, received)] = SEEN
    assert [s["index"] for s in received["successes"]] == [0, 2, 3, 4]
    assert [(f["index"], f["error_type"]) for f in received["failures"]] == [(1, "Permanent")]
