"""A ``raysaga worker`` started with SIGINT ignored keeps it ignored; SIGTERM still stops it cleanly.

A non-interactive shell starts ``nohup raysaga worker &`` with SIGINT ignored: the job shares the
terminal's process group, so a Ctrl-C meant for the foreground job reaches it too. The worker's
CLI installed its Ctrl-C handler regardless, and such a worker stopped (handing its runs back) on
that Ctrl-C. Real processes: the worker drives a step that waits for a file; the test sends
SIGINT, then SIGTERM, then opens the gate (not for the control, which must stop without it). A
worker that acted on the SIGINT takes the SIGTERM as a second signal and exits at once with 143
(the handlers run in signal-number order, SIGINT's first); one that ignored it stops cleanly on
the SIGTERM, exit 0, its run handed back after the step in flight committed.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import pytest

from raysaga import Client
from raysaga.state import NodeStatus, RunStatus, SqlStore
from tests.support import REPO
from tests.support import gated_stop29 as flows
from tests.support.child_signals import sigint_default, sigint_ignored
from tests.support.crash_driver import wait_until


def _worker(db: str, preexec: Callable[[], None]) -> subprocess.Popen[str]:
    args = [sys.executable, "-m", "raysaga", "worker", "--db", db, "--executor", "inline", "--lease-ttl", "30",
            "--poll", "0.05", "--concurrency", "1", "--workflow", "tests.support.gated_stop29:gated"]
    return subprocess.Popen(args, cwd=REPO, env={**os.environ, "PYTHONPATH": str(REPO)}, text=True,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, preexec_fn=preexec)


@pytest.mark.parametrize(("preexec", "signals", "code"), [
    (sigint_ignored, [signal.SIGINT, signal.SIGTERM], 0),  # the SIGINT is not acted on
    (sigint_ignored, [signal.SIGTERM], 0),
    (sigint_default, [signal.SIGINT], 0),  # Ctrl-C in the foreground still stops it cleanly
    (sigint_default, [signal.SIGINT, signal.SIGTERM], 143),  # the control: a second signal, at once
], ids=["ignored-int-then-term", "ignored-term", "default-int", "default-int-then-term"])
def test_an_inherited_ignored_sigint_is_kept(sqlite_url: str, tmp_path: Path, preexec: Callable[[], None],
                                            signals: list[int], code: int) -> None:
    with Client(sqlite_url) as client:
        run_id = client.submit(flows.gated, {"dir": str(tmp_path)}).run_id
    proc = _worker(sqlite_url, preexec)
    try:
        wait_until(lambda: (tmp_path / "started").exists() or proc.poll() is not None, timeout=60,
                   what="the worker to start the gated step")
        assert proc.poll() is None, proc.communicate()
        for signum in signals:
            proc.send_signal(signum)
        if code == 0:  # a clean stop waits for the step in flight: open its gate
            (tmp_path / "go").write_text("go")
        # The control stops at once, before the gate opens: its step never finishes, so nothing can
        # hand the run back first. (Opening the gate here raced the signal: the main thread runs the
        # handlers when its join wakes, up to 0.5 s after a signal another thread received, by
        # which time the step could have committed and the run been handed back.)
        out, err = proc.communicate(timeout=60)
    finally:
        proc.kill()
    assert proc.returncode == code, (out, err)
    store = SqlStore(sqlite_url)
    try:
        run = store.get_run(run_id)
        nodes = {n.node_id: n.status for n in store.nodes(run_id)}
    finally:
        store.close()
    if code == 0:  # a clean stop: the step in flight finished and was committed, the run handed back
        assert "handed back 1" in out, (out, err)
        assert run.status == RunStatus.RUNNING and run.lease_owner is None
        assert nodes == {"gate": NodeStatus.COMPLETED}
    else:  # stopped at once: the lease is still held by the dead process
        assert run.lease_owner is not None
