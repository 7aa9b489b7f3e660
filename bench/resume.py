"""Resume after SIGKILL: a 20-step chain of 0.2 s steps is killed midway and launched again;
how long until the first step of the new process starts, and did a completed step run again?

Per system, per rep (systems interleaved): launch the chain in a subprocess of its own session;
when step ``r10`` has started (10 steps completed), wait half a step and SIGKILL it; relaunch
the same run and time, from the relaunch's ``Popen``, the first step that starts. Steps log
``<time> start|end <step> <pid>`` (``flows.slow_step``, ``resume_child.py``).

* raysaga inline: ``raysaga run flows:slow_chain_20 --executor inline``, then ``raysaga resume``.
* raysaga, Ray cold: the same with ``--executor ray``: each launch starts a local Ray of its own
  (``RAY_ADDRESS=local`` under a private ``RAY_TMPDIR``); the kill takes the driver's whole
  session (its local Ray with it), so the relaunch starts Ray again.
* raysaga, joining a running cluster: a ``ray start --head`` cluster started once, up for the
  whole scenario; both launches ``--address`` it; the kill takes the driver only.
* raysaga, a running ``raysaga worker`` takes over: a ``raysaga worker`` (joined to that cluster,
  warmed by driving one run of the chain to the end first) watches a store of its own; each rep's
  first launch is a ``raysaga run --address`` driver on that store, SIGKILLed the same way, and
  nothing is relaunched: the worker sees that the run's driver is gone (same host) and takes the
  run over at once (``orchestrator/worker.py``). Its time is counted from the kill, not from a
  relaunch (there is none): kill -> first step, so it includes noticing the death.
* LangGraph + SqliteSaver and DBOS (SQLite): ``resume_child.py``.
* Ray alone, the floor of the cluster row: a fresh Python process that imports Ray, joins the same
  cluster with the ``runtime_env`` raysaga's driver passes and runs one no-op task
  (``resume_child.py ray``): launch -> that task's start, split into its phases. No run, no
  store: what any fresh driver on the cluster pays before its first task, raysaga or not.

"Completed steps re-run" counts steps whose ``end`` was logged before the kill and that start
again after the relaunch (raysaga must show 0); the step in flight at the kill runs again in
every system (at-least-once), printed apart.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import subprocess
import sys
import time
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from statistics import median

import dbos_peer
import lg_peer
from table import Report, Samples, Target, pair_ratios, ratio_target, spread

HERE = Path(__file__).resolve().parent
BIN = Path(sys.executable).parent
STEPS = 20
KILL_AT = 10  # killed while this step runs (KILL_AT steps completed)

INLINE = "raysaga inline"
COLD = "raysaga on Ray, cold (starts Ray)"
CLUSTER = "raysaga joining a running Ray cluster"
FLEET = "raysaga: a running worker takes over (kill->)"
RAY_FLOOR = "Ray alone: a fresh driver joins, 1st task"
#: The phases of the Ray-alone row, in order (``resume_child.ray_floor``'s keys).
FLOOR_PHASES = (("imported", "Ray imported"), ("joined", "joined"), ("submitted", "task sent"),
                ("worker_start", "its worker process started"), ("task_start", "task started"))
LANGGRAPH = "LangGraph + SqliteSaver"
DBOS = "DBOS (SQLite)"


@dataclass(frozen=True)
class Attempt:
    first_step: float  # relaunch -> the first step's start, seconds
    finished: float  # relaunch -> the relaunched process's exit, seconds
    completed_rerun: int
    in_flight_rerun: int


def _lines(log: Path) -> list[tuple[float, str, str]]:
    if not log.exists():
        return []
    out = []
    for line in log.read_text().splitlines():
        parts = line.split()
        if len(parts) == 4:
            out.append((float(parts[0]), parts[1], parts[2]))
    return out


def _session_pids(sid: int) -> list[int]:
    """Processes of session ``sid`` (a child started with ``start_new_session``, and what it spawned)."""
    found = []
    for proc in Path("/proc").iterdir():
        if proc.name.isdigit():
            with contextlib.suppress(OSError, IndexError, ValueError):
                fields = (proc / "stat").read_text().rsplit(")", 1)[1].split()
                if int(fields[3]) == sid:
                    found.append(int(proc.name))
    return found


def _mentioning(marker: str) -> list[int]:
    found = []
    for proc in Path("/proc").iterdir():
        if proc.name.isdigit() and int(proc.name) != os.getpid():
            with contextlib.suppress(OSError):
                if marker in (proc / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace"):
                    found.append(int(proc.name))
    return found


def _kill(pids: list[int]) -> None:
    for pid in pids:
        with contextlib.suppress(OSError):
            os.kill(pid, signal.SIGKILL)


def _wait_for(check: Callable[[], bool], timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while not check():
        if time.monotonic() > deadline:
            raise TimeoutError(f"timed out after {timeout:.0f}s waiting for {what}")
        time.sleep(0.005)


def launch_and_kill(first: list[str], log: Path, env: dict[str, str], secs: float, *, kill_session: bool,
                    marker: str | None = None) -> float:
    """Launch ``first`` and SIGKILL it while step ``KILL_AT`` runs; the time of the kill."""
    step = f"r{KILL_AT:02d}"
    proc = subprocess.Popen(first, cwd=HERE, env=env, start_new_session=True,
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    try:
        _wait_for(lambda: any(w == "start" and s == step for _, w, s in _lines(log)) or proc.poll() is not None,
                  120, f"{step} to start")
        if proc.poll() is not None:
            tail = proc.stderr.read().decode()[-2000:] if proc.stderr else ""
            raise RuntimeError(f"first launch exited {proc.returncode}: {tail}")
        time.sleep(secs / 2)
        killed_at = time.time()
        _kill(_session_pids(proc.pid) if kill_session else [proc.pid])
        proc.wait(10)
    finally:
        if proc.poll() is None:
            _kill([proc.pid])
        if proc.stderr:
            proc.stderr.close()
    if marker and kill_session:
        _kill(_mentioning(marker))  # the local Ray the driver started, if it left its session
    return killed_at


def attempt(first: list[str], again: list[str], log: Path, env: dict[str, str], secs: float, *,
            kill_session: bool, marker: str | None = None) -> Attempt:
    """Launch ``first``, SIGKILL it midway, run ``again`` to the end; what the log says."""
    killed_at = launch_and_kill(first, log, env, secs, kill_session=kill_session, marker=marker)
    time.sleep(0.2)  # the kill settles (a cluster's workers of the dead job go too)
    start = time.time()
    relaunch = subprocess.Popen(again, cwd=HERE, env=env, start_new_session=True, stdout=subprocess.DEVNULL,
                                stderr=subprocess.PIPE)
    try:
        _, err = relaunch.communicate(timeout=300)
        finished = time.time() - start
    finally:
        _kill(_session_pids(relaunch.pid))  # what it left behind (a local Ray's agents), and itself on a timeout
    if relaunch.returncode != 0:
        raise RuntimeError(f"relaunch exited {relaunch.returncode}: {err.decode()[-2000:]}")
    return tally(log, killed_at, start, finished)


def tally(log: Path, killed_at: float, start: float, finished: float) -> Attempt:
    """What the log says: the first step from ``start`` on, and what ran again."""
    lines = _lines(log)
    before = [(t, w, s) for t, w, s in lines if t < killed_at]
    after = [(t, w, s) for t, w, s in lines if t >= start]
    done_before = {s for _, w, s in before if w == "end"}
    started_before = {s for _, w, s in before if w == "start"}
    started_after = [s for _, w, s in after if w == "start"]
    if not started_after:
        raise RuntimeError("the relaunch ran no step")
    missing = {f"r{i:02d}" for i in range(STEPS)} - done_before - set(started_after)
    if missing:
        raise RuntimeError(f"steps never completed: {sorted(missing)}")
    return Attempt(first_step=min(t for t, w, _ in after if w == "start") - start, finished=finished,
                   completed_rerun=len(done_before & set(started_after)),
                   in_flight_rerun=len((started_before - done_before) & set(started_after)))


# ---------------------------------------------------------------------------- systems


@contextlib.contextmanager
def ray_cluster(tmp: Path) -> Iterator[str]:
    """A ``ray start --head`` cluster of our own (its own temp dir; stopped by killing its processes)."""
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    temp = tmp / "rc"
    env = {**os.environ, "RAY_AUTH_MODE": "disabled", "RAY_USAGE_STATS_ENABLED": "0"}
    # a session of its own: the head's processes (some rename themselves ray::..., and no longer
    # name the temp dir) are found by it and killed at the end, never by `ray stop` (everyone's)
    starter = subprocess.Popen([str(BIN / "ray"), "start", "--head", f"--port={port}", "--num-cpus=2",
                                "--include-dashboard=false", "--node-ip-address=127.0.0.1", f"--temp-dir={temp}",
                                "--disable-usage-stats"], env=env, start_new_session=True,
                               stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        if starter.wait(120) != 0:
            raise RuntimeError(f"ray start exited {starter.returncode}")
        yield f"127.0.0.1:{port}"
    finally:
        _kill(_session_pids(starter.pid) + _mentioning(str(temp)))


def _raysaga_env() -> dict[str, str]:
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(HERE), os.environ.get("PYTHONPATH", "")]),
           "RAY_USAGE_STATS_ENABLED": "0", "RAY_AUTH_MODE": "disabled"}
    env.pop("RAY_ADDRESS", None)
    return env


def _chain_cmd(db: str, run_id: str, log: Path, secs: float) -> list[str]:
    return [str(BIN / "raysaga"), "run", "flows:slow_chain_20", "--db", db, "--run-id", run_id, "-q",
            "-i", json.dumps({"log": str(log), "secs": secs})]


def raysaga_attempt(tmp: Path, secs: float, executor: str, address: str | None) -> Attempt:
    tag = uuid.uuid4().hex[:8]
    log, db = tmp / f"rs-{tag}.log", f"sqlite:///{tmp / f'rs-{tag}.db'}"
    run_id = f"resume-{tag}"
    env = _raysaga_env()
    ray_tmp = tmp / f"rt{tag}"
    where = ["--executor", executor]
    if address:
        where += ["--address", address]
    elif executor == "ray":
        ray_tmp.mkdir()
        env.update(RAY_ADDRESS="local", RAY_TMPDIR=str(ray_tmp))
    first = [*_chain_cmd(db, run_id, log, secs), *where]
    again = [str(BIN / "raysaga"), "resume", run_id, "--db", db, "-q", *where]
    try:
        return attempt(first, again, log, env, secs, kill_session=executor == "ray" and not address,
                       marker=str(ray_tmp))
    finally:
        if executor == "ray" and not address:
            _kill(_mentioning(str(ray_tmp)))


@contextlib.contextmanager
def worker_fleet(tmp: Path, address: str) -> Iterator[str]:
    """A ``raysaga worker`` for ``flows:slow_chain_20`` joined to the cluster at ``address``, with
    default settings, on a store of its own (yielded), warmed by driving one run to the end."""
    db = f"sqlite:///{tmp / 'fleet.db'}"
    env = _raysaga_env()
    errors = (tmp / "fleet-worker.err").open("wb")
    worker = subprocess.Popen([str(BIN / "raysaga"), "worker", "--workflow", "flows:slow_chain_20", "--db", db,
                               "--executor", "ray", "--address", address], cwd=HERE, env=env,
                              start_new_session=True, stdout=subprocess.PIPE, stderr=errors)
    try:
        assert worker.stdout is not None
        if not worker.stdout.readline().startswith(b"worker "):  # its banner: joined, signals in place
            raise RuntimeError(f"raysaga worker did not start: {(tmp / 'fleet-worker.err').read_text()[-2000:]}")
        warm = tmp / "fleet-warm.log"
        subprocess.run([str(BIN / "raysaga"), "submit", "flows:slow_chain_20", "--db", db, "-i",
                        json.dumps({"log": str(warm), "secs": 0.0})], cwd=HERE, env=env, check=True,
                       stdout=subprocess.DEVNULL)
        last = f"r{STEPS - 1:02d}"
        _wait_for(lambda: any(w == "end" and s == last for _, w, s in _lines(warm)), 120, "the fleet's warm-up run")
        yield db
    finally:
        worker.send_signal(signal.SIGTERM)  # it hands back what it drives and leaves Ray
        with contextlib.suppress(subprocess.TimeoutExpired):
            worker.wait(30)
        _kill(_session_pids(worker.pid))
        errors.close()


def fleet_attempt(tmp: Path, secs: float, address: str, db: str) -> Attempt:
    """A ``raysaga run`` driver on the fleet's store, SIGKILLed midway; the worker finishes the run."""
    tag = uuid.uuid4().hex[:8]
    log = tmp / f"fleet-{tag}.log"
    first = [*_chain_cmd(db, f"fleet-{tag}", log, secs), "--executor", "ray", "--address", address]
    killed_at = launch_and_kill(first, log, _raysaga_env(), secs, kill_session=False)
    last = f"r{STEPS - 1:02d}"
    _wait_for(lambda: any(w == "end" and s == last for _, w, s in _lines(log)), 300, "the worker to finish the run")
    ended = max(t for t, w, s in _lines(log) if w == "end" and s == last)
    return tally(log, killed_at, killed_at, ended - killed_at)


def peer_attempt(tmp: Path, secs: float, system: str) -> Attempt:
    tag = uuid.uuid4().hex[:8]
    log, db = tmp / f"{system}-{tag}.log", tmp / f"{system}-{tag}.db"
    cmd = [sys.executable, str(HERE / "resume_child.py"), system, str(db), str(log), str(STEPS), str(secs)]
    return attempt(cmd, [*cmd, "--resume"], log, dict(os.environ), secs, kill_session=False)


def ray_floor_attempt(tmp: Path, address: str, phases: list[dict[str, float]]) -> Attempt:
    """Ray alone (``resume_child.py ray``): launch -> the first task's start; its phases appended
    to ``phases`` (seconds from the launch)."""
    out = tmp / f"floor-{uuid.uuid4().hex[:8]}.json"
    start = time.time()
    done = subprocess.run([sys.executable, str(HERE / "resume_child.py"), "ray", address, str(out)], cwd=HERE,
                          env=_raysaga_env(), stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, timeout=120)
    finished = time.time() - start
    if done.returncode != 0:
        raise RuntimeError(f"the Ray-alone driver exited {done.returncode}: {done.stderr.decode()[-2000:]}")
    times = json.loads(out.read_text())
    phases.append({key: times[key] - start for key, _ in FLOOR_PHASES})
    return Attempt(first_step=times["task_start"] - start, finished=finished, completed_rerun=0, in_flight_rerun=0)


def run(reps: int, secs: float, tmp: Path, log: Callable[[str], None], *, with_ray: bool = True) -> Report:
    tmp.mkdir(parents=True, exist_ok=True)
    first, total, rerun, in_flight = Samples(), Samples(), Samples(), Samples()
    floor_phases: list[dict[str, float]] = []
    with contextlib.ExitStack() as stack:
        systems: list[tuple[str, Callable[[], Attempt]]] = [
            (INLINE, lambda: raysaga_attempt(tmp, secs, "inline", None))]
        if with_ray:
            address = stack.enter_context(ray_cluster(tmp))
            fleet_db = stack.enter_context(worker_fleet(tmp, address))
            systems += [(COLD, lambda: raysaga_attempt(tmp, secs, "ray", None)),
                        (CLUSTER, lambda: raysaga_attempt(tmp, secs, "ray", address)),
                        (FLEET, lambda: fleet_attempt(tmp, secs, address, fleet_db)),
                        (RAY_FLOOR, lambda: ray_floor_attempt(tmp, address, floor_phases))]
        if lg_peer.available():
            systems.append((LANGGRAPH, lambda: peer_attempt(tmp, secs, "langgraph")))
        else:
            log("resume: langgraph not installed, skipped")
        if dbos_peer.available():
            systems.append((DBOS, lambda: peer_attempt(tmp, secs, "dbos")))
        else:
            log("resume: dbos not installed, skipped")
        for rep in range(reps):
            for label, go in systems:
                log(f"resume: rep {rep + 1}/{reps}: {label}")
                try:
                    a = go()
                except Exception as exc:
                    log(f"resume: {label} failed: {type(exc).__name__}: {exc}")
                    continue
                first.add(label, a.first_step)
                total.add(label, a.finished)
                rerun.add(label, a.completed_rerun)
                in_flight.add(label, a.in_flight_rerun)
    r = Report()
    r.heading(f"Resume: SIGKILL at step {KILL_AT + 1} of a {STEPS}-step chain of {secs:.2f} s steps, relaunch "
              f"({reps} reps, interleaved)")
    rows = []
    for label in first.values:
        vs = spread(pair_ratios(first[label], first[LANGGRAPH]), "{:.2f}") if LANGGRAPH in first else ""
        reruns = ["-", "-"] if label == RAY_FLOOR else [f"{int(sum(rerun[label]))}", f"{int(sum(in_flight[label]))}"]
        rows.append([label, spread(first[label]), vs, spread(total[label], "{:.2f}"), *reruns])
    r.table(["", "relaunch -> 1st step s", "this / LangGraph", "relaunch -> end s", "completed re-run",
             "in-flight re-run"], rows, [46, 24, 18, 20, 16, 16])
    r.p(f"  (re-runs summed over the reps; 'relaunch -> end' includes the remaining {STEPS - KILL_AT} steps)")
    if FLEET in first:
        r.p(f"  ('{FLEET}': no relaunch; a `raysaga worker` already joined to the cluster takes the run over: "
            "timed from the SIGKILL)")
    if floor_phases:
        r.p(f"  ('{RAY_FLOOR}': no run, no store; launch -> " + ", ".join(
            f"{name} {median([p[key] for p in floor_phases]):.3f}" for key, name in FLOOR_PHASES)
            + " s (medians): what a fresh driver on the cluster pays before its first task, raysaga or not)")
    if CLUSTER in first:
        r.target(ratio_target("resume: raysaga joining a running cluster <= LangGraph's relaunch -> first step",
                              pair_ratios(first[CLUSTER], first[LANGGRAPH]), at_most=1.0))
    if FLEET in first:
        r.target(ratio_target("resume: a running raysaga worker takes over, kill -> first step (no relaunch) <= "
                              "LangGraph's relaunch -> first step", pair_ratios(first[FLEET], first[LANGGRAPH]),
                              at_most=1.0))
    for label in (INLINE, COLD, CLUSTER, FLEET):
        if label in first:
            n = int(sum(rerun[label]))
            r.target(Target(f"resume: {label}: completed steps re-run == 0", n == 0, str(n)))
    return r


def cleanup(tmp: Path) -> None:
    shutil.rmtree(tmp, ignore_errors=True)
