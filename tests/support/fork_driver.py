"""A driver process that forks a run of the order example and drives the fork (the fork kill sweep).

    python -m tests.support.fork_driver --db URL --parent RUN --run-id NEW --from NODE \\
        [--executor inline|ray] [--lease-ttl S] [--resume] [--go-file PATH]

Without ``--resume`` it forks ``--parent`` from ``--from`` into ``--run-id`` (one transaction)
and drives the new run; with it, it resumes that run. Crash points come from ``RAYSAGA_FAULTS``;
the output and exit codes are ``tests.support.crash_driver``'s.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any

from tests.support.crash_driver import report, wait_for_go

MODULE = "tests.support.fork_driver"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="fork a run of the order example and drive the fork")
    parser.add_argument("--db", required=True)
    parser.add_argument("--parent", required=True)
    parser.add_argument("--run-id", required=True)
    parser.add_argument("--from", dest="from_node", required=True)
    parser.add_argument("--executor", choices=["inline", "ray"], default="inline")
    parser.add_argument("--lease-ttl", type=float, default=None)
    parser.add_argument("--resume", action="store_true")
    parser.add_argument("--go-file", default=None)
    args = parser.parse_args(argv)

    import raysaga
    from examples.order.workflow import wf

    if args.go_file:
        wait_for_go(Path(args.go_file))
    options = raysaga.RunOptions(lease_ttl=args.lease_ttl) if args.lease_ttl else None

    def drive() -> Any:
        if args.resume:
            return raysaga.resume(wf, args.run_id, store=args.db, executor=args.executor, options=options)
        return raysaga.fork(wf, args.parent, from_node=args.from_node, store=args.db, new_run_id=args.run_id,
                            executor=args.executor, options=options)

    return report(drive, ok=lambda record: record.status == raysaga.RunStatus.COMPLETED)


def command(db: str, parent: str, run_id: str, from_node: str, *, executor: str, lease_ttl: float, resume: bool,
            go_file: Path | None) -> list[str]:
    cmd = [sys.executable, "-m", MODULE, "--db", db, "--parent", parent, "--run-id", run_id, "--from", from_node,
           "--executor", executor, "--lease-ttl", str(lease_ttl)]
    if resume:
        cmd.append("--resume")
    if go_file is not None:
        cmd += ["--go-file", str(go_file)]
    return cmd


if __name__ == "__main__":
    sys.exit(main())
