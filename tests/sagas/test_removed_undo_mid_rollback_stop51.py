"""A rollback resumed under code that no longer has the compensation that was running (stop 51).

The driver was SIGKILLed while ``charge``'s refund ran; the rollback was resumed with
``--allow-changed`` under code without that compensation. The run ended ``compensated`` with the
refund's row ``running`` for ever (guarantees.md: a rolled-back run shows no node running), and
``status`` showed it "interrupted ... it runs again when the run goes on" on a finished run. The
row is settled ``cancelled`` now, saying that whether the refund took effect is unknown.

A real ``raysaga run`` process killed by the engine's fault point; the resume in this process; a
real SQLite file.
"""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

import raysaga
from raysaga import RunOptions
from raysaga.state import NodeStatus, RunStatus, SqlStore
from tests.support.files import import_file

V1 = textwrap.dedent('''
    from raysaga import Permanent, Workflow

    wf = Workflow("undo51")


    @wf.step(effect=True)
    def charge(input: int) -> int:
        return input


    @wf.compensation("charge")
    def refund(output: int) -> None:
        pass


    @wf.step()
    def finish(charge: int) -> int:
        raise Permanent("the shop is closed")
''')
V2 = V1.replace('@wf.compensation("charge")', "")  # the refund is a plain function now: no undo


def test_the_refund_row_a_deploy_orphaned_is_settled(tmp_path: Path) -> None:
    (tmp_path / "v1").mkdir()
    (tmp_path / "v1" / "undo51_flow.py").write_text(V1)
    url = f"sqlite:///{tmp_path / 'raysaga.db'}"
    env = {k: v for k, v in os.environ.items() if k != "RAYSAGA_DB"}
    killed = subprocess.run([sys.executable, "-m", "raysaga", "run", "undo51_flow:wf", "--db", url, "--run-id", "u",
                             "--executor", "inline", "--input", "5"], cwd=tmp_path / "v1", capture_output=True,
                            text=True, timeout=120, env={**env, "RAYSAGA_FAULTS": "before_commit:charge:compensate"})
    assert killed.returncode == -9, killed.stdout + killed.stderr
    store = SqlStore(url)
    try:
        assert store.get_run("u").status == RunStatus.COMPENSATING
        assert {n.node_id: n.status for n in store.nodes("u")}["charge:compensate"] == NodeStatus.RUNNING
        (tmp_path / "v2.py").write_text(V2)
        wf2 = import_file(tmp_path / "v2.py", "undo51_v2").wf
        done = raysaga.resume(wf2, "u", store=store, executor="inline", options=RunOptions(allow_changed=True))
        assert done.status == RunStatus.COMPENSATED, done.status_reason
        rows = {n.node_id: n for n in store.nodes("u")}
        assert {r.status for r in rows.values()} <= {NodeStatus.COMPLETED, NodeStatus.FAILED, NodeStatus.CANCELLED}
        refund = rows["charge:compensate"]
        assert refund.status == NodeStatus.CANCELLED
        assert refund.error is not None and "whether it took effect is unknown" in str(refund.error.as_dict())
    finally:
        store.close()
