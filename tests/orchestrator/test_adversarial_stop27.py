"""Second adversarial round, the DSL and outputs: what was unchecked at definition time.

- ``Workflow(version=...)`` took anything (``str(version)``). Its run row's column holds 50
  characters of text: a version with NUL or longer than that ran on SQLite and failed every run
  on PostgreSQL with psycopg's ``DataError`` (a lone surrogate failed on both with
  ``UnicodeEncodeError``), long after the workflow was declared. Now a ``WorkflowDefinitionError``
  at ``Workflow(...)``, naming the workflow and the rule.
- An int of more than 4300 digits (``sys.get_int_max_str_digits``) is no JSON Python can write or
  read back: its write raised a bare ``ValueError`` ("Exceeds the limit ... for integer string
  conversion") naming neither the value nor the step; a run input holding one was no
  ``InvalidInputError``. Now a ``NotJSONableError`` naming where it sits: the input is refused
  before any run row, an output fails its step permanently.
- ``RunOptions(retry_budget=..., token_budget=...)`` had no upper bound: a budget beyond its
  column (32-bit, 64-bit), ``sys.maxsize`` as "no limit" say, failed the run's insert on
  PostgreSQL (``DataError``) or SQLite (``OverflowError``). Now an ``InvalidOptionError``.
- Pydantic writes a NaN or infinity held by an ``Any`` field (``dict[str, Any]``...) as null: a
  step returning such a model completed with ``null`` in place of the number (a bare NaN, or one
  in a ``float`` field, was refused), and an approval's ``Ask(payload=...)`` lost its payload.
  Now ``jsoncodec`` refuses it, naming the path, unless the model sets ``ser_json_inf_nan``.
- ``@wf.approval(default=...)`` was not checked: a value that is not JSON failed only when the
  timeout answered (an object crashed the driver; NaN became null). Now refused at definition.
- ``Worker(limits=...)`` took any value (the CLI checked ``--limit``): below 1 the workflow's runs
  were never claimed, NaN limited nothing. A name given for a workflow raised ``AttributeError``.
- A span processor (or tracer provider) of the application's that raised failed the driver right
  after a commit: the run stayed ``running``. Tracing now logs the failure once and the run goes on.
- A step named ``input`` or ``ctx`` was accepted: a dependent's parameter of that name received the
  run input (or the context), never the step's output. Now refused at validation.
"""

from __future__ import annotations

import math
import sys
from typing import Any

import pytest
from pydantic import BaseModel, ConfigDict

import raysaga
from raysaga import Ask, InvalidInputError, InvalidOptionError, RetryPolicy, RunOptions, RunStatus, Worker, Workflow
from raysaga.errors import UserError, WorkflowDefinitionError
from raysaga.state import NodeStatus, SqlStore

BAD_VERSIONS = {"nul": "1\x00", "lone-surrogate": "v\ud800", "too-long": "v" * 51, "empty": "", "newline": "1\n2"}


@pytest.mark.parametrize("version", BAD_VERSIONS.values(), ids=list(BAD_VERSIONS))
def test_a_version_no_run_row_can_hold_is_refused_at_definition(version: str) -> None:
    rule = r"workflow 'shop': version must be 1 to 50 printable characters.* \(e\.g\. version=\"2\""
    with pytest.raises(WorkflowDefinitionError, match=rule):
        Workflow("shop", version=version)


@pytest.mark.parametrize("version", ["v" * 50, 2, "2026-05-01"])
def test_a_version_a_row_can_hold_runs_on_both_stores(store_url: str, version: Any) -> None:
    wf = Workflow("shop", version=version)

    @wf.step()
    def total(input: int) -> int:
        return input * 2

    record = raysaga.run(wf, 21, store=store_url, executor="inline")
    assert (record.status, record.output, record.workflow_version) == (RunStatus.COMPLETED, {"total": 42}, str(version))


LONG_INT = 10**5000


def _echo_flow() -> Workflow:
    wf = Workflow("long_ints")

    @wf.step()
    def first(input: Any) -> Any:
        return input

    @wf.step(retry=RetryPolicy(max_attempts=3, base=0.01, cap=0.01))
    def grow(first: Any) -> Any:
        return {"n": [LONG_INT if first == "grow" else first]}

    return wf


@pytest.mark.parametrize("value", [LONG_INT, {"x": [-LONG_INT]}], ids=["bare", "nested"])
def test_a_run_input_with_an_int_too_long_to_write_is_invalid_input(store_url: str, value: Any) -> None:
    store = SqlStore(store_url)
    try:
        before = len(store.list_runs(limit=100_000))
        with pytest.raises(InvalidInputError, match="integer of more than 4300 digits: store it as a string"):
            raysaga.run(_echo_flow(), value, store=store, executor="inline")
        assert len(store.list_runs(limit=100_000)) == before
    finally:
        store.close()


def test_an_output_with_an_int_too_long_to_write_fails_its_step_naming_it(store_url: str) -> None:
    store = SqlStore(store_url)
    try:
        record = raysaga.run(_echo_flow(), "grow", store=store, executor="inline")
        assert record.status == RunStatus.FAILED
        grow = next(n for n in store.nodes(record.run_id) if n.node_id == "grow")
        assert (grow.status, grow.attempt) == (NodeStatus.FAILED, 1)
        assert grow.error is not None and grow.error["type"] == "NotJSONableError"
        assert grow.error["message"].startswith("output of step 'grow'['n'][0] is an integer of more than 4300 digits")
    finally:
        store.close()


def test_ints_just_below_the_limit_round_trip_exactly(store_url: str) -> None:
    big = 10**4299 + 7  # 4300 digits: written and read back as is
    record = raysaga.run(_echo_flow(), big, store=store_url, executor="inline")
    assert record.status == RunStatus.COMPLETED
    assert record.output == {"grow": {"n": [big]}}


@pytest.mark.parametrize(("field", "value"), [("retry_budget", 2**31), ("retry_budget", sys.maxsize),
                                              ("token_budget", 2**63), ("token_budget", 10**30)])
def test_a_budget_no_run_row_can_hold_is_refused_by_run_options(field: str, value: int) -> None:
    """``retry_budget`` is a 32-bit column, ``token_budget`` a 64-bit one: ``sys.maxsize`` as "no
    limit" ran on SQLite and failed on PostgreSQL with ``DataError`` (integer out of range), and a
    larger one raised ``OverflowError`` on SQLite, both at the run's insert."""
    with pytest.raises(InvalidOptionError, match=f"RunOptions.{field} must be None .no limit. or a whole number"):
        RunOptions(**{field: value})  # type: ignore[arg-type]


@pytest.mark.parametrize(("field", "value"), [("retry_budget", 2**31 - 1), ("token_budget", 2**63 - 1)])
def test_the_largest_budgets_a_row_holds_run_on_both_stores(store_url: str, field: str, value: int) -> None:
    record = raysaga.run(_echo_flow(), 1, store=store_url, executor="inline", options=RunOptions(**{field: value}))  # type: ignore[arg-type]
    assert record.status == RunStatus.COMPLETED
    assert getattr(record, field) == value


class Report(BaseModel):
    """A step's result with free-form data: pydantic writes a NaN under ``Any`` as null."""

    count: int
    data: dict[str, Any]


class NullsWanted(BaseModel):
    model_config = ConfigDict(ser_json_inf_nan="null")  # the model asks for null itself

    data: Any


@pytest.mark.parametrize("data", [{"mean": math.nan}, {"series": [1.0, math.inf]}, {"deep": {"x": -math.inf}}],
                         ids=["nan", "inf-in-list", "nested"])
def test_a_model_holding_nan_under_any_fails_its_step_instead_of_storing_null(store_url: str,
                                                                             data: dict[str, Any]) -> None:
    wf = Workflow("nan_in_models")

    @wf.step(retry=RetryPolicy(max_attempts=3, base=0.01, cap=0.01))
    def measure() -> Report:
        return Report(count=3, data=data)

    @wf.step()
    def use(measure: Report) -> Any:
        return measure.data

    store = SqlStore(store_url)
    try:
        record = raysaga.run(wf, None, store=store, executor="inline")
        assert record.status == RunStatus.FAILED, record.output  # it completed with null in place of NaN
        node = next(n for n in store.nodes(record.run_id) if n.node_id == "measure")
        assert (node.status, node.attempt, node.output) == (NodeStatus.FAILED, 1, None)
        assert node.error is not None and node.error["type"] == "NotJSONableError"
        assert "output of step 'measure'['data']" in node.error["message"]
        assert "JSON has no NaN or infinity" in node.error["message"]
    finally:
        store.close()


def test_a_model_that_asks_for_null_gets_null(store_url: str) -> None:
    wf = Workflow("nan_as_null")

    @wf.step()
    def measure() -> NullsWanted:
        return NullsWanted(data={"mean": math.nan})

    record = raysaga.run(wf, None, store=store_url, executor="inline")
    assert record.status == RunStatus.COMPLETED
    assert record.output == {"measure": {"data": {"mean": None}}}


def test_an_approval_payload_holding_nan_fails_the_node_instead_of_asking_without_it(store_url: str) -> None:
    """``Ask.payload`` is ``Any``: the approver was shown ``payload: null``, the order to review gone."""
    wf = Workflow("nan_in_ask")

    @wf.approval()
    def review() -> Ask:
        return Ask(prompt="Refund this order?", payload={"order": "o-1", "amount": math.nan})

    store = SqlStore(store_url)
    try:
        record = raysaga.run(wf, None, store=store, executor="inline", options=RunOptions(release_after=0))
        assert record.status == RunStatus.FAILED
        node = next(n for n in store.nodes(record.run_id) if n.node_id == "review")
        assert node.error is not None and "['payload']['amount'] is nan" in node.error["message"]
    finally:
        store.close()


@pytest.mark.parametrize("default", [math.nan, {1, 2}, object(), {"ok": math.inf}], ids=["nan", "set", "object", "inf"])
def test_an_approval_default_that_is_not_json_is_refused_at_definition(default: Any) -> None:
    """It becomes the node's output when the timeout answers: an object crashed the driver then
    (``PydanticSerializationError``, the run left ``running``), NaN was stored as null."""
    wf = Workflow("bad_default")
    with pytest.raises(WorkflowDefinitionError, match=r"approval 'review': default="):
        @wf.approval(timeout=60, on_timeout="default", default=default)
        def review() -> str:
            return "ship it?"


@pytest.mark.parametrize("limit", [0, -1, math.nan, 2.5, True], ids=["zero", "negative", "nan", "float", "bool"])
def test_a_worker_limit_that_is_no_count_is_refused(sqlite_url: str, limit: Any) -> None:
    """``raysaga worker --limit`` checked it; ``Worker(limits=...)`` did not: below 1 no run of the
    workflow was ever claimed (the worker idled, silently), NaN limited nothing."""
    store = SqlStore(sqlite_url)
    try:
        with pytest.raises(UserError, match="limits are whole numbers >= 1"):
            Worker([_echo_flow()], store, executor="inline", limits={"long_ints": limit})
    finally:
        store.close()


def test_a_worker_given_a_name_instead_of_a_workflow_says_so(sqlite_url: str) -> None:
    store = SqlStore(sqlite_url)
    try:
        with pytest.raises(UserError, match="a worker drives Workflow objects, got 'long_ints'"):
            Worker(["long_ints"], store, executor="inline")  # type: ignore[list-item]
    finally:
        store.close()


class FailingProvider:
    def get_tracer(self, *args: Any, **kwargs: Any) -> Any:
        raise RuntimeError("no tracer today")


@pytest.mark.parametrize("failing", ["processor", "provider"])
def test_a_failing_tracer_never_fails_the_run(store_url: str, caplog: pytest.LogCaptureFixture,
                                              failing: str) -> None:
    """A span processor that raised in ``on_end`` raised out of the driver right after a commit:
    the run stayed ``running``, and every resume failed the same way while the collector was down."""
    from opentelemetry.sdk.trace import ReadableSpan, SpanProcessor, TracerProvider

    class FailingProcessor(SpanProcessor):
        """An application's span processor whose export fails (a collector down, a bug)."""

        def on_end(self, span: ReadableSpan) -> None:
            raise RuntimeError("collector down")

    provider: Any = FailingProvider()
    if failing == "processor":
        provider = TracerProvider()
        provider.add_span_processor(FailingProcessor())
    raysaga.configure_tracing(provider)
    try:
        with caplog.at_level("WARNING", logger="raysaga.driver"):
            record = raysaga.run(_echo_flow(), 4, store=store_url, executor="inline")
    finally:
        raysaga.configure_tracing(None)
    assert record.status == RunStatus.COMPLETED
    assert record.output == {"grow": {"n": [4]}}
    assert "collector down" in caplog.text or "no tracer today" in caplog.text


@pytest.mark.parametrize("reserved", ["input", "ctx"])
def test_a_step_named_like_a_reserved_parameter_is_refused(reserved: str) -> None:
    """A dependent's parameter ``input`` is the run input and ``ctx`` the context: a step so named
    was accepted, and the step depending on it silently received the run input instead."""
    wf = Workflow("reserved_names")

    def parse(input: str) -> str:
        return input.upper()

    wf.step(name=reserved)(parse)

    @wf.step(after=[reserved])
    def use(input: str) -> str:
        return input

    with pytest.raises(WorkflowDefinitionError, match=f"step name '{reserved}' is reserved"):
        wf.validate()
