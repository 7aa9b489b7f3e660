"""A lease owner's identity (``host:pid:starttime:boot_id:pidns:random``, written by
``raysaga.orchestrator.ownership.new_owner``) read against this host's processes.

Here, in the state layer, so a claim can tell, in its transaction, an owner whose lease expired
while its process still runs (a driver gone silent: a step holding the GIL, a stopped process)
from one that died: only the death counts toward a crash loop (``claims.abandonment``).
``ownership`` builds on it (when an owner is provably *gone*).
"""

from __future__ import annotations

import os
import socket
from collections.abc import Callable
from dataclasses import dataclass

_FIELDS = 6
#: Process states of a pid that exited (a zombie, or dead being reaped).
EXITED = frozenset({"Z", "X", "x"})


@dataclass(frozen=True)
class Owner:
    host: str
    pid: int
    start: int | None
    boot: str | None
    pidns: str | None
    tag: str

    def label(self) -> str:
        return f"pid {self.pid} on {self.host}"


def read_text(path: str) -> str | None:
    try:
        with open(path, encoding="ascii", errors="replace") as fh:
            return fh.read().strip()
    except OSError:
        return None


def boot_id() -> str | None:
    """This kernel's boot id (hex, no dashes), or None where there is no /proc."""
    raw = read_text("/proc/sys/kernel/random/boot_id")
    return raw.replace("-", "") if raw else None


def pid_namespace() -> str | None:
    try:
        link = os.readlink("/proc/self/ns/pid")  # "pid:[4026531836]"
    except OSError:
        return None
    return link.partition("[")[2].rstrip("]") or None


def host_name() -> str:
    return (socket.gethostname() or "unknown").replace(":", "_")[:64]


def proc_stat(pid: int, read: Callable[[str], str | None] = read_text) -> tuple[str, int] | None:
    """(state letter, start time in ticks) of a live process of this namespace, else None."""
    raw = read(f"/proc/{pid}/stat")
    if not raw:
        return None
    fields = raw.rpartition(")")[2].split()  # after "pid (comm)": the comm may hold spaces and ')'
    try:
        return fields[0], int(fields[19])
    except (IndexError, ValueError):
        return None


def parse_owner(owner: str) -> Owner | None:
    """The parts of an owner string; None for one raysaga did not write. An older
    ``host:pid:random`` string parses with no start, boot or namespace (never checkable)."""
    parts = owner.split(":")
    if len(parts) >= _FIELDS:
        host = ":".join(parts[: len(parts) - _FIELDS + 1])
        pid, start, boot, pidns, tag = parts[len(parts) - _FIELDS + 1:]
    elif len(parts) >= 3:
        host, pid, tag = ":".join(parts[:-2]), parts[-2], parts[-1]
        start = boot = pidns = ""
    else:
        return None
    try:
        return Owner(host=host, pid=int(pid), start=int(start) if start else None, boot=boot or None,
                     pidns=pidns or None, tag=tag)
    except ValueError:
        return None


def checkable_here(parsed: Owner) -> bool:
    """Whether the owner ran under this kernel, in this pid namespace, on a host of this name: only
    then does its pid say anything here (a pid of another host or container names another process)."""
    if parsed.boot is None or parsed.pidns is None or parsed.start is None:
        return False
    return parsed.host == host_name() and parsed.boot == boot_id() and parsed.pidns == pid_namespace()


def alive_because(owner: str, read: Callable[[str], str | None] = read_text) -> str | None:
    """Why the owner's process provably still runs (this host, its pid there with the start time the
    owner recorded, not a zombie), or None when it may be gone or cannot be checked from here.
    Alive is about the process: its driver may be silent (its lease expired), it did not die."""
    parsed = parse_owner(owner)
    if parsed is None or not checkable_here(parsed):
        return None
    if parsed.pid == os.getpid():
        return f"its process ({parsed.label()}) is this one, running"
    found = proc_stat(parsed.pid, read)
    if found is None or found[0] in EXITED or found[1] != parsed.start:
        return None  # gone, a zombie, a reused pid, or hidden from us (/proc hidepid): not provably alive
    return f"its process ({parsed.label()}) still runs"
