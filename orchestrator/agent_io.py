"""The driver's answers to an agent's queries that need the store or user code: a prompt built,
a circuit breaker asked, a shared-memory key read or compare-and-set; and what its calls said,
scrubbed of the secrets the driver knows.

The run machine only asks (``raysaga.orchestrator.machine.outbox``); these do the I/O. Circuit
breakers are store rows shared by every driver on the store (the fleet): a probe is admitted by
compare-and-set here, while call outcomes are counted in the run's fenced batch
(``Batch.breakers``); the transitions themselves are pure (``raysaga.agents.breaker``).
"""

from __future__ import annotations

from raysaga.agents.breaker import BreakerPolicy, admit
from raysaga.agents.runtime import scrubbed_response
from raysaga.node_key import NodeKey
from raysaga.orchestrator.machine.outbox import AdmitTool, MemoryOp
from raysaga.orchestrator.speculation import is_peek
from raysaga.orchestrator.task import NodeOutcome
from raysaga.state import BreakerRecord, BreakerState, Lease, MemoryEntry, Store, jsoncodec
from raysaga.state.redact import json_may_hold_secret_value, scrub_secret_values, secret_values_known

#: Compare-and-set attempts on a breaker row before giving up (a change by another driver each time).
CAS_TRIES = 5


def admit_tool(store: Store, query: AdmitTool, now: float, seen: dict[str, BreakerRecord] | None = None) -> str | None:
    """None if the call may go out now; else what the model is told (also when the breaker's row
    kept changing under ``CAS_TRIES`` compare-and-sets: refused, never admitted unchecked).

    ``seen``: breakers already read in this round of the driver (the tool calls a burst of model
    answers asks for), reused: a round reads each breaker once, not once per call. Only a state
    that admitting leaves as it is (closed, or open and cooling down) is reused; a probe changes
    the row, and the next call reads it again. A query whose key ``is_peek`` only reads: None
    if the breaker is closed (its tools may run speculatively), else why not.
    """
    policy = BreakerPolicy(query.threshold, query.cooldown)
    name = query.breaker
    if is_peek(query.key):  # a read for speculation: None only if closed; never takes the probe
        record = seen.get(name) if seen is not None else None
        if record is None:
            record = store.breaker_get(name)
            if seen is not None and record.state == BreakerState.CLOSED:
                seen[name] = record
        return None if record.state == BreakerState.CLOSED else f"breaker {name} is {record.state.value}"
    for _ in range(CAS_TRIES):
        record = seen.pop(name, None) if seen is not None else None
        if record is None:
            record = store.breaker_get(name)
        allowed, wait, change = admit(record, now, policy)
        if change is None and seen is not None:
            seen[name] = record
        if not allowed:
            return (f"the tool is unavailable: its dependency failed {record.failures} times in a row and its "
                    f"circuit breaker ({name}) is open; try again in about {max(1, round(wait))} s, or continue "
                    "without it")
        if change is None or store.breaker_cas(change, record.version):
            return None
    # every compare-and-set lost: other drivers changed the row each time (taking the probe, or
    # counting outcomes). Admitting anyway let a call through an open breaker without being its
    # probe; the call is refused for now (fail closed), and the model may ask again
    return (f"the tool is unavailable for a moment: its circuit breaker {name} is being changed by other "
            "calls (a probe after failures); try again in a moment, or continue without it")


def memory(store: Store, lease: Lease, op: MemoryOp) -> MemoryEntry:
    """A read, or a compare-and-set fenced by the lease (the caller committed what led to it first)."""
    if op.name == "memory_read":
        return store.memory_get(lease.run_id, op.memory_key)
    return store.memory_cas(lease, op.memory_key, op.value, op.expected_version, op.writer)


def scrubbed_turns(outcomes: list[tuple[NodeKey, NodeOutcome]]) -> list[tuple[NodeKey, NodeOutcome]]:
    """What an agent's model calls and tool calls returned, scrubbed of the secret values this
    driver knows (DESIGN invariant 7). Their task scrubbed them of what its worker knows; a value
    declared only in the driver (a ``Secret`` input's, ``register_secret``) is unknown on a Ray
    worker, and the store writes outputs as given. The run machine gets the scrubbed text, so the
    conversation goes on as a resume, reading the row, would see it."""
    if not secret_values_known():
        return outcomes
    out = outcomes
    for i, (key, outcome) in enumerate(outcomes):
        text = outcome.output_json
        if key.turn is None or not outcome.ok or text is None or not json_may_hold_secret_value(text):
            continue
        value = jsoncodec.loads(text)
        # a model's response as ``scrubbed_response`` has it on the worker: a tool call whose input
        # held a secret is answered, never run with the input the scrub rewrote
        clean = scrubbed_response(value) if key.call is None and isinstance(value, dict) else scrub_secret_values(value)
        if clean != value:
            if out is outcomes:
                out = list(outcomes)
            out[i] = (key, outcome._replace(output_json=jsoncodec.dumps(clean, f"node {key.label}")))
    return out
