"""A driver process the crash tests can kill, and the helpers the tests launch it with.

As a script, it drives one run of a workflow from ``tests.support.crash_flows`` (or the module
``--flows`` names, e.g. ``tests.support.saga_flows``) to a resting state and prints the final
record as one ``RESULT {json}`` line::

    python -m tests.support.crash_driver --flow order|wide|gate|workerkill --db URL --run-id ID \\
        --executor inline|ray --input JSON [--lease-ttl S] [--resume | --create-only] \\
        [--flows MODULE] [--any-state-ok]

Exit codes follow the CLI's: 0 completed (with ``--any-state-ok``: any resting state, which the
rollback tests read from the store), 1 the run ended failed or cancelled, 3 another live
driver holds the lease, 4 this driver lost its lease. Crash points come from ``RAYSAGA_FAULTS``
(the driver SIGKILLs itself there); a Ray driver joins the cluster named by ``RAY_ADDRESS``.

As a module, it offers ``spawn``/``run_driver`` to launch that script, ``wait_until``/
``wait_lease_expired`` to poll real conditions with a deadline, and what every driver script of
the tests shares (``agent_flows`` is one too): ``driver_env``, ``wait_for_go``, ``report``.
"""

from __future__ import annotations

import argparse
import importlib
import json
import os
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from types import ModuleType
from typing import Any, TypeVar

from tests.support import REPO

MODULE = "tests.support.crash_driver"  # run as `python -m MODULE` from the repository root
DEFAULT_FLOWS = "tests.support.crash_flows"
RESULT_PREFIX = "RESULT "
EXIT_FAILED, EXIT_LEASE_HELD, EXIT_LEASE_LOST = 1, 3, 4
FAULTS_ENV = "RAYSAGA_FAULTS"
GO_TIMEOUT = 300.0

T = TypeVar("T")


def load_flows(name: str = DEFAULT_FLOWS) -> ModuleType:
    """Import the flows module ``name`` (a dotted module name, importable from the repository root).

    Imported by name, so Ray pickles its steps by reference and Ray workers import it again from
    the ``sys.path`` the executor hands them (the repository root is on it).
    """
    return importlib.import_module(name)


# ---------------------------------------------------------------------- the driver process


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="drive one crash-test run")
    parser.add_argument("--flow", required=True)
    parser.add_argument("--db", required=True)
    parser.add_argument("--run-id", required=True)
    parser.add_argument("--executor", choices=["inline", "ray"], default="inline")
    parser.add_argument("--input", default="null", help="the run input, as JSON")
    parser.add_argument("--lease-ttl", type=float, default=None)
    parser.add_argument("--flows", default=DEFAULT_FLOWS, help="the module that holds FLOWS (a dotted name)")
    parser.add_argument("--any-state-ok", action="store_true", help="exit 0 for any resting state")
    mode = parser.add_mutually_exclusive_group()
    mode.add_argument("--resume", action="store_true", help="resume an existing run (never create one)")
    mode.add_argument("--create-only", action="store_true", help="record the run as pending and exit")
    parser.add_argument("--go-file", default=None,
                        help="import everything, then wait for this file before touching the run (a test "
                             "starts the process early, so its start-up overlaps what the test waits for)")
    args = parser.parse_args(argv)

    import raysaga

    flow = load_flows(args.flows).FLOWS[args.flow]
    if args.go_file:
        wait_for_go(Path(args.go_file))
    options = raysaga.RunOptions(lease_ttl=args.lease_ttl) if args.lease_ttl else None
    run_input = json.loads(args.input)

    def drive() -> Any:
        if args.create_only:
            return raysaga.create_run(flow, run_input, store=args.db, run_id=args.run_id, options=options)
        if args.resume:
            return raysaga.resume(flow, args.run_id, store=args.db, executor=args.executor, options=options)
        return raysaga.run(flow, run_input, store=args.db, run_id=args.run_id, executor=args.executor,
                           options=options)

    return report(drive, ok=lambda record: bool(args.create_only or args.any_state_ok
                                                or record.status == raysaga.RunStatus.COMPLETED))


def wait_for_go(go: Path) -> None:
    """Block until the test creates ``go`` (a driver started early, its imports done)."""
    wait_until(go.exists, timeout=GO_TIMEOUT, what=f"the go file {go}")


def report(drive: Callable[[], Any], *, ok: Callable[[Any], bool],
           extra: Callable[[Any], dict[str, Any]] | None = None) -> int:
    """Run ``drive`` (which returns the run's record); print the record as one ``RESULT {json}``
    line and return the driver's exit code (a lease held or lost: its code, said on stderr)."""
    from raysaga.errors import LeaseHeldError, LeaseLostError

    try:
        record = drive()
    except LeaseHeldError as exc:
        print(f"lease held: {exc}", file=sys.stderr, flush=True)
        return EXIT_LEASE_HELD
    except LeaseLostError as exc:
        print(f"lease lost: {exc}", file=sys.stderr, flush=True)
        return EXIT_LEASE_LOST
    result = {"run_id": record.run_id, "status": record.status.value, "output": record.output,
              "error": None if record.error is None else record.error.as_dict(),
              "status_reason": record.status_reason, **(extra(record) if extra else {}), "pid": os.getpid()}
    print(RESULT_PREFIX + json.dumps(result, sort_keys=True), flush=True)
    return 0 if ok(record) else EXIT_FAILED


# ---------------------------------------------------------------------- helpers for the tests


@dataclass
class Finished:
    """A driver process that exited."""

    returncode: int
    stdout: str
    stderr: str

    @property
    def result(self) -> dict[str, Any] | None:
        lines = [line for line in self.stdout.splitlines() if line.startswith(RESULT_PREFIX)]
        return json.loads(lines[-1][len(RESULT_PREFIX):]) if lines else None

    def describe(self) -> str:
        return f"exit {self.returncode}\n--- stdout\n{self.stdout[-3000:]}\n--- stderr\n{self.stderr[-6000:]}"


def command(flow: str, db: str, run_id: str, *, executor: str = "inline", run_input: Any = None,
            lease_ttl: float | None = None, resume: bool = False, create_only: bool = False,
            go_file: Path | None = None, flows: str = DEFAULT_FLOWS, any_state_ok: bool = False) -> list[str]:
    cmd = [sys.executable, "-m", MODULE, "--flow", flow, "--db", db, "--run-id", run_id, "--executor", executor,
           "--input", json.dumps(run_input)]
    if lease_ttl:
        cmd += ["--lease-ttl", str(lease_ttl)]
    if resume:
        cmd.append("--resume")
    if create_only:
        cmd.append("--create-only")
    if go_file is not None:
        cmd += ["--go-file", str(go_file)]
    if flows != DEFAULT_FLOWS:
        cmd += ["--flows", flows]
    if any_state_ok:
        cmd.append("--any-state-ok")
    return cmd


def driver_env(faults: str | None, extra: dict[str, str] | None = None) -> dict[str, str]:
    """This process's environment for a driver process: ``RAYSAGA_FAULTS`` exactly ``faults``
    (unset when None), then ``extra``."""
    env = dict(os.environ)
    env.pop(FAULTS_ENV, None)
    if faults:
        env[FAULTS_ENV] = faults
    env.update(extra or {})
    return env


def spawn(flow: str, db: str, run_id: str, *, faults: str | None = None, **kwargs: Any) -> subprocess.Popen[str]:
    """Start a driver process (from the repository root; ``RAYSAGA_FAULTS`` exactly ``faults``)."""
    return subprocess.Popen(command(flow, db, run_id, **kwargs), cwd=REPO, env=driver_env(faults), text=True,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE)


def finish(proc: subprocess.Popen[str], timeout: float = 120.0) -> Finished:
    """Wait for a driver process to exit (kill it and fail if it does not within ``timeout``)."""
    try:
        stdout, stderr = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        proc.kill()
        stdout, stderr = proc.communicate()
        raise AssertionError(f"driver pid {proc.pid} still running after {timeout}s\n{stdout}\n{stderr}") from None
    return Finished(proc.returncode, stdout, stderr)


def stop(proc: subprocess.Popen[str]) -> None:
    """Kill a driver process a test no longer needs (a no-op once it exited)."""
    if proc.poll() is None:
        proc.kill()
    proc.communicate()


def run_driver(flow: str, db: str, run_id: str, *, timeout: float = 120.0, faults: str | None = None,
               **kwargs: Any) -> Finished:
    return finish(spawn(flow, db, run_id, faults=faults, **kwargs), timeout)


def wait_until(condition: Callable[[], T | None], *, timeout: float, what: str, interval: float = 0.02) -> T:
    """Poll ``condition`` until it returns something truthy; fail naming ``what`` after ``timeout``.

    What it returns is never None (None is falsy), hence ``T`` for a ``condition`` returning ``T | None``."""
    deadline = time.monotonic() + timeout
    while True:
        value = condition()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout}s waiting for {what}")
        time.sleep(interval)


def process_gone(pid: int) -> bool:
    """True once process ``pid`` has exited (no /proc entry, or a zombie waiting to be reaped)."""
    try:
        status = Path(f"/proc/{pid}/status").read_text()
    except OSError:
        return True
    return "\nState:\tZ" in status


def wait_lease_expired(store: Any, run_id: str, *, timeout: float = 60.0) -> Any:
    """Poll the run row until no live lease is recorded (released, or expired by the clock)."""

    def expired() -> Any:
        run = store.get_run(run_id)
        return run if run.lease_expires_at is None or run.lease_expires_at < time.time() else None

    return wait_until(expired, timeout=timeout, what=f"the lease of run {run_id!r} to expire")


if __name__ == "__main__":
    sys.exit(main())
