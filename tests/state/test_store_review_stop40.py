"""The store's readers and counters found wrong by review (stop 40), on SQLite and PostgreSQL:

- the DAG views' agent tokens (``status --dag``, ``--format``, ``RunView``) read at most 400 turn
  and tool-call rows, of item -1 only: a long agent showed too few tokens, a mapped one none, a
  turn whose answer is a blob none. Now one aggregate over every turn row of the step;
- the dashboard's search (``q``) and its status tabs lower-cased the query in Python and the
  columns with SQL ``lower()``, ASCII-only on SQLite: "ärger" never found "Ärger" there;
- ``/metrics`` left out ledger rows ``abandoned`` (and any status it did not list);
- a node's ledger rows were matched by LIKE prefixes, case-insensitive on SQLite: ``pay``'s page
  listed ``Pay:compensate``;
- a model ``cost()`` of 1e308 added up to inf: SQLite kept it, PostgreSQL refused the driver's
  commit (out of range) and left the run ``running``, every resume failing the same way.
"""

from __future__ import annotations

import json
import math
import uuid
from dataclasses import dataclass
from typing import Any

import pytest
from sqlalchemy import insert, update

import raysaga
from raysaga import RunOptions, RunStatus, Workflow
from raysaga.agents import Agent, ScriptedModel, Usage, text_reply
from raysaga.agents.models import tool_reply
from raysaga.agents.tools import tool
from raysaga.errors import Permanent
from raysaga.orchestrator import Driver, InlineExecutor
from raysaga.orchestrator.dag_svg import workflow_graph
from raysaga.orchestrator.dashboard import metrics, views
from raysaga.orchestrator.machine.budgets import MAX_CALL_COST, Budgets, model_cost
from raysaga.orchestrator.run_views import mermaid, step_views
from raysaga.state import Batch, EffectStatus, NewRun, SqlStore
from raysaga.state.dashboard_reads import RunFilter
from raysaga.state.schema import effects, runs
from raysaga.state.statements import MAX_COST_USED
from raysaga.state.text_match import fold_case


@pytest.fixture
def tag() -> str:
    """A prefix of this test's own: the PostgreSQL database is the session's."""
    return uuid.uuid4().hex[:10]


@tool
def lookup(q: int) -> dict[str, int]:
    """Look a number up."""
    return {"q": q}


def _tokens(store: SqlStore, wf: Workflow, run_id: str) -> dict[str, int]:
    graph = {"source": "workflow", **workflow_graph(wf)}
    return {v.step: v.tokens for v in step_views(store, run_id, graph) if v.turns}


# ---------------------------------------------------------------- agent tokens in the DAG views

LONG_TURNS = 205  # 205 turns asking for a tool, 205 tool calls, the answer: 411 rows, above the 400 read

long_wf = Workflow("stop40_long", version="1")
_long_script = tuple(tool_reply(("lookup", {"q": i}), input_tokens=100 + i, output_tokens=7) for i in range(LONG_TURNS))


@long_wf.agent(Agent("long", ScriptedModel(default=(*_long_script, text_reply("done", input_tokens=5,
                                                                                 output_tokens=5))),
                     tools=(lookup,), max_turns=LONG_TURNS + 5))
def research(input: Any) -> str:
    return "go"


def test_a_long_agents_tokens_are_every_turns(store: SqlStore, tag: str) -> None:
    """Before: the first 400 rows by start (~200 of the 206 turns) were summed."""
    record = raysaga.run(long_wf, {}, store=store, run_id=f"{tag}-long", executor="inline")
    assert record.status == RunStatus.COMPLETED
    want = sum(100 + i + 7 for i in range(LONG_TURNS)) + 10
    assert record.tokens_used == want
    assert _tokens(store, long_wf, record.run_id) == {"research": want}
    assert store.agent_tokens(record.run_id, "research") == want


mapped_wf = Workflow("stop40_mapped", version="1")
_mapped_model = ScriptedModel(default=(tool_reply(("lookup", {"q": 1}), input_tokens=100, output_tokens=7),
                                       text_reply("done", input_tokens=5, output_tokens=5)))


@mapped_wf.step()
def plan(input: Any) -> list[str]:
    return ["a", "b", "c"]


@mapped_wf.agent(Agent("mapped", _mapped_model, tools=(lookup,)), map_over="plan")
def ask(plan: str) -> str:
    return f"go {plan}"


# a step whose name differs only in case: its turns are not ``ask``'s (LIKE ignores case on SQLite)
@mapped_wf.agent(Agent("other", ScriptedModel(default=(text_reply("ok", input_tokens=1000, output_tokens=1),))))
def Ask(input: Any) -> str:  # the name differs from a step's only in case
    return "go"


@pytest.mark.parametrize("blob_threshold", [64 * 1024, 0], ids=["inline", "blobs"])
def test_a_mapped_agents_tokens_are_its_items_turns(store: SqlStore, tag: str, blob_threshold: int) -> None:
    """Before: item -1 only, so a mapped agent showed 0 tokens; an answer kept as a blob counted 0."""
    record = raysaga.run(mapped_wf, {}, store=store, run_id=f"{tag}-mapped", executor="inline",
                         options=RunOptions(blob_threshold=blob_threshold))
    assert record.status == RunStatus.COMPLETED
    assert record.tokens_used == 3 * (107 + 10) + 1001
    shown = _tokens(store, mapped_wf, record.run_id)
    assert shown == {"ask": 3 * (107 + 10), "Ask": 1001}
    graph = {"source": "workflow", **workflow_graph(mapped_wf)}
    assert "351 tokens" in mermaid(graph, step_views(store, record.run_id, graph))


def test_agent_tokens_of_rows_that_hold_no_usage_count_nothing(store: SqlStore, tag: str) -> None:
    """A turn row whose output is not a model's answer (changed by hand, not JSON on SQLite)
    counts 0 instead of failing the view; the run's other turns still count."""
    record = raysaga.run(mapped_wf, {}, store=store, run_id=f"{tag}-odd", executor="inline")
    with store.engine.begin() as conn:
        key = conn.execute(runs.select().where(runs.c.run_id == record.run_id)).one().run_key
        conn.exec_driver_sql("UPDATE raysaga_nodes SET output = " + (
            "'not json'" if store.engine.dialect.name == "sqlite" else "CAST('[1, 2]' AS JSON)")
            + f" WHERE run_key = {int(key)} AND node_id = 'ask@0' AND fan_index = 0")
    assert store.agent_tokens(record.run_id, "ask") == 3 * 117 - 107


# ---------------------------------------------------------------- search (q) beyond ASCII


def _new(run_id: str, workflow: str, labels: dict[str, str] | None = None) -> NewRun:
    return NewRun(run_id=run_id, workflow_name=workflow, workflow_version="1", definition_hash="d" * 64,
                  trace_id=uuid.uuid4().hex, labels=labels)


def _found(store: SqlStore, text: str, tag: str) -> tuple[list[str], int]:
    page = sorted(r["run_id"] for r in store.run_page(RunFilter(text=text, limit=100)))
    assert all(r.startswith(tag) for r in page), page  # every needle carries the tag: only this test's runs
    return page, sum(store.run_counts(RunFilter(text=text)).values())


def test_search_folds_non_ascii_letters_on_both_databases(store: SqlStore, tag: str) -> None:
    """Before, on SQLite: none of these found anything but the exact spelling (``lower()`` there
    folds ASCII only), in the page and in the status tabs' counts."""
    store.create_run(_new(f"{tag}-Ärger", f"Überweisung-{tag}"))
    store.create_run(_new(f"{tag}-greek", f"ΣΙΓΜΑ-ΟΔΟΣ-{tag}"))
    store.create_run(_new(f"{tag}-label", "wf", {"site": f"ZÜRICH-{tag}"}))
    store.create_run(_new(f"{tag}-reason", "wf"))
    store.create_run(_new(f"{tag}-İstanbul", "wf"))
    with store.engine.begin() as conn:
        conn.execute(update(runs).where(runs.c.run_id == f"{tag}-reason")
                     .values(status_reason=f"Ошибка оплаты {tag}: карта отклонена"))
    up = tag.upper()
    for text, want in [(f"{tag}-ärger", [f"{tag}-Ärger"]), (f"{up}-ÄRGER", [f"{tag}-Ärger"]),
                       (f"überweisung-{up}", [f"{tag}-Ärger"]), (f"σιγμα-οδοσ-{tag}", [f"{tag}-greek"]),
                       (f"Σιγμα-ΟδοΣ-{up}", [f"{tag}-greek"]), (f"site=zürich-{tag}", [f"{tag}-label"]),
                       (f"zürich-{up}", [f"{tag}-label"]), (f"ошибка ОПЛАТЫ {up}", [f"{tag}-reason"]),
                       (f"{up}-istanbul", [f"{tag}-İstanbul"]), (f"{tag}-İSTANBUL", [f"{tag}-İstanbul"])]:
        assert _found(store, text, tag) == (want, 1), text


def test_search_still_matches_wildcards_as_written(store: SqlStore, tag: str) -> None:
    store.create_run(_new(f"{tag}-a%b_Ä/", "wf"))
    store.create_run(_new(f"{tag}-axbyÄ/", "wf"))
    assert _found(store, f"{tag.upper()}-A%B_ä/", tag) == ([f"{tag}-a%b_Ä/"], 1)
    assert _found(store, f"{tag}-a_b", tag) == ([], 0)
    assert _found(store, f"{tag}-A", tag)[1] == 2


def test_fold_case_is_postgresqls_lower() -> None:
    """Each character by its own mapping, as PostgreSQL's ``lower()`` in a UTF-8 locale: no
    final sigma (Python's ``str.lower`` has one), İ to i (Python: i and a combining dot)."""
    assert fold_case("ΟΔΟΣ ÄRGER İ ẞ Ошибка") == "οδοσ ärger i ß ошибка"
    assert fold_case(None) is None and fold_case(3) == 3


# ---------------------------------------------------------------- /metrics: every ledger status


def test_metrics_lists_every_ledger_status(own_store_url: str, tag: str) -> None:
    """Before: ``raysaga_effects`` listed pending, committed and failed only: an abandoned
    effect (a call in an unknown state) was missing from the figures."""
    store = SqlStore(own_store_url)
    try:
        store.create_run(_new(f"{tag}-run", "wf"))
        rows = [("committed", 2), ("abandoned", 3), ("mystery \"x\"", 1)]
        with store.engine.begin() as conn:
            conn.execute(insert(effects), [
                {"idempotency_key": f"{tag}-{status[:3]}-{i}", "run_id": f"{tag}-run", "node_id": "pay",
                 "fan_index": -1, "effect_name": "pay", "args_digest": "0" * 64, "status": status,
                 "result": None, "external_id": None, "created_at": 1.0, "updated_at": 1.0}
                for status, n in rows for i in range(n)])
        lines = [line for line in metrics.render(store).splitlines() if line.startswith("raysaga_effects{")]
        assert lines == ['raysaga_effects{status="pending"} 0', 'raysaga_effects{status="committed"} 2',
                         'raysaga_effects{status="failed"} 0', 'raysaga_effects{status="abandoned"} 3',
                         'raysaga_effects{status="mystery \\"x\\""} 1']
        assert [s.value for s in EffectStatus] == ["pending", "committed", "failed", "abandoned"]
    finally:
        store.close()


# ---------------------------------------------------------------- a node's ledger rows, by case

case_wf = Workflow("stop40_case", version="1")


def _undo(ctx: Any, output: Any) -> dict[str, Any]:
    return {"undone": output}


@case_wf.step(effect=True, compensate=_undo)
def pay(input: Any) -> dict[str, str]:
    return {"paid": "lower"}


@case_wf.step(effect=True, compensate=_undo)
def Pay(input: Any) -> dict[str, str]:  # the name differs from a step's only in case
    return {"paid": "upper"}


@case_wf.step()
def boom(pay: Any, Pay: Any) -> None:  # inputs are named after their steps
    raise Permanent("roll back")


def test_a_nodes_ledger_rows_are_its_own_whatever_the_case(store: SqlStore, tag: str) -> None:
    """Before, on SQLite: ``pay``'s page listed ``Pay:compensate`` (LIKE ``pay:%`` ignores case)."""
    record = raysaga.run(case_wf, {}, store=store, run_id=f"{tag}-case", executor="inline")
    assert record.status == RunStatus.COMPENSATED
    assert sorted(e.node_id for e in store.effects(record.run_id)) == ["Pay", "Pay:compensate", "pay",
                                                                       "pay:compensate"]
    assert sorted(e.node_id for e in store.node_effects(record.run_id, "pay", -1)) == ["pay", "pay:compensate"]
    assert sorted(e.node_id for e in store.node_effects(record.run_id, "Pay", -1)) == ["Pay", "Pay:compensate"]
    page = views.node_page(store, record.run_id, "pay")
    assert sorted(e["node"] for e in page["effects"]) == ["pay", "pay:compensate"]


# ---------------------------------------------------------------- a run's cost stays finite


@dataclass(frozen=True)
class PriceyModel(ScriptedModel):
    """A model of one's own whose ``cost()`` is finite and >= 0, but absurd."""

    price: float = 1e308

    def cost(self, usage: Usage) -> float:
        return self.price


def _pricey_wf(price: float) -> Workflow:
    model = PriceyModel(default=(tool_reply(("lookup", {"q": 1})), tool_reply(("lookup", {"q": 2})),
                                 text_reply("done")), name="pricey-model", price=price)
    wf = Workflow("stop40_pricey", version="1")

    @wf.agent(Agent("p", model, tools=(lookup,)))
    def ask(input: Any) -> str:
        return "go"

    return wf


def test_an_absurd_model_cost_fails_the_agent_node_on_both_databases(store: SqlStore, tag: str) -> None:
    """Before: 1e308 + 1e308 made the run's cost inf on SQLite (``status --json`` printed
    ``Infinity``) and PostgreSQL refused the driver's commit (out of range), the run left
    ``running``. Now the agent node fails naming the model and the value; the run fails."""
    record = raysaga.run(_pricey_wf(1e308), {}, store=store, run_id=f"{tag}-pricey", executor="inline")
    assert record.status == RunStatus.FAILED
    assert record.cost_used == 0.0 and record.tokens_used == 20  # the first answer's tokens are counted
    (node,) = [n for n in store.nodes(record.run_id) if n.node_id == "ask"]
    assert node.error is not None and node.error["type"] == "ModelCostFailed"
    assert "'pricey-model'" in node.error["message"] and "1e+308" in node.error["message"]
    assert record.status_reason is not None and "pricey-model" in record.status_reason
    json.dumps(store.get_run(record.run_id).model_dump(mode="json"), allow_nan=False)


def test_a_run_total_that_holds_inf_becomes_finite(store: SqlStore, tag: str) -> None:
    """A row that holds inf already (SQLite kept one before): the next charge stores a finite
    total, the same on both databases (before: inf stayed inf)."""
    wf = _pricey_wf(0.25)
    run_id = raysaga.create_run(wf, {}, store=store, run_id=f"{tag}-inf").run_id
    with store.engine.begin() as conn:
        conn.execute(update(runs).where(runs.c.run_id == run_id).values(cost_used=math.inf))
    final = Driver(wf, store, InlineExecutor(), run_id).drive()
    assert final.status == RunStatus.COMPLETED
    assert final.cost_used == MAX_COST_USED and math.isfinite(store.get_run(run_id).cost_used)


class _Costing:
    name = "costing"

    def __init__(self, cost: Any) -> None:
        self.value = cost

    def cost(self, usage: Usage) -> Any:
        return self.value


def test_model_cost_bounds_one_call() -> None:
    """Pure: an int beyond a float's range is refused (before: ``math.isfinite`` raised
    OverflowError, a driver crash); the bound itself is accepted; the total stays finite."""
    _, why = model_cost(_Costing(10**400), Usage())
    assert why is not None and "'costing'" in why
    assert model_cost(_Costing(MAX_CALL_COST), Usage()) == (MAX_CALL_COST, None)
    assert model_cost(_Costing(MAX_CALL_COST * 1.5), Usage())[1] is not None
    budgets = Budgets(cost=math.inf)
    batch = Batch()
    budgets.charge(10, 0.5, batch)
    assert budgets.cost == MAX_COST_USED and batch.run is not None and batch.run.cost_delta == 0.5
