"""An operator's cancel or pause stops an inline round between two items, as Ctrl-C does.

The inline executor runs a round's attempts one by one inside ``submit``; a stop signal was looked
at between two of them, a cancel or a pause only at the driver's next loop, once the whole round
had run: `raysaga cancel` of an 8-item fan-out of one-second items blocked ~8 s while every item
ran, effects (charges, emails) included, and only then ended the run ``cancelled``. Now the rest
of the round is held back once the driver's heartbeat has seen the cancel (or pause): those items
never run, their rows say ``not sent``, and an effect item's ledger row, written ``pending``
before the round, ends ``failed`` (it took no effect), not in doubt.

``tests.support.stop49_flows:charges``: the second item holds until its driver has seen the
signal, so the test knows which items had started before the cancel was seen, with no sleep.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

from raysaga.state import EffectStatus, NodeStatus, RunStatus, open_store
from tests.support import REPO
from tests.support.crash_driver import wait_until

ENV = {**os.environ, "PYTHONPATH": str(REPO)}


def _cli(*args: str, timeout: float = 180) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "raysaga", *args], cwd=REPO, env=ENV, capture_output=True,
                          text=True, timeout=timeout)


def _start(tmp_path: Path, db: str, run_id: str) -> subprocess.Popen[str]:
    """``raysaga run`` of the charges fan-out, inline, up to its second item holding for the signal."""
    proc = subprocess.Popen([sys.executable, "-m", "raysaga", "run", "tests.support.stop49_flows:charges",
                             "--executor", "inline", "--db", db, "--run-id", run_id, "--quiet",
                             "--input", json.dumps({"dir": str(tmp_path), "n": 8})],
                            cwd=REPO, env=ENV, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    wait_until(lambda: (tmp_path / "started-1").exists() or proc.poll() is not None, timeout=180,
               what="the second item to start")
    assert proc.poll() is None, proc.communicate()
    return proc


def _started(tmp_path: Path) -> list[int]:
    return sorted(int(p.name.split("-")[1]) for p in tmp_path.glob("started-*"))


def test_a_cancel_stops_an_inline_effect_fan_out_between_two_items(tmp_path: Path) -> None:
    db = f"sqlite:///{tmp_path / 'c.db'}"
    proc = _start(tmp_path, db, "cancel-49")
    cancelled = _cli("cancel", "cancel-49", "--db", db)
    out, err = proc.communicate(timeout=180)
    assert cancelled.returncode == 0, cancelled.stdout + cancelled.stderr
    assert proc.returncode == 1, out + err  # the run ended, not completed
    # the two items started before the cancel was seen; none after it
    assert _started(tmp_path) == [0, 1]
    assert len((tmp_path / "charges.log").read_text().splitlines()) == 2
    store = open_store(db)
    try:
        assert store.get_run("cancel-49").status == RunStatus.CANCELLED
        effects = store.effects("cancel-49")
        assert [e for e in effects if e.status == EffectStatus.PENDING] == []
        assert sorted(e.fan_index for e in effects if e.status == EffectStatus.COMMITTED) == [0, 1]
        nodes = {n.fan_index: n for n in store.nodes("cancel-49") if n.node_id == "charge"}
        for index in range(2, 8):  # held back: never sent, so no effect to undo or reconcile
            node = nodes[index]
            assert node.status == NodeStatus.CANCELLED, node
            assert node.error is not None and node.error.took_effect is False, node
        assert "total" not in {n.node_id for n in store.nodes("cancel-49")}
        kinds = [e.kind for e in store.events("cancel-49")]
        assert kinds[-1] == "run_cancelled", kinds
    finally:
        store.close()


def test_a_pause_holds_the_rest_of_an_inline_round_and_a_resume_charges_each_item_once(tmp_path: Path) -> None:
    db = f"sqlite:///{tmp_path / 'p.db'}"
    proc = _start(tmp_path, db, "pause-49")
    paused = _cli("pause", "pause-49", "--db", db)
    assert paused.returncode == 0, paused.stdout + paused.stderr
    out, err = proc.communicate(timeout=180)
    assert proc.returncode == 1, out + err
    assert _started(tmp_path) == [0, 1]
    store = open_store(db)
    try:
        assert store.get_run("pause-49").status == RunStatus.PAUSED
        assert [e for e in store.effects("pause-49") if e.status == EffectStatus.PENDING] == []
    finally:
        store.close()
    unpaused = _cli("unpause", "pause-49", "--db", db)
    assert unpaused.returncode == 0, unpaused.stdout + unpaused.stderr
    resumed = _cli("resume", "pause-49", "--db", db, "--executor", "inline", "--quiet")
    assert resumed.returncode == 0, resumed.stdout + resumed.stderr
    keys = (tmp_path / "charges.log").read_text().splitlines()
    assert len(keys) == len(set(keys)) == 8, keys  # each item charged once, under its own key
    assert _started(tmp_path) == list(range(8))
    store = open_store(db)
    try:
        run = store.get_run("pause-49")
        assert run.status == RunStatus.COMPLETED and run.output == {"total": 8}, run
    finally:
        store.close()
