"""Processes of this machine, read from ``/proc``: what a test started and must stop, or must
prove is gone."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any, cast


def pids_mentioning(marker: str) -> list[int]:
    """Every process but this one whose command line contains ``marker`` (a Ray node's temp dir,
    a run id: Ray workers name themselves ``ray::<task name>``, and raysaga names tasks after runs)."""
    found = []
    for proc_dir in Path("/proc").iterdir():
        if not proc_dir.name.isdigit() or int(proc_dir.name) == os.getpid():
            continue
        try:
            cmdline = (proc_dir / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
        except OSError:
            continue
        if marker in cmdline:
            found.append(int(proc_dir.name))
    return found


def first_pid_mentioning(marker: str) -> int | None:
    """One process whose command line contains ``marker`` (e.g. a second Ray node's raylet), if any."""
    found = pids_mentioning(marker)
    return found[0] if found else None


def ray_nodes() -> list[dict[str, Any]]:
    """``ray.nodes()`` of the cluster this process joined: one dict per node (Ray leaves it untyped)."""
    import ray

    return cast(list[dict[str, Any]], ray.nodes())  # type: ignore[no-untyped-call]
