"""CPU seconds a run cost the machine: the bench process's descendants' (Ray's raylet, GCS and
workers), read from Linux's /proc. On 2 cores a CPU-bound run's wall time follows what every
process of it spent, so a row's CPU says where a gap in wall time comes from."""

from __future__ import annotations

import os

Snapshot = dict[int, float]


def children_cpu(exclude: int | None = None) -> Snapshot | None:
    """CPU seconds (user + system) so far of each of this process's descendants, but ``exclude``
    and its own; None without a Linux ``/proc``."""
    tick = os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 100
    parent: dict[int, int] = {}
    used: dict[int, float] = {}
    try:
        pids = [int(p) for p in os.listdir("/proc") if p.isdigit()]
    except OSError:
        return None
    for pid in pids:
        try:
            with open(f"/proc/{pid}/stat") as f:
                fields = f.read().rpartition(")")[2].split()
        except OSError:  # gone meanwhile
            continue
        parent[pid] = int(fields[1])
        used[pid] = (int(fields[11]) + int(fields[12])) / tick

    me, found = os.getpid(), {}
    for pid, cpu in used.items():
        up = pid
        while up > 1 and up != me and up != exclude:
            up = parent.get(up, 0)
        if up == me and pid != me:
            found[pid] = cpu
    return found


def spent(before: Snapshot | None, after: Snapshot | None) -> float | None:
    """CPU seconds the descendants spent between two snapshots: a process that started meanwhile
    counts whole; one that exited meanwhile is not counted (what it spent is gone with it)."""
    if before is None or after is None:
        return None
    total = 0.0
    for pid, cpu in after.items():
        then = before.get(pid)
        total += cpu - then if then is not None and then <= cpu else cpu  # (less than before: a pid reused)
    return total
