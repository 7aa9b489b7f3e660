"""Creating a run (``SqlStore`` mixes this in): ``pending``, for whoever drives it later; or claimed
and ``running`` already, for the driver that creates the run it drives (``raysaga.run``).

The second is one transaction where it was three, each fsync'd: the insert, the claim of the lease
and the move to ``running``. It writes what the three wrote, the same rows and the same events in
the same order (``run_created``, ``lease_claimed``, ``run_running``); a crash leaves the run not
created at all, or created and held by a driver that is gone (taken over like any other).
"""

from __future__ import annotations

import time
from typing import Any

from sqlalchemy import Connection, Engine
from sqlalchemy.exc import IntegrityError

from raysaga.errors import RunExistsError, UserError
from raysaga.state.models import Lease, NewRun, RunRecord, RunStatus
from raysaga.state.redact import scrub
from raysaga.state.run_labels import stored_labels
from raysaga.state.run_sql import insert_run_sql, run_of, run_params
from raysaga.state.statements import HotSql, driver_sql, json_param


def check_new_run_id(run_id: str) -> str:
    """A new run's id must not start with ``-`` (``UserError``): every command line naming the run
    (``raysaga status -dash``, the hints printed after a launch, a failure, a Ctrl-C) would have it
    read as an option. A run recorded with one before stays reachable (``raysaga status -- -dash``)."""
    if run_id.startswith("-"):
        raise UserError(f"run id {run_id!r} starts with '-', which a command line reads as an option (`raysaga status "
                        f"{run_id}` would not find the run): choose a run id that starts with another character")
    return run_id


class RunCreation:
    """``create_run`` and ``create_claimed`` of ``SqlStore`` (it provides the engine and helpers)."""

    engine: Engine

    def _run_value(self, conn: Connection, value: Any, what: str) -> tuple[Any, str | None, str | None]:
        raise NotImplementedError  # SqlStore's

    def create_run(self, new: NewRun) -> RunRecord:
        return self._insert_run(new, None)

    def create_claimed(self, new: NewRun, owner: str, ttl: float) -> tuple[RunRecord, Lease]:
        record = self._insert_run(new, (owner, ttl))
        assert record.lease_expires_at is not None
        return record, Lease(run_id=new.run_id, owner=owner, fence=record.fence, expires_at=record.lease_expires_at,
                             ttl=ttl)

    def _insert_run(self, new: NewRun, claim: tuple[str, float] | None) -> RunRecord:
        check_new_run_id(new.run_id)  # here, where every new run is recorded (API, CLI, launch; a fork: fork_rows)
        now = time.time()
        values = new.model_dump(exclude={"input", "labels"})  # the input is not copied: it may be large
        values["labels"] = stored_labels(new.labels)
        values.update(status=RunStatus.PENDING.value, version=0, fence=0, event_seq=1, retries_used=0,
                      tokens_used=0, cost_used=0.0, created_at=now, updated_at=now)
        rows = [(new.run_id, 1, now, "run_created", None, None, json_param(scrub({"workflow": new.workflow_name})))]
        if claim is not None:  # as ``claim`` (fence + 1) and the driver's commit of ``running`` (version + 1) do
            owner, ttl = claim
            values.update(status=RunStatus.RUNNING.value, version=1, fence=1, event_seq=3, lease_owner=owner,
                          lease_expires_at=now + ttl)
            rows += [(new.run_id, 2, now, "lease_claimed", None, None, json_param({"owner": owner, "fence": 1})),
                     (new.run_id, 3, now, "run_running", None, None, json_param({"reason": None}))]
        try:
            with self.engine.begin() as conn:
                values["input"], values["input_digest"], _ = self._run_value(conn, new.input, "input")
                dialect, hot = conn.dialect.name, HotSql(conn)
                # the row as inserted (RETURNING): no read of it after the commit
                row = hot.one(insert_run_sql(dialect, tuple(values)), run_params(values))
                hot.many(driver_sql(dialect).events, rows)
                return run_of(conn, new.run_id, row, lenient=False)
        except IntegrityError:
            raise RunExistsError(new.run_id) from None
