"""Step placement options, checked when a step is declared: ``io_bound``, ``num_cpus``,
``num_gpus``, ``memory``, ``resources``; and the I/O pool's size (``RAYSAGA_IO_CONCURRENCY``).

No Ray here: the Ray side (a request no node can hold, a custom resource on a second node) is in
``test_resources_ray.py``.
"""

from __future__ import annotations

from typing import Any

import pytest

from raysaga import Workflow
from raysaga.agents import Agent, ScriptedModel
from raysaga.errors import WorkflowDefinitionError
from raysaga.orchestrator.io_pool import DEFAULT_IO_CONCURRENCY, io_concurrency_limit
from raysaga.orchestrator.options import InvalidOptionError
from raysaga.orchestrator.resources import ResourceRequest


def _one_step(**options: Any) -> Workflow:
    wf = Workflow("placed")

    @wf.step(**options)
    def work(input: int) -> int:
        return input

    return wf


def test_resources_become_ray_options() -> None:
    spec = _one_step(num_cpus=0.5, num_gpus=1, memory=2 * 1024**3, resources={"special": 1}).steps["work"]
    assert spec.resources == ResourceRequest(num_cpus=0.5, num_gpus=1.0, memory=2 * 1024**3,
                                             custom=(("special", 1.0),))
    assert spec.resources.ray_options() == {"num_cpus": 0.5, "num_gpus": 1.0, "memory": 2 * 1024**3,
                                            "resources": {"special": 1.0}}
    assert spec.resources.demand() == {"CPU": 0.5, "GPU": 1.0, "memory": 2.0 * 1024**3, "special": 1.0}
    assert spec.io_bound is None
    plain = _one_step().steps["work"]
    assert plain.resources is None and plain.io_bound is None
    assert _one_step(io_bound=True).steps["work"].io_bound is True
    assert _one_step(num_cpus=0).steps["work"].resources == ResourceRequest(num_cpus=0.0)


def test_map_takes_the_same_options() -> None:
    wf = Workflow("mapped")

    @wf.step()
    def plan() -> list[int]:
        return [1, 2]

    @wf.map("plan", io_bound=True)
    def fetch(plan: int) -> int:
        return plan

    @wf.map("plan", num_gpus=1)
    def train(plan: int) -> int:
        return plan

    assert wf.steps["fetch"].io_bound is True
    assert wf.steps["train"].resources == ResourceRequest(num_gpus=1.0)


@pytest.mark.parametrize(("options", "expected"), [
    ({"num_cpus": -1}, "num_cpus must be a finite number >= 0, got -1"),
    ({"num_gpus": "one"}, "num_gpus must be a finite number >= 0, got 'one'"),
    ({"num_gpus": True}, "num_gpus must be a finite number >= 0, got True"),
    ({"num_cpus": float("nan")}, "num_cpus must be a finite number >= 0"),
    ({"num_gpus": 1.5}, "above 1, Ray only grants whole units"),
    ({"memory": -5}, "memory must be a number of bytes >= 0"),
    ({"memory": "2GB"}, "memory must be a number of bytes >= 0, got '2GB'"),
    ({"memory": 1.5}, "memory is in bytes, got 1.5"),
    ({"resources": ["special"]}, "resources= must be a dict"),
    ({"resources": {"special": -1}}, "resources['special'] must be a finite number >= 0"),
    ({"resources": {"special": "x"}}, "resources['special'] must be a finite number >= 0"),
    ({"resources": {"": 1}}, "resource names must be non-empty strings"),
    ({"resources": {"GPU": 1}}, "use num_gpus= for Ray's GPU resource"),
    ({"resources": {"CPU": 1}}, "use num_cpus= for Ray's CPU resource"),
    ({"io_bound": "yes"}, "io_bound must be True or False"),
    ({"io_bound": True, "num_cpus": 1}, "io_bound=True runs it in a thread of the shared I/O pool"),
    ({"num_gpu": 1}, "unknown option(s) ['num_gpu']"),
])
def test_bad_placement_options_name_the_step(options: dict[str, Any], expected: str) -> None:
    with pytest.raises(WorkflowDefinitionError) as info:
        _one_step(**options)
    assert "step 'work'" in str(info.value)
    assert expected in str(info.value)


def test_map_refuses_unknown_options_naming_the_step() -> None:
    wf = Workflow("mapped")

    @wf.step()
    def plan() -> list[int]:
        return [1]

    # options the signature refuses, passed untyped so that the check at definition time is what is tested
    mistyped: dict[str, Any] = {"gpus": 1}
    with pytest.raises(WorkflowDefinitionError, match=r"step 'fetch': unknown option\(s\) \['gpus'\]"):
        @wf.map("plan", **mistyped)
        def fetch(plan: int) -> int:
            return plan


def test_agent_nodes_refuse_placement_and_unknown_options() -> None:
    agent = Agent("helper", ScriptedModel())
    wf = Workflow("agents")
    # options the signature refuses, passed untyped so that the check at definition time is what is tested
    placement: dict[str, Any] = {"num_gpus": 1}
    typo: dict[str, Any] = {"crtical": False}
    with pytest.raises(WorkflowDefinitionError, match=r"agent 'ask': \['num_gpus'\] do not apply to an agent node"):
        @wf.agent(agent, **placement)
        def ask(input: str) -> str:
            return input
    with pytest.raises(WorkflowDefinitionError, match=r"step 'ask2': unknown option\(s\) \['crtical'\]"):
        @wf.agent(agent, name="ask2", **typo)
        def ask(input: str) -> str:
            return input


def test_placement_does_not_change_the_definition_hash() -> None:
    """Where a step runs is not what it means: a run resumes after its resources change."""
    base = _one_step().definition_hash
    assert _one_step(num_gpus=1, memory=10**9, resources={"special": 2}).definition_hash == base
    assert _one_step(io_bound=True).definition_hash == base
    assert _one_step(critical=False).definition_hash != base  # a contract change still does


def test_io_concurrency_setting(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("RAYSAGA_IO_CONCURRENCY", raising=False)
    assert io_concurrency_limit() == DEFAULT_IO_CONCURRENCY == 64
    assert io_concurrency_limit(8) == 8
    monkeypatch.setenv("RAYSAGA_IO_CONCURRENCY", "200")
    assert io_concurrency_limit() == 200
    assert io_concurrency_limit(3) == 3  # the executor's argument wins over the environment
    for bad in ("0", "-4", "many", "2.5"):
        monkeypatch.setenv("RAYSAGA_IO_CONCURRENCY", bad)
        with pytest.raises(InvalidOptionError, match="RAYSAGA_IO_CONCURRENCY must be a whole number"):
            io_concurrency_limit()
    with pytest.raises(InvalidOptionError, match="io_concurrency must be a whole number"):
        io_concurrency_limit(0)
