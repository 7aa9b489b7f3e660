"""Run the dashboard: the bind rule, the store, uvicorn."""

from __future__ import annotations

from collections.abc import Iterable
from typing import TYPE_CHECKING

from raysaga.orchestrator.dashboard.security import Guard, check_bind, resolve_token
from raysaga.state import Store

if TYPE_CHECKING:
    from fastapi import FastAPI


def build(store: Store, *, host: str = "127.0.0.1", token: str | None = None,
          allow_hosts: Iterable[str] = (), poll: float | None = None) -> tuple[FastAPI, Guard]:
    """The application and its guard; ``UserError`` when ``host`` is not loopback and there is
    no token (``token`` or ``RAYSAGA_DASHBOARD_TOKEN``)."""
    from raysaga.orchestrator.dashboard.app import POLL_SECONDS, create_app

    secret = resolve_token(token)
    check_bind(host, secret)
    guard = Guard.make(host, secret, allow_hosts)
    return create_app(store, guard, poll=POLL_SECONDS if poll is None else poll), guard


__all__ = ["build"]
