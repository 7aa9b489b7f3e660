"""An I/O-bound step that outlives its node timeout: a thread nobody can stop, so only killing the
pool actor's process ends it (tests/orchestrator/test_io_bound.py, test_io_pool_kill_stalled_raylet.py)."""

from __future__ import annotations

import os
import time

from raysaga import RetryPolicy, StepContext, Workflow


def stuck_io_workflow(name: str) -> Workflow:
    """``stuck``: each attempt appends its process id to the file named by the input, then sleeps
    60 s against a 2 s timeout; 2 attempts. Defined in a function: Ray pickles it by value."""
    wf = Workflow(name)

    @wf.step(io_bound=True, timeout=2.0, retry=RetryPolicy(max_attempts=2, base=0.01, cap=0.01))
    def stuck(ctx: StepContext, input: str) -> int:
        with open(input, "a") as fh:
            fh.write(f"{os.getpid()}\n")
        time.sleep(60)  # the workload: longer than the node timeout
        return ctx.attempt

    return wf
