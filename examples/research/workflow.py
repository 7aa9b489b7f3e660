"""The research example: plan → five researchers in parallel (one fails) → a quorum → writer → editor.

A planner splits a question into five sub-questions; ``researcher`` fans out over them (Ray
tasks in parallel with ``--executor ray``). One sub-question's sources are unreachable, so
that researcher fails for good; the fan-out's policy, ``raysaga.quorum(4)``, weighs the
outcome once every item settled, records a ``fanout_decision`` event (verdict ``continue``)
and hands the writer a ``raysaga.FanOutResult``: four reports and one annotated failure,
which the writer merges into an article that names its gap.

Each researcher files its report with the (fake) publishing service, an effect with an
idempotency key, and declares an undo, ``withdraw_report``. With ``--reject`` the editor
turns the article down (a critical failure) and the run rolls back: the four filed reports
are withdrawn, in reverse, and the run ends ``compensated``. The failed researcher filed
nothing, so nothing of it is withdrawn.

No language model here: the agents are plain functions (real sub-agents come with
``raysaga.agents``).

    python -m examples.research.workflow [--executor ray] [--reject] [--db URL] [--run-id ID]
"""

from __future__ import annotations

import argparse
import hashlib
import json
import sys
import uuid
from typing import Any

from pydantic import BaseModel

import raysaga
from examples.order.fake_services import FakeServices, get_log, post
from raysaga import Permanent, RetryPolicy, StepContext, Workflow

COMPENSATE_SUFFIX = ":compensate"
ANGLES = ("history", "economics", "technology", "archives", "policy")
QUORUM = 4
PROVIDER_RETRY = RetryPolicy(max_attempts=4, base=0.1, cap=1.0)


class ResearchIn(BaseModel):
    """The run input."""

    question: str
    services_url: str
    unreachable: list[str] = ["archives"]
    """Angles whose sources cannot be reached: their researcher fails (deterministically)."""
    reject_draft: bool = False
    """The editor rejects the article: the run rolls back (the reports are withdrawn)."""


class SubQuestion(BaseModel):
    index: int
    angle: str
    text: str


class Report(BaseModel):
    index: int
    angle: str
    finding: str
    report_id: str


class Article(BaseModel):
    question: str
    sections: list[str]
    report_ids: list[str]
    gaps: list[str]
    coverage: float


class Verdict(BaseModel):
    approved: bool
    article: Article


wf = Workflow("research", version="1", description="plan, research in parallel with a quorum, write, edit")
#: Where `raysaga resume`, `fork` and the dashboard import this workflow (run as a script, it records none by itself).
REF = "examples.research.workflow:wf"


def _key(ctx: StepContext) -> str:
    assert ctx.idempotency_key is not None, f"step {ctx.label!r} is not an effect"
    return ctx.idempotency_key


def _subject(input: ResearchIn, angle: str) -> str:
    return f"{hashlib.sha256(input.question.encode()).hexdigest()[:8]}/{angle}"


@wf.step()
def plan(input: ResearchIn) -> list[SubQuestion]:
    """Split the question into one sub-question per angle."""
    return [SubQuestion(index=i, angle=angle, text=f"{input.question} — what does the {angle} say?")
            for i, angle in enumerate(ANGLES)]


def withdraw_report(ctx: StepContext, input: ResearchIn, plan: SubQuestion, output: Report | None) -> dict[str, Any]:
    """Undo a filed report. ``output`` is None when the filing's outcome is unknown (it was in
    flight at the failure): withdraw by the filing's key, and "nothing to withdraw" is fine."""
    original = _key(ctx).removesuffix(COMPENSATE_SUFFIX)
    reply = post(input.services_url, "withdraw_report", _key(ctx), {
        "subject": _subject(input, plan.angle), "report_id": output.report_id if output else None,
        "request_key": original})
    return {"withdrawn": output.report_id if output else original, "reference": reply["id"]}


@wf.map("plan", effect=True, policy=raysaga.quorum(QUORUM), retry=PROVIDER_RETRY, compensate=withdraw_report)
def researcher(ctx: StepContext, input: ResearchIn, plan: SubQuestion) -> Report:
    """One sub-agent: find an answer to its sub-question and file it as a report."""
    if plan.angle in input.unreachable:
        raise Permanent(f"no reachable sources for the {plan.angle} angle")
    digest = hashlib.sha256(plan.text.encode()).hexdigest()
    finding = f"{plan.angle}: evidence #{int(digest[:6], 16) % 1000} supports the claim"
    reply = post(input.services_url, "report", _key(ctx), {"subject": _subject(input, plan.angle),
                                                           "finding": finding})
    return Report(index=plan.index, angle=plan.angle, finding=finding, report_id=reply["id"])


@wf.step()
def writer(input: ResearchIn, researcher: raysaga.FanOutResult) -> Article:
    """Merge what the researchers found; name what is missing."""
    reports = [Report.model_validate(output) for output in researcher.outputs]
    return Article(
        question=input.question,
        sections=[f"{r.angle.title()}. {r.finding}" for r in reports],
        report_ids=[r.report_id for r in reports],
        gaps=[f"{ANGLES[f.index]}: {f.message}" for f in researcher.failures],
        coverage=researcher.success_ratio,
    )


@wf.step()
def editor(input: ResearchIn, writer: Article) -> Verdict:
    if input.reject_draft:
        raise Permanent("the editor rejected the draft")
    return Verdict(approved=True, article=writer)


def sample_input(services_url: str, *, reject: bool = False) -> dict[str, Any]:
    return ResearchIn(question="Did the printing press cause the Reformation?", services_url=services_url,
                      reject_draft=reject).model_dump()


def main(argv: list[str] | None = None) -> int:
    """Start the provider, run one research question, print the decision, the article and the call log.

    Exit code 0 when the run ended as intended (``completed``; ``compensated`` with ``--reject``).
    """
    parser = argparse.ArgumentParser(prog="python -m examples.research.workflow",
                                     description="a research fan-out with a quorum, against a fake provider")
    parser.add_argument("--db", default=None, help="store URL (default: RAYSAGA_DB or ~/.raysaga/raysaga.db)")
    parser.add_argument("--executor", choices=["inline", "ray"], default="inline")
    parser.add_argument("--run-id", default=None)
    parser.add_argument("--reject", action="store_true", help="the editor rejects the article: roll back")
    args = parser.parse_args(argv)
    run_id = args.run_id or f"research-demo-{uuid.uuid4().hex[:8]}"
    store = raysaga.open_store(args.db)
    with FakeServices() as services:
        try:
            record = raysaga.run(wf, sample_input(services.url, reject=args.reject), store=store, run_id=run_id,
                                 workflow_ref=REF, executor=args.executor)
        except raysaga.LeaseHeldError as exc:
            print(f"{exc}\n(a killed driver's lease expires after its last heartbeat: try again then)",
                  file=sys.stderr)
            return 3
        log = get_log(services.url)
    print(f"run {record.run_id}: {record.status.value}" + (f" — {record.status_reason}"
                                                           if record.status_reason else ""))
    for event in store.events(run_id):
        if event.kind == "fanout_decision":
            print(f"fan-out decision: {event.data['verdict']} ({event.data['reason']}); "
                  f"failed items: {event.data['failures']}")
    if record.output is not None:
        print(json.dumps(record.output["editor"]["article"], indent=2))
    print("provider calls, in order:")
    for i, call in enumerate(log["calls"], 1):
        print(f"  {i}. {call['kind']:<16} {call['key']}" + ("  (duplicate)" if call.get("duplicate") else ""))
    store.close()
    wanted = raysaga.RunStatus.COMPENSATED if args.reject else raysaga.RunStatus.COMPLETED
    return 0 if record.status == wanted else 1


if __name__ == "__main__":
    # Run the importable copy (not __main__), so Ray pickles the steps by reference to
    # ``examples.research.workflow`` and its workers import the same module.
    from examples.research import workflow as _importable

    sys.exit(_importable.main())
