"""The hypothesis strategy of the chaos suite's random DAGs (specs for ``tests.support.chaos_flows``).

``dag_specs(min_steps, max_steps)`` draws a JSON spec of ``min_steps``-``max_steps`` steps in a
topological order (``s0``, ``s1``, ...), each depending on up to three earlier ones:

- kinds: plain steps, ``plan`` steps (1-4 elements) and ``map`` steps fanning out over an
  earlier plan, with a partial-failure policy (``all``, ``best_effort``, ``quorum(k)``,
  ``ratio(r)``) and up to two items that fail permanently;
- about half the steps are effects (one call to the fake provider with their key), about a
  third have a compensation (an effect of its own);
- up to two steps fail permanently on purpose (half of them non-critical, their dependents
  skipped or handed the failure), and some are flaky (a transient error on attempt 1);
- with ``agents=True``, ``agent`` nodes (1-3 tool turns of 1-2 calls each, drawn from the plain
  ``lookup`` and the effects ``act`` and ``act_undone``, then the answer); with
  ``approvals=True``, ``approval`` nodes the harness approves (3 in 4) or rejects, some of them
  non-critical;
- ``fanned=True`` (the shapes of the second generator, ``test_random_fanned_dags_...``): about
  half the agents and approvals drawn after a plan fan out over it (an agent per element, with
  a partial-failure policy; an approval per element, up to one of them rejected), and agents
  also call the tools that raise (``chaos_flows.RAISING``: a ``ToolError``, an effect failing
  for good before its call, a tool whose every attempt fails transiently) and ``act_lost``
  (``chaos_flows.LOST``: an effect failing transiently *after* its call took effect, its retry
  re-sending the key). Off, the draws are
  exactly those of the first generator, so its derandomised CI DAGs stay what they were.
- ``ending=True`` (the third generator, ``test_random_ending_dags_...``; with ``fanned=True``):
  about half the agents end on their own once their tool turns are done (``end``, one of
  ``chaos_flows.ENDS``: max turns, a loop, answers that are never valid JSON, an answer refused
  once and then valid, the API refusing a turn (400), the API overloaded at every attempt (529);
  in a fan-out only for the items in ``end_items``, so a partial-failure policy sees failed
  agents); about a third of the agents meet transport faults (``model_faults``: per turn up to
  two of 429, 500, 529, a dropped connection and a stall past the client's timeout before the
  answer); agents also call the
  flaky tools (``lookup_flaky``, ``act_flaky``: a transient failure on the first attempt, then
  success) and ``act_gated`` (an effect with ``requires_approval``, its calls in
  ``reject_calls`` rejected by the harness, some of the others in ``edit_calls``, approved with
  edited arguments); a third of the agents are ``speculative``; approvals ask a quorum of two
  approvers (``quorum``) and take an integer answer (``answer``), a third of them each. Off,
  no draw of this list is made.

``agent_dag_specs(min_steps, max_steps)`` (the Ray agent sweep, ``tests/chaos/test_ray_agent_sweep.py``)
draws DAGs weighted to agents, so that a fault on Ray finds model calls in flight and answered
turns not yet durable: two in three nodes are agents (about half of them fanned out over a
plan), each of 2-3 tool turns drawn from ``AGENT_TOOLS`` (effects twice as likely as a lookup,
``act_lost`` twice as likely as one tool that raises), beside plain and effect steps, plans, and
maps whose items fail only under a partial policy; no approvals (each costs a Ray driver) and no
failure before the end: a third of the DAGs end with a step failing for good that waits for every
other node (the rollback undoes what the agents did, none of them cut off by it).

Plans never fail and are always critical, so a map always fans out over a list. An effect never
takes a partial fan-out's result (a ``FanOutResult``) as an input: its failures carry attempt
counts, which a crash before the fan-out settles may raise (a killed attempt counts), and the
effect's key digests its inputs, so its key would differ from the golden run's without any call
being repeated; nor does a compensated step, whose compensation's key digests its inputs too
(found by a sweep: ``s11`` over a best-effort fan-out whose failed item a crash cost an attempt).
Plain steps take them (their outputs digest them without the counts). For the same reason an
effect, or a compensated step, never takes an approval as an input: its decision time differs
per run, and the key of the effect or of its compensation digests the inputs.
"""

from __future__ import annotations

from typing import Any

from hypothesis import strategies as st

from tests.support.chaos_flows import ENDING, ENDS, LOST, MODEL_FAULTS, RAISING, TOOLS, digest

MAX_DEPS = 3
MAX_ITEMS = 4


MAX_TURNS = 3


@st.composite
def dag_specs(draw: st.DrawFn, min_steps: int = 5, max_steps: int = 50, *, agents: bool = False,
              approvals: bool = False, fanned: bool = False, ending: bool = False) -> dict[str, Any]:
    n = draw(st.integers(min_steps, max_steps), label="steps")
    failing = set(draw(st.lists(st.integers(0, n - 1), max_size=2, unique=True), label="failing"))
    steps: list[dict[str, Any]] = []
    plans: list[str] = []
    partial: set[str] = set()  # maps whose policy hands dependents a FanOutResult
    decided: set[str] = set()  # approvals: no effect takes one as an input
    kinds = ["step", "step", "step", "plan"] + ["agent"] * agents + ["approval"] * approvals
    kinds += ["agent", "agent"] if ending else []  # the third generator is about agents: more of them
    for i in range(n):
        name = f"s{i}"
        earlier = [s["name"] for s in steps]
        kind = draw(st.sampled_from(kinds + (["map", "map"] if plans else [])))
        extra = draw(st.lists(st.sampled_from(earlier), max_size=MAX_DEPS, unique=True)) if earlier else []
        step: dict[str, Any] = {"name": name, "kind": kind, "deps": extra}
        if kind in ("agent", "approval"):
            over = draw(st.sampled_from([None, *plans]), label="over") if fanned and plans else None
            if over is not None:  # a fan-out: one agent, or one approval, per element of the plan
                step["over"] = over
                step["deps"] = [over, *(d for d in extra if d != over)]
            if kind == "agent":
                tools: tuple[str, ...] = TOOLS + RAISING + LOST if fanned else TOOLS
                tools += ENDING if ending else ()
                step["turns"] = draw(st.lists(st.lists(st.sampled_from(tools), min_size=1, max_size=2),
                                              min_size=1, max_size=MAX_TURNS))
                if over is not None:
                    step["policy"] = draw(policies(), label="policy")
                    if step["policy"]["kind"] != "all":
                        partial.add(name)
                if ending:
                    draw_ending(draw, step)
            elif over is not None:
                step["reject_items"] = draw(st.lists(st.integers(0, MAX_ITEMS - 1), max_size=1), label="reject")
                decided.add(name)
            else:
                step["verdict"] = draw(st.sampled_from(["approve", "approve", "approve", "reject"]))
                decided.add(name)
            if kind == "approval" and ending:
                draw_approval(draw, step)
            if draw(st.sampled_from([True, True, True, False])) is False:
                step["critical"] = False
                step["on_failure"] = draw(st.sampled_from(["skip", "pass"]))
            steps.append(step)
            continue
        if kind == "plan":
            step["items"] = draw(st.integers(1, MAX_ITEMS))
            plans.append(name)
            steps.append(step)
            continue
        if kind == "map":
            step["over"] = draw(st.sampled_from(plans))
            step["deps"] = [step["over"], *(d for d in extra if d != step["over"])]
            step["fail_items"] = draw(st.lists(st.integers(0, MAX_ITEMS - 1), max_size=2, unique=True))
            step["policy"] = draw(policies())
            if step["policy"]["kind"] != "all":
                partial.add(name)
        step["effect"] = draw(st.booleans())
        if step["effect"]:  # see the module's docstring: no partial fan-out result in an effect's key
            step["deps"] = [d for d in step["deps"] if (d not in partial or d == step.get("over")) and d not in decided]
        step["compensate"] = draw(st.sampled_from([False, False, True]))
        if step["compensate"]:  # a compensation's key digests its step's inputs (effect or not)
            step["deps"] = [d for d in step["deps"] if (d not in partial or d == step.get("over")) and d not in decided]
        step["fate"] = "fail" if i in failing and kind == "step" else draw(st.sampled_from(["ok"] * 7 + ["flaky"]))
        if draw(st.sampled_from([True, True, True, False])) is False or (i in failing and draw(st.booleans())):
            step["critical"] = False
            step["on_failure"] = draw(st.sampled_from(["skip", "pass"]))
        steps.append(step)
    return {"name": f"chaos_{digest(steps)[:10]}", "steps": steps}


def draw_ending(draw: st.DrawFn, step: dict[str, Any]) -> None:
    """The third generator's draws for an agent ``step`` (see the module's docstring)."""
    end = draw(st.sampled_from([None, None, *ENDS]), label="end")
    if end is not None:
        step["end"] = end
        if "over" in step:
            step["end_items"] = draw(st.lists(st.integers(0, MAX_ITEMS - 1), min_size=1, max_size=2, unique=True),
                                     label="end_items")
    if draw(st.sampled_from([False, False, True]), label="faulty model"):
        last = len(step["turns"]) + (end == "fixed")  # the answer's turn (one more when the first is refused)
        step["model_faults"] = draw(st.dictionaries(
            st.integers(0, last).map(str), st.lists(st.sampled_from(MODEL_FAULTS), min_size=1, max_size=2),
            min_size=1, max_size=2), label="model_faults")
    gated = [f"{t}.{k}" for t, calls in enumerate(step["turns"]) for k, tool in enumerate(calls) if tool == "act_gated"]
    if gated:
        step["reject_calls"] = draw(st.lists(st.sampled_from(gated), max_size=1), label="reject_calls")
        edits = [call for call in gated if call not in step["reject_calls"] and draw(st.booleans(), label="edit")]
        if edits:
            step["edit_calls"] = edits
    if draw(st.sampled_from([False, False, True]), label="speculative"):
        step["speculative"] = True


def draw_approval(draw: st.DrawFn, step: dict[str, Any]) -> None:
    """The third generator's draws for an approval ``step``: a quorum of two approvers (one in
    three), an integer answer each approver gives its own (one in three)."""
    if draw(st.sampled_from([False, False, True]), label="quorum of two"):
        step["quorum"] = 2
    if draw(st.sampled_from([False, False, True]), label="answer"):
        step["answer"] = True


@st.composite
def policies(draw: st.DrawFn) -> dict[str, Any]:
    """A fan-out's partial-failure policy, as ``chaos_flows._policy`` reads it."""
    policy: dict[str, Any] = {"kind": draw(st.sampled_from(["all", "best_effort", "quorum", "ratio"]))}
    if policy["kind"] == "quorum":
        policy["k"] = draw(st.integers(1, MAX_ITEMS))
    elif policy["kind"] == "ratio":
        policy["r"] = draw(st.sampled_from([0.25, 0.5, 0.75, 1.0]))
    return policy


def describe(spec: dict[str, Any]) -> str:
    """One line per step, for a failing example's report."""
    lines = []
    for s in spec["steps"]:
        flags = [f for f in ("effect", "compensate") if s.get(f)]
        if s.get("critical") is False:
            flags.append(f"noncritical:{s.get('on_failure')}")
        if s.get("fate", "ok") != "ok":
            flags.append(s["fate"])
        if s["kind"] == "map":
            flags.append(f"over={s['over']} policy={s['policy']} fail_items={s['fail_items']}")
        if s["kind"] == "plan":
            flags.append(f"items={s['items']}")
        if s["kind"] in ("agent", "approval") and "over" in s:
            flags.append(f"over={s['over']}" + (f" policy={s['policy']}" if "policy" in s else ""))
        if s["kind"] == "agent":
            flags.append(f"turns={s['turns']}")
            flags += [f"{k}={s[k]}" for k in ("end", "end_items", "model_faults", "reject_calls", "edit_calls",
                                              "speculative") if k in s]
        if s["kind"] == "approval":
            flags.append(s["verdict"] if "verdict" in s else f"reject_items={s['reject_items']}")
            flags += [f"{k}={s[k]}" for k in ("quorum", "answer") if k in s]
        lines.append(f"{s['name']} {s['kind']} <- {','.join(s['deps']) or '-'} {' '.join(flags)}")
    return "\n".join(lines)


#: The Ray agent sweep's tools: effects (``act``, ``act_undone``) twice as likely as ``lookup``, the
#: lost reply twice as likely as one tool that raises.
AGENT_TOOLS = ("lookup", "act", "act", "act_undone", "act_undone", *RAISING, *LOST, *LOST)


@st.composite
def agent_dag_specs(draw: st.DrawFn, min_steps: int = 4, max_steps: int = 12) -> dict[str, Any]:
    """A DAG weighted to agents (see the module's docstring): ``min_steps``-``max_steps`` nodes, then
    perhaps the failing step that waits for them all."""
    n = draw(st.integers(min_steps, max_steps), label="steps")
    steps: list[dict[str, Any]] = []
    plans: list[str] = []
    partial: set[str] = set()
    for i in range(n):
        name = f"s{i}"
        earlier = [s["name"] for s in steps]
        kind = draw(st.sampled_from(["agent"] * 4 + ["step", "plan"] + (["map"] if plans else [])), label="kind")
        extra = draw(st.lists(st.sampled_from(earlier), max_size=2, unique=True)) if earlier else []
        step: dict[str, Any] = {"name": name, "kind": kind, "deps": extra}
        if kind == "plan":
            step["items"] = draw(st.integers(1, 3))
            plans.append(name)
        elif kind == "agent":
            over = draw(st.sampled_from([None, *plans]), label="over") if plans else None
            if over is not None:
                step["over"] = over
                step["deps"] = [over, *(d for d in extra if d != over)]
                step["policy"] = draw(policies(), label="policy")
            step["turns"] = draw(st.lists(st.lists(st.sampled_from(AGENT_TOOLS), min_size=1, max_size=2),
                                          min_size=2, max_size=MAX_TURNS), label="turns")
            if step.get("policy", {}).get("kind", "all") != "all":
                partial.add(name)
        else:
            if kind == "map":
                step["over"] = draw(st.sampled_from(plans))
                step["deps"] = [step["over"], *(d for d in extra if d != step["over"])]
                step["policy"] = draw(policies())
                partial_policy = step["policy"]["kind"] != "all"
                step["fail_items"] = draw(st.lists(st.integers(0, MAX_ITEMS - 1), max_size=1)) if partial_policy else []
                if partial_policy:
                    partial.add(name)
            step["effect"] = draw(st.booleans())
            step["compensate"] = draw(st.sampled_from([False, False, True]))
            if step["effect"] or step["compensate"]:  # no partial fan-out result in a key (module docstring)
                step["deps"] = [d for d in step["deps"] if d not in partial or d == step.get("over")]
            step["fate"] = draw(st.sampled_from(["ok"] * 7 + ["flaky"]))
        steps.append(step)
    if draw(st.sampled_from([False, False, True]), label="rollback"):
        waited = {d for s in steps for d in s["deps"]}
        steps.append({"name": f"s{n}", "kind": "step", "fate": "fail",
                      "deps": [s["name"] for s in steps if s["name"] not in waited]})
    return {"name": f"chaos_{digest(steps)[:10]}", "steps": steps}
