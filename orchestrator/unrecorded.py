"""A Ctrl-C before ``raysaga run`` recorded its new run: Ray still starting (seconds on a loaded
machine; the run is recorded only once its executor is up, so that a cluster that cannot be
reached leaves no ``pending`` run behind).

The CLI said "`raysaga resume X` continues it", and that resume found no run X. ``runner.run``
raises ``InterruptedBeforeRecorded`` instead (still a ``KeyboardInterrupt``), which the CLI's error
edge words as it is: nothing ran, run the command again. The CLI process then shuts the local Ray
it was starting down without Ray's graceful part (``abandon_ray``): up to two seconds per Ray
process, one after another, for processes that ran nothing (a Ctrl-C took up to 14 s to exit on a
loaded machine).
"""

from __future__ import annotations

import contextlib
import logging
import sys
from collections.abc import Iterator

log = logging.getLogger("raysaga.driver")


class InterruptedBeforeRecorded(KeyboardInterrupt):
    """A SIGINT while a new run's executor started, before the run was recorded: nothing ran."""

    def __init__(self, run_id: str | None) -> None:
        super().__init__(run_id)
        self.run_id = run_id


@contextlib.contextmanager
def before_recording(run_id: str | None) -> Iterator[None]:
    """A ``KeyboardInterrupt`` in the block (the executor's start of a run not recorded yet) says so."""
    try:
        yield
    except InterruptedBeforeRecorded:
        raise
    except KeyboardInterrupt as exc:
        raise InterruptedBeforeRecorded(run_id) from exc


def abandon_ray() -> None:
    """Shut down now, without its graceful part, the local Ray this process started: a process
    about to exit (the CLI after ``InterruptedBeforeRecorded``) whose Ray ran nothing. Ray's own
    shutdown at exit gives each of its processes a second to exit after SIGTERM, then a second after
    SIGKILL, one after another (and sleeps half a second first); here each is killed at once, after
    this process left the cluster (killed before that, the exit waited for the dead GCS for 15 s,
    or crashed). A Ray joined at an address (no process of this one) is only left, as at exit.
    Only where the process ends next (the CLI's error edge): ``ray_start`` is not told."""
    ray = sys.modules.get("ray")
    worker = getattr(getattr(ray, "_private", None), "worker", None)
    node = getattr(worker, "_global_node", None)
    if ray is None or worker is None or node is None:
        return
    kill = node.kill_all_processes

    def at_once(check_alive: bool = True, allow_graceful: bool = False, wait: bool = False) -> None:
        kill(check_alive=check_alive, allow_graceful=False, wait=wait)

    try:
        node.kill_all_processes = at_once
        ray.shutdown()
    except Exception as exc:  # Ray's internals moved: its own shutdown at exit does it, slowly
        node.kill_all_processes = kill
        log.debug("could not shut the Ray being started down at once: %s", exc)


__all__ = ["InterruptedBeforeRecorded", "abandon_ray", "before_recording"]
