"""Third adversarial round, ``--db`` naming a file the file system cannot hold.

A SQLite path whose file name is longer than the file system takes (255 bytes on ext4) made
every read command (``list``, ``status``, ``events``, ``prune``...) fail with
``OSError: [Errno 36] File name too long`` and a hint to rerun with ``--debug``: ``Path.exists``
raises for it. Now it is one line naming the store and the option to fix, and nothing is created.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.support.cli import invoke, one_line_error


@pytest.mark.parametrize("command", [["list"], ["status", "order-7"], ["prune", "--older-than", "30d"]])
def test_a_store_file_name_too_long_is_one_line(tmp_path: Path, command: list[str]) -> None:
    path = tmp_path / ("x" * 300 + ".db")
    code, _, err = invoke(*command, "--db", f"sqlite:///{path}")
    one_line_error(code, err, "cannot be a store file (File name too long): check --db or RAYSAGA_DB")
    assert list(tmp_path.iterdir()) == []
