"""Why and until when a run rests without a driver: the choices of ``RunMachine.resting`` and
``RunMachine.rest_at_gate``, with no state of their own.

A run that waits for a human rests ``waiting_human``, also when a timer or a rate limit's gate
is due sooner (its ``wake_at``): its reason names the decision awaited, so ``status`` says who is
waited for, and a decision wakes it at once (``raysaga.state.decisions.decide``). A run that
waits only for time (a sleep, a retry's backoff, a rate limit) rests ``waiting_timer``.
"""

from __future__ import annotations

from collections.abc import Sequence

from raysaga.node_key import NodeKey
from raysaga.state import RunStatus

#: How a rest is recorded: its status, when it is due again (None: only a decision wakes it), why.
Rest = tuple[RunStatus, float | None, str]


def idle_rest(humans: Sequence[NodeKey], sleeping: Sequence[NodeKey], when: float | None, now: float,
              release_after: float) -> Rest | None:
    """The rest of a run with nothing in flight or ready (``RunMachine.resting``): for a human, or
    for a timer further away than ``release_after`` seconds; None: the driver waits itself."""
    far = when is None or when - now > release_after
    if humans and far:
        return RunStatus.WAITING_HUMAN, when, f"waiting for a decision on {', '.join(k.label for k in humans)}"
    if not humans and when is not None and far:
        what = f"sleep {', '.join(k.label for k in sleeping)}" if sleeping else "a retry's backoff"
        return RunStatus.WAITING_TIMER, when, f"waiting for {what}"
    return None


def gate_rest(humans: Sequence[NodeKey], limits: str, wake: float) -> Rest:
    """The rest of a run whose attempts all wait at their rate limits (``limits``: why, as
    ``state.rate_limits.waiting_reason`` says it), due at ``wake``. With a decision awaited too it
    rests ``waiting_human`` and names it: rested ``waiting_timer`` "waiting for rate limit ...", an
    approval's decision neither showed in its reason nor woke it before the limit's window ended."""
    if not humans:
        return RunStatus.WAITING_TIMER, wake, limits
    labels, limited = ", ".join(k.label for k in humans), limits.removeprefix("waiting for ")
    return RunStatus.WAITING_HUMAN, wake, f"waiting for a decision on {labels}, and for {limited}"
