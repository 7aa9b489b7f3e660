"""A second run in one process, each on a local Ray raysaga starts and shuts down, with an
I/O-bound step (every agent's model calls are): the second failed with Ray's raw "Can't find
actor ... from a different cluster" and was left ``running`` (stop 47's diff review). A new
local Ray gives its first driver the same job id, and the pools were kept by job id: the dead
one was reused. In a process of its own (the test session's is joined to the session's cluster)."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

SCRIPT = textwrap.dedent('''
    import json, sys
    import raysaga
    from raysaga import Workflow

    wf = Workflow("io_pool_new_ray_stop47")

    @wf.step(io_bound=True)
    def fetch(input: dict) -> int:
        return 1

    out = []
    for i in range(2):
        try:
            out.append(raysaga.run(wf, {"i": i}, store=sys.argv[1], executor="ray").status.value)
        except BaseException as exc:
            out.append(f"raised {type(exc).__name__}: {str(exc)[:300]}")
    print(json.dumps(out), flush=True)
''')


def test_a_second_run_on_a_new_local_ray_gets_a_new_io_pool(tmp_path: Path) -> None:
    env = {k: v for k, v in os.environ.items() if k != "RAY_ADDRESS"}  # a local Ray of its own, twice
    done = subprocess.run([sys.executable, "-c", SCRIPT, f"sqlite:///{tmp_path / 'io.db'}"], capture_output=True,
                          text=True, timeout=300, env=env, cwd=tmp_path)
    assert done.stdout.strip().splitlines()[-1:] == ['["completed", "completed"]'], done.stdout + done.stderr[-3000:]
