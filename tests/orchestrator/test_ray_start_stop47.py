"""A Ray that raysaga starts itself (the host called no ``ray.init()``), in a process of its own:
the test session's is connected already. Its driver joins the session's cluster (``RAY_ADDRESS``).

- ``ray.init`` (and ``import ray``) replaced the host's SIGTERM handler, ``sys.excepthook`` and
  environment variables for good: a uvicorn host lost its graceful shutdown. They are put back
  when raysaga shuts its Ray down.
- Runs in two threads: each executor checked ``ray.is_initialized()`` then called ``ray.init()``
  with no lock, and the first run to end shut Ray down under the other's step. One start under a
  lock; the last executor using it shuts it down."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

FLOWS = '''
import time
from pathlib import Path
from raysaga import Workflow

def _wait_for(path: str) -> None:
    deadline = time.monotonic() + 120
    while not Path(path).exists() and time.monotonic() < deadline:
        time.sleep(0.05)

first = Workflow("fixray_first")

@first.step
def quick(input: dict) -> str:
    _wait_for(input["b_started"])  # ends only once the other run's step runs
    return "first"

second = Workflow("fixray_second")

@second.step
def slow(input: dict) -> str:
    Path(input["b_started"]).touch()
    _wait_for(input["a_done"])  # runs on while the first run ends
    return "second"

@second.step
def after(slow: str) -> str:
    return slow + "!"
'''


def _run(tmp_path: Path, ray_address: str, code: str) -> dict[str, object]:
    (tmp_path / "fixray_flows.py").write_text(FLOWS)
    env = {**os.environ, "RAY_ADDRESS": ray_address}
    proc = subprocess.run([sys.executable, "-c", textwrap.dedent(code)], cwd=tmp_path, env=env,
                          capture_output=True, text=True, timeout=400)
    assert proc.returncode == 0, proc.stderr[-3000:]
    out: dict[str, object] = json.loads(proc.stdout.strip().splitlines()[-1])
    return out


def test_the_hosts_signal_handlers_hook_and_environment_are_put_back(tmp_path: Path, ray_address: str) -> None:
    out = _run(tmp_path, ray_address, f'''
        import json, os, signal, sys
        import raysaga
        from fixray_flows import first
        def host_term(signum, frame): pass
        def host_int(signum, frame): pass
        signal.signal(signal.SIGTERM, host_term)
        signal.signal(signal.SIGINT, host_int)
        hook, env = sys.excepthook, dict(os.environ)
        open("{tmp_path}/b", "w").close()
        rec = raysaga.run(first, {{"b_started": "{tmp_path}/b"}}, store="sqlite:///{tmp_path}/r.db", executor="ray")
        import ray
        changed = sorted(k for k in set(env) | set(os.environ) if env.get(k) != os.environ.get(k))
        print(json.dumps({{"status": rec.status.value, "ray": ray.is_initialized(),
                          "term": signal.getsignal(signal.SIGTERM) is host_term,
                          "int": signal.getsignal(signal.SIGINT) is host_int,
                          "hook": sys.excepthook is hook, "env": changed}}))
    ''')
    assert out == {"status": "completed", "ray": False, "term": True, "int": True, "hook": True, "env": []}


def test_runs_in_threads_share_the_ray_raysaga_starts(tmp_path: Path, ray_address: str) -> None:
    out = _run(tmp_path, ray_address, f'''
        import json, threading
        from pathlib import Path
        import raysaga
        from fixray_flows import first, second
        url, inp = "sqlite:///{tmp_path}/r.db", {{"b_started": "{tmp_path}/b", "a_done": "{tmp_path}/a"}}
        got = {{}}
        def drive(name, wf):
            try:
                got[name] = raysaga.run(wf, inp, store=url, executor="ray").status.value
            except BaseException as exc:
                got[name] = f"raised {{type(exc).__name__}}: {{exc}}"
        a = threading.Thread(target=drive, args=("a", first))
        b = threading.Thread(target=drive, args=("b", second))
        a.start(); b.start()
        a.join()
        import ray
        up = ray.is_initialized()
        Path("{tmp_path}/a").touch()  # the second run's step goes on, the first run over
        b.join()
        print(json.dumps({{**got, "up_after_a": up, "up_after_b": ray.is_initialized()}}))
    ''')
    assert out == {"a": "completed", "b": "completed", "up_after_a": True, "up_after_b": False}
