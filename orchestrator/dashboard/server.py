"""Run the dashboard: the bind rule, the store, uvicorn."""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from typing import TYPE_CHECKING

from raysaga.orchestrator.dashboard.security import Guard, check_bind, resolve_token, resolve_users
from raysaga.state import Store

if TYPE_CHECKING:
    from fastapi import FastAPI

    from raysaga.orchestrator.workflow import Workflow


def build(store: Store, *, host: str = "127.0.0.1", token: str | None = None,
          allow_hosts: Iterable[str] = (), poll: float | None = None, users: Mapping[str, str] | None = None,
          user_pairs: Iterable[str] = (), users_file: str | None = None,
          workflows: Sequence[Workflow] = ()) -> tuple[FastAPI, Guard]:
    """The application and its guard; ``UserError`` when ``host`` is not loopback and there is
    neither a token (``token`` or ``RAYSAGA_DASHBOARD_TOKEN``) nor users (``users``: name ->
    token; ``user_pairs``, ``--user NAME=TOKEN`` as given; the lines of ``users_file``, else of the
    file ``RAYSAGA_DASHBOARD_USERS`` names). ``workflows`` (``--workflow``): the DAGs of their runs."""
    from raysaga.orchestrator.dashboard.app import POLL_SECONDS, create_app

    people = resolve_users([*(f"{name}={key}" for name, key in (users or {}).items()), *user_pairs], users_file)
    secret = resolve_token(token)
    check_bind(host, secret, people)
    guard = Guard.make(host, secret, allow_hosts, people)
    return create_app(store, guard, poll=POLL_SECONDS if poll is None else poll, workflows=workflows), guard


__all__ = ["build"]
