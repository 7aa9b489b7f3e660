"""The workflow DSL: a named, versioned DAG of steps declared with decorators.

    wf = Workflow("order", version="1")

    @wf.step()
    def reserve(input: Order) -> Reservation: ...

    @wf.step(effect=True, retry=RetryPolicy(max_attempts=5), compensate=refund)
    def charge(ctx: StepContext, input: Order, reserve: Reservation) -> Charge: ...

A parameter named after another step receives that step's output (a dependency); ``input``
receives the run's input; ``ctx`` (or any parameter annotated ``StepContext``) the context.
Decorators return the function unchanged, so it stays callable and testable on its own.
"""

from __future__ import annotations

import asyncio
import dataclasses
import hashlib
import json
from collections.abc import Callable, Iterable
from functools import cached_property
from typing import TYPE_CHECKING, Any, Literal, ParamSpec, TypeVar, overload

import networkx as nx
from pydantic import BaseModel

from raysaga.errors import WorkflowDefinitionError
from raysaga.orchestrator import run_input
from raysaga.orchestrator.dsl_checks import (
    check_common,
    check_flag,
    check_optional_name,
    checked_version,
    dataflow_problems,
    decorator_options,
    plain_options,
    step_where,
)
from raysaga.orchestrator.options import RetryPolicy
from raysaga.orchestrator.resources import placement
from raysaga.orchestrator.signatures import bind, late_dependencies
from raysaga.orchestrator.spec import StepSpec
from raysaga.orchestrator.type_adapters import type_adapter
from raysaga.orchestrator.validation import WORKFLOW_NAME_RE, check_name, compensation_target_problem, validate
from raysaga.sagas.policy import ALL, FanOutPolicy
from raysaga.types import compensation_node

if TYPE_CHECKING:
    from raysaga.agents.agent import Agent

P = ParamSpec("P")
R = TypeVar("R")
F = TypeVar("F", bound=Callable[..., Any])

#: What a non-critical step's dependents get when it fails for good (``on_failure=``).
OnFailure = Literal["skip", "pass"]


class Workflow:
    """A DAG definition. Validated (networkx) the first time it is used or ``validate()`` is called."""

    @plain_options("Workflow")
    def __init__(self, name: str, *, version: str = "1", description: str = "") -> None:
        if not isinstance(description, str):
            raise WorkflowDefinitionError(f"workflow {name!r}: description= takes a str, got {description!r}")
        if not isinstance(name, str) or not WORKFLOW_NAME_RE.fullmatch(name):
            raise WorkflowDefinitionError(
                f"workflow name {name!r} is not valid: it prefixes run ids, so use 1-100 characters: ASCII letters, "
                "digits, '_', '-' and '.', starting with a letter or '_'"
            )
        self.name = name
        self.version = checked_version(name, version)
        self.description = description
        self.steps: dict[str, StepSpec] = {}
        self.compensations: dict[str, Callable[..., Any]] = {}
        self.compensation_retries: dict[str, RetryPolicy] = {}  # declared with compensation(retry=)
        self._graph: nx.DiGraph | None = None

    def __repr__(self) -> str:
        return f"Workflow({self.name!r}, version={self.version!r}, steps={list(self.steps)})"

    def _repr_html_(self) -> str:
        """In a notebook: the DAG as an SVG, steps by generation (``raysaga.orchestrator.dag_svg``)."""
        from raysaga.orchestrator.dag_svg import workflow_html

        return workflow_html(self)

    # ------------------------------------------------------------------ decorators
    #
    # Every option is an explicit, typed keyword (no ``**options: Any``): a type checker sees a
    # typo, and at run time ``_decorator_options`` answers one with a WorkflowDefinitionError that
    # names the step and the options there are, never Python's bare TypeError.

    @overload
    def step(
        self,
        fn: Callable[P, R],
        /,
        *,
        name: str | None = None,
        after: Iterable[str] = (),
        critical: bool = True,
        effect: bool = False,
        effect_name: str | None = None,
        retry: RetryPolicy | None = None,
        timeout: float | None = None,
        compensate: Callable[..., Any] | None = None,
        reconcile: Callable[..., Any] | None = None,
        map_over: str | None = None,
        policy: FanOutPolicy | None = None,
        on_failure: OnFailure = "skip",
        io_bound: bool | None = None,
        local: bool = False,
        num_cpus: float | None = None,
        num_gpus: float | None = None,
        memory: int | None = None,
        resources: dict[str, float] | None = None,
    ) -> Callable[P, R]: ...

    @overload
    def step(
        self,
        fn: None = None,
        /,
        *,
        name: str | None = None,
        after: Iterable[str] = (),
        critical: bool = True,
        effect: bool = False,
        effect_name: str | None = None,
        retry: RetryPolicy | None = None,
        timeout: float | None = None,
        compensate: Callable[..., Any] | None = None,
        reconcile: Callable[..., Any] | None = None,
        map_over: str | None = None,
        policy: FanOutPolicy | None = None,
        on_failure: OnFailure = "skip",
        io_bound: bool | None = None,
        local: bool = False,
        num_cpus: float | None = None,
        num_gpus: float | None = None,
        memory: int | None = None,
        resources: dict[str, float] | None = None,
    ) -> Callable[[Callable[P, R]], Callable[P, R]]: ...

    @decorator_options("step")
    def step(
        self,
        fn: Callable[P, R] | None = None,
        /,
        *,
        name: str | None = None,
        after: Iterable[str] = (),
        critical: bool = True,
        effect: bool = False,
        effect_name: str | None = None,
        retry: RetryPolicy | None = None,
        timeout: float | None = None,
        compensate: Callable[..., Any] | None = None,
        reconcile: Callable[..., Any] | None = None,
        map_over: str | None = None,
        policy: FanOutPolicy | None = None,
        on_failure: OnFailure = "skip",
        io_bound: bool | None = None,
        local: bool = False,
        num_cpus: float | None = None,
        num_gpus: float | None = None,
        memory: int | None = None,
        resources: dict[str, float] | None = None,
    ) -> Callable[P, R] | Callable[[Callable[P, R]], Callable[P, R]]:
        """Declare a step: ``@wf.step``, ``@wf.step()``, ``@wf.step(name=..., retry=...)``, or
        ``wf.step(fn, name=...)`` for a function defined elsewhere. Keyword-only options:

        Args:
            name: step name (default: the function's name).
            after: extra upstream steps to wait for, with no data passed (step names; one name
                may be given as a plain string).
            critical: a permanent failure fails the run (and, with compensations, rolls it back).
            effect: the step changes the world; it gets ``ctx.idempotency_key`` and runs through
                the ledger, so a resume never repeats a committed effect.
            effect_name: name used in the idempotency key (default: the step name).
            retry: the step's ``RetryPolicy`` (default: 3 attempts, full jitter).
            timeout: seconds before an attempt is cancelled and counted a transient failure.
            compensate: undo for this step, run in reverse order when the run rolls back.
            reconcile: ``fn(ctx, **same_args) -> result | NOT_APPLIED`` asked on resume of an effect
                whose call may or may not have happened, before re-issuing it.
            map_over: fan out: run once per element of this upstream step's list output.
            policy: a fan-out's partial-failure policy (``raysaga.sagas``: ``ALL`` (default),
                ``quorum(k)``, ``min_success_ratio(r)``, ``BEST_EFFORT``, ``on_partial_failure(fn)``).
                Anything but ``ALL`` hands dependents a ``FanOutResult`` instead of a list.
            on_failure: for a non-critical step, ``"skip"`` its dependents when it fails for good,
                or ``"pass"`` them a ``StepFailed`` record in place of its output.
            io_bound: the step mostly waits (HTTP, a model): on Ray it runs in a thread of the
                executor's I/O pool, not as a task holding a CPU (see docs/execution.md).
            num_cpus, num_gpus, memory, resources: what each attempt asks Ray for (default: one
                CPU); ``resources`` names custom resources, ``{"special": 1}``. Checked here, and
                against the cluster's nodes when an attempt is sent.
            local: run it in the driver's process, not as a Ray task: cheap glue only (docs/execution.md).

        Raises:
            WorkflowDefinitionError: an option of the wrong type or out of range, an unknown
                option, or a function the DSL cannot bind; the message names the step.
        """

        def decorate(func: Callable[P, R]) -> Callable[P, R]:
            where = step_where(func, name)
            upstream = check_common(where, name=name, after=after, critical=critical, retry=retry,
                                     timeout=timeout, map_over=map_over)
            check_flag(where, "effect", effect)
            check_optional_name(where, "effect_name", effect_name)
            if reconcile is not None and not callable(reconcile):
                raise WorkflowDefinitionError(f"step {where!r}: reconcile= must be a function")
            spec = self._make_spec(func, name=name, after=upstream, critical=critical, effect=effect,
                                   effect_name=effect_name, retry=retry, timeout=timeout, compensate=compensate,
                                   reconcile=reconcile, map_over=map_over, policy=policy, on_failure=on_failure)
            io, request, here = placement(spec.name, io_bound=io_bound, num_cpus=num_cpus, num_gpus=num_gpus,
                                          memory=memory, resources=resources, local=(local, timeout, map_over))
            self._add(dataclasses.replace(spec, io_bound=io, resources=request, local=here))
            return func

        if fn is not None:
            return decorate(fn)
        return decorate

    @decorator_options("agent")
    def agent(
        self,
        agent: Agent,
        *,
        name: str | None = None,
        after: Iterable[str] = (),
        critical: bool = True,
        retry: RetryPolicy | None = None,
        timeout: float | None = None,
        compensate: Callable[..., Any] | None = None,
        map_over: str | None = None,
        policy: FanOutPolicy | None = None,
        on_failure: OnFailure = "skip",
    ) -> Callable[[Callable[P, R]], Callable[P, R]]:
        """An LLM sub-agent node (``raysaga.agents.Agent``): ``@wf.agent(agent)``,
        ``@wf.agent(agent, map_over="plan")``.

        The decorated function builds the agent's prompt from its inputs (upstream outputs,
        ``input``, a fan-out item) and runs in the driver, so keep it cheap and pure; the node's
        output is the agent's final answer (validated against ``agent.output_type``).

        The options are ``step``'s, less those that do not apply to an agent node: ``effect``
        (declare ``effect=True`` on its tools), ``effect_name`` and ``reconcile``, and the placement
        options (its model and tool calls run in the executor's I/O pool).
        """
        from raysaga.agents.agent import Agent

        if not isinstance(agent, Agent):
            raise WorkflowDefinitionError(f"@{self.name}.agent takes a raysaga.agents.Agent, got {agent!r}")

        def decorate(func: Callable[P, R]) -> Callable[P, R]:
            where = step_where(func, name)
            upstream = check_common(where, name=name, after=after, critical=critical, retry=retry,
                                     timeout=timeout, map_over=map_over)
            spec = self._make_spec(func, name=name, after=upstream, critical=critical, effect=False, effect_name=None,
                                   retry=retry, timeout=timeout, compensate=compensate, reconcile=None,
                                   map_over=map_over, policy=policy, on_failure=on_failure)
            self._add(dataclasses.replace(spec, kind="agent", options={"agent": agent},
                                          output_type=agent.output_type or Any))
            return func

        return decorate

    @decorator_options("approval")
    def approval(self, *, name: str | None = None, after: Iterable[str] = (), approvers: Iterable[str] | None = None,
                 quorum: int = 1, answer: Any = None, timeout: float | None = None,
                 on_timeout: Literal["reject", "default", "escalate"] = "reject", default: Any = None,
                 escalate_to: Iterable[str] = (), critical: bool = True, on_failure: OnFailure = "skip",
                 map_over: str | None = None) -> Callable[[Callable[P, R]], Callable[P, R]]:
        """A human approval node: the decorated function builds what is asked (a ``str`` prompt or
        ``Ask(prompt, payload)``) from its inputs; the node's output is an ``Approval``. A rejection
        fails the node (a critical one rolls the saga back). ``answer``: the type of an approve
        "with edits"; ``on_timeout``: ``reject``, ``default`` (approve with ``default``) or
        ``escalate`` (to ``escalate_to``, for another ``timeout``). docs/operations.md."""
        from raysaga.orchestrator.waits_dsl import approval

        return approval(self._make_spec, self._add, name=name, after=after, approvers=approvers, quorum=quorum,
                        answer=answer, timeout=timeout, on_timeout=on_timeout, default=default,
                        escalate_to=escalate_to, critical=critical, on_failure=on_failure, map_over=map_over)

    @plain_options("Workflow.sleep()")
    def sleep(self, name: str, *, seconds: float, after: Iterable[str]) -> None:
        """A durable sleep node: ``seconds`` after the steps ``after`` complete. A long sleep holds
        nothing (the run rests ``waiting_timer``) and wakes on time after any crash."""
        from raysaga.orchestrator.waits_dsl import sleep

        sleep(self._make_spec, self._add, name, seconds=seconds, after=after)

    @decorator_options("map")
    def map(
        self,
        over: str,
        *,
        name: str | None = None,
        after: Iterable[str] = (),
        critical: bool = True,
        effect: bool = False,
        effect_name: str | None = None,
        retry: RetryPolicy | None = None,
        timeout: float | None = None,
        compensate: Callable[..., Any] | None = None,
        reconcile: Callable[..., Any] | None = None,
        policy: FanOutPolicy | None = None,
        on_failure: OnFailure = "skip",
        io_bound: bool | None = None,
        num_cpus: float | None = None,
        num_gpus: float | None = None,
        memory: int | None = None,
        resources: dict[str, float] | None = None,
    ) -> Callable[[Callable[P, R]], Callable[P, R]]:
        """Fan-out sugar: ``@wf.map("plan", ...)`` is ``@wf.step(map_over="plan", ...)``; the
        other options are ``step``'s."""
        if not isinstance(over, str):
            raise WorkflowDefinitionError(f"@{self.name}.map takes the name of the step to fan out over, got {over!r}")
        decorator: Callable[[Callable[P, R]], Callable[P, R]] = self.step(
            name=name, after=after, critical=critical, effect=effect, effect_name=effect_name, retry=retry,
            timeout=timeout, compensate=compensate, reconcile=reconcile, map_over=over, policy=policy,
            on_failure=on_failure, io_bound=io_bound, num_cpus=num_cpus, num_gpus=num_gpus, memory=memory,
            resources=resources)
        return decorator

    @plain_options("Workflow.compensation()")
    def compensation(self, step_name: str, *, retry: RetryPolicy | None = None
                     ) -> Callable[[Callable[P, R]], Callable[P, R]]:
        """Register ``fn`` as the compensation of step ``step_name`` (checked at validation).

        ``retry`` bounds its retries; by default a compensation retries transient failures with
        the step's backoff (or base 0.5 s, cap 60 s) until it succeeds or is refused permanently."""
        if not isinstance(step_name, str):  # used bare (@wf.compensation), or given the step's function
            raise WorkflowDefinitionError(compensation_target_problem(self.name, step_name, self.steps))
        if retry is not None and not isinstance(retry, RetryPolicy):
            raise WorkflowDefinitionError(f"compensation of {step_name!r}: retry= must be a RetryPolicy")
        check_name("compensation target (step)", step_name)

        def decorate(func: Callable[P, R]) -> Callable[P, R]:
            if step_name in self.compensations:
                raise WorkflowDefinitionError(f"step {step_name!r} already has a compensation")
            self.compensations[step_name] = func
            if retry is not None:
                self.compensation_retries[step_name] = retry
            self._invalidate()
            return func

        return decorate

    # ------------------------------------------------------------------ building

    def _make_spec(self, func: Callable[..., Any], *, name: str | None, after: tuple[str, ...], critical: bool,
                   effect: bool, effect_name: str | None, retry: RetryPolicy | None, timeout: float | None,
                   compensate: Callable[..., Any] | None, reconcile: Callable[..., Any] | None,
                   map_over: str | None, policy: FanOutPolicy | None = None,
                   on_failure: str = "skip") -> StepSpec:
        step_name = name or getattr(func, "__name__", None)
        if not callable(func) or not step_name:
            raise WorkflowDefinitionError(f"@{self.name}.step decorates functions, got {func!r}")
        if timeout is not None and timeout <= 0:
            raise WorkflowDefinitionError(f"step {step_name!r}: timeout must be > 0 seconds, got {timeout}")
        if compensate is not None and not callable(compensate):
            raise WorkflowDefinitionError(f"step {step_name!r}: compensate= must be a function")
        if policy is not None and map_over is None:
            raise WorkflowDefinitionError(f"step {step_name!r}: policy= applies to fan-outs; add map_over=")
        if policy is not None and not isinstance(policy, FanOutPolicy):
            raise WorkflowDefinitionError(
                f"step {step_name!r}: policy={policy!r} is not a fan-out policy: use raysaga.sagas.quorum(k), "
                "min_success_ratio(r), BEST_EFFORT, ALL or on_partial_failure(fn)")
        if on_failure not in ("skip", "pass"):
            raise WorkflowDefinitionError(
                f"step {step_name!r}: on_failure must be 'skip' or 'pass', not {on_failure!r}")
        if on_failure == "pass" and critical:
            raise WorkflowDefinitionError(
                f"step {step_name!r}: on_failure='pass' is what a non-critical step's dependents get when it "
                "fails; add critical=False (a critical step's failure stops the run)")
        if effect_name is not None and not effect:
            raise WorkflowDefinitionError(f"step {step_name!r}: effect_name= names an effect; add effect=True")
        if reconcile is not None and not effect:
            raise WorkflowDefinitionError(f"step {step_name!r}: reconcile= only makes sense with effect=True")
        bound = bind(step_name, func, self.steps)
        param_deps = bound.param_deps
        if map_over is not None and map_over not in param_deps:
            raise WorkflowDefinitionError(
                f"step {step_name!r} maps over {map_over!r}: add a parameter named {map_over!r} that receives "
                "one element of that step's list output")
        for dep in after:
            if dep == step_name:
                raise WorkflowDefinitionError(f"step {step_name!r} depends on itself (after={dep!r})")
        return StepSpec(
            name=step_name, fn=func, deps=tuple(dict.fromkeys([*param_deps, *after])), param_deps=tuple(param_deps),
            input_param=bound.input_param, ctx_param=bound.ctx_param, param_types=bound.param_types,
            output_type=bound.hints.get("return", Any), optional_params=bound.optional, map_over=map_over,
            critical=critical, effect=effect,
            effect_name=effect_name or step_name, retry=retry, timeout=timeout, compensate=compensate,
            reconcile=reconcile, is_async=asyncio.iscoroutinefunction(func),
            fan_out_policy=policy or ALL, on_failure=on_failure,
        )

    def make_spec(self, func: Callable[..., Any], *, name: str, effect: bool = False, effect_name: str | None = None,
                  retry: RetryPolicy | None = None, timeout: float | None = None) -> StepSpec:
        """A spec for a function run outside the DAG (a compensation), bound the same way as steps."""
        return self._make_spec(func, name=name, after=(), critical=True, effect=effect, effect_name=effect_name,
                               retry=retry, timeout=timeout, compensate=None, reconcile=None, map_over=None)

    def _add(self, spec: StepSpec) -> None:
        check_name("agent" if spec.kind == "agent" else "step", spec.name)
        if spec.effect and spec.effect_name != spec.name:
            check_name(f"step {spec.name!r}: effect", spec.effect_name)
        if spec.name in self.steps:
            raise WorkflowDefinitionError(
                f"workflow {self.name!r} already has a step named {spec.name!r}: "
                "give one of them another name (name=...)")
        self.steps[spec.name] = spec
        self._invalidate()

    def _invalidate(self) -> None:
        """Drop the validated graph and what is cached from it."""
        self._graph = None
        self.__dict__.pop("order", None)
        self.__dict__.pop("definition_hash", None)

    # ------------------------------------------------------------------ validated views

    def validate(self) -> Workflow:
        """Check the DAG; raise ``WorkflowDefinitionError`` naming every culprit."""
        if self._graph is None:
            self.steps = late_dependencies(self.steps)
            self._graph = validate(self.name, self.steps, self.compensations,
                                   [*self._compensation_problems(), *dataflow_problems(self.steps, self.compensations)])
            self.__dict__.pop("order", None)
            self.__dict__.pop("definition_hash", None)
        return self

    def _compensation_problems(self) -> list[str]:
        """Each compensation bound as the rollback will bind it, now rather than half-way through one."""
        problems = []
        for step in self.steps:
            fn = self.compensation_for(step)
            if fn is not None and callable(fn):
                try:
                    bind(compensation_node(step), fn, self.steps,
                         what=f"the compensation {getattr(fn, '__name__', fn)!r} of step {step!r}")
                except WorkflowDefinitionError as exc:
                    problems.append(str(exc))
        return problems

    @property
    def graph(self) -> nx.DiGraph:
        self.validate()
        assert self._graph is not None
        return self._graph

    @cached_property
    def order(self) -> list[str]:
        """Steps in a deterministic topological order."""
        return list(nx.lexicographical_topological_sort(self.graph))

    def dependents(self, step: str) -> list[str]:
        return sorted(self.graph.successors(step))

    def sinks(self) -> list[str]:
        return [s for s in self.order if self.graph.out_degree(s) == 0]

    def compensation_for(self, step: str) -> Callable[..., Any] | None:
        return self.compensations.get(step) or self.steps[step].compensate

    @cached_property
    def definition_hash(self) -> str:
        """Hash of the DAG's shape and contracts; a resume refuses a run started under another one."""
        self.validate()
        shape = {"name": self.name, "version": self.version,
                 "steps": [self.steps[s].signature_for_hash() for s in self.order],
                 "compensations": sorted(self.compensations)}
        return hashlib.sha256(json.dumps(shape, sort_keys=True).encode()).hexdigest()

    @property
    def input_type(self) -> Any:
        """The annotation of the ``input`` parameters (they must agree), or Any."""
        return run_input.input_type(self)

    def check_input(self, value: Any, *, stored: bool = False) -> Any:
        """Validate a run input against the declared input type; return its JSON form."""
        return run_input.check_input(self, value, stored=stored)


#: Declared types a JSON value of exactly that type already is (no validation to run).
_SCALARS = frozenset({int, str, float, bool})


def coerce(tp: Any, value: Any) -> Any:
    """Turn stored JSON back into the type a step's parameter declares (pydantic models etc.)."""
    if tp is Any or tp is None or value is None or (type(value) is tp and tp in _SCALARS):
        return value
    if isinstance(tp, type) and issubclass(tp, BaseModel):  # (stored by name: read by name and by alias)
        return tp.model_validate(value, by_alias=True, by_name=True)
    return type_adapter(tp).validate_python(value, by_alias=True, by_name=True)
