#!/usr/bin/env python
"""Agent fan-out: N sub-agents x C model calls against the local Messages server, side by side.

    python bench/agents_fanout.py               # 50 sub-agents x 3 calls x 500 ms, 3 reps (~35 s)
    python bench/agents_fanout.py --quick       # 1 rep
    python bench/agents_fanout.py --agents 50 --calls 3 --latency 0.5 --concurrency 50 --reps 3

Each sub-agent is a tool-use conversation on the real ``anthropic`` SDK with the local stand-in
for the Messages API (tests/support/messages_server.py, run in a subprocess): its first C - 1
model calls ask for the cheap, non-effect tool ``lookup``, the last answers. Every call is held
``--latency`` s at the server before it is answered.

Rows (medians over ``--reps``, interleaved per rep, one process, one local Ray ``num_cpus=2``):

* ``ideal``: ceil(N / concurrency) x C x latency;
* ``raysaga``: ``plan -> @wf.agent(map_over="plan") research -> join`` with ``executor="ray"``, a
  fresh migrated SQLite store per run (create_run + lease + drive timed, the migration not); the
  model and tool calls run in raysaga's I/O pool, ``RAYSAGA_IO_CONCURRENCY`` = ``--concurrency``;
* ``floor`` (``--floor``, ``agents_floor.py``): each conversation's loop in one call on a pool
  actor, its turns written to SQLite (fenced, group-committed) or not written: what moving the
  loop out of the run machine into the actor could reach at best;
* ``LangGraph`` (when importable): ``plan`` sends N branches, each the same tool-use loop on the
  SDK in this process, joined, SqliteSaver on a fresh file, ``max_concurrency`` = ``--concurrency``;
  once with the loop in one node per branch (checkpointed when the branch ends) and once as a
  ReAct subgraph ``model <-> tools`` per branch (checkpointed at each step, as raysaga is).

For each row the server counts the model calls it received, and the bench splits the wall time
into the lead-in (run start -> first call at the server), the server's span (first call -> last
answer) and the tail (last answer -> run returned); "turn gap" is, per conversation, the time
from one answer to the next call (the orchestrator's work per turn: store the response, run the
tool, store its result, send the next request). "CPU s" is this process's CPU during the run
(every thread): raysaga's driver, or all of LangGraph; "others CPU s" that of its child processes
but the server (Ray's raylet, GCS and workers: raysaga's I/O pool actors, which run the SDK), read
from /proc (Linux; "-" elsewhere). On 2 cores a turn's burst of 50 answers is CPU-bound, so the
sum of the two is what a row costs the machine.

Targets: raysaga <= 1.5 x ideal, <= 1 x each LangGraph row, and exactly N x C model calls at the
server. Exit 0 either way unless ``--fail-on-miss``.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import math
import os
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
REPO = HERE.parent
if str(HERE) not in sys.path:  # `import agents_fanout` here and on Ray workers (bench.start_ray)
    sys.path.insert(0, str(HERE))

os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")

from machine_cpu import children_cpu, spent  # noqa: E402

import raysaga  # noqa: E402
from raysaga import Workflow  # noqa: E402
from raysaga.agents import Agent, AnthropicModel, tool  # noqa: E402

MODEL = "claude-haiku-4-5"
SYSTEM = "You answer one sub-question. Use the lookup tool as you are told, then answer in one line."
#: The environment variable the agents read their API key from (on the Ray workers): a dummy key
#: for the local server, never ANTHROPIC_API_KEY, so a real key in the environment is never sent.
KEY_ENV = "RAYSAGA_BENCH_LOCAL_KEY"
LOCAL_KEY = "local-bench-dummy-key"  # the server insists on it; not a credential
STEP = "research"

TARGET_IDEAL_RATIO = 1.5
TARGET_PEER_RATIO = 1.0


# ---------------------------------------------------------------------------- the workflow
# Module-level functions, so Ray workers import them from `agents_fanout` (bench/ is on their
# PYTHONPATH) rather than unpickling them by value from __main__.


def lookup(query: str, page: int) -> str:
    """Look the query up; returns one page of (canned) results."""
    return f"page {page} for {query!r}: 3 results, nothing surprising"


LOOKUP = tool(lookup, name="lookup")


def plan(input: dict[str, int]) -> list[int]:
    """The sub-agents to run: ``input["n"]`` of them."""
    return list(range(int(input["n"])))


def prompt_for(i: int) -> str:
    return f"Sub-question {i}: look item-{i} up as often as you are told, then answer in one line."


def research(plan: int) -> str:
    """The prompt of sub-agent ``plan`` (runs in the driver)."""
    return prompt_for(plan)


def join(research: list[str]) -> int:
    return len(research)


#: Set by ``--speculative-tools`` (an environment variable: Ray workers build the agent too).
SPECULATIVE_ENV = "RAYSAGA_BENCH_SPECULATIVE"


def make_agent(base_url: str, calls: int) -> Agent:
    model = AnthropicModel(MODEL, max_tokens=256, base_url=base_url, timeout=30.0, api_key_env=KEY_ENV)
    return Agent("sub_agent", model, system=SYSTEM, tools=(LOOKUP,), max_turns=calls + 1, max_tokens=256,
                 speculative_tools=os.environ.get(SPECULATIVE_ENV) == "1")


def sdk_request(agent: Agent) -> dict[str, Any]:
    """The agent's Messages API request but its messages: what the rows that call the SDK
    themselves (LangGraph's, the floor's) send, as raysaga's agent does."""
    return {"model": MODEL, "max_tokens": agent.max_tokens, "system": agent.system, "tools": agent.tool_definitions()}


def build(base_url: str, calls: int) -> Workflow:
    """``plan -> research[0..N-1] (an agent per item) -> join``; input ``{"n": N}``."""
    wf = Workflow("bench-agents-fanout")
    wf.step()(plan)
    wf.agent(make_agent(base_url, calls), map_over="plan")(research)
    wf.step()(join)
    return wf.validate()


# ---------------------------------------------------------------------------- the server (a subprocess)


def serve(latency: float, calls: int) -> int:
    """``--serve``: the Messages server; prints its URL, then answers ``stats`` / ``clear`` on stdin."""
    if str(REPO) not in sys.path:
        sys.path.insert(0, str(REPO))
    from tests.support import messages_server as ms

    def respond(body: dict[str, Any]) -> ms.Reply:
        turn = ms.turn_of(body)
        if turn < calls - 1:
            r = ms.tool_use("lookup", {"query": str(ms.conversation_of(body)), "page": turn})
        else:
            r = ms.text(f"answer after {turn} lookups")
        return ms.delayed(latency, r) if latency > 0 else r

    def stats(srv: ms.MessagesServer) -> dict[str, Any]:
        log = [r for r in srv.requests if r.path == "/v1/messages"]
        by_conv: dict[str | None, list[float]] = {}
        for r in log:
            by_conv.setdefault(r.conversation, []).append(r.arrived)
        gaps = [b - (a + latency) for arrivals in by_conv.values()
                for a, b in zip(sorted(arrivals), sorted(arrivals)[1:], strict=False)]
        return {"calls": len(log), "repeated": len(srv.repeated_requests()),
                "first": min((r.arrived for r in log), default=None),
                "last_end": max((r.arrived for r in log), default=-latency) + latency,
                "gaps": gaps}

    # backlog: N clients connect at once; with the default 5, Linux drops SYNs and they retry 1 s later
    with ms.MessagesServer(respond, api_key=LOCAL_KEY, model=MODEL, backlog=1024) as srv:
        print(srv.base_url, flush=True)
        for line in sys.stdin:
            if line.strip() == "clear":
                srv.clear()
                print("{}", flush=True)
            elif line.strip() == "stats":
                print(json.dumps(stats(srv)), flush=True)
    return 0


@dataclass
class Served:
    """What the server saw during one run, on the clock ``time.monotonic`` (one per machine on Linux)."""

    calls: int  # POST /v1/messages received
    repeated: int  # answered requests asked again (MessagesServer.repeated_requests)
    first: float
    last_end: float
    gaps: list[float]


class ServerProcess:
    """The Messages server in a subprocess: its CPU is not taken from the driver's GIL."""

    def __init__(self, latency: float, calls: int) -> None:
        self.proc = subprocess.Popen(
            [sys.executable, str(Path(__file__).resolve()), "--serve", "--latency", str(latency),
             "--calls", str(calls)],
            stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True, cwd=REPO)
        assert self.proc.stdout is not None
        self.base_url = self.proc.stdout.readline().strip()
        if not self.base_url.startswith("http://"):
            self.close()
            raise RuntimeError(f"the Messages server did not start (it said {self.base_url!r})")

    def ask(self, command: str) -> dict[str, Any]:
        assert self.proc.stdin is not None and self.proc.stdout is not None
        self.proc.stdin.write(command + "\n")
        self.proc.stdin.flush()
        answer: dict[str, Any] = json.loads(self.proc.stdout.readline())
        return answer

    def clear(self) -> None:
        self.ask("clear")

    def served(self) -> Served:
        s = self.ask("stats")
        if s["first"] is None:
            raise RuntimeError("the run made no model call")
        return Served(calls=s["calls"], repeated=s["repeated"], first=s["first"],
                      last_end=s["last_end"], gaps=s["gaps"])

    def close(self) -> None:
        with contextlib.suppress(Exception):
            assert self.proc.stdin is not None
            self.proc.stdin.close()
        try:
            self.proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()


# ---------------------------------------------------------------------------- rows


@dataclass
class Sample:
    wall: float
    served: Served
    lead: float  # run start -> first call at the server
    tail: float  # last answer sent -> run returned
    cpu: float  # CPU seconds of this process (every thread) during the run
    stored_calls: int | None  # model-turn rows in raysaga's store (None: not raysaga)
    others: float | None = None  # CPU seconds of the child processes (Ray) but the server (None: no /proc)


@dataclass
class Run:
    """A row's one run: its start and end on ``time.monotonic``, the CPU it took in this process."""

    start: float
    end: float
    cpu: float
    stored_calls: int | None = None


Runner = Callable[[], Run]


def measured(server: ServerProcess, runner: Runner) -> Sample:
    server.clear()
    before = children_cpu(server.proc.pid)
    run = runner()
    after = children_cpu(server.proc.pid)
    served = server.served()
    return Sample(wall=run.end - run.start, served=served, lead=served.first - run.start,
                  tail=run.end - served.last_end, cpu=run.cpu, stored_calls=run.stored_calls,
                  others=spent(before, after))


TURN_NODE = re.compile(rf"^{STEP}@\d+$")


def raysaga_runner(wf: Workflow, n: int, tmp: Path) -> Runner:
    import bench  # the bench's helpers (fresh_store)

    def run() -> Run:
        with bench.fresh_store(tmp, "agents") as (store, _):
            cpu, start = time.process_time(), time.monotonic()
            record = raysaga.run(wf, {"n": n}, store=store, executor="ray")
            end, cpu = time.monotonic(), time.process_time() - cpu
            if record.status != raysaga.RunStatus.COMPLETED or record.output != {"join": n}:
                raise RuntimeError(f"bench run {record.run_id} ended {record.status.value} "
                                   f"(output {record.output!r}): {record.error}")
            stored = sum(1 for r in store.nodes(record.run_id) if TURN_NODE.match(r.node_id))
        return Run(start, end, cpu, stored)

    return run


def langgraph_runner(n: int, calls: int, base_url: str, tmp: Path, concurrency: int,
                     subgraph: bool) -> Runner | None:
    import anthropic
    from peers import langgraph_agents_runner

    client = anthropic.Anthropic(base_url=base_url, api_key=LOCAL_KEY, timeout=30.0)
    agent = make_agent(base_url, calls)
    graph = langgraph_agents_runner([prompt_for(i) for i in range(n)], client, sdk_request(agent), {"lookup": lookup},
                                    agent.max_turns, tmp, concurrency, subgraph)
    if graph is None:
        return None
    invoke: Callable[[], float] = graph

    def run() -> Run:
        cpu = time.process_time()
        took = invoke()  # the graph's own timing: compiling it and opening the file are left out
        end, cpu = time.monotonic(), time.process_time() - cpu
        return Run(end - took, end, cpu)

    return run


# ---------------------------------------------------------------------------- main


def median(values: list[float]) -> float:
    return statistics.median(values) if values else float("nan")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0] if __doc__ else None)
    parser.add_argument("--agents", type=int, default=50, help="sub-agents (fan-out width)")
    parser.add_argument("--calls", type=int, default=3, help="model calls per sub-agent (the last one answers)")
    parser.add_argument("--latency", type=float, default=0.5, help="seconds the server holds each model call")
    parser.add_argument("--concurrency", type=int, default=50,
                        help="raysaga's RAYSAGA_IO_CONCURRENCY and LangGraph's max_concurrency")
    parser.add_argument("--reps", type=int, default=None, help="default 3 (1 with --quick)")
    parser.add_argument("--quick", action="store_true", help="1 rep")
    parser.add_argument("--no-peers", action="store_true", help="skip LangGraph")
    parser.add_argument("--speculative-tools", action="store_true",
                        help="Agent(speculative_tools=True): a model call's attempt runs the tools it asks for")
    parser.add_argument("--floor", action="store_true",
                        help="add the rows of agents_floor.py: each conversation's loop in one pool-actor call, "
                             "turns written (fenced, group-committed) and not written")
    parser.add_argument("--fail-on-miss", action="store_true")
    parser.add_argument("--serve", action="store_true", help=argparse.SUPPRESS)  # the server subprocess
    args = parser.parse_args(argv)
    if args.calls < 1 or args.agents < 1 or args.concurrency < 1:
        parser.error("--agents, --calls and --concurrency must be >= 1")
    if args.serve:
        return serve(args.latency, args.calls)

    os.environ["RAYSAGA_IO_CONCURRENCY"] = str(args.concurrency)
    os.environ[KEY_ENV] = LOCAL_KEY  # before Ray starts: its workers inherit it
    if args.speculative_tools:
        os.environ[SPECULATIVE_ENV] = "1"
    import bench
    from raysaga.orchestrator.io_pool import io_concurrency_limit

    conc = io_concurrency_limit()
    reps = args.reps or (1 if args.quick else 3)
    n, calls, latency = args.agents, args.calls, args.latency
    expected = n * calls
    ideal = math.ceil(n / conc) * calls * latency

    def log(msg: str) -> None:
        print(f"[agents-bench {time.strftime('%H:%M:%S')}] {msg}", file=sys.stderr, flush=True)

    tmp = Path(tempfile.mkdtemp(prefix="raysaga-agents-bench-"))
    server: ServerProcess | None = None
    try:
        log("starting the Messages server and Ray")
        server = ServerProcess(latency, calls)
        bench.start_ray(None, tmp / "ray")
        ours = "raysaga (Ray, I/O pool, SQLite)"
        rows: list[tuple[str, Runner]] = [(ours, raysaga_runner(build(server.base_url, calls), n, tmp))]
        peers: list[str] = []
        if not args.no_peers:
            for label, subgraph in ((f"LangGraph Send, loop in one node (max_conc={conc})", False),
                                    (f"LangGraph Send, ReAct subgraph (max_conc={conc})", True)):
                runner = langgraph_runner(n, calls, server.base_url, tmp, conc, subgraph)
                if runner is None:
                    log(f"{label}: langgraph is not installed (pip install -e '.[bench]'), skipped")
                    continue
                rows.append((label, runner))
                peers.append(label)
        if args.floor:
            import agents_floor

            request = sdk_request(make_agent(server.base_url, calls))
            for label, written in (("floor: loop in a pool actor, turns written", True),
                                   ("floor: loop in a pool actor, nothing written", False)):
                rows.append((label, agents_floor.floor_runner(n, calls, server.base_url, tmp, request,
                                                              written=written)))
        log("warming up (I/O pool actors start, workers import raysaga and anthropic)")
        for _, runner in rows:
            measured(server, runner)
        samples: dict[str, list[Sample]] = {label: [] for label, _ in rows}
        for rep in range(reps):
            log(f"rep {rep + 1}/{reps}")
            for label, runner in rows:
                samples[label].append(measured(server, runner))

        med = {label: median([s.wall for s in v]) for label, v in samples.items()}
        mine = med[ours]
        print(f"Agent fan-out: {n} sub-agents x {calls} model calls, {latency * 1000:.0f} ms per call at the local "
              f"Messages server, local Ray num_cpus=2, {os.cpu_count()} CPUs, concurrency {conc}, medians of "
              f"{reps}, load average {' '.join(f'{x:.1f}' for x in os.getloadavg())}")
        print(f"  {'':50} {'wall s':>7} {'x ideal':>8} {'raysaga/this':>13} {'calls':>6} {'lead-in ms':>11} "
              f"{'server span s':>14} {'turn gap ms med/max':>20} {'tail ms':>8} {'CPU s':>6} {'others CPU s':>13}")
        print(f"  {'ideal: ceil(N / concurrency) x calls x latency':50} {ideal:7.3f} {1:8.2f} {'':13} {expected:6d}")
        for label, v in samples.items():
            gaps = [g for s in v for g in s.served.gaps]
            calls_seen = sorted({s.served.calls for s in v})
            span = median([s.served.last_end - s.served.first for s in v])
            gap = f"{median(gaps) * 1000:.0f} / {max(gaps, default=float('nan')) * 1000:.0f}"
            others = [s.others for s in v if s.others is not None]
            other = f"{median(others):13.2f}" if others else f"{'-':>13}"
            print(f"  {label:50} {med[label]:7.3f} {med[label] / ideal:8.2f} {mine / med[label]:13.2f} "
                  f"{'/'.join(map(str, calls_seen)):>6} {median([s.lead for s in v]) * 1000:11.0f} "
                  f"{span:14.3f} {gap:>20} {median([s.tail for s in v]) * 1000:8.0f} "
                  f"{median([s.cpu for s in v]):6.2f} {other}")

        our = samples[ours]
        counts = [s.served.calls for s in our]
        stored = [s.stored_calls for s in our]
        repeated = sum(s.served.repeated for s in our)
        targets = [(f"raysaga <= {TARGET_IDEAL_RATIO}x ideal", mine / ideal <= TARGET_IDEAL_RATIO,
                    f"{mine / ideal:.2f}x ({mine:.3f} s vs {ideal:.3f} s)")]
        for label in peers:
            targets.append((f"raysaga <= {TARGET_PEER_RATIO}x {label}", mine <= med[label] * TARGET_PEER_RATIO,
                            f"{mine / med[label]:.2f}x"))
        targets.append((f"raysaga model calls at the server == {expected} in every rep",
                        all(c == expected for c in counts),
                        f"{' '.join(map(str, counts))} (in the store: {' '.join(map(str, stored))}; "
                        f"answered calls asked again: {repeated})"))
        print("== Targets ==")
        for title, ok, value in targets:
            print(f"  {'PASS' if ok else 'MISS'}  {title}: {value}")
        return 1 if args.fail_on_miss and not all(ok for _, ok, _ in targets) else 0
    finally:
        with contextlib.suppress(Exception):
            import ray

            if ray.is_initialized():
                ray.shutdown()
        if server is not None:
            server.close()
        shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    # Run as `agents_fanout`, not `__main__`: Ray workers then import the workflow's functions from
    # this file by name (bench/ is on their PYTHONPATH) instead of unpickling copies of them.
    import agents_fanout

    sys.exit(agents_fanout.main())
