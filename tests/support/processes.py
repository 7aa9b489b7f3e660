"""Processes of this machine, read from ``/proc``: what a test started and must stop, or must
prove is gone."""

from __future__ import annotations

import contextlib
import os
from pathlib import Path
from typing import Any, cast


def pids_mentioning(marker: str, *, open_files: bool = False) -> list[int]:
    """Every process but this one whose command line contains ``marker`` (a Ray node's temp dir,
    a run id: Ray workers name themselves ``ray::<task name>``, and raysaga names tasks after runs).
    ``open_files``: also those holding a file open under ``marker`` (a folder): a Ray node's
    ``ray::DashboardAgent`` and ``ray::RuntimeEnvAgent`` name no folder, and outlived the teardowns
    that looked at command lines only (parent 1, for ever)."""
    found = []
    for proc_dir in Path("/proc").iterdir():
        if not proc_dir.name.isdigit() or int(proc_dir.name) == os.getpid():
            continue
        try:
            cmdline = (proc_dir / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
        except OSError:
            continue
        if marker in cmdline or (open_files and _holds_open_under(proc_dir, marker)):
            found.append(int(proc_dir.name))
    return found


def _holds_open_under(proc_dir: Path, folder: str) -> bool:
    try:
        for fd in (proc_dir / "fd").iterdir():
            with contextlib.suppress(OSError):
                if os.readlink(fd).startswith(folder):
                    return True
    except OSError:  # gone, or not ours to look at
        return False
    return False


def first_pid_mentioning(marker: str) -> int | None:
    """One process whose command line contains ``marker`` (e.g. a second Ray node's raylet), if any."""
    found = pids_mentioning(marker)
    return found[0] if found else None


def ray_nodes() -> list[dict[str, Any]]:
    """``ray.nodes()`` of the cluster this process joined: one dict per node (Ray leaves it untyped)."""
    import ray

    return cast(list[dict[str, Any]], ray.nodes())  # type: ignore[no-untyped-call]
