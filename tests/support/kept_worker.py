"""A fleet test's worker kept alive: a SIGKILLed ``raysaga worker`` is started again at once, as a
supervisor (systemd, Kubernetes) would, so a poison pill meets a new process each time."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path
from typing import IO

from tests.support import REPO


class KeptWorker:
    """One ``raysaga worker`` process (inline executor, a 2 s lease, ``args`` for the rest) started
    again whenever it dies: the deaths' exit codes are kept, and each process's output in a file."""

    def __init__(self, db: str, folder: Path, *args: str) -> None:
        self.db, self.folder, self.args = db, folder, args
        self.proc: subprocess.Popen[bytes] | None = None
        self.files: list[IO[bytes]] = []
        self.deaths: list[int] = []
        self.start()

    def start(self) -> None:
        log = (self.folder / f"worker-{len(self.files)}.log").open("wb")
        self.files.append(log)
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "raysaga", "worker", "--db", self.db, "--executor", "inline", "--lease-ttl", "2",
             "--poll", "0.05", *self.args],
            cwd=REPO, env={**os.environ, "PYTHONPATH": str(REPO)}, stdout=log, stderr=subprocess.STDOUT)

    def keep_alive(self) -> None:
        assert self.proc is not None
        if self.proc.poll() is not None:
            self.deaths.append(self.proc.returncode)
            self.start()

    def logs(self) -> str:
        return "\n".join(f.name + ":\n" + Path(f.name).read_text(errors="replace")[-2000:] for f in self.files)

    def close(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout=60)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        for log in self.files:
            log.close()
