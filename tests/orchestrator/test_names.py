"""Node names are validated at definition time, and every valid name exports valid Mermaid/DOT.

The engine reserves ``:`` (compensations: ``pay:compensate``, ``tool:NAME``), ``@`` and ``.``
(an agent's turns and tool calls: ``ask@3.1``), ``[``/``]`` (fan-out labels: ``fetch[2]``).
A step named ``pay:compensate`` next to an effect ``pay`` used to crash every run and resume
with an AssertionError (and re-issue the pending effect each time).
"""

from __future__ import annotations

import re
from typing import Any

import pytest

from raysaga import Workflow, WorkflowDefinitionError
from raysaga.agents import Agent, ScriptedModel, tool
from raysaga.orchestrator.render import dot, mermaid


def test_a_step_named_like_a_compensation_is_a_definition_error() -> None:
    wf = Workflow("shop")

    @wf.step(effect=True)
    def pay() -> str:
        return "paid"

    with pytest.raises(WorkflowDefinitionError) as caught:
        @wf.step(name="pay:compensate")
        def undo_pay() -> str:
            return "undone"

    message = str(caught.value)
    assert "'pay:compensate'" in message and "':'" in message and "reserved" in message
    assert list(wf.steps) == ["pay"]


BAD_NAMES = ["pay:compensate", "ask@0", "ask@0.1", "fetch[2]", "a.b", 'say "hi"', "two words", "tab\tname",
             "new\nline", "-leading-dash", "9lives", "x" * 101, "semi;colon", "back\\slash", "ünïcode",
             "curly{", "arrow->"]


@pytest.mark.parametrize("bad", BAD_NAMES)
def test_bad_step_names_are_rejected_naming_the_step(bad: str) -> None:
    wf = Workflow("names")
    with pytest.raises(WorkflowDefinitionError) as caught:
        @wf.step(name=bad)
        def step() -> int:
            return 1
    message = str(caught.value)
    assert repr(bad) in message
    assert "letters, digits, '_' and '-'" in message


@pytest.mark.parametrize("bad", ["ask@0", "fetch[1]", "pay:compensate", "a b"])
def test_bad_agent_map_compensation_and_effect_names_are_rejected(bad: str) -> None:
    agent = Agent("helper", ScriptedModel())
    wf = Workflow("kinds")

    @wf.step()
    def plan() -> list[int]:
        return [1, 2]

    with pytest.raises(WorkflowDefinitionError, match=re.escape(repr(bad))):
        @wf.agent(agent, name=bad)
        def ask() -> str:
            return "prompt"

    with pytest.raises(WorkflowDefinitionError, match=re.escape(repr(bad))):
        @wf.map("plan", name=bad)
        def each(plan: int) -> int:
            return plan

    with pytest.raises(WorkflowDefinitionError, match=re.escape(repr(bad))):
        wf.compensation(bad)

    with pytest.raises(WorkflowDefinitionError, match=re.escape(repr(bad))):
        @wf.step(effect=True, effect_name=bad)
        def charge() -> int:
            return 1

    with pytest.raises(WorkflowDefinitionError, match=re.escape(repr(bad))):
        Agent(bad, ScriptedModel())

    assert list(wf.steps) == ["plan"]


@pytest.mark.parametrize("bad", ["look:up", "ask@1", "a.b", "a b", "x" * 65])
def test_bad_tool_names_are_rejected(bad: str) -> None:
    def lookup(q: str) -> str:
        return q

    with pytest.raises(WorkflowDefinitionError, match=re.escape(repr(bad))):
        tool(name=bad)(lookup)


@pytest.mark.parametrize("bad", ['order "x"', "my flow", "a:b", "", "-x", "x/y", "x" * 101])
def test_bad_workflow_names_are_rejected(bad: str) -> None:
    with pytest.raises(WorkflowDefinitionError, match=re.escape(repr(bad))):
        Workflow(bad)


def test_good_names_still_work() -> None:
    Workflow("order.v2-beta_1")
    wf = Workflow("ok")

    @wf.step(name="Fetch-all_2")
    def fetch() -> int:
        return 1

    @wf.step(name="_private", after=["Fetch-all_2"])
    def private() -> int:
        return 2

    wf.validate()
    assert list(wf.steps) == ["Fetch-all_2", "_private"]


def test_a_bad_name_slipped_in_after_definition_is_caught_by_validate() -> None:
    wf = Workflow("late")

    @wf.step()
    def fine() -> int:
        return 1

    wf.steps["pay:compensate"] = wf.steps.pop("fine")
    wf._invalidate()
    with pytest.raises(WorkflowDefinitionError, match=re.escape("'pay:compensate'")):
        wf.validate()


# ---------------------------------------------------------------------- exports

def _flow(name: str) -> Workflow:
    wf = Workflow("tmp")
    wf.name = name  # the constructor refuses such names; the exports must not depend on that

    @wf.step(name="end")  # a Mermaid keyword
    def first() -> list[int]:
        return [1]

    @wf.map("end", name="each-item")
    def each(end: int) -> int:
        return end

    @wf.step(name="class", effect=True, after=["each-item"])
    def second(end: Any) -> int:
        return 1

    @wf.step(name="n0", after=["class"])
    def third() -> int:
        return 1

    return wf


DOT_ID = r'"(?:[^"\\]|\\.)*"'
DOT_ATTR = rf'[A-Za-z]+=(?:{DOT_ID}|[A-Za-z0-9]+)'
DOT_LINE = re.compile(
    rf"\s+(?:rankdir=TB;|{DOT_ID} \[{DOT_ATTR}(?:, {DOT_ATTR})*\];|{DOT_ID} -> {DOT_ID};)")


def _parse_dot(text: str) -> tuple[str, set[str], set[tuple[str, str]]]:
    """A strict parser of the DOT subset ``dot()`` writes: returns the graph name, node ids, edges."""
    lines = text.rstrip("\n").split("\n")
    head = re.fullmatch(rf"digraph ({DOT_ID}) \{{", lines[0])
    assert head, lines[0]
    assert lines[-1] == "}"
    nodes: set[str] = set()
    edges: set[tuple[str, str]] = set()

    def unquote(s: str) -> str:
        return re.sub(r"\\(.)", r"\1", s[1:-1])

    for line in lines[1:-1]:
        assert DOT_LINE.fullmatch(line), f"not valid DOT: {line!r}"
        edge = re.fullmatch(rf"\s+({DOT_ID}) -> ({DOT_ID});", line)
        if edge:
            edges.add((unquote(edge.group(1)), unquote(edge.group(2))))
        node = re.fullmatch(rf"\s+({DOT_ID}) \[", line.split(" [")[0] + " [")
        if node and not edge:
            nodes.add(unquote(node.group(1)))
    return unquote(head.group(1)), nodes, edges


@pytest.mark.parametrize("name", ['order "rush" \\ 2', "my flow", "a\nb", "x" * 5])
def test_dot_export_parses_for_any_workflow_name(name: str) -> None:
    wf = _flow(name)
    graph_name, nodes, edges = _parse_dot(dot(wf))
    assert graph_name == name.replace("\n", "n")  # a line break is written as \n
    assert nodes == set(wf.steps)
    assert edges == set(wf.graph.edges)


MERMAID_NODE = re.compile(r'    ([A-Za-z_][A-Za-z0-9_]*)(\[\[|\[)"([^"\n]*)"(\]\]|\])')
MERMAID_EDGE = re.compile(r"    ([A-Za-z_][A-Za-z0-9_]*) --> ([A-Za-z_][A-Za-z0-9_]*)")
MERMAID_CLASS = re.compile(r"    class ([A-Za-z_][A-Za-z0-9_]*) ([A-Za-z0-9_-]+)")
MERMAID_KEYWORDS = {"end", "graph", "subgraph", "class", "classdef", "click", "style", "linkstyle", "flowchart"}


def test_mermaid_export_uses_safe_ids_and_escaped_labels() -> None:
    wf = _flow('the "quoted" flow')
    text = mermaid(wf, {"class": "completed", "end": "failed", "nope": "x"})
    lines = text.rstrip("\n").split("\n")
    assert lines[0] == "flowchart TD"
    ids: dict[str, str] = {}
    edges = set()
    for line in lines[1:]:
        node, edge, klass = MERMAID_NODE.fullmatch(line), MERMAID_EDGE.fullmatch(line), MERMAID_CLASS.fullmatch(line)
        assert node or edge or klass, f"not valid Mermaid: {line!r}"
        if node:
            assert node.group(1).lower() not in MERMAID_KEYWORDS
            ids[node.group(3).split(" (")[0]] = node.group(1)
        if edge:
            edges.add((edge.group(1), edge.group(2)))
    assert set(ids) == set(wf.steps)
    assert len(set(ids.values())) == len(ids)  # n0 the step keeps its id; the generated one differs
    assert edges == {(ids[a], ids[b]) for a, b in wf.graph.edges}
    assert f"    class {ids['class']} completed" in lines and f"    class {ids['end']} failed" in lines


def test_mermaid_escapes_quotes_and_entities_in_labels(monkeypatch: pytest.MonkeyPatch) -> None:
    from raysaga.orchestrator import render

    wf = Workflow("q")

    @wf.step()
    def plain() -> int:
        return 1

    monkeypatch.setattr(render, "_node_text", lambda _wf, _step: 'a "b" #c <d>')
    assert mermaid(wf) == 'flowchart TD\n    plain["a #quot;b#quot; #35;c #lt;d#gt;"]\n'


def test_a_name_with_a_non_ascii_letter_is_refused_saying_ascii_letters() -> None:
    """Stop 46: ``café`` was refused with "use 1-100 characters: letters, ...", which é is."""
    wf = Workflow("names")
    with pytest.raises(WorkflowDefinitionError, match=r"'café' is not valid: use 1-100 characters: ASCII letters"):
        @wf.step(name="café")
        def step() -> int:
            return 1
    with pytest.raises(WorkflowDefinitionError, match=r"'naïve' is not valid: .* characters: ASCII letters"):
        Workflow("naïve")
