"""A fan-out's state from its items' counts: the Python rule (``fan_states.fan_state``: ``status``,
``--dag``) and the dashboard's TypeScript ``fanState`` give the same answer for every mix (stop 51).

A cancel (or a rollback) that ended a fan-out mid-way left completed and cancelled items and none
to go on: both said ``running``, which ``status`` then showed ``interrupted`` on a finished run. It
is ``cancelled`` now, in both copies; this test keeps the two from drifting apart. The TypeScript
is bundled with the project's own esbuild (``dashboard-ui/node_modules``, installed by ``.ci/run``)
and run by node.
"""

from __future__ import annotations

import itertools
import json
import shutil
import subprocess
from pathlib import Path

import pytest

from raysaga.orchestrator.fan_states import fan_state

UI = Path(__file__).resolve().parents[2] / "dashboard-ui"
STATES = ("pending", "running", "retrying", "waiting", "failed", "completed", "cancelled", "skipped")


def _mixes() -> list[dict[str, int]]:
    """Every mix of up to three states (counts 1 or 2), and no items at all."""
    mixes: list[dict[str, int]] = [{}]
    for size in (1, 2, 3):
        for states in itertools.combinations(STATES, size):
            for counts in itertools.product((1, 2), repeat=size):
                mixes.append(dict(zip(states, counts, strict=True)))
    return mixes


def test_a_fan_out_a_cancel_ended_is_cancelled_not_running() -> None:
    assert fan_state({"completed": 3, "cancelled": 1}) == "cancelled"
    assert fan_state({"completed": 3, "cancelled": 1, "pending": 2}) == "running"  # (what goes on)
    assert fan_state({"completed": 3}) == "completed"


def test_the_dashboard_agrees_with_python_on_every_mix(tmp_path: Path) -> None:
    esbuild, node = UI / "node_modules" / ".bin" / "esbuild", shutil.which("node")
    if not esbuild.exists() or node is None:
        pytest.skip("dashboard-ui's node_modules (npm ci) and node are needed")
    bundle = tmp_path / "status.cjs"
    subprocess.run([str(esbuild), str(UI / "src" / "status.ts"), "--bundle", "--format=cjs", "--platform=node",
                    f"--outfile={bundle}"], check=True, capture_output=True, timeout=120)
    mixes = _mixes()
    (tmp_path / "mixes.json").write_text(json.dumps(mixes))
    script = (f"const s = require({str(bundle)!r}); const m = require({str(tmp_path / 'mixes.json')!r});"
              "process.stdout.write(JSON.stringify(m.map((c) => s.fanState(c))));")
    done = subprocess.run([node, "-e", script], check=True, capture_output=True, text=True, timeout=120)
    ts = json.loads(done.stdout)
    differ = [(mix, py, t) for mix, t in zip(mixes, ts, strict=True) if (py := fan_state(mix)) != t]
    assert not differ, differ[:10]
