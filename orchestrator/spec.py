"""The frozen description of one step, built by the DSL and read by the driver and workers."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from raysaga.orchestrator.options import RetryPolicy
from raysaga.orchestrator.resources import ResourceRequest
from raysaga.sagas.policy import ALL, FanOutPolicy
from raysaga.types import RateLimit, is_compensation

#: Returned by a ``reconcile`` hook when the downstream shows the effect never happened.
NOT_APPLIED: Any = type("NotApplied", (), {"__repr__": lambda self: "NOT_APPLIED"})()


@dataclass(frozen=True)
class StepSpec:
    """One node kind of the DAG: a user function plus how raysaga must treat it."""

    name: str
    fn: Callable[..., Any]
    deps: tuple[str, ...]
    """Every upstream step, data or ordering."""
    param_deps: tuple[str, ...]
    """Parameters that receive an upstream step's output (param name == step name)."""
    input_param: str | None
    ctx_param: str | None
    param_types: dict[str, Any]
    output_type: Any
    map_over: str | None = None
    """Fan-out: run once per element of this upstream step's (list) output."""
    critical: bool = True
    effect: bool = False
    effect_name: str = ""
    retry: RetryPolicy | None = None
    timeout: float | None = None
    compensate: Callable[..., Any] | None = None
    reconcile: Callable[..., Any] | None = None
    fan_out_policy: FanOutPolicy = ALL
    """A fan-out's partial-failure policy; anything but ALL hands dependents a FanOutResult."""
    on_failure: str = "skip"
    """A non-critical step's failure: 'skip' its dependents, or 'pass' them a StepFailed record."""
    kind: str = "step"
    is_async: bool = False
    options: dict[str, Any] = field(default_factory=dict)
    io_bound: bool | None = None
    """Runs in the executor's I/O pool (a thread of a zero-CPU actor), not as a one-CPU task.
    None: the default, True for an agent's model and tool calls, False for a plain step."""
    resources: ResourceRequest | None = None
    """What each attempt asks Ray for (``num_cpus``, ``num_gpus``, ``memory``, custom resources)."""
    optional_params: dict[str, Any] = field(default_factory=dict)
    """Parameters with a default named after no step when the step was declared: each becomes a
    dependency if such a step exists once the workflow is complete (``Workflow.validate``)."""
    local: bool = False
    """Runs in the driver's own process, not as a Ray task (``local_steps``): cheap glue, a
    planner or a join, spared a Ray round trip. Left out of the hash, like ``io_bound``."""
    rate_limit: RateLimit | None = None
    """A fleet-wide limit each attempt is admitted through before it is sent (an agent's model
    calls, a tool's calls): left out of the hash, like ``resources``."""

    @property
    def checked_return(self) -> Any:
        """What a call's return value is checked against (``output_types``): a plain step's
        declared type; Any for kinds whose function returns something other than the node's
        output (an approval's ask, an agent's prompt) and for compensations (nothing reads what
        an undo returns, and a refund answering more than it declares must not park a rollback)."""
        return self.output_type if self.kind == "step" and not is_compensation(self.name) else Any

    def signature_for_hash(self, *, legacy: bool = False) -> dict[str, Any]:
        """What identifies the step's place and contract in the DAG (not its body).

        ``io_bound``, ``local`` and ``resources`` are left out on purpose: they say where an attempt runs, not
        what the step means or what its checkpoints hold, so a run resumes after they change (a
        step moved to a GPU node, given more memory, or to the I/O pool). See docs/execution.md.

        Since hash scheme 2 it also holds, each only when it is not the default (a step without it
        keeps the hash it had): whether the step reads the run's ``input``, a fan-out policy's
        threshold, an agent's tool contracts (``tool_contracts``). ``legacy``: the scheme-1 shape
        without them, by which a run recorded by an earlier raysaga is known to be of this very code
        (``versions.changes``). Types are not hashed: a resume checks that the stored outputs fit
        the types declared now (``machine.type_fit``)."""
        retry = self.retry
        shape = {
            "name": self.name,
            "deps": sorted(self.deps),
            "params": sorted(self.param_deps),
            "map_over": self.map_over,
            "critical": self.critical,
            "effect": self.effect,
            "effect_name": self.effect_name,
            "kind": self.kind,
            "retry": None if retry is None else [retry.max_attempts, retry.base, retry.cap],
            "timeout": self.timeout,
            "compensate": self.compensate is not None,
            "policy": self.fan_out_policy.kind,
            "on_failure": self.on_failure,
        }
        return shape if legacy else {**shape, **self._contract_extras()}

    def _contract_extras(self) -> dict[str, Any]:
        """The scheme-2 fields of ``signature_for_hash`` that differ from their defaults."""
        extras: dict[str, Any] = {}
        if self.input_param is not None:  # what it receives, and (for an effect) what its key is made of
            extras["input"] = True
        policy = self.fan_out_policy
        if policy.quorum is not None or policy.min_ratio is not None:
            extras["policy_args"] = [policy.quorum, policy.min_ratio]
        tools = tool_contracts(self.options.get("agent")) if self.kind == "agent" else []
        if tools:
            extras["tools"] = tools
        return extras


def tool_contracts(agent: Any) -> list[list[Any]]:
    """What each tool of an agent promises the ledger and a rollback: its name, whether it is an
    effect, the arguments its key is made of, whether it has an undo, whether a human approves it."""
    return sorted([tool.name, tool.effect, list(tool.key) if tool.key else None, tool.compensate is not None,
                   tool.requires_approval] for tool in getattr(agent, "tools", ()) or ())
