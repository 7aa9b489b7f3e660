"""The driver's answers to an agent's queries that need the store or user code: a prompt built,
a circuit breaker asked or told, a shared-memory key read or compare-and-set.

The run machine only asks (``raysaga.orchestrator.machine.outbox``); these do the I/O. Circuit
breakers are store rows shared by every driver on the store (the fleet), changed by
compare-and-set; the transitions themselves are pure (``raysaga.agents.breaker``).
"""

from __future__ import annotations

from raysaga.agents.breaker import BreakerPolicy, admit, after_call
from raysaga.orchestrator.machine.outbox import AdmitTool, BreakerOutcome, MemoryOp
from raysaga.state import Lease, MemoryEntry, Store

#: Compare-and-set attempts on a breaker row before giving up (a change by another driver each time).
CAS_TRIES = 5


def admit_tool(store: Store, query: AdmitTool, now: float) -> str | None:
    """None if the call may go out now; else what the model is told."""
    policy = BreakerPolicy(query.threshold, query.cooldown)
    name = query.breaker
    for _ in range(CAS_TRIES):
        record = store.breaker_get(name)
        allowed, wait, change = admit(record, now, policy)
        if not allowed:
            return (f"the tool is unavailable: {name} failed {record.failures} times in a row and its circuit "
                    f"breaker is open; try again in about {max(1, round(wait))} s, or continue without it")
        if change is None or store.breaker_cas(change, record.version):
            return None
    return None


def record_breaker(store: Store, outcome: BreakerOutcome, now: float) -> None:
    policy = BreakerPolicy(outcome.threshold, outcome.cooldown)
    for _ in range(CAS_TRIES):
        record = store.breaker_get(outcome.breaker)
        if outcome.ok and record.state == "closed" and record.failures == 0:
            return
        if store.breaker_cas(after_call(record, outcome.ok, now, policy), record.version):
            return


def memory(store: Store, lease: Lease, op: MemoryOp) -> MemoryEntry:
    """A read, or a compare-and-set fenced by the lease (the caller committed what led to it first)."""
    if op.name == "memory_read":
        return store.memory_get(lease.run_id, op.memory_key)
    return store.memory_cas(lease, op.memory_key, op.value, op.expected_version, op.writer)
