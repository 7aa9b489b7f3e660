"""Stop 46 (a review of the DSL): a step whose module is importable by the driver but not on the
Ray workers failed with ``RayTaskError(ModuleNotFoundError)``, its recorded message the whole
traceback through raysaga's wire module and cloudpickle, naming neither the problem (the code is
not on the worker) nor the way out (ship it with the job)."""

from __future__ import annotations

import importlib
import sys
import uuid
from pathlib import Path

import pytest

import raysaga
from raysaga import RetryPolicy, RunStatus, Workflow
from raysaga.orchestrator.executor import RayExecutor
from raysaga.state import SqlStore


def test_a_step_whose_module_is_missing_on_the_worker_says_so_and_how_to_ship_it(
        ray_session: str, sqlite_url: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    name = f"driver_only_{uuid.uuid4().hex[:8]}"  # importable here (sys.path), on no Ray worker
    folder = tmp_path / "driver_only"
    folder.mkdir()
    (folder / f"{name}.py").write_text("def fetch() -> int:\n    return 7\n")
    monkeypatch.syspath_prepend(str(folder))
    module = importlib.import_module(name)  # in sys.modules: pickled by reference, as a user's module is
    monkeypatch.setitem(sys.modules, name, module)  # (and gone from this process after the test)
    fetch = module.fetch
    wf = Workflow("code-missing", version="1")
    wf.step(retry=RetryPolicy(max_attempts=2, base=0.01, cap=0.01))(fetch)
    record = raysaga.run(wf, None, store=sqlite_url, executor=RayExecutor(address=ray_session))
    assert record.status == RunStatus.FAILED
    store = SqlStore(sqlite_url)
    try:
        (node,) = store.nodes(record.run_id)
    finally:
        store.close()
    error = node.error
    assert error is not None
    assert error["type"] == "StepCodeMissing" and error["transient"] is True, error
    message = error["message"]
    assert message.startswith("this Ray worker cannot load the step's code (ModuleNotFoundError: No module named "
                              f"'{name}')"), message
    assert "working_dir / py_modules: docs/cluster.md" in message and "Traceback" not in message, message
