"""The workflows ``test_launch.py`` starts on its cluster.

The test copies this file into a project folder and launches ``launch_flow:wf`` from there, the
way a user launches their own module: ``raysaga launch`` ships that folder as the job's
``working_dir``. So it imports nothing of the test suite: its effects call the deduping fake
provider (``examples.order.fake_services``) over plain HTTP with the same protocol.
"""

from __future__ import annotations

import json
import os
import time
import urllib.request
from pathlib import Path
from typing import Any

from pydantic import BaseModel

from raysaga import RetryPolicy, StepContext, Workflow

#: Set on each node of the test's cluster (``head`` / ``special``): where a step ran.
NODE_VAR = "RAYSAGA_TEST_NODE"
#: A variable of the launching shell, sent with ``--env``: what a step on the cluster saw.
MARK_VAR = "RAYSAGA_LAUNCH_MARK"
#: Longest the pinned step waits for its gate file before failing.
GATE_TIMEOUT_S = 120.0

wf = Workflow("cluster-launch")


class Order(BaseModel):
    services_url: str
    order_id: str
    gate: str
    """A file: the pinned step runs on once it exists (the test kills the driver before that)."""


def _post(url: str, kind: str, key: str, body: dict[str, Any]) -> dict[str, Any]:
    request = urllib.request.Request(f"{url.rstrip('/')}/{kind}", data=json.dumps(body).encode(), method="POST",
                                     headers={"Content-Type": "application/json", "Idempotency-Key": key})
    with urllib.request.urlopen(request, timeout=10) as response:
        reply: dict[str, Any] = json.loads(response.read())
        return reply


@wf.step()
def greet(input: Order) -> dict[str, str | None]:
    return {"mark": os.environ.get(MARK_VAR), "node": os.environ.get(NODE_VAR)}


@wf.step(effect=True, retry=RetryPolicy(max_attempts=3))
def charge(ctx: StepContext, input: Order, greet: dict[str, str | None]) -> str:
    assert ctx.idempotency_key is not None
    return str(_post(input.services_url, "charge", ctx.idempotency_key, {"order_id": input.order_id})["id"])


@wf.step(resources={"special": 1})
def pinned(input: Order, charge: str) -> str | None:
    """Runs on the node offering ``special``; holds until the gate file exists."""
    deadline = time.monotonic() + GATE_TIMEOUT_S
    while not Path(input.gate).exists():
        if time.monotonic() > deadline:
            raise TimeoutError(f"gate {input.gate} never opened")
        time.sleep(0.05)  # waiting for the test to open the gate (a file), not for time to pass
    return os.environ.get(NODE_VAR)


@wf.step(effect=True, retry=RetryPolicy(max_attempts=3))
def email(ctx: StepContext, input: Order, pinned: str | None) -> str:
    assert ctx.idempotency_key is not None
    return str(_post(input.services_url, "email", ctx.idempotency_key, {"order_id": input.order_id})["id"])


@wf.step()
def done(greet: dict[str, str | None], pinned: str | None, email: str) -> dict[str, Any]:
    return {"greet": greet, "pinned_on": pinned, "email": email}


hello = Workflow("cluster-hello")


@hello.step(resources={"special": 1})
def where() -> str | None:
    return os.environ.get(NODE_VAR)


@hello.step()
def mark() -> str | None:
    return os.environ.get(MARK_VAR)
