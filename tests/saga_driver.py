"""A driver process the rollback tests can kill, for the flows of ``tests/saga_flows.py``.

``tests/crash_driver.py`` only knows ``tests/crash_flows.py`` (its ``--flow`` is looked up
there), so this is its twin for the saga flows; the launching and polling helpers
(``finish``, ``stop``, ``wait_until``, ``wait_lease_expired``, ``Finished``) are crash_driver's.

    python tests/saga_driver.py --flow trip|diamond|wide10|inflight|unknown --db URL --run-id ID \\
        --executor inline|ray --input JSON [--lease-ttl S] [--resume] [--go-file PATH]

Prints the final record as one ``RESULT {json}`` line. Exit codes: 0 the run rested (any
state: the tests read which), 3 another live driver holds the lease, 4 this driver lost it.
Crash points come from ``RAYSAGA_FAULTS``; a Ray driver joins the cluster named by ``RAY_ADDRESS``.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import subprocess
import sys
from pathlib import Path
from types import ModuleType
from typing import Any

TESTS = Path(__file__).resolve().parent
REPO = TESTS.parent
SCRIPT = Path(__file__).resolve()
RESULT_PREFIX = "RESULT "
EXIT_LEASE_HELD, EXIT_LEASE_LOST = 3, 4
FAULTS_ENV = "RAYSAGA_FAULTS"
GO_TIMEOUT = 300.0


def _load(name: str) -> ModuleType:
    """Import ``tests/<name>.py`` by path, registered as ``name`` (so Ray pickles its functions
    by reference; workers import it from the PYTHONPATH, which holds this folder)."""
    if name in sys.modules:
        return sys.modules[name]
    for path in (str(TESTS), str(REPO)):
        if path not in sys.path:
            sys.path.append(path)
    spec = importlib.util.spec_from_file_location(name, TESTS / f"{name}.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    spec.loader.exec_module(module)
    return module


def load_flows() -> ModuleType:
    return _load("saga_flows")


crash_driver = _load("crash_driver")
Finished = crash_driver.Finished
finish = crash_driver.finish
stop = crash_driver.stop
wait_until = crash_driver.wait_until
wait_lease_expired = crash_driver.wait_lease_expired


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="drive one saga-test run")
    parser.add_argument("--flow", required=True)
    parser.add_argument("--db", required=True)
    parser.add_argument("--run-id", required=True)
    parser.add_argument("--executor", choices=["inline", "ray"], default="inline")
    parser.add_argument("--input", default="null", help="the run input, as JSON")
    parser.add_argument("--lease-ttl", type=float, default=None)
    parser.add_argument("--resume", action="store_true", help="resume an existing run (never create one)")
    parser.add_argument("--go-file", default=None,
                        help="import everything, then wait for this file before touching the run")
    args = parser.parse_args(argv)

    import raysaga
    from raysaga.errors import LeaseHeldError, LeaseLostError

    flow = load_flows().FLOWS[args.flow]
    if args.go_file:
        go = Path(args.go_file)
        wait_until(go.exists, timeout=GO_TIMEOUT, what=f"the go file {go}")
    options = raysaga.RunOptions(lease_ttl=args.lease_ttl) if args.lease_ttl else None
    try:
        if args.resume:
            record = raysaga.resume(flow, args.run_id, store=args.db, executor=args.executor, options=options)
        else:
            record = raysaga.run(flow, json.loads(args.input), store=args.db, run_id=args.run_id,
                                 executor=args.executor, options=options)
    except LeaseHeldError as exc:
        print(f"lease held: {exc}", file=sys.stderr, flush=True)
        return EXIT_LEASE_HELD
    except LeaseLostError as exc:
        print(f"lease lost: {exc}", file=sys.stderr, flush=True)
        return EXIT_LEASE_LOST
    result = {"run_id": record.run_id, "status": record.status.value, "output": record.output,
              "error": record.error, "status_reason": record.status_reason, "pid": os.getpid()}
    print(RESULT_PREFIX + json.dumps(result, sort_keys=True), flush=True)
    return 0


# ---------------------------------------------------------------------- helpers for the tests


def command(flow: str, db: str, run_id: str, *, executor: str = "inline", run_input: Any = None,
            lease_ttl: float | None = None, resume: bool = False, go_file: Path | None = None) -> list[str]:
    cmd = [sys.executable, str(SCRIPT), "--flow", flow, "--db", db, "--run-id", run_id, "--executor", executor,
           "--input", json.dumps(run_input)]
    if lease_ttl:
        cmd += ["--lease-ttl", str(lease_ttl)]
    if resume:
        cmd.append("--resume")
    if go_file is not None:
        cmd += ["--go-file", str(go_file)]
    return cmd


def spawn(flow: str, db: str, run_id: str, *, faults: str | None = None, **kwargs: Any) -> subprocess.Popen[str]:
    """Start a driver process (from the repository root; ``RAYSAGA_FAULTS`` exactly ``faults``)."""
    env = dict(os.environ)
    env.pop(FAULTS_ENV, None)
    if faults:
        env[FAULTS_ENV] = faults
    return subprocess.Popen(command(flow, db, run_id, **kwargs), cwd=REPO, env=env, text=True,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE)


def run_driver(flow: str, db: str, run_id: str, *, timeout: float = 120.0, faults: str | None = None,
               **kwargs: Any) -> Any:
    return finish(spawn(flow, db, run_id, faults=faults, **kwargs), timeout)


if __name__ == "__main__":
    sys.exit(main())
