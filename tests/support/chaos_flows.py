"""Random workflows for the chaos suite, built from a JSON spec so any process rebuilds the same DAG.

Not a test module. A spec (``tests.support.chaos_gen`` draws them) is a plain JSON object::

    {"name": "chaos_1a2b", "steps": [
        {"name": "s0", "kind": "plan", "items": 3, "deps": []},
        {"name": "s1", "kind": "map", "over": "s0", "deps": ["s0"], "effect": true, "compensate": true,
         "fail_items": [2], "policy": {"kind": "quorum", "k": 2}},
        {"name": "s2", "kind": "step", "deps": ["s1"], "effect": true, "fate": "flaky",
         "critical": false, "on_failure": "pass"}, ...]}

``build(spec)`` turns it into a ``Workflow``; ``FLOWS[path]`` builds the spec saved as JSON at
``path``, which is how a driver process gets it
(``python -m tests.support.crash_driver --flows tests.support.chaos_flows --flow /tmp/x/spec.json``).

Every step is deterministic in its inputs and its attempt number:

- ``plan`` returns ``items`` elements; ``map`` runs once per element of ``over``'s output,
  its items in ``fail_items`` failing permanently, with the fan-out ``policy`` (``all``,
  ``best_effort``, ``quorum`` k, ``ratio`` r) deciding what the step does with them;
- ``fate``: ``ok``; ``fail`` (``Permanent``, before any call); ``flaky`` (a ``ConnectionError``
  on attempt 1, before any call, then ``ok``);
- ``effect``: one call to the fake provider (kind ``do``, subject ``<seed>/<label>``) with
  ``ctx.idempotency_key``; ``compensate``: a compensation calling it (kind ``undo``, subject
  ``<seed>/<label>:undo``) with its own key, so the provider's ordered log is the rollback's order;
- ``critical`` (default true) and ``on_failure`` (``skip``/``pass``) as in the DSL.

A step's output digests its name, the run's seed and every input it received (canonical JSON,
fan-out results included), so a resumed run that fed a step anything else than the golden run
did ends with other outputs.
"""

from __future__ import annotations

import hashlib
import inspect
import json
from collections.abc import Callable, Iterator, Mapping
from functools import cache
from pathlib import Path
from typing import Any

from pydantic import BaseModel

from raysaga import BEST_EFFORT, Permanent, RetryPolicy, StepContext, Workflow, min_success_ratio, quorum
from raysaga.sagas.policy import ALL, FanOutPolicy, FanOutResult
from tests.support import services as fake_services

#: A flaky step's second attempt is due at once: with any backoff, whether a rollback starts
#: before or after the retry would hang on the wall clock (and a crash's pause lets the timer
#: run out), so a resumed run could legitimately end otherwise than the golden one.
FAST_RETRY = RetryPolicy(max_attempts=3, base=0.0, cap=0.0)
COMPENSATION_RETRY = RetryPolicy(max_attempts=3, base=0.01, cap=0.02)
FATES = ("ok", "fail", "flaky")
POLICIES = ("all", "best_effort", "quorum", "ratio")
FAN_OUT_FIELDS = set(FanOutResult.model_fields)


class ChaosIn(BaseModel):
    services_url: str
    seed: str = "chaos"


def sample_input(services_url: str, seed: str = "chaos") -> dict[str, Any]:
    return ChaosIn(services_url=services_url, seed=seed).model_dump()


def canonical(value: Any) -> Any:
    """``value`` as plain JSON data (pydantic models dumped), for digests.

    A fan-out result's failures lose their attempt counts: a crash may cost an attempt (a killed
    attempt counts, so a step that kills its process is parked), so they may differ from the
    golden run's without anything being wrong."""
    if isinstance(value, BaseModel):
        return canonical(value.model_dump(mode="json"))
    if isinstance(value, dict):
        if set(value) == FAN_OUT_FIELDS:  # a FanOutResult, as a step with an untyped input gets it
            value = {**value, "failures": [{k: v for k, v in f.items() if k != "attempts"} for f in value["failures"]]}
        return {str(k): canonical(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [canonical(v) for v in value]
    return value


def digest(*parts: Any) -> str:
    return hashlib.sha256(json.dumps(canonical(list(parts)), sort_keys=True).encode()).hexdigest()[:12]


def _key(ctx: StepContext) -> str:
    assert ctx.idempotency_key is not None, f"{ctx.label} is not an effect"
    return ctx.idempotency_key


def run_step(step: dict[str, Any], ctx: StepContext, input: ChaosIn, deps: dict[str, Any]) -> Any:
    """The body of every generated step."""
    fate = step.get("fate", "ok")
    if step["kind"] == "map" and ctx.fan_index in step.get("fail_items", []):
        fate = "fail"
    if fate == "flaky" and ctx.attempt == 1:
        raise ConnectionError(f"{ctx.label}: flaky on its first attempt")
    if fate == "fail":
        raise Permanent(f"{ctx.label} fails on purpose")
    receipt = None
    if step.get("effect"):
        reply = fake_services.post(input.services_url, "do", _key(ctx), {"subject": f"{input.seed}/{ctx.label}"})
        receipt = reply["id"]
    mine = digest(ctx.label, input.seed, deps)
    if step["kind"] == "plan":
        return [{"item": i, "d": digest(mine, i)} for i in range(step["items"])]
    return {"step": ctx.label, "d": mine, "receipt": receipt}


def undo(ctx: StepContext, input: ChaosIn, output: Any) -> dict[str, Any]:
    """The compensation of every compensated step: one provider call, kind ``undo``."""
    reply = fake_services.post(input.services_url, "undo", _key(ctx), {
        "subject": f"{input.seed}/{ctx.label}:undo", "output": digest(output)})
    return {"undo": reply["id"]}


def _policy(spec: dict[str, Any] | None) -> FanOutPolicy:
    kind = (spec or {}).get("kind", "all")
    if kind == "best_effort":
        return BEST_EFFORT
    if kind == "quorum":
        return quorum(int(spec["k"]))  # type: ignore[index]
    if kind == "ratio":
        return min_success_ratio(float(spec["r"]))  # type: ignore[index]
    assert kind == "all", kind
    return ALL


def _function(step: dict[str, Any]) -> Callable[..., Any]:
    """A function named after the step whose parameters are ``ctx``, ``input`` and its dependencies."""
    deps: list[str] = list(step["deps"])

    def body(**kwargs: Any) -> Any:
        ctx, run_input = kwargs.pop("ctx"), kwargs.pop("input")
        return run_step(step, ctx, run_input, kwargs)

    kind = inspect.Parameter.POSITIONAL_OR_KEYWORD
    params = [inspect.Parameter("ctx", kind, annotation=StepContext),
              inspect.Parameter("input", kind, annotation=ChaosIn)]
    params += [inspect.Parameter(dep, kind, annotation=Any) for dep in deps]
    body.__signature__ = inspect.Signature(params, return_annotation=Any)  # type: ignore[attr-defined]
    body.__annotations__ = {"ctx": StepContext, "input": ChaosIn, **dict.fromkeys(deps, Any), "return": Any}
    body.__name__ = body.__qualname__ = step["name"]
    return body


def build(spec: dict[str, Any]) -> Workflow:
    """The workflow of ``spec`` (the same DAG, names and contracts in every process)."""
    wf = Workflow(spec["name"], version="1", description="a random DAG of the chaos suite")
    for step in spec["steps"]:
        options: dict[str, Any] = {
            "name": step["name"], "effect": bool(step.get("effect")), "retry": FAST_RETRY,
            "critical": bool(step.get("critical", True)), "on_failure": step.get("on_failure", "skip")}
        if step["kind"] == "map":
            wf.map(step["over"], policy=_policy(step.get("policy")), **options)(_function(step))
        else:
            wf.step(**options)(_function(step))
        if step.get("compensate"):
            wf.compensation(step["name"], retry=COMPENSATION_RETRY)(undo)
    return wf.validate()


@cache
def load(path: str) -> Workflow:
    return build(json.loads(Path(path).read_text()))


class _Specs(Mapping[str, Workflow]):
    """``FLOWS[path]``: the workflow of the JSON spec at ``path`` (for ``crash_driver --flow``)."""

    def __getitem__(self, path: str) -> Workflow:
        if not Path(path).is_file():
            raise KeyError(path)
        return load(path)

    def __iter__(self) -> Iterator[str]:
        return iter(())

    def __len__(self) -> int:
        return 0


FLOWS = _Specs()


def save(spec: dict[str, Any], folder: Path) -> str:
    """Write ``spec`` as JSON into ``folder``; return the path a driver process takes as ``--flow``."""
    path = folder / f"{spec['name']}.json"
    path.write_text(json.dumps(spec, indent=1, sort_keys=True))
    return str(path)
