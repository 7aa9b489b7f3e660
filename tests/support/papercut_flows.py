"""What the CLI papercut tests (stop 48) share: two tiny workflows a project folder holds (a step
and an agent on a scripted model, both run inline), a run made old enough for ``raysaga prune``,
and a user name this machine does not have."""

from __future__ import annotations

import pwd
import time

from sqlalchemy import update

from raysaga.state import open_store
from raysaga.state.schema import runs

#: One step: ``raysaga run papercut_keep:wf --input N``.
KEEP_FLOW = '''
from raysaga import Workflow

wf = Workflow("papercut_keep", version="1")


@wf.step()
def one(input: int) -> int:
    return input
'''

#: A step, an agent of three turns (two tool calls, then one), a step: 3 turns and 3 tool calls.
AGENT_FLOW = '''
from raysaga import Workflow
from raysaga.agents import Agent, ScriptedModel, text_reply, tool, tool_reply


@tool
def lookup(q: str) -> str:
    """Look something up."""
    return "found " + q


def _model() -> ScriptedModel:
    return ScriptedModel(script={"task": [tool_reply(("lookup", {"q": "a"}), ("lookup", {"q": "c"})),
                                          tool_reply(("lookup", {"q": "b"})), text_reply("done")]})


wf = Workflow("papercut_agent", version="1")


@wf.step()
def first(input: str) -> str:
    return input


@wf.agent(Agent("worker", _model(), tools=(lookup,), max_turns=5), after=["first"])
def work(first: str) -> str:
    return "task"


@wf.step(after=["work"])
def last(work: str) -> str:
    return "x"
'''


def age_run(url: str, run_id: str, days: float) -> None:
    """Make ``run_id`` look last updated ``days`` ago (so ``raysaga prune --older-than`` takes it);
    its creation time is kept, so it keeps its place in ``raysaga list``."""
    store = open_store(url)
    try:
        with store.engine.begin() as conn:
            conn.execute(update(runs).where(runs.c.run_id == run_id).values(updated_at=time.time() - days * 86400))
    finally:
        store.close()


def no_such_user() -> str:
    """A user name this machine has no account for (``~NAME`` cannot be expanded)."""
    name = "raysaga-nosuchuser-48"
    try:
        pwd.getpwnam(name)
    except KeyError:
        return name
    raise AssertionError(f"this machine has a user {name!r}: the test needs a name it lacks")
