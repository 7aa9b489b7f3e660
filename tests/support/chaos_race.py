"""Zombie drivers and lease races for the chaos suite.

``zombie_trial``: driver A is armed to stall (``RAYSAGA_FAULTS=<point>:<label>=stall:S``) at a
fault point of a chaos DAG; once the store or the provider shows it got there, the test
SIGSTOPs it (its heartbeat stops with it), waits for its lease to expire, lets driver B resume
the run to rest, snapshots everything durable and the provider's log, then SIGCONTs A. A must
notice its stale fence and exit (lease lost) without writing a row or making a call.

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
import signal
import sys
import threading
from collections import Counter
from pathlib import Path
from typing import Any

from raysaga.state import EffectStatus, NodeStatus, SqlStore
from tests.support import chaos_flows
from tests.support import crash_driver as harness
from tests.support.chaos_sweep import FLOWS, RUN_ID, Golden, Kill, check
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
        harness.wait_until(lambda: arrived(kill, golden, store, services) or a.poll() is not None, timeout=60,
                           what=f"driver A to reach {kill}")
        os.kill(a.pid, signal.SIGSTOP)
        assert a.poll() is None, f"A ended before it was stopped at {kill}:\n{harness.finish(a).describe()}"
        uncertain = {e.idempotency_key for e in store.effects(RUN_ID) if e.status == EffectStatus.PENDING}
        returned = uncertain & set(services.log()["raw"])
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
