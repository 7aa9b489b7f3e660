"""The scripted conversation the example uses offline (``raysaga.testing.ScriptedModel``).

A ``ScriptedModel`` answers each conversation, keyed by its first user message (the prompt the
workflow built), with the responses listed for it, turn by turn: a replayed turn gets the same
answer, so a resumed run sees what the crashed one saw. The script is computed from the same
prompt builders and the same corpus the workflow uses, so it fits any question: the planner
splits it into four sub-questions, each researcher searches, files one report and answers with
it, and the writer merges the four.
"""

from __future__ import annotations

import json

from examples.agents_research.workflow import (
    DEFAULT_QUESTION,
    planner_prompt,
    researcher_prompt,
    search_corpus,
    writer_prompt,
)
from raysaga.agents import ModelResponse
from raysaga.testing import ScriptedModel, text_reply, tool_reply

_DEFAULT_PLAN = [
    "How well do air-source heat pumps heat a home in very cold weather?",
    "How do the running costs of a heat pump compare with a gas boiler?",
    "How much does a heat pump cut household carbon emissions?",
    "What does installing a heat pump in an older home involve, and what does it cost upfront?",
]
_ANGLES = ("performance", "running costs", "carbon emissions", "installation and upfront cost")


def sub_questions(question: str) -> list[str]:
    """The planner's (scripted) plan: hand-written for the default question, a template otherwise."""
    if question == DEFAULT_QUESTION:
        return list(_DEFAULT_PLAN)
    return [f"What does the evidence say about the {angle} side of this: {question}" for angle in _ANGLES]


def findings(sub_question: str) -> str:
    """A researcher's report: the two best documents for its sub-question, cited by id."""
    docs = search_corpus(sub_question, 2)
    if not docs:
        return "The corpus has nothing on this sub-question."
    return " ".join(f"{d['text']} [{d['id']}]" for d in docs)


def final_answer(question: str, subs: list[str], reports: list[str]) -> str:
    lines = [f"{question}", "",
             "Short answer: it depends on the house and on energy prices; the four reports below say what "
             "decides it.", ""]
    for i, (sub, report) in enumerate(zip(subs, reports, strict=True), 1):
        lines += [f"{i}. {sub}", f"   {report}"]
    return "\n".join(lines)


def conversations(question: str = DEFAULT_QUESTION) -> dict[str, list[ModelResponse]]:
    """Each agent's prompt → its turns (token counts are made up, but fixed: the usage is deterministic)."""
    subs = sub_questions(question)
    script: dict[str, list[ModelResponse]] = {
        planner_prompt(question): [text_reply(json.dumps({"sub_questions": subs}), input_tokens=220,
                                              output_tokens=95)],
    }
    reports = []
    for sub in subs:
        report = findings(sub)
        reports.append(report)
        script[researcher_prompt(question, sub)] = [
            tool_reply(("search", {"query": sub}), text="Let me search the corpus.", input_tokens=310,
                       output_tokens=40),
            tool_reply(("file_report", {"question": sub, "findings": report}), input_tokens=520,
                       output_tokens=160),
            text_reply(report, input_tokens=700, output_tokens=150),
        ]
    script[writer_prompt(question, subs, reports)] = [
        text_reply(final_answer(question, subs, reports), input_tokens=900, output_tokens=420)]
    return script


def scripted_model(question: str = DEFAULT_QUESTION) -> ScriptedModel:
    return ScriptedModel(conversations(question))
