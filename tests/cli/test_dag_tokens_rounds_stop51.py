"""``status --dag``'s tokens of a mapped agent whose items a policy retried (stop 51, a review).

A retry round asks a failed item's turns again, over its turn rows: the step's total, summed over
the rows, is its last round's, while the run's ``tokens_used`` counts every call made (``4500``
against ``3000`` here). The line said "2 turns, 3000 tokens" as if that were all; it now says it
is the last round's. (A durable per-step total of every round is follow-up work.)

A real inline run with a scripted model (the edge this is not about) on a real SQLite file.
"""

from __future__ import annotations

import sys
import textwrap
from collections.abc import Iterator
from pathlib import Path

import pytest

import raysaga
from tests.support.cli import invoke

FLOW = textwrap.dedent('''
    from dataclasses import dataclass

    from raysaga import Continue, FanOutResult, Permanent, RetryFailed, Workflow, on_partial_failure
    from raysaga.agents import Agent, tool
    from raysaga.agents.models import ScriptedModel, text_reply, tool_reply

    CALLS = {"n": 0}


    @dataclass(frozen=True)
    class FailsOnce(ScriptedModel):
        def complete(self, request):
            CALLS["n"] += 1
            if CALLS["n"] == 2:  # the item's second call: the item fails, its round is retried
                raise Permanent("model down")
            return super().complete(request)


    @tool
    def lookup(q: str) -> str:
        """Look up."""
        return "found " + q


    model = FailsOnce(default=(tool_reply(("lookup", {"q": "a"}), input_tokens=1000, output_tokens=500),
                               text_reply("done", input_tokens=1000, output_tokens=500)))
    wf = Workflow("dag_tokens51")


    @wf.step()
    def plan(input: int) -> list[str]:
        return [f"q{i}" for i in range(input)]


    @wf.agent(Agent("res", model, tools=(lookup,)), map_over="plan",
              policy=on_partial_failure(lambda r: RetryFailed() if r.round < 2 else Continue()))
    def research(plan: str) -> str:
        return f"question {plan}"


    @wf.step()
    def gather(research: FanOutResult) -> int:
        return len(research.successes)
''')


@pytest.fixture
def flow_dir(tmp_path: Path) -> Iterator[Path]:
    (tmp_path / "dag_tokens51_flow.py").write_text(FLOW)
    sys.path.insert(0, str(tmp_path))
    yield tmp_path
    sys.path.remove(str(tmp_path))
    sys.modules.pop("dag_tokens51_flow", None)


def test_the_dag_says_a_retried_agents_tokens_are_its_last_rounds(flow_dir: Path) -> None:
    from dag_tokens51_flow import wf  # type: ignore[import-not-found]

    url = f"sqlite:///{flow_dir / 'raysaga.db'}"
    run = raysaga.run(wf, 1, store=url, run_id="t", executor="inline")
    assert run.output == {"gather": 1} and run.tokens_used == 4500  # three calls answered, 1500 each
    code, out, err = invoke("status", "t", "--dag", "--workflow", "dag_tokens51_flow:wf", "--db", url)
    assert code == 0, err
    assert "research  completed, 1 items ✓1, 2 turns, 3000 tokens (last round's)" in out, out
