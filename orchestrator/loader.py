"""Resolve ``MODULE:WORKFLOW`` (a dotted module or a .py file path) to a ``Workflow``."""

from __future__ import annotations

import importlib
import importlib.util
import os
import sys
from pathlib import Path

from raysaga.errors import WorkflowLoadError
from raysaga.orchestrator.workflow import Workflow


def load_workflow(ref: str) -> Workflow:
    module_ref, sep, attr = ref.rpartition(":")
    if not sep or not module_ref or not attr:
        raise WorkflowLoadError(f"{ref!r} is not MODULE:WORKFLOW (e.g. examples.order.workflow:wf or flows.py:wf)")
    if os.getcwd() not in sys.path:
        sys.path.insert(0, os.getcwd())
    try:
        if module_ref.endswith(".py"):
            path = Path(module_ref)
            if not path.is_file():
                raise WorkflowLoadError(f"no such file {module_ref!r}")
            sys.path.insert(0, str(path.resolve().parent))
            spec = importlib.util.spec_from_file_location(path.stem, path)
            assert spec is not None and spec.loader is not None
            module = importlib.util.module_from_spec(spec)
            sys.modules[path.stem] = module
            spec.loader.exec_module(module)
        else:
            module = importlib.import_module(module_ref)
    except WorkflowLoadError:
        raise
    except ModuleNotFoundError as exc:
        raise WorkflowLoadError(f"cannot import {module_ref!r}: {exc} (run from the folder that contains it, "
                                "or pass a path like flows/order.py:wf)") from None
    except Exception as exc:
        raise WorkflowLoadError(f"importing {module_ref!r} failed: {type(exc).__name__}: {exc}") from None
    workflow = getattr(module, attr, None)
    if workflow is None:
        found = sorted(k for k, v in vars(module).items() if isinstance(v, Workflow))
        raise WorkflowLoadError(f"module {module_ref!r} has no attribute {attr!r}"
                                + (f"; workflows there: {', '.join(found)}" if found else ""))
    if not isinstance(workflow, Workflow):
        raise WorkflowLoadError(f"{ref!r} is a {type(workflow).__name__}, not a raysaga Workflow")
    return workflow.validate()
