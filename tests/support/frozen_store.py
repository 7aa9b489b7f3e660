"""A SQLite store its reader cannot write, made so for real (stop 49): ``chattr +i`` marks a folder
or file immutable, which even root cannot write, create files in or delete from, as an auditor's,
another Unix user's, a snapshot mount's or a backup's store is to whoever reads it.

``frozen`` clears the flags however the test ends (a frozen folder cannot be cleaned up), and skips
the test with the reason when ``chattr`` is missing or refused (not root, a file system without the
flag). ``wf`` is a one-step workflow the CLI runs inline (``tests.support.frozen_store:wf``).
"""

from __future__ import annotations

import shutil
import sqlite3
import subprocess
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest

from raysaga import Workflow

FLOW = "tests.support.frozen_store:wf"

wf = Workflow("frozen_store_stop49", version="1")


@wf.step()
def double(input: int) -> int:
    return input * 2


@contextmanager
def frozen(*paths: Path) -> Iterator[None]:
    """``paths`` immutable (``chattr +i``) for the ``with`` block, their flags cleared after."""
    if shutil.which("chattr") is None:
        pytest.skip("chattr is not installed: these tests make a store read-only with `chattr +i`")
    done: list[Path] = []
    try:
        for path in paths:
            made = subprocess.run(["chattr", "+i", str(path)], capture_output=True, text=True, check=False)
            if made.returncode != 0:
                pytest.skip(f"`chattr +i {path}` failed ({made.stderr.strip()}): these tests need root and a "
                            "file system with the immutable flag (ext4, xfs, btrfs)")
            done.append(path)
        yield
    finally:
        for path in reversed(done):
            subprocess.run(["chattr", "-i", str(path)], check=False)


def sidecars(db: Path) -> list[Path]:
    """The ``-wal`` and ``-shm`` files of ``db`` that exist."""
    return [p for p in (db.with_name(db.name + "-wal"), db.with_name(db.name + "-shm")) if p.exists()]


def runs_in_file_alone(db: Path) -> int:
    """The runs the database file holds by itself, its ``-wal`` left out (what ``immutable=1`` reads)."""
    conn = sqlite3.connect(f"{db.as_uri()}?mode=ro&immutable=1", uri=True)
    try:
        return int(conn.execute("SELECT count(*) FROM raysaga_runs").fetchone()[0])
    finally:
        conn.close()
