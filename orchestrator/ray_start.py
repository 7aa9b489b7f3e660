"""The Ray raysaga starts itself (no ``ray.init()`` by the host): one per process, shared, and undone.

Executors of runs in several threads share it: its start is under a process-wide lock (two
threads each calling ``ray.init`` failed with "Perhaps you called ray.init twice", or all timed
out starting), and it is shut down by the last executor using it, not by the first run that
ends (that shut Ray down under the other runs' steps in flight). A Ray the host started is never
shut down by raysaga.

``ray.init`` also changes the host process: it installs its own SIGTERM (and SIGINT) handler,
``sys.excepthook``, and environment variables (``PYTHONBREAKPOINT``, ``RAY_AUTH_MODE``...), and
``ray.shutdown`` leaves them behind: a uvicorn host lost its graceful shutdown to Ray's SIGTERM
handler. What ``ray.init`` changed is put back at that shutdown, unless the host changed it since.
"""

from __future__ import annotations

import logging
import os
import signal
import sys
import threading
from collections.abc import Callable
from concurrent.futures import Future
from dataclasses import dataclass, field
from typing import Any

from raysaga.orchestrator.ray_address import check_cluster, host_port, unreachable
from raysaga.orchestrator.ray_auth import check_gcs
from raysaga.orchestrator.step_env import forwarded

#: held while raysaga looks whether Ray runs, starts it, or shuts it down
LOCK = threading.RLock()
_users = 0  # executors using the Ray raysaga started (0: none, or the host's Ray)
_host: HostState | None = None  # the process as it was before raysaga's ray.init, and as it left it

_SIGNALS = (signal.SIGTERM, signal.SIGINT)


def _hooks() -> dict[str, Any]:
    return {"sys.excepthook": sys.excepthook, "threading.excepthook": threading.excepthook}


def _set_hook(name: str, value: Any) -> None:
    if name == "sys.excepthook":
        sys.excepthook = value
    else:
        threading.excepthook = value


#: The variables Ray's import and ``ray.init`` set in the host's environment: the only ones put
#: back. Every difference was taken for Ray's: a variable the host set (another thread) while Ray
#: started was deleted at the last shutdown.
RAYS_OWN_ENV = frozenset({"PYTHONBREAKPOINT", "RAY_AUTH_MODE", "RAY_USAGE_STATS_ENABLED", "RAY_CLIENT_MODE",
                          "RAY_ADDRESS", "RAY_JOB_ID", "RAY_RAYLET_PID", "RAY_NODE_ID"})


@dataclass
class HostState:
    """What ``ray.init`` may change in the process: signal handlers (only readable and settable
    from the main thread), exception hooks and environment variables; before it, and after it."""

    signals: dict[int, Any] = field(default_factory=dict)
    hooks: dict[str, Any] = field(default_factory=dict)
    env: dict[str, str] = field(default_factory=dict)
    after_signals: dict[int, Any] = field(default_factory=dict)
    after_hooks: dict[str, Any] = field(default_factory=dict)
    after_env: dict[str, str] = field(default_factory=dict)

    @classmethod
    def taken(cls) -> HostState:
        state = cls(hooks=_hooks(), env=dict(os.environ))
        if threading.current_thread() is threading.main_thread():
            state.signals = {sig: signal.getsignal(sig) for sig in _SIGNALS}
        return state

    def started(self) -> None:
        """Note what ``ray.init`` left: only what is still that at the shutdown is put back."""
        self.after_hooks = _hooks()
        self.after_env = dict(os.environ)
        if self.signals:
            self.after_signals = {sig: signal.getsignal(sig) for sig in self.signals}

    def restore(self) -> None:
        """Put back what ``ray.init`` changed and nobody changed since."""
        now = _hooks()
        for name, before in self.hooks.items():
            if now[name] is not before and now[name] is self.after_hooks.get(name, now[name]):
                _set_hook(name, before)
        for name in (set(self.env) | set(self.after_env)) & RAYS_OWN_ENV:
            before, after, current = self.env.get(name), self.after_env.get(name), os.environ.get(name)
            if before == after or current != after:
                continue  # ray.init left it alone, or it was changed since
            if before is None:
                os.environ.pop(name, None)
            else:
                os.environ[name] = before
        if self.signals and threading.current_thread() is threading.main_thread():
            for sig, handler in self.signals.items():
                installed = signal.getsignal(sig)
                if handler is not None and installed is not handler and installed is self.after_signals.get(sig):
                    signal.signal(sig, handler)


#: what ``import ray`` itself changed (its ``sys.excepthook``, ``RAY_CLIENT_MODE``), if raysaga imported
#: it: {name: (before, after)}, put back with what ``ray.init`` changed
_import_hooks: dict[str, tuple[Any, Any]] = {}
_import_env: dict[str, tuple[str | None, str | None]] = {}


def imported() -> Any:
    """Ray's module, imported now if the host has not: noting what the import changed."""
    if "ray" not in sys.modules:
        with LOCK:
            if "ray" not in sys.modules:
                hooks, env = _hooks(), dict(os.environ)
                import ray  # what it changes is noted below

                _import_hooks.update({k: (v, now) for k, v in hooks.items() if (now := _hooks()[k]) is not v})
                _import_env.update({k: (env.get(k), os.environ.get(k)) for k in {*env, *os.environ} & RAYS_OWN_ENV
                                    if env.get(k) != os.environ.get(k)})
    import ray

    return ray


def _taken() -> HostState:
    """The process as it is, with what raysaga's ``import ray`` changed (and is still so) as before it."""
    host = HostState.taken()
    for name, (before, after) in _import_hooks.items():
        if host.hooks[name] is after:
            host.hooks[name] = before
    for name, (env_before, env_after) in _import_env.items():
        if host.env.get(name) == env_after:
            if env_before is None:
                host.env.pop(name, None)
            else:
                host.env[name] = env_before
    return host


class _Keeper:
    """A thread that starts Ray and lives until raysaga shuts it down: Ray ties the processes it
    starts (GCS, raylet) to the thread that started them (``PR_SET_PDEATHSIG``), and a run in a
    host's thread that ended took them down under the runs of other threads still using them."""

    def __init__(self, init: Callable[[], None]) -> None:
        self.release = threading.Event()
        self._init = init
        self._started: Future[None] = Future()
        threading.Thread(target=self._run, name="raysaga-ray", daemon=True).start()
        self._started.result()  # raises what the start raised

    def _run(self) -> None:
        try:
            self._init()
        except BaseException as exc:
            self._started.set_exception(exc)
            return
        self._started.set_result(None)
        self.release.wait()


_keeper: _Keeper | None = None  # the thread that started raysaga's Ray, if not the main thread


def start(init: Callable[[], None]) -> None:
    """Call ``init`` (raysaga's ``ray.init``), with ``LOCK`` held, noting the process's state
    before and after it (put back by the last ``leave``). A failed start puts it back at once."""
    global _host, _keeper
    host = _taken()
    try:
        if threading.current_thread() is threading.main_thread():
            init()
        else:
            _keeper = _Keeper(init)
    except BaseException:
        host.started()
        host.restore()
        raise
    host.started()
    _host = host


def join(ray: Any) -> bool:
    """With ``LOCK`` held and Ray running: count one more executor using it if raysaga started
    it (True: that executor must ``leave``); False for a Ray the host started."""
    global _users
    if _host is None or not ray.is_initialized():
        return False
    _users += 1
    return True


def leave(ray: Any) -> None:
    """An executor that ``join``-ed is done: the last one shuts Ray down and puts the host back."""
    global _users, _host, _keeper
    with LOCK:
        _users -= 1
        if _users > 0:
            return
        _users, host, _host, keeper, _keeper = 0, _host, None, _keeper, None
        ray.shutdown()
        from raysaga.orchestrator.io_pool import forget_pools

        forget_pools()  # their actors went with it
        if keeper is not None:
            keeper.release.set()
        if host is not None:
            host.restore()


def start_ray(ray: Any, address: str | None, num_cpus: int | None) -> None:
    """raysaga's own ``ray.init`` (with ``LOCK`` held): joining ``address``, or a local Ray."""
    check_cluster(address)
    if address and host_port(address) is not None:
        check_gcs(address)  # token authentication settled first: a refusal is one line, at once
    # workers must import the user's workflow module as the driver does
    pythonpath = os.pathsep.join(p for p in [os.getcwd(), *sys.path] if p and os.path.isdir(p))
    env_vars = {"PYTHONPATH": pythonpath, **forwarded(os.environ)}  # RAYSAGA_ENV: what steps need
    try:
        start(lambda: ray.init(
            address=address, num_cpus=None if address else num_cpus, include_dashboard=False,
            logging_level=logging.ERROR, log_to_driver=False, configure_logging=True,
            runtime_env={"env_vars": env_vars}))
    except (ConnectionError, TimeoutError) as exc:  # "auto" with no cluster running, a GCS gone...
        if not address:
            raise  # starting a local Ray failed: not a cluster to reach
        raise unreachable(address, str(exc).splitlines()[0] if str(exc) else "") from None
