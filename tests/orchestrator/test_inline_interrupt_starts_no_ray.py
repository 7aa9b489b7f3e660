"""An inline step's own ``KeyboardInterrupt`` or ``sys.exit()`` fails it for good, as on Ray
(tests/orchestrator/test_inline_step_exits.py), and starts nothing on the way: deciding whether
the step ran on a Ray worker once asked Ray (``ray.get_runtime_context()``), which starts a local
Ray cluster in a process that has imported Ray without joining one (seen: the test session's own
process joined a new local cluster and every later Ray test refused the session's)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

SCRIPT = """
import sys
import ray
import raysaga
from raysaga import Workflow

wf = Workflow("interrupted")

@wf.step
def boom() -> None:
    raise {exc}

try:
    record = raysaga.run(wf.validate(), None, store=sys.argv[1], executor="inline")
    print(record.status, record.error.message.split(":")[0], "ray started:", ray.is_initialized(), flush=True)
except BaseException as exc:
    print(type(exc).__name__, "ray started:", ray.is_initialized(), flush=True)
"""


@pytest.mark.parametrize("exc", ["KeyboardInterrupt", "SystemExit(3)"])
def test_an_inline_step_ending_the_process_starts_no_ray(exc: str, tmp_path: Path) -> None:
    done = subprocess.run([sys.executable, "-c", SCRIPT.format(exc=exc), f"sqlite:///{tmp_path / 's.db'}"],
                          capture_output=True, text=True, timeout=120)
    raised = f"{exc} (sys.exit())" if exc.startswith("SystemExit") else exc
    assert done.stdout.strip() == f"failed step 'boom' raised {raised} ray started: False", \
        done.stdout + done.stderr[-2000:]
