"""What a resume says when a workflow's definition changed (``raysaga.orchestrator.versions``)."""

from __future__ import annotations

import time
from typing import Any

from raysaga import Workflow
from raysaga.orchestrator.versions import changes, definition_known, step_hashes
from raysaga.state import RunRecord, RunStatus


def _flow(version: str = "1", *, extra: bool = False, timeout: float | None = None) -> Workflow:
    wf = Workflow("vers", version=version)

    @wf.step()
    def a(input: int) -> int:
        return input

    @wf.step(timeout=timeout)
    def b(a: int) -> int:
        return a

    if extra:
        @wf.step()
        def c(b: int) -> int:
            return b

    return wf


def _run(wf: Workflow, **extra: Any) -> RunRecord:
    values: dict[str, Any] = {
        "run_id": "r", "workflow_name": wf.name, "workflow_version": wf.version, "status": RunStatus.RUNNING,
        "definition_hash": wf.definition_hash, "step_hashes": step_hashes(wf), "version": 1, "trace_id": "t",
        "created_at": time.time(), "updated_at": time.time()}
    return RunRecord.model_validate({**values, **extra})


def test_nothing_changed() -> None:
    assert changes(_run(_flow()), _flow()) is None
    assert definition_known(_run(_flow()), _flow()) and not definition_known(_run(_flow()), _flow("2"))


def test_the_changed_added_and_removed_steps_are_named() -> None:
    now = _flow(extra=True, timeout=5.0)
    found = changes(_run(_flow()), now)
    assert found is not None and (found.changed, found.added, found.removed) == (["b"], ["c"], [])
    assert found.describe() == "steps changed: b; steps added: c"
    back = changes(_run(now), _flow("2"))
    assert back is not None
    assert back.describe() == "version 1 -> 2; steps changed: b; steps removed: c"


def test_a_run_recorded_without_step_hashes_says_so() -> None:
    found = changes(_run(_flow(), step_hashes=None), _flow(extra=True))
    assert found is not None and not found.known
    assert "recorded without per-step hashes" in found.describe()
