"""What the inline executor holds back once a cancel or pause is seen (``Executor.hold_new``), and
that a hold whose signal went without being obeyed does not hang a run: the held attempts run at
the next wait. The end-to-end behaviour (a cancel from another process) is
``tests/cli/test_inline_cancel_stop49.py``."""

from __future__ import annotations

from raysaga import Workflow
from raysaga.orchestrator.executor import InlineExecutor
from raysaga.orchestrator.task import NodeCall

wf = Workflow("hold49", version="1")
ran: list[str] = []


@wf.step()
def step_a() -> str:
    ran.append("step_a")
    return "a"


def _call(run_id: str, node: str) -> NodeCall:
    return NodeCall(fields=(run_id, node, -1, 1, "trace", None, False), kwargs={}, max_output_bytes=1 << 20)


def test_held_only_for_its_own_run_and_not_a_compensation() -> None:
    ran.clear()
    asked = [True]
    ex = InlineExecutor()
    ex.hold_new("r-1", lambda: asked[0])
    spec = wf.validate().steps["step_a"]
    other = ex.submit(spec, _call("r-2", "step_a"))  # another run's: runs
    undo = ex.submit(spec, _call("r-1", "step_a:compensate"))  # a rollback's: runs
    held = ex.submit(spec, _call("r-1", "step_a"))
    assert other.outcome is not None and other.outcome.ok and undo.outcome is not None
    assert held.held and not held.sent and held.outcome is None
    assert ran == ["step_a", "step_a"]
    assert held not in ex.wait(None, 0)  # still asked: held, not run
    ex.cancel(held)  # the driver obeys the cancel: never run
    asked[0] = False
    assert ex.wait(None, 0) == []
    assert ran == ["step_a", "step_a"]


def test_a_hold_whose_signal_went_runs_at_the_next_wait() -> None:
    ran.clear()
    asked = [True]
    ex = InlineExecutor()
    ex.hold_new("r-1", lambda: asked[0])
    held = ex.submit(wf.validate().steps["step_a"], _call("r-1", "step_a"))
    assert ran == [] and held.held
    asked[0] = False  # taken by another process, never obeyed here
    assert ex.wait(None, 0) == [held]
    assert held.outcome is not None and held.outcome.ok and held.sent and not held.held
    assert ran == ["step_a"]
