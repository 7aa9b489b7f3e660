"""Zombie drivers and lease races for the chaos suite.

``zombie_trial``: driver A is armed to stall (``RAYSAGA_FAULTS=<point>:<label>=stall:S``) at a
fault point of a chaos DAG; once the store or the provider shows it got there and A sits in the
stall (``stalled``: its main thread blocked in ``time.sleep`` for a while, so not still making
another call the inline executor runs in the same batch), the test SIGSTOPs it (its heartbeat
stops with it) at a moment it holds no write lock on the SQLite file (``frozen_unlocked``),
waits for its lease to expire, lets driver B resume the run to rest, snapshots everything
durable and the provider's log, then SIGCONTs A. A must notice its stale fence and exit (lease
lost) without writing a row or making a call.

As a script, ``python -m tests.support.chaos_race --db URL --run-id ID --threads N --go FILE``
is one process of a claim race: N threads wait for the go file, then each calls
``store.claim`` on the run once at the same moment; it prints one ``RACE {json}`` line with
how many won, how many were told the lease is held, and any other error (by type and message).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import platform
import signal
import sqlite3
import subprocess
import sys
import threading
import time
from collections import Counter
from collections.abc import Callable
from pathlib import Path
from typing import Any

from raysaga.state import EffectStatus, NodeStatus, SqlStore
from tests.support import chaos_flows
from tests.support import crash_driver as harness
from tests.support.chaos_sweep import FLOWS, RUN_ID, Golden, Kill, check, ledger_of, returned_calls
from tests.support.kill_sweep import ledger_label
from tests.support.services import FakeServices

MODULE_RACE = "tests.support.chaos_race"  # run as `python -m MODULE_RACE` from the repository root
RACE_PREFIX = "RACE "
ZOMBIE_TTL = 1.0
STALL = 2.0  # only needs to outlast the test noticing the arrival: A is SIGSTOPped within it


def durable_state(store: SqlStore, run_id: str = RUN_ID) -> dict[str, Any]:
    """Everything the store holds about a run (rows as dicts, in a stable order)."""
    return {
        "run": store.get_run(run_id).model_dump(),
        "events": [e.model_dump() for e in store.events(run_id)],
        "nodes": sorted((n.model_dump() for n in store.nodes(run_id)), key=lambda n: (n["node_id"], n["fan_index"])),
        "effects": sorted((e.model_dump() for e in store.effects(run_id)), key=lambda e: e["idempotency_key"]),
    }


def zombie_points(golden: Golden) -> list[Kill]:
    """Points at which a stalled driver's arrival shows in the store or at the provider:
    ``after_pending`` of a ledger row (it is ``pending``), ``before_commit`` of an effect whose
    first attempt makes its call (the provider saw the key), ``after_commit`` of a node that
    completes on its first attempt (its row is ``completed``)."""
    points: list[Kill] = []
    for label, (key, _) in golden.ledger.items():
        points.append(("after_pending", label))
        step = _step(golden, label)
        if key in golden.effective and (step is None or _first_try(step, label)):
            points.append(("before_commit", label))
    for label, status in golden.nodes.items():
        step = _step(golden, label)
        if status == NodeStatus.COMPLETED.value and (step is None or _first_try(step, label)):
            points.append(("after_commit", label))
    return sorted(set(points))


def _step(golden: Golden, label: str) -> dict[str, Any] | None:
    name = label.partition("[")[0]
    return next((s for s in golden.spec["steps"] if s["name"] == name), None)


def _first_try(step: dict[str, Any], label: str) -> bool:
    """The step's node ``label`` ends on its first attempt (not flaky; compensations always do)."""
    return step.get("fate", "ok") != "flaky" or ":" in label


def arrived(kill: Kill, golden: Golden, store: SqlStore, services: FakeServices) -> bool:
    point, label = kill
    if point == "after_pending":
        return any(ledger_label(e) == label and e.status == EffectStatus.PENDING for e in store.effects(RUN_ID))
    if point == "before_commit":
        return golden.ledger[label][0] in services.log()["raw"]
    assert point == "after_commit", kill
    return any(n.label == label and n.status == NodeStatus.COMPLETED for n in store.nodes(RUN_ID))


#: ``clock_nanosleep``'s syscall number, CLOCK_MONOTONIC and TIMER_ABSTIME: how ``time.sleep``
#: blocks on Linux (glibc's ``nanosleep``, SQLite's busy wait, passes CLOCK_REALTIME and no flag).
CLOCK_NANOSLEEP = {"x86_64": "230", "aarch64": "115"}.get(platform.machine())
PYTHON_SLEEP = [CLOCK_NANOSLEEP, "0x1", "0x1"]
#: How long A must be seen in a sleep to be in the stall (the engine's own sleeps here, a
#: compensation's retry backoff or a busy wait, last 20 ms at most; the stall ``STALL``).
IN_STALL = 0.2


def sleeping(pid: int) -> bool:
    """Whether process ``pid``'s main thread is blocked in ``time.sleep`` (Linux ``/proc``; on an
    architecture this does not know, always true: the arrival alone is then what is waited for)."""
    if CLOCK_NANOSLEEP is None:
        return True
    try:
        return Path(f"/proc/{pid}/syscall").read_text().split()[:3] == PYTHON_SLEEP
    except OSError:
        return False


def stalled(kill: Kill, golden: Golden, store: SqlStore, services: FakeServices,
            a: subprocess.Popen[str]) -> Callable[[], bool]:
    """A condition for ``wait_until``: A arrived at ``kill`` and has been sleeping for ``IN_STALL``
    seconds (or it exited). The provider seeing ``before_commit``'s key is not enough alone: the
    inline executor may still be running the batch's other calls before A reaches the commit."""
    since: list[float] = []

    def check() -> bool:
        if a.poll() is not None:
            return True
        if not (sleeping(a.pid) and arrived(kill, golden, store, services)):
            since.clear()
            return False
        since[:] = since or [time.monotonic()]
        return time.monotonic() - since[0] >= IN_STALL

    return check


def write_locked(path: Path) -> bool:
    """Whether some connection holds SQLite file ``path``'s write lock (a ``BEGIN IMMEDIATE`` that
    would have to wait)."""
    conn = sqlite3.connect(path, timeout=0, isolation_level=None)
    try:
        conn.execute("BEGIN IMMEDIATE")
        conn.execute("ROLLBACK")
        return False
    except sqlite3.OperationalError as exc:
        assert "locked" in str(exc) or "busy" in str(exc), exc
        return True
    finally:
        conn.close()


def frozen_unlocked(a: subprocess.Popen[str], path: Path) -> Callable[[], bool]:
    """A condition for ``wait_until`` that SIGSTOPs A and holds when A holds no write lock on the
    store; else it lets A go on (SIGCONT) for the next try. A's heartbeat thread writes while its
    main thread stalls: stopped inside that short transaction, A would lock every other driver
    out of the SQLite file for as long as it stays stopped (a frozen process does that to SQLite:
    no driver can take over then, so the trial stops A between two writes)."""

    def check() -> bool:
        os.kill(a.pid, signal.SIGSTOP)
        harness.wait_until(lambda: stopped(a.pid), timeout=10, what=f"pid {a.pid} stopped", interval=0.001)
        if not write_locked(path):
            return True
        os.kill(a.pid, signal.SIGCONT)
        return False

    return check


def stopped(pid: int) -> bool:
    """Whether every thread of ``pid`` is stopped (SIGSTOP is delivered asynchronously: until
    then a thread may still take a lock)."""
    states = []
    for task in Path(f"/proc/{pid}/task").iterdir():
        with contextlib.suppress(OSError):  # a thread that just ended
            states.append((task / "stat").read_text().rpartition(")")[2].split()[0])
    return bool(states) and all(state in ("T", "t") for state in states)


def zombie_trial(golden: Golden, kill: Kill, services: FakeServices, folder: Path) -> None:
    db = f"sqlite:///{folder / 'run.db'}"
    go = folder / "go"
    services.reset()
    store = SqlStore(db)
    # B starts now (its imports overlap A's life) and touches the run once `go` exists
    b = harness.spawn(golden.path, db, RUN_ID, flows=FLOWS, any_state_ok=True, resume=True, go_file=go,
                      lease_ttl=ZOMBIE_TTL)
    a = harness.spawn(golden.path, db, RUN_ID, flows=FLOWS, any_state_ok=True, lease_ttl=ZOMBIE_TTL,
                      run_input=chaos_flows.sample_input(services.url), faults=f"{kill[0]}:{kill[1]}=stall:{STALL}")
    try:
        harness.wait_until(stalled(kill, golden, store, services, a), timeout=60, what=f"driver A to stall at {kill}")
        harness.wait_until(frozen_unlocked(a, folder / "run.db"), timeout=10, what="A stopped holding no lock")
        assert a.poll() is None, f"A ended before it was stopped at {kill}:\n{harness.finish(a).describe()}"
        uncertain = {e.idempotency_key for e in store.effects(RUN_ID) if e.status == EffectStatus.PENDING}
        returned = returned_calls(golden, uncertain, services.log()["raw"], ledger_of(store))
        fence_a = store.get_run(RUN_ID).fence
        harness.wait_lease_expired(store, RUN_ID, timeout=30)
        go.touch()
        done = harness.finish(b)
        assert done.returncode == 0, done.describe()
        before, log_before = durable_state(store), services.log()
        assert before["run"]["fence"] == fence_a + 1, (before["run"]["fence"], fence_a)
        check(golden, store, log_before, kill, uncertain, returned)
        os.kill(a.pid, signal.SIGCONT)
        woke = harness.finish(a, timeout=60)
        assert woke.returncode == harness.EXIT_LEASE_LOST and woke.result is None, woke.describe()
        assert durable_state(store) == before, f"the zombie wrote after the takeover at {kill}"
        assert services.log() == log_before, f"the zombie called the provider after the takeover at {kill}"
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.kill(a.pid, signal.SIGCONT)
        harness.stop(a)
        harness.stop(b)
        store.close()


# ---------------------------------------------------------------------- a claim race


def race_main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="one process of a lease-claim race")
    parser.add_argument("--db", required=True)
    parser.add_argument("--run-id", required=True)
    parser.add_argument("--threads", type=int, required=True)
    parser.add_argument("--go", required=True)
    parser.add_argument("--ttl", type=float, default=60.0)
    args = parser.parse_args(argv)
    from raysaga.errors import LeaseHeldError

    store = SqlStore(args.db)
    store.get_run(args.run_id)  # connected and warm before the start
    outcomes: Counter[str] = Counter()
    errors: list[str] = []
    lock = threading.Lock()
    barrier = threading.Barrier(args.threads)

    def racer(i: int) -> None:
        barrier.wait()
        try:
            store.claim(args.run_id, f"racer:{os.getpid()}:{i}", args.ttl)
            outcome = "won"
        except LeaseHeldError:
            outcome = "held"
        except Exception as exc:
            outcome = "error"
            with lock:
                errors.append(f"{type(exc).__name__}: {str(exc)[:300]}")
        with lock:
            outcomes[outcome] += 1

    threads = [threading.Thread(target=racer, args=(i,)) for i in range(args.threads)]
    harness.wait_for_go(Path(args.go))
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    store.close()
    print(RACE_PREFIX + json.dumps({"pid": os.getpid(), **outcomes, "errors": errors}), flush=True)
    return 0


def race_result(finished: harness.Finished) -> dict[str, Any]:
    lines = [line for line in finished.stdout.splitlines() if line.startswith(RACE_PREFIX)]
    assert finished.returncode == 0 and lines, finished.describe()
    result: dict[str, Any] = json.loads(lines[-1][len(RACE_PREFIX):])
    return result


if __name__ == "__main__":
    sys.exit(race_main())
