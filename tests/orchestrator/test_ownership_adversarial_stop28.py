"""Third adversarial round, proving a lease holder gone: a process /proc does not show.

On a host whose /proc is mounted ``hidepid=1`` or ``hidepid=2`` (hardened servers), a process of
another user has no readable ``/proc/<pid>/stat``: a worker running as ``raysaga`` saw the live
driver of a ``raysaga run`` started by ``alice`` as "process not running" and took its lease at
once, every time it looked (the live driver then found its fence stale and stopped: a run handed
back and forth, its steps in flight cancelled). Now a pid the kernel still knows (signal 0
answers EPERM, not ESRCH) is alive, only unreadable: not provably gone.

The mount cannot be changed under the test session (it is the machine's), so /proc's refusal is
stood in for; the processes are real.
"""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Callable, Iterator

import pytest

from raysaga.orchestrator import ownership
from raysaga.orchestrator.ownership import gone_because

pytestmark = pytest.mark.skipif(not os.path.exists("/proc/self/stat"), reason="needs Linux /proc")


@pytest.fixture
def child() -> Iterator[subprocess.Popen[bytes]]:
    proc = subprocess.Popen([sys.executable, "-c", "import time\nwhile True: time.sleep(1)"])
    yield proc
    if proc.poll() is None:
        proc.kill()
    proc.wait()


def _owner(pid: int, start: int) -> str:
    return ":".join([ownership._host(), str(pid), str(start), ownership.boot_id() or "",
                     ownership.pid_namespace() or "", "abcd1234"])


def test_a_live_process_proc_hides_is_not_gone(child: subprocess.Popen[bytes],
                                               monkeypatch: pytest.MonkeyPatch) -> None:
    start = ownership.process_start(child.pid)
    assert start is not None
    owner = _owner(child.pid, start)
    read = ownership._read
    hidden = f"/proc/{child.pid}/"
    monkeypatch.setattr(ownership, "_read", lambda path: None if path.startswith(hidden) else read(path))
    monkeypatch.setattr(os, "kill", _eperm_for(child.pid, os.kill))  # what the kernel answers another user
    assert gone_because(owner) is None


def test_a_dead_process_proc_hides_is_still_gone(child: subprocess.Popen[bytes],
                                                 monkeypatch: pytest.MonkeyPatch) -> None:
    start = ownership.process_start(child.pid)
    assert start is not None
    owner = _owner(child.pid, start)
    child.kill()
    child.wait()
    read = ownership._read
    hidden = f"/proc/{child.pid}/"
    monkeypatch.setattr(ownership, "_read", lambda path: None if path.startswith(hidden) else read(path))
    assert gone_because(owner) == "process not running"


def _eperm_for(pid: int, kill: Callable[[int, int], None]) -> Callable[[int, int], None]:
    def answer(target: int, sig: int) -> None:
        kill(target, sig)  # raises ProcessLookupError if it is gone
        if target == pid:
            raise PermissionError(1, "Operation not permitted")

    return answer
