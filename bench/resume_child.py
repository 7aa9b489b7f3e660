"""The peers' side of bench/resume.py: a chain of N steps that each log and sleep, run by LangGraph
(SqliteSaver, ``durability="sync"``) or DBOS (SQLite system database), in a process the bench
SIGKILLs midway and then starts again to finish the same run.

    python resume_child.py langgraph DB LOG N SECS [--resume]
    python resume_child.py dbos DB LOG N SECS [--resume]
    python resume_child.py ray ADDRESS OUT

Each step appends ``<time> start|end <step> <pid>`` to LOG around its sleep (the format of
``flows.slow_step``). ``--resume``: LangGraph invokes the same thread with no input (it goes on
from the last checkpoint); DBOS's launch recovers the pending workflow, and this waits for it.

``ray``: Ray alone, the floor of a fresh driver joining a running cluster: ``import ray``,
``ray.init(ADDRESS)`` with the ``runtime_env`` a raysaga driver passes (``PYTHONPATH``), one
no-op task; OUT gets the times (epoch seconds) of each phase, the task's start and the
start of the worker process it ran in.

No ``from __future__ import annotations``: LangGraph reads the hints of its state at build time.
"""

import os
import sys
import time
from collections.abc import Callable
from typing import Any, TypedDict, TypeVar, cast

THREAD = "raysaga-bench-resume"
F = TypeVar("F", bound=Callable[..., Any])


def log_line(path: str, what: str, step: str) -> None:
    with open(path, "a") as f:
        f.write(f"{time.time():.6f} {what} {step} {os.getpid()}\n")


class State(TypedDict):
    last: str


def langgraph(db: str, log: str, n: int, secs: float, resume: bool) -> None:
    import sqlite3

    from langgraph.checkpoint.sqlite import SqliteSaver
    from langgraph.graph import END, START, StateGraph

    g = StateGraph(State)
    prev = START
    for i in range(n):
        name = f"r{i:02d}"

        def node(state: State, _name: str = name) -> dict[str, Any]:
            log_line(log, "start", _name)
            time.sleep(secs)
            log_line(log, "end", _name)
            return {"last": _name}

        g.add_node(name, node)
        g.add_edge(prev, name)
        prev = name
    g.add_edge(prev, END)
    conn = sqlite3.connect(db, check_same_thread=False)
    graph = g.compile(checkpointer=SqliteSaver(conn))
    config: Any = {"configurable": {"thread_id": THREAD}}
    out = graph.invoke(None if resume else {"last": ""}, config, durability="sync")
    assert out["last"] == f"r{n - 1:02d}", out


def dbos(db: str, log: str, n: int, secs: float, resume: bool) -> None:
    import logging

    from dbos import DBOS, SetWorkflowID

    step = cast(Callable[[F], F], DBOS.step())  # DBOS's decorators keep the signature
    workflow = cast(Callable[[F], F], DBOS.workflow())

    @step
    def slow(name: str) -> None:
        log_line(log, "start", name)
        time.sleep(secs)
        log_line(log, "end", name)

    @workflow
    def chain(count: int) -> int:
        for i in range(count):
            slow(f"r{i:02d}")
        return count

    DBOS(config={"name": "raysaga_bench_resume", "system_database_url": f"sqlite:///{db}", "log_level": "ERROR"})
    DBOS.launch()  # recovers this executor's pending workflows (the killed run) in the background
    logging.getLogger("dbos").setLevel(logging.ERROR)
    if resume:
        handle: Any = DBOS.retrieve_workflow(THREAD)
        assert handle.get_result() == n
    else:
        with SetWorkflowID(THREAD):
            assert chain(n) == n
    DBOS.destroy()


def process_started(pid: int) -> float:
    """When process ``pid`` started (epoch seconds, to a clock tick), from ``/proc``."""
    from pathlib import Path

    since_boot = float(Path("/proc/uptime").read_text().split()[0])
    ticks = int(Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[19])
    return time.time() - since_boot + ticks / os.sysconf("SC_CLK_TCK")


def first_task() -> tuple[float, float]:
    """The body of the floor's task: when it started, and when its worker process started."""
    return time.time(), process_started(os.getpid())


def ray_floor(address: str, out: str) -> None:
    import json
    import logging

    times = {"exec": process_started(os.getpid())}
    import ray

    times["imported"] = time.time()
    path = os.pathsep.join(p for p in [os.getcwd(), *sys.path] if p and os.path.isdir(p))
    ray.init(address=address, include_dashboard=False, log_to_driver=False, logging_level=logging.ERROR,
             runtime_env={"env_vars": {"PYTHONPATH": path}})  # as raysaga's RayExecutor joins
    times["joined"] = time.time()
    ref = ray.remote(max_retries=0)(first_task).remote()
    times["submitted"] = time.time()
    times["task_start"], times["worker_start"] = ray.get(ref)
    with open(out, "w") as f:
        json.dump(times, f)


def main(argv: list[str]) -> int:
    if argv[0] == "ray":
        ray_floor(argv[1], argv[2])
        return 0
    system, db, log, n, secs = argv[:5]
    resume = "--resume" in argv[5:]
    {"langgraph": langgraph, "dbos": dbos}[system](db, log, int(n), float(secs), resume)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
