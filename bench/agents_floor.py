"""The floor under ``agents_fanout.py``'s raysaga row: each conversation's whole tool-use loop in ONE
call on a pool actor, with no run machine, for ``agents_fanout.py --floor``.

Why: raysaga's row is ~1.05x LangGraph's loop in one node on 2 cores, and the turn breakdown
(bench/README.md) put the gap in the hops between the driver and the I/O pool. Moving the loop
into the pool actor (DESIGN, "Agents as turns": its per-turn writes fenced like the driver's)
removes every hop; these rows measure what that design could reach at best, in the same run:

* ``floor, turns written``: 2 actors x ``ceil(N / 2)`` threads (``num_cpus=0``), the anthropic SDK
  as raysaga's pool runs it, and each model response and tool result written to a SQLite file
  (WAL, ``synchronous=FULL``) in a transaction that proves the run's fence first, group-committed
  by one writer thread per actor: what "every model response durable before its tools run"
  costs with nothing else around it (no pydantic records, budgets, breakers, events);
* ``floor, nothing written``: the same loop with no write at all (no durability: the turns are
  encoded and dropped), the cost of the process layout alone.

LangGraph's loop in one node checkpoints when its branch ends, not per turn: a crash re-asks the
model every turn of an unfinished branch.
"""

from __future__ import annotations

import json
import math
import queue
import sqlite3
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import agents_fanout as af

SCHEMA = ("CREATE TABLE runs (run_id TEXT PRIMARY KEY, fence INTEGER NOT NULL, version INTEGER NOT NULL)",
          "CREATE TABLE turns (run_id TEXT, node TEXT, k INTEGER, body TEXT, PRIMARY KEY (run_id, node, k))")
ACTORS = 2


@dataclass
class _Write:
    run_id: str
    fence: int
    node: str
    k: int
    body: str
    done: threading.Event = field(default_factory=threading.Event)
    fenced_out: bool = False


class FloorActor:
    """One pool actor: runs conversations in its threads, writes their turns through one writer."""

    def __init__(self, base_url: str, calls: int) -> None:
        import anthropic

        self.client = anthropic.Anthropic(base_url=base_url, api_key=af.LOCAL_KEY, timeout=30.0, max_retries=0)
        self.calls = calls
        self.conn: sqlite3.Connection | None = None
        self.writes: queue.Queue[_Write] = queue.Queue()
        threading.Thread(target=self._writer, daemon=True).start()

    def open(self, db: str | None) -> None:
        """The next run's file (None: nothing is written); between runs, no write in flight."""
        if self.conn is not None:
            self.conn.close()
            self.conn = None
        if db is not None:
            self.conn = sqlite3.connect(db, check_same_thread=False, isolation_level=None, timeout=30)
            self.conn.execute("PRAGMA journal_mode=WAL")
            self.conn.execute("PRAGMA synchronous=FULL")

    def _writer(self) -> None:
        """Group commit: every write waiting when a transaction starts goes in it."""
        while True:
            batch = [self.writes.get()]
            while not self.writes.empty():
                batch.append(self.writes.get_nowait())
            conn = self.conn
            assert conn is not None
            conn.execute("BEGIN IMMEDIATE")
            for w in batch:  # the fence first, as a driver's commit proves it
                proved = conn.execute("UPDATE runs SET version = version + 1 WHERE run_id = ? AND fence = ?",
                                           (w.run_id, w.fence)).rowcount == 1
                if proved:
                    conn.execute("INSERT INTO turns VALUES (?, ?, ?, ?)", (w.run_id, w.node, w.k, w.body))
                w.fenced_out = not proved
            conn.execute("COMMIT")
            for w in batch:
                w.done.set()

    def _write(self, run_id: str, fence: int, node: str, k: int, value: Any) -> None:
        body = json.dumps(value)
        if self.conn is None:
            return
        write = _Write(run_id, fence, node, k, body)
        self.writes.put(write)
        write.done.wait()
        if write.fenced_out:
            raise RuntimeError(f"run {run_id}: fence {fence} is stale")

    def converse(self, run_id: str, fence: int, i: int, request: dict[str, Any]) -> str:
        messages: list[dict[str, Any]] = [{"role": "user", "content": af.prompt_for(i)}]
        node = f"{af.STEP}@{i}"
        for k in range(self.calls + 1):
            body = self.client.messages.create(**request, messages=messages).model_dump(mode="json")  # type: ignore[arg-type]
            self._write(run_id, fence, node, 2 * k, body)  # durable before its tools run
            uses = [b for b in body["content"] if b["type"] == "tool_use"]
            if not uses:
                return "".join(b.get("text", "") for b in body["content"])
            results = [{"type": "tool_result", "tool_use_id": u["id"], "content": af.lookup(**u["input"])}
                       for u in uses]
            self._write(run_id, fence, node, 2 * k + 1, results)
            messages += [{"role": "assistant", "content": body["content"]}, {"role": "user", "content": results}]
        raise RuntimeError(f"conversation {i} did not answer in {self.calls + 1} turns")


def floor_runner(n: int, calls: int, base_url: str, tmp: Path, request: dict[str, Any], *,
                 written: bool) -> af.Runner:
    """A row: per run, a fresh SQLite file (``written``), opened by the row's two actors (made at
    its first run: the warm-up) before the clock starts."""
    import ray

    actor_cls: Any = ray.remote(FloorActor).options(num_cpus=0, max_concurrency=math.ceil(n / ACTORS) + 1)
    actors: list[Any] = []
    made = [0]

    def run() -> af.Run:
        if not actors:
            actors.extend(actor_cls.remote(base_url, calls) for _ in range(ACTORS))
        made[0] += 1
        db = None
        if written:
            db = str(tmp / f"floor-{made[0]}.db")
            with sqlite3.connect(db) as conn:
                conn.execute("PRAGMA journal_mode=WAL")
                for statement in SCHEMA:
                    conn.execute(statement)
                conn.execute("INSERT INTO runs VALUES ('run', 1, 0)")
        ray.get([a.open.remote(db) for a in actors])
        cpu, start = time.process_time(), time.monotonic()
        answers = ray.get([actors[i % ACTORS].converse.remote("run", 1, i, request) for i in range(n)])
        end, cpu = time.monotonic(), time.process_time() - cpu
        if len(answers) != n:
            raise RuntimeError(f"the floor row answered {len(answers)} conversations, not {n}")
        return af.Run(start, end, cpu)

    return run
