"""Who drives a run: the lease owner's identity, and whether that owner is provably gone.

A driver's lease owner string is ``host:pid:starttime:boot_id:pidns:random``:

* ``host`` — the host name (for people; never trusted alone: host names repeat);
* ``pid`` and ``starttime`` — the process and its start time in clock ticks since boot
  (``/proc/<pid>/stat`` field 22), so a pid reused by a later process is told apart;
* ``boot_id`` — ``/proc/sys/kernel/random/boot_id`` without dashes: the running kernel;
* ``pidns`` — the inode of ``/proc/self/ns/pid``: the pid namespace the pid means something in;
* ``random`` — 8 hex digits, so two leases of one process differ.

**Provably gone** means: the owner ran under *this* kernel (same boot id) in *this* pid namespace,
on a host of the same name, and its pid no longer exists, is a zombie, or now belongs to a
process that started at another time (a reused pid). Only then may a resume or cancel take the
lease before it expires. Anything else — another host, another container, a process merely
stopped (SIGSTOP), an owner string written by an older raysaga — is treated as alive until its
lease expires: a lease cannot be proven dead from elsewhere.

**Provably alive** (``alive_because``, in ``raysaga.state.owner_identity``: a claim asks it) is the
converse: this kernel, this namespace, the pid running with the start time the owner recorded.
Such an owner whose lease expired went silent (a step holding the GIL in C code starves its
heartbeat thread; a stopped process): a take-over of it is no death (``state.claims.abandonment``),
and ``status`` says it is alive. Such take-overs are bounded all the same: too many in a row with no
progress between them park the run, naming its step (``crash_loop.live_takeovers_in_a_row``).
"""

from __future__ import annotations

import os
import shlex
import time
import uuid

from raysaga.errors import LeaseHeldError
from raysaga.state import Lease, RunRecord, Store
from raysaga.state.owner_identity import (
    EXITED,
    Owner,
    alive_because,
    boot_id,
    checkable_here,
    host_name,
    parse_owner,
    pid_namespace,
    proc_stat,
    read_text,
)

__all__ = ["Owner", "alive_because", "boot_id", "claim", "describe_lease", "gone_because", "let_go", "new_owner",
           "owner_is_gone", "parse_owner", "pid_namespace", "process_start"]

_read = read_text  # (module attributes: a test hides /proc/<pid>/ from this module's reads)
_host = host_name


def _stat(pid: int) -> tuple[str, int] | None:
    """(state letter, start time in ticks) of a live process of this namespace, else None."""
    return proc_stat(pid, _read)


def _exists(pid: int) -> bool:
    """Whether a process ``pid`` exists in this pid namespace (signal 0: nothing is sent)."""
    if pid <= 0:
        return False
    try:
        os.kill(pid, 0)
    except (ProcessLookupError, OverflowError):  # no such process (a pid beyond any: none either)
        return False
    except OSError:
        return True  # EPERM: it exists, another user's (anything else: not provably gone)
    return True


def process_start(pid: int) -> int | None:
    found = _stat(pid)
    return found[1] if found else None


def new_owner() -> str:
    """The lease owner string of a driver in this process (see the module doc)."""
    pid = os.getpid()
    start = process_start(pid)
    return ":".join([_host(), str(pid), "" if start is None else str(start), boot_id() or "",
                     pid_namespace() or "", uuid.uuid4().hex[:8]])


def gone_because(owner: str) -> str | None:
    """Why the owner is provably gone ("process not running", "zombie", "pid reused"), or None
    when it may be alive (or cannot be checked from here)."""
    parsed = parse_owner(owner)
    if parsed is None or not checkable_here(parsed):
        return None
    if parsed.pid == os.getpid():  # this process: alive, unless that driver stopped holding it
        return "its driver in this process stopped" if owner in _STOPPED else None
    found = _stat(parsed.pid)
    if found is None:
        # no readable /proc/<pid>/stat: gone, or only hidden from us (/proc mounted hidepid=1|2 hides
        # other users' processes): the kernel's answer to signal 0 tells them apart
        return "process not running" if not _exists(parsed.pid) else None
    state, start = found
    if state in EXITED:
        return "process exited (zombie)"
    if start != parsed.start:
        return "its pid now belongs to a newer process"
    return None


#: Owners of this process's drivers that stopped without letting go of their lease (``let_go``).
_STOPPED: set[str] = set()


def let_go(store: Store, lease: Lease) -> None:
    """Release a stopping driver's lease. When the store cannot take the release (it stopped
    answering), the lease stands until it expires, but its owner is known stopped: a driver of this
    process (``raysaga.resume`` after ``StoreOutageError``) takes the run over at once, not at expiry."""
    try:
        store.release(lease)
    except BaseException:
        _STOPPED.add(lease.owner)
        raise


def owner_is_gone(owner: str) -> bool:
    """True only when the owner ran on this host, this boot, this pid namespace, and is dead."""
    return gone_because(owner) is not None


def _utc(at: float) -> str:
    return time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime(at))


def describe_lease(run: RunRecord, now: float) -> str:
    """One human line about who drives the run, e.g. "live driver pid 4242 on host-a (lease renews;
    expires in 12s)", "driver pid 4242 on host-a is gone (process not running); `raysaga resume`
    takes over at once" or "no live driver since 2026-11-23 10:51:02 UTC". A driver whose lease expired
    while its process provably still runs here is "alive but silent", never "no live driver"."""
    if run.lease_owner is None:
        # A release clears the lease; the run's last write is when its last driver was active.
        return f"no live driver since {_utc(run.updated_at)}"
    parsed = parse_owner(run.lease_owner)
    who = parsed.label() if parsed else run.lease_owner
    expires = run.lease_expires_at
    # a run that records no workflow module (started from Python where none was found) needs it named
    resume = f"`raysaga resume {shlex.quote(run.run_id)}{'' if run.workflow_ref else ' --workflow MODULE:WF'}`"
    if expires is not None and expires < now:
        if alive_because(run.lease_owner, _read) is not None:  # silent, not dead: it computes on, unaware
            return (f"driver {who} is alive but silent: its lease expired at {_utc(expires)} (it renews no more: a "
                    f"step holding the GIL, or a stopped process); a worker or {resume} may take the run over, "
                    "and that driver then stops at its next write")
        return f"no live driver since {_utc(expires)} (the lease of driver {who} expired; {resume} takes over)"
    why = gone_because(run.lease_owner)
    if why is not None:
        return f"driver {who} is gone ({why}); {resume} takes over at once"
    left = f"expires in {max(0.0, expires - now):.0f}s" if expires is not None else "no expiry"
    if parsed is not None and parsed.host == _host() and parsed.boot == boot_id():
        return f"live driver {who} (lease renews; {left})"
    return f"driver {who} holds the lease (it renews while alive; {left}; not checkable from this host)"


def claim(store: Store, run_id: str, owner: str, ttl: float) -> tuple[Lease, str | None]:
    """Claim the run's lease if it is free or expired, or take it at once from an owner that is
    provably gone. Returns the lease and the owner it was taken from (None for a plain claim);
    ``LeaseHeldError`` if a live (or uncheckable) driver holds it."""
    try:
        return store.claim(run_id, owner, ttl), None
    except LeaseHeldError:
        run = store.get_run(run_id)
        dead = run.lease_owner
        if dead is None or (run.lease_expires_at is not None and run.lease_expires_at < time.time()):
            return store.claim(run_id, owner, ttl), None  # released or expired since: claim it plainly
        if not owner_is_gone(dead):
            raise
    return store.claim(run_id, owner, ttl, take_from=dead), dead
