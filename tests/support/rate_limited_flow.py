"""A fan-out of agents under one fleet-wide rate limit, driven in its own process.

Not a test module: ``tests/agents/test_rate_limits.py`` starts several of these driver processes
on one store against one ``tests.support.messages_server``::

    RATE_FLOW_MODEL_URL=http://127.0.0.1:PORT ANTHROPIC_API_KEY=... \\
    python -m tests.support.rate_limited_flow --db URL --run-id ID --items N --requests R --per S

The flow ``rate_limited``: ``plan`` (N items) → ``ask`` (an agent per item on the real ``anthropic``
SDK, whose model calls go through ``RateLimit(name=LIMIT, requests=R, per=S)``) → ``collect``.
Each agent makes one model call (the server answers with text). Prints ``RESULT {json}``; exit
code 0 when the run completed.
"""

from __future__ import annotations

import argparse
import importlib
import os
import subprocess
import sys
from typing import Any

from raysaga import RateLimit, RetryPolicy, Workflow
from raysaga.agents import Agent, AnthropicModel
from tests.support import REPO
from tests.support import crash_driver as harness

MODULE = "tests.support.rate_limited_flow"
MODEL_URL_ENV = "RATE_FLOW_MODEL_URL"
LIMIT_ENV = "RATE_FLOW_LIMIT"  # requests,per
KEY_ENV = "ANTHROPIC_API_KEY"
TEST_KEY = "sk-ant-test-raysaga-rate-limits"
LIMIT = "messages-api"
#: A 429 is retried soon; its retry-after (when the server gives one) decides the wait.
TRANSPORT = RetryPolicy(max_attempts=8, base=0.05, cap=0.2)


def make_flow(model_url: str, requests: int, per: float) -> Workflow:
    wf = Workflow("rate_limited", version="1", description="agents fanned out under one rate limit")
    model = AnthropicModel("claude-haiku-4-5", base_url=model_url, timeout=10.0, api_key_env=KEY_ENV)
    agent = Agent("asker", model, transport_retry=TRANSPORT, max_turns=2,
                  rate_limit=RateLimit(name=LIMIT, requests=requests, per=per))

    @wf.step()
    def plan(input: int) -> list[int]:
        return list(range(input))

    @wf.agent(agent, map_over="plan")
    def ask(plan: int) -> str:
        return f"question {plan}"

    @wf.step()
    def collect(ask: list[str]) -> int:
        return len(ask)

    return wf


def flow_from_env() -> Workflow:
    requests, per = os.environ[LIMIT_ENV].split(",")
    return make_flow(os.environ[MODEL_URL_ENV], int(requests), float(per))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="drive one run of the rate_limited flow")
    parser.add_argument("--db", required=True)
    parser.add_argument("--run-id", required=True)
    parser.add_argument("--items", type=int, required=True)
    parser.add_argument("--executor", choices=["inline", "ray"], default="inline")
    args = parser.parse_args(argv)

    import raysaga

    flow = importlib.import_module(MODULE).flow_from_env()  # by module name: Ray pickles by reference
    store = raysaga.open_store(args.db)

    def drive() -> Any:
        return raysaga.run(flow, args.items, store=store, run_id=args.run_id, executor=args.executor)

    return harness.report(drive, ok=lambda record: bool(record.status == raysaga.RunStatus.COMPLETED),
                          extra=lambda record: {"output": record.output})


def spawn(db: str, run_id: str, *, items: int, model_url: str, requests: int, per: float,
          executor: str = "inline") -> subprocess.Popen[str]:
    cmd = [sys.executable, "-m", MODULE, "--db", db, "--run-id", run_id, "--items", str(items),
           "--executor", executor]
    env = harness.driver_env(None, {MODEL_URL_ENV: model_url, LIMIT_ENV: f"{requests},{per}", KEY_ENV: TEST_KEY,
                                    "RAYSAGA_FORBID_REAL_API": "1"})
    return subprocess.Popen(cmd, cwd=REPO, env=env, text=True, stdout=subprocess.PIPE, stderr=subprocess.PIPE)


if __name__ == "__main__":
    sys.exit(main())
