"""An agent workflow the agent tests drive in driver subprocesses, and the model that answers it.

Not a test module: the tests import it as ``tests.support.agent_flows``. As a script it is a
driver process, like ``tests.support.crash_driver`` but for the flow below::

    AGENT_FLOWS_MODEL_URL=http://127.0.0.1:PORT AGENT_FLOWS_SERVICES_URL=http://127.0.0.1:PORT \\
    ANTHROPIC_API_KEY=... python -m tests.support.agent_flows --db URL --run-id ID \\
        [--executor inline|ray] [--lease-ttl S] [--resume] [--go-file PATH] [--log-level DEBUG]

It creates the run (unless ``--resume``) and drives it as ``raysaga.resume`` does, with the
backoff jitter seeded (``SEED``), and prints the final record as one ``RESULT {json}`` line;
exit codes are crash_driver's (0 completed, 1 failed/paused/cancelled, 3 lease held, 4 lease
lost). Crash points come from ``RAYSAGA_FAULTS``; ``AGENT_FLOWS_BACKOFF`` slows the model
calls' transport retries (for a kill during a backoff).

The flow, ``agent_sweep``: ``brief`` (a step) → ``research`` (an agent on the real ``anthropic``
SDK, pointed at ``tests.support.messages_server``) → ``publish`` (a step). The conversation the
server scripts (``reply_for``) is:

- turn 0 → ``tool_use search`` (a plain tool, no effect);
- turn 1 → ``tool_use file_report`` with the search result as its body (an ``effect=True`` tool
  that files the report with the deduping fake provider under its idempotency key);
- turn 2 → the final JSON answer, quoting the receipt the provider returned.

Each reply is a pure function of the request (the messages so far), so a turn asked again gets
the same answer, and each turn's usage is distinct (``TURN_USAGE``), so a billed repeat shows
which turn it was.
"""

from __future__ import annotations

import argparse
import functools
import hashlib
import importlib
import json
import logging
import os
import random
import subprocess
import sys
from pathlib import Path
from typing import Any

from pydantic import BaseModel

from raysaga import RetryPolicy, Workflow
from raysaga.agents import Agent, AnthropicModel, tool
from tests.support import REPO, spans
from tests.support import crash_driver as harness
from tests.support import messages_server as ms
from tests.support import services as fake_services

MODULE = "tests.support.agent_flows"  # run as `python -m MODULE` from the repository root
MODEL = "claude-haiku-4-5"
MODEL_URL_ENV = "AGENT_FLOWS_MODEL_URL"
SERVICES_URL_ENV = "AGENT_FLOWS_SERVICES_URL"
BACKOFF_ENV = "AGENT_FLOWS_BACKOFF"  # seconds: the ceiling of the model calls' transport backoff
#: The driver's backoff jitter is drawn from ``random.Random(SEED)``: the first draw is
#: ``backoff_draw(ceiling)``, so a test knows how long a retry will wait.
SEED = 0
KEY_ENV = "ANTHROPIC_API_KEY"
#: The key the agent tests run with. Ray workers read the key from *their* environment (the
#: raylet's, inherited from the pytest process when the session's Ray head starts, which is
#: after collection): a test module that runs agents on Ray calls ``use_test_key()`` at import.
TEST_KEY = "sk-ant-test-raysaga-agents"
TOPIC = "tidal power in the Severn estuary"
STEP = "research"
#: (input, output) tokens of the reply to each turn: distinct, so a repeat names its turn.
TURN_USAGE = {0: (101, 11), 1: (203, 23), 2: (307, 37)}
#: Transport retries fast enough for tests (the durable backoff timer is still used).
FAST_TRANSPORT = RetryPolicy(max_attempts=6, base=0.02, cap=0.1)


def use_test_key() -> None:
    os.environ[KEY_ENV] = TEST_KEY


# ---------------------------------------------------------------------- the flow


class SweepIn(BaseModel):
    topic: str = TOPIC


class Finding(BaseModel):
    """The agent's final answer (its ``output_type``)."""

    topic: str
    summary: str
    receipt: str
    sources: int


def _digest(*parts: object) -> str:
    return hashlib.sha256(repr(parts).encode()).hexdigest()[:12]


def search_impl(q: str) -> str:
    """Search the (fake) web: deterministic in the query."""
    return f"3 sources on {q}: tide tables {_digest(q, 1)}, turbine trial {_digest(q, 2)}, grid study {_digest(q, 3)}"


def file_report_impl(services_url: str, title: str, body: str, idempotency_key: str) -> dict[str, str]:
    """File a report with the provider (an effect: the provider dedupes by the key)."""
    reply = fake_services.post(services_url, "report", idempotency_key, {"subject": title, "body": body})
    return {"receipt": str(reply["id"])}  # the provider's id only: a deduped replay returns the same


search = tool(search_impl, name="search", description="Search the web; returns a summary of the sources.")


def file_report_tool(services_url: str) -> Any:
    # a partial (not a closure) so Ray pickles it by reference to this module plus the URL
    return tool(functools.partial(file_report_impl, services_url), name="file_report", effect=True,
                description="File a report with the publisher; returns its receipt.")


def make_agent(model_url: str, services_url: str, *, timeout: float = 10.0, **overrides: Any) -> Agent:
    options: dict[str, Any] = {"system": "You are a careful research assistant.", "output_type": Finding,
                               "transport_retry": FAST_TRANSPORT, "max_turns": 6}
    options.update(overrides)
    model = AnthropicModel(MODEL, base_url=model_url, timeout=timeout, api_key_env=KEY_ENV)
    return Agent("researcher", model, tools=(search, file_report_tool(services_url)), **options)


def make_flow(model_url: str, services_url: str, **agent_options: Any) -> Workflow:
    """``brief → research (agent) → publish``; ``agent_options`` override the agent's fields."""
    wf = Workflow("agent_sweep", version="1", description="a step, an agent with an effect tool, a step")
    agent = make_agent(model_url, services_url, **agent_options)

    @wf.step()
    def brief(input: SweepIn) -> str:
        return f"Research {input.topic}. Search first, file one report, then answer in JSON."

    @wf.agent(agent)
    def research(brief: str) -> str:
        return brief

    @wf.step()
    def publish(research: Finding) -> dict[str, Any]:
        return {"headline": f"{research.topic}: {research.summary}", "receipt": research.receipt,
                "digest": _digest(research.model_dump_json())}

    return wf


def flow_from_env() -> Workflow:
    options: dict[str, Any] = {}
    if os.environ.get(BACKOFF_ENV):
        ceiling = float(os.environ[BACKOFF_ENV])
        options["transport_retry"] = RetryPolicy(max_attempts=4, base=ceiling, cap=ceiling)
    return make_flow(os.environ[MODEL_URL_ENV], os.environ[SERVICES_URL_ENV], **options)


def backoff_draw(ceiling: float) -> float:
    """The first backoff a driver of this script waits (``RetryPolicy(base=cap=ceiling)``)."""
    return random.Random(SEED).uniform(0.0, ceiling)


# ---------------------------------------------------------------------- the model's side


def last_tool_result(request: dict[str, Any]) -> str:
    """The content of the last tool_result the request carries (what the agent's tool returned)."""
    last = request["messages"][-1]
    blocks = [b for b in last.get("content", []) if isinstance(b, dict) and b.get("type") == "tool_result"]
    if not blocks:
        raise LookupError(f"turn {ms.turn_of(request)} should carry a tool result, got {last!r}")
    content = blocks[-1]["content"]
    return content if isinstance(content, str) else json.dumps(content)


def reply_for(request: dict[str, Any]) -> Any:
    """The scripted model: a responder for ``MessagesServer`` (pure in the request)."""
    turn = ms.turn_of(request)
    if turn == 0:
        return ms.tool_use("search", {"q": TOPIC}, usage=TURN_USAGE[0])
    if turn == 1:
        return ms.tool_use("file_report", {"title": "Tidal power", "body": last_tool_result(request)},
                           usage=TURN_USAGE[1])
    if turn == 2:
        receipt = json.loads(last_tool_result(request))["receipt"]
        answer = {"topic": TOPIC, "summary": "promising, with grid limits", "receipt": receipt, "sources": 3}
        return ms.text(json.dumps(answer), usage=TURN_USAGE[2])
    raise LookupError(f"the script has 3 turns, asked for turn {turn}")


# ---------------------------------------------------------------------- the driver process


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="drive one run of the agent_sweep flow")
    parser.add_argument("--db", required=True)
    parser.add_argument("--run-id", required=True)
    parser.add_argument("--executor", choices=["inline", "ray"], default="inline")
    parser.add_argument("--topic", default=TOPIC)
    parser.add_argument("--lease-ttl", type=float, default=None)
    parser.add_argument("--resume", action="store_true", help="resume an existing run (never create one)")
    parser.add_argument("--go-file", default=None, help="import everything, then wait for this file")
    parser.add_argument("--log-level", default=None, help="configure root logging at this level (to stderr)")
    args = parser.parse_args(argv)
    spans.install_from_env()  # RAYSAGA_TEST_SPANS: this process's spans to a file (tests/orchestrator/test_tracing.py)
    if args.log_level:
        logging.basicConfig(level=args.log_level.upper(), stream=sys.stderr)

    import anthropic  # noqa: F401  (imported by the model call anyway: a resumer pays for it while it waits)

    import raysaga
    from raysaga.orchestrator.driver import Driver
    from raysaga.orchestrator.executor import make_executor

    # this file imported again under its module name (not __main__): Ray pickles its functions by reference
    flow = importlib.import_module(MODULE).flow_from_env()
    if args.go_file:
        harness.wait_for_go(Path(args.go_file))
    options = raysaga.RunOptions(lease_ttl=args.lease_ttl) if args.lease_ttl else raysaga.RunOptions()
    store = raysaga.open_store(args.db)
    if not args.resume:
        raysaga.create_run(flow, SweepIn(topic=args.topic).model_dump(), store=store, run_id=args.run_id,
                           options=options)
    executor = make_executor(args.executor)

    def drive() -> Any:
        try:  # raysaga.resume, with a seeded jitter
            return Driver(flow, store, executor, args.run_id, options=options, rng=random.Random(SEED)).drive()
        finally:
            executor.shutdown()

    return harness.report(drive, ok=lambda record: bool(record.status == raysaga.RunStatus.COMPLETED),
                          extra=lambda record: {"tokens_used": record.tokens_used})


# ---------------------------------------------------------------------- helpers for the tests


def spawn(db: str, run_id: str, *, model_url: str, services_url: str, api_key: str,
          executor: str = "inline", faults: str | None = None, lease_ttl: float | None = None,
          resume: bool = False, go_file: Path | None = None, log_level: str | None = None,
          extra_env: dict[str, str] | None = None) -> subprocess.Popen[str]:
    """Start a driver process of this flow (``RAYSAGA_FAULTS`` exactly ``faults``)."""
    cmd = [sys.executable, "-m", MODULE, "--db", db, "--run-id", run_id, "--executor", executor]
    if lease_ttl:
        cmd += ["--lease-ttl", str(lease_ttl)]
    if resume:
        cmd.append("--resume")
    if go_file is not None:
        cmd += ["--go-file", str(go_file)]
    if log_level:
        cmd += ["--log-level", log_level]
    env = harness.driver_env(faults, {MODEL_URL_ENV: model_url, SERVICES_URL_ENV: services_url, KEY_ENV: api_key,
                                      "RAYSAGA_FORBID_REAL_API": "1", **(extra_env or {})})
    return subprocess.Popen(cmd, cwd=REPO, env=env, text=True, stdout=subprocess.PIPE, stderr=subprocess.PIPE)


if __name__ == "__main__":
    sys.exit(main())
