"""The agents research example: a planner, four researcher sub-agents in parallel, a writer.

    planner (agent) → plan (step: the sub-questions as a list) → research x4 (agents, a fan-out) → write (agent)

The planner splits a question into four sub-questions (its answer is validated against ``Plan``).
One researcher agent per sub-question, in parallel, searches a small local corpus with the
``search`` tool (no side effect: it may run again after a crash) and files one report with
``file_report``, an **effect** tool: raysaga derives its idempotency key from the run, the
researcher's fan-out index and the report's ``question`` argument (``key=("question",)``), never
from the model's wording, and the fake provider dedupes by that key. The writer merges the four
reports into the final answer.

Every model response is durable before the tools it asks for run, and every tool result before
the model sees it: kill the driver anywhere and ``--run-id`` the same run again, and no answered
turn is asked again and no report is filed twice.

Offline by default: without ``ANTHROPIC_API_KEY`` the agents talk to a scripted model
(``raysaga.testing.ScriptedModel``, see ``script.py``) and the run is deterministic; with the key
they talk to Claude (``--model``, default ``claude-sonnet-4-5``)::

    python -m examples.agents_research.workflow [--executor inline|ray] [--address RAY] [--db URL]
                                                [--run-id ID] [--question TEXT] [--model NAME]
"""

from __future__ import annotations

import argparse
import contextlib
import os
import re
import sys
import uuid
from collections.abc import Mapping

from pydantic import BaseModel, Field

import raysaga
from examples.order import fake_services
from raysaga import RetryPolicy, Workflow
from raysaga.agents import Agent, AnthropicModel, Model, ToolError, tool
from raysaga.state import NodeStatus

DEFAULT_QUESTION = "Should a household in a cold climate replace its gas boiler with a heat pump?"
DEFAULT_MODEL = "claude-sonnet-4-5"
NO_KEY_NOTICE = "no ANTHROPIC_API_KEY: using a scripted model, offline"
SUB_QUESTIONS = 4

#: The provider fails transiently now and then (timeouts, 5xx): retried under the same key, so safe.
PROVIDER_RETRY = RetryPolicy(max_attempts=4, base=0.2, cap=2.0)


class Question(BaseModel):
    """The run input."""

    question: str = Field(min_length=3)


class Plan(BaseModel):
    """The planner's answer: it must be JSON of this shape (a mismatch is fed back to the model)."""

    sub_questions: list[str] = Field(min_length=SUB_QUESTIONS, max_length=SUB_QUESTIONS)


# ---------------------------------------------------------------------- the corpus and its tool

#: A small made-up corpus, so the demo needs no network (the figures are illustrative).
CORPUS: tuple[dict[str, str], ...] = (
    {"id": "doc-01", "title": "Cold-climate field trial",
     "text": "A three-winter field trial of cold-climate air-source heat pumps measured a seasonal "
             "efficiency (COP) of 2.6 to 3.2, still above 1.8 at minus 20 degrees."},
    {"id": "doc-02", "title": "Heat pump output in very cold weather",
     "text": "Heat pump capacity falls as outdoor temperature drops; sizing for the coldest week and "
             "keeping a small backup heater avoids cold rooms during a deep freeze."},
    {"id": "doc-03", "title": "Running costs: heat pump versus gas boiler",
     "text": "Running costs depend on the electricity to gas price ratio: below about 3 a heat pump "
             "with a COP of 3 is cheaper to run than a 90 percent efficient gas boiler."},
    {"id": "doc-04", "title": "Tariffs and running costs",
     "text": "Time-of-use electricity tariffs cut heat pump running costs by 10 to 20 percent when the "
             "house is pre-heated off-peak."},
    {"id": "doc-05", "title": "Household carbon emissions from heating",
     "text": "Replacing a gas boiler with a heat pump cuts heating carbon emissions by 50 to 70 percent "
             "on a typical grid, and by more as the grid decarbonizes."},
    {"id": "doc-06", "title": "Refrigerants and lifecycle emissions",
     "text": "Lifecycle carbon emissions of a heat pump are dominated by electricity use; refrigerant leaks "
             "add a few percent, less with low-GWP refrigerants such as R290."},
    {"id": "doc-07", "title": "Installation in an older home",
     "text": "Installation in an older home often needs larger radiators or better insulation so the "
             "heat pump can run at a low flow temperature; a heat-loss survey comes first."},
    {"id": "doc-08", "title": "Installation time and disruption",
     "text": "A typical installation takes two to five days; the outdoor unit needs a clear spot and "
             "the hot water cylinder may need replacing."},
    {"id": "doc-09", "title": "Upfront cost and grants",
     "text": "The upfront cost of a heat pump is two to four times that of a new gas boiler before grants; "
             "many regions offer grants that close most of the gap."},
)

_STOP = frozenset(("a", "an", "and", "are", "as", "at", "be", "by", "can", "do", "does", "for", "from", "how", "in",
                   "is", "it", "its", "of", "on", "or", "than", "that", "the", "this", "to", "what", "when", "which",
                   "with"))


def _words(text: str) -> set[str]:
    return {w for w in re.findall(r"[a-z0-9]+", text.lower()) if w not in _STOP}


def search_corpus(query: str, limit: int = 3) -> list[dict[str, str]]:
    """The best matching documents, by words in common with the query (ties: by id). Deterministic."""
    wanted = _words(query)
    scored = sorted(((-len(wanted & _words(f"{d['title']} {d['text']}")), d["id"], d) for d in CORPUS),
                    key=lambda s: (s[0], s[1]))
    return [dict(d) for score, _, d in scored[:limit] if score < 0]


@tool
def search(query: str, limit: int = 3) -> list[dict[str, str]]:
    """Search the research corpus. Returns up to `limit` documents (id, title, text), best first."""
    if not query.strip():
        raise ToolError("the query is empty: search for some words")  # the model sees this
    return search_corpus(query, max(1, min(limit, 5)))


# ---------------------------------------------------------------------- prompts (pure: they run in the driver)

PLANNER_SYSTEM = (f"You plan research. Split the user's question into exactly {SUB_QUESTIONS} self-contained "
                  'sub-questions that together answer it. Reply with only JSON: {"sub_questions": [...]}.')
RESEARCHER_SYSTEM = ("You research one sub-question. Use the search tool to find evidence in the corpus, then "
                     "file exactly one report with file_report (question: your sub-question; findings: two or "
                     "three sentences that cite document ids in brackets), then reply with the same findings.")
WRITER_SYSTEM = ("You write the final answer from the researchers' reports: a short direct answer first, then "
                 "one line per sub-question. Keep the document ids in brackets; add nothing the reports lack.")


def planner_prompt(question: str) -> str:
    return f"Question: {question}"


def researcher_prompt(question: str, sub_question: str) -> str:
    return f"Overall question: {question}\nYour sub-question: {sub_question}"


def writer_prompt(question: str, sub_questions: list[str], reports: list[str]) -> str:
    parts = [f"Question: {question}", ""]
    for i, (sub, report) in enumerate(zip(sub_questions, reports, strict=True), 1):
        parts += [f"Report {i} — {sub}", report, ""]
    return "\n".join(parts).rstrip()


# ---------------------------------------------------------------------- the workflow


def build(model: Model, services_url: str) -> Workflow:
    """The workflow, its agents talking to ``model`` and filing reports at ``services_url``.

    A factory because the model and the provider are chosen at run time; the definition (and
    so its hash, which a resume checks) is the same whatever they are.
    """

    @tool(effect=True, key=("question",), retry=PROVIDER_RETRY)
    def file_report(question: str, findings: str, idempotency_key: str) -> dict[str, str]:
        """File your report with the research desk. File once: the report is identified by its question."""
        # idempotency_key is filled in by raysaga (the model never sees it): the provider dedupes by it
        reply = fake_services.post(services_url, "report", idempotency_key,
                                   {"subject": question, "findings": findings})
        return {"report_id": reply["id"]}

    planner = Agent("planner", model, system=PLANNER_SYSTEM, output_type=Plan, max_turns=4)
    researcher = Agent("researcher", model, system=RESEARCHER_SYSTEM, tools=(search, file_report), max_turns=8)
    writer = Agent("writer", model, system=WRITER_SYSTEM, max_turns=3, max_tokens=2048)

    wf = Workflow("agents_research", version="1",
                  description="a planner agent, four researcher agents in parallel, a writer agent")

    @wf.agent(planner, name="planner")
    def plan_question(input: Question) -> str:
        return planner_prompt(input.question)

    @wf.step()
    def plan(planner: Plan) -> list[str]:
        """The planner's answer as a list, for the fan-out to map over."""
        return list(planner.sub_questions)

    @wf.agent(researcher, map_over="plan")
    def research(input: Question, plan: str) -> str:
        return researcher_prompt(input.question, plan)

    @wf.agent(writer)
    def write(input: Question, plan: list[str], research: list[str]) -> str:
        return writer_prompt(input.question, plan, research)

    return wf


def choose_model(model_name: str, question: str) -> Model:
    """Claude if ``ANTHROPIC_API_KEY`` is set (read on the worker, never stored), else the script."""
    if os.environ.get("ANTHROPIC_API_KEY"):
        print(f"using {model_name} through the Anthropic API", file=sys.stderr)
        return AnthropicModel(model_name, max_tokens=1024)
    print(NO_KEY_NOTICE, file=sys.stderr)
    from examples.agents_research.script import scripted_model  # it imports this module

    return scripted_model(question)


def main(argv: list[str] | None = None) -> int:
    """Start the fake provider, run one question, print the answer, the token usage and the provider log."""
    parser = argparse.ArgumentParser(prog="python -m examples.agents_research.workflow",
                                     description="planner → 4 researcher agents in parallel → writer")
    parser.add_argument("--question", default=DEFAULT_QUESTION,
                        help="offline, the scripted model answers the default question best")
    parser.add_argument("--model", default=DEFAULT_MODEL, help="Claude model (used when ANTHROPIC_API_KEY is set)")
    parser.add_argument("--executor", choices=["ray", "inline"], default="ray")
    parser.add_argument("--address", default=None, help="a Ray cluster to join (default: RAY_ADDRESS or a local Ray)")
    parser.add_argument("--db", default=None, help="store URL (default: RAYSAGA_DB or ~/.raysaga/raysaga.db)")
    parser.add_argument("--run-id", default=None, help="default: a new id; an existing run's id resumes it")
    parser.add_argument("--services-url", default=None,
                        help="a provider already running (python -m examples.order.fake_services); "
                             "default: start one in this process")
    parser.add_argument("--lease-ttl", type=float, default=raysaga.RunOptions().lease_ttl,
                        help="seconds a killed driver's lease keeps others from resuming its run "
                             "(default: %(default)s)")
    args = parser.parse_args(argv)
    model = choose_model(args.model, args.question)
    run_id = args.run_id or f"agents-research-{uuid.uuid4().hex[:8]}"
    store = raysaga.open_store(args.db)
    with contextlib.ExitStack() as stack:
        stack.callback(store.close)
        url = args.services_url or stack.enter_context(fake_services.FakeServices()).url
        try:
            record = raysaga.run(build(model, url), Question(question=args.question).model_dump(), store=store,
                                 run_id=run_id, executor=args.executor, address=args.address,
                                 options=raysaga.RunOptions(lease_ttl=args.lease_ttl))
        except raysaga.LeaseHeldError as exc:
            print(f"{exc}\n(a killed driver's lease expires after its last heartbeat: try again then)",
                  file=sys.stderr)
            return 3
        log = fake_services.get_log(url)
        nodes = store.nodes(run_id)
        filed = {e.idempotency_key: e.fan_index for e in store.effects(run_id)}
    print(f"run {record.run_id}: {record.status.value}"
          + (f" — {record.status_reason}" if record.status_reason and record.status != raysaga.RunStatus.COMPLETED
             else ""))
    for node in nodes:
        if node.status == NodeStatus.FAILED:
            error: Mapping[str, object] = node.error or {}
            print(f"  failed: {node.label}: {error.get('type')}: {error.get('message')}", file=sys.stderr)
    if record.output is not None:
        print("\nfinal answer:\n")
        print(record.output["write"])
    print(f"\ntokens used: {record.tokens_used} (cost ${record.cost_used:.4f})")
    print("provider log (reports filed, per idempotency key; raw = calls received, effective = taken effect):")
    if not log["raw"]:
        print("  (no calls)")
    for key in sorted(log["raw"], key=lambda k: (filed.get(k, 99), k)):
        who = f"research[{filed[key]}]" if key in filed else "?"
        print(f"  {who:<12} {log['kinds'][key]:<6} {key}  raw={log['raw'][key]} "
              f"effective={log['effective'].get(key, 0)}")
    return 0 if record.status == raysaga.RunStatus.COMPLETED else 1


if __name__ == "__main__":
    # Run the importable copy (not __main__), so Ray pickles module-level functions (``search``) by
    # reference to ``examples.agents_research.workflow`` and its workers import the same module.
    from examples.agents_research import workflow as _importable

    sys.exit(_importable.main())
