"""Read-only queries for the dashboard (``raysaga dashboard``) and its ``/metrics``.

Each is one plain SELECT (or a few) on the store's read engine, reading only the columns its view
shows: a page of runs never reads a run's input or output, a node's items never their outputs, so
a 2,000-item fan-out or a store of many runs costs what is on screen. ``SqlStore`` exposes them as
methods of the ``Store`` interface; the orchestrator never writes SQL.
"""

from __future__ import annotations

import contextlib
import json
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

from sqlalchemy import Connection, Engine, Text, and_, cast, func, literal_column, or_, select

from raysaga.errors import BlobIntegrityError
from raysaga.node_key import AGENT_SEP
from raysaga.state import blob_rows, jsoncodec
from raysaga.state.decoding import reading
from raysaga.state.driver_stops import DriverStop, count_undriven, latest_stops
from raysaga.state.fork_rows import run_key_of
from raysaga.state.item_pages import counts as item_counts
from raysaga.state.item_pages import first_items, rows_at
from raysaga.state.item_pages import page as item_page
from raysaga.state.item_pages import sub_rows as item_sub_rows
from raysaga.state.models import EffectRecord, EventRecord
from raysaga.state.run_labels import labels_contain, labels_match
from raysaga.state.schema import effects, events, nodes, runs
from raysaga.state.schema import node_rows as view  # the view's columns (its rows are read by key)
from raysaga.state.text_match import folded_contains, has_prefix

#: Event kinds counted by ``metrics`` (one GROUP BY over these kinds).
COUNTED_EVENTS = ("retry_scheduled", "node_failed", "node_completed", "items_completed", "compensation_completed",
                  "run_cancelled")


@dataclass(frozen=True)
class RunFilter:
    """What the run list shows: every field optional; ``before`` is the keyset cursor
    (created_at, run_id) of the last row of the previous page; ``labels`` (key, value) pairs a run
    must all carry (as ``raysaga list --label``), matched as written: no wildcard."""

    status: str | None = None
    workflow: str | None = None
    since: float | None = None
    until: float | None = None
    text: str | None = None
    before: tuple[float, str] | None = None
    limit: int = 50
    labels: tuple[tuple[str, str], ...] = ()


_RUN_COLUMNS = (runs.c.run_id, runs.c.workflow_name, runs.c.workflow_version, runs.c.status, runs.c.status_reason,
                runs.c.created_at, runs.c.updated_at, runs.c.deadline_at, runs.c.lease_owner,
                runs.c.lease_expires_at, runs.c.retries_used, runs.c.retry_budget, runs.c.tokens_used,
                runs.c.token_budget, runs.c.cost_used, runs.c.cost_budget, runs.c.parent_run_id,
                # what a run no driver drives needs to say how to go on (``orchestrator.undriven``)
                runs.c.workflow_ref, runs.c.queue,
                # as text, decoded by `_summary`: one damaged labels value shows as {}, never a failed page
                cast(runs.c.labels, Text).label("labels"))


def _summary(row: Any) -> dict[str, Any]:
    """A run's summary row as a dict, its labels (JSON text, or NULL) as a dict of str."""
    out = dict(row._mapping)
    try:
        labels = json.loads(out["labels"]) if out["labels"] else {}
    except (TypeError, ValueError):
        labels = {}
    ok = isinstance(labels, dict) and all(isinstance(k, str) and isinstance(v, str) for k, v in labels.items())
    out["labels"] = labels if ok else {}
    return out


def _filtered(query: Any, f: RunFilter, dialect: str, *, with_status: bool = True) -> Any:
    if with_status and f.status:
        query = query.where(runs.c.status == f.status)
    if f.workflow:
        query = query.where(runs.c.workflow_name == f.workflow)
    if f.since is not None:
        query = query.where(runs.c.created_at >= f.since)
    if f.until is not None:
        query = query.where(runs.c.created_at < f.until)
    if f.text:  # case folded in SQL, the same on both dialects (``text_match``)
        query = query.where(or_(*(folded_contains(c, f.text)
                                  for c in (runs.c.run_id, runs.c.workflow_name, runs.c.status_reason)),
                                labels_contain(dialect, f.text)))
    if f.labels:
        query = query.where(*labels_match(dialect, dict(f.labels)))
    return query


def run_page(engine: Engine, f: RunFilter) -> list[dict[str, Any]]:
    """Newest first, summary columns only, keyset-paged on (created_at, run_id)."""
    query = _filtered(select(*_RUN_COLUMNS), f, engine.dialect.name)
    if f.before is not None:
        at, run_id = f.before
        query = query.where(or_(runs.c.created_at < at, and_(runs.c.created_at == at, runs.c.run_id < run_id)))
    query = query.order_by(runs.c.created_at.desc(), runs.c.run_id.desc()).limit(f.limit)
    with engine.connect() as conn:
        return [_summary(r) for r in conn.execute(query).all()]


def run_counts(engine: Engine, f: RunFilter | None = None) -> dict[str, int]:
    """Runs by status under the filter (its status and cursor ignored): the list's tabs."""
    query = select(runs.c.status, func.count()).group_by(runs.c.status)
    if f is not None:
        query = _filtered(query, f, engine.dialect.name, with_status=False)
    with engine.connect() as conn:
        return {str(s): int(n) for s, n in conn.execute(query).all()}


def undriven_count(engine: Engine, f: RunFilter | None, now: float) -> int:
    """Active runs under the filter (its status and cursor ignored, as ``run_counts``) that no
    driver drives (``driver_stops.count_undriven``): the list's "no driver" count."""
    scope = select(runs.c.run_id)
    if f is not None:
        scope = _filtered(scope, f, engine.dialect.name, with_status=False)
    with engine.connect() as conn:
        return count_undriven(conn, scope, now)


def driver_stops(engine: Engine, run_ids: Iterable[str]) -> dict[str, DriverStop]:
    """Of each run, its driver's last ``driver_interrupted`` when none claimed it since (``driver_stops``)."""
    wanted = list(run_ids)
    if not wanted:
        return {}
    with engine.connect() as conn:
        return latest_stops(conn, wanted)


def run_row(engine: Engine, run_id: str) -> dict[str, Any] | None:
    """A run's summary columns (as ``run_page`` rows), or None."""
    with engine.connect() as conn:
        row = conn.execute(select(*_RUN_COLUMNS).where(runs.c.run_id == run_id)).first()
    return None if row is None else _summary(row)


_LIGHT_NAMES = tuple(c.name for c in view.c if c.name not in ("run_id", "output", "error"))


def step_rows(engine: Engine, run_id: str, items_cap: int) -> list[dict[str, Any]]:
    """Every node row of a run except fan-out items (steps, agent turns and tool calls,
    compensations), and the first ``items_cap`` items of each fan-out: no outputs, no errors."""
    with reading(run_id, nodes.name), engine.connect() as conn:
        return first_items(conn, run_id, items_cap, _LIGHT_NAMES)


def items(engine: Engine, run_id: str, node_id: str, after: int = -1, limit: int = 500,
          status: str | None = None) -> list[dict[str, Any]]:
    """A fan-out's items by index after ``after`` (no outputs): rows and item chunks read by their
    keys (``item_pages``), not every item of the step through the view."""
    with reading(run_id, nodes.name), engine.connect() as conn:
        return item_page(conn, run_id, node_id, after, limit, _LIGHT_NAMES, status)


def node_rows(engine: Engine, run_id: str, keys: Iterable[tuple[str, int]]) -> list[dict[str, Any]]:
    """The named node rows (no outputs): what a live update sends for the nodes an event names."""
    wanted = sorted(set(keys))
    if not wanted:
        return []
    with reading(run_id, nodes.name), engine.connect() as conn:
        return rows_at(conn, run_id, wanted, _LIGHT_NAMES)


def step_counts(engine: Engine, run_id: str, node_ids: Iterable[str]) -> dict[str, dict[str, int]]:
    """Items by status of each named fan-out step (its own row, fan_index -1, left out)."""
    wanted = sorted(set(node_ids))
    if not wanted:
        return {}
    out: dict[str, dict[str, int]] = {n: {} for n in wanted}
    with reading(run_id, nodes.name), engine.connect() as conn:
        for node_id, by_status in item_counts(conn, run_id, wanted, items_only=True).items():
            out[node_id] = {status: count for status, (count, _) in by_status.items() if count}
    return out


def fanout_sizes(engine: Engine, run_id: str) -> dict[str, int]:
    """How many items each fan-out of the run expanded into (its latest ``fanout_expanded`` event):
    items in flight have no row yet, so this is what tells "3 of 2,000 done" from "3 of 3"."""
    with engine.connect() as conn:
        return fanout_sizes_in(conn, run_id)


def fanout_sizes_in(conn: Connection, run_id: str) -> dict[str, int]:
    """``fanout_sizes`` on an open connection: read in the same snapshot as the rows it is set against."""
    query = (select(events.c.node_id, events.c.data)
             .where(events.c.run_id == run_id, events.c.kind == "fanout_expanded").order_by(events.c.seq))
    sizes: dict[str, int] = {}
    with reading(run_id, events.name):
        for node_id, data in conn.execute(query).all():
            if node_id and isinstance(data, dict) and isinstance(data.get("items"), int):
                sizes[str(node_id)] = int(data["items"])
    return sizes


#: Every column of the view, in its order: what ``node_row`` gives.
_ALL_NAMES = tuple(c.name for c in view.c)


def node_row(engine: Engine, run_id: str, node_id: str, fan_index: int) -> dict[str, Any] | None:
    """One node row with its output (inline, or the digest of its blob) and error, as the view
    gives it: read by key (``item_pages.rows_at``: its row, else the chunk whose span holds the
    index), not through the view, which expanded every item of the step to find one."""
    with reading(run_id, nodes.name), engine.connect() as conn:
        found = rows_at(conn, run_id, [(node_id, fan_index)], _ALL_NAMES)
    return found[0] if found else None


def node_events(engine: Engine, run_id: str, node_id: str, fan_index: int, limit: int = 500) -> list[EventRecord]:
    """The events naming a node, oldest first."""
    query = select(events).where(events.c.run_id == run_id, events.c.node_id == node_id)
    query = query.where(events.c.fan_index == fan_index) if fan_index >= 0 else \
        query.where(or_(events.c.fan_index.is_(None), events.c.fan_index < 0))
    with reading(run_id, events.name), engine.connect() as conn:
        rows = conn.execute(query.order_by(events.c.seq).limit(limit)).all()
    return [EventRecord.model_validate(dict(r._mapping)) for r in rows]


def node_effects(engine: Engine, run_id: str, node_id: str, fan_index: int) -> list[EffectRecord]:
    """The ledger rows of a node: its own and, for an agent, its tool calls' (``node@turn.call``)
    and its compensation's (``node:compensate``)."""
    dialect = engine.dialect.name  # case-sensitive prefixes: ``pay``'s are not ``Pay``'s (LIKE on SQLite)
    query = select(effects).where(effects.c.run_id == run_id, effects.c.fan_index == fan_index, or_(
        effects.c.node_id == node_id, has_prefix(effects.c.node_id, node_id + AGENT_SEP, dialect),
        has_prefix(effects.c.node_id, node_id + ":", dialect)))
    with reading(run_id, effects.name), engine.connect() as conn:
        rows = conn.execute(query.order_by(effects.c.created_at, effects.c.idempotency_key).limit(1000)).all()
    return [EffectRecord.model_validate(dict(r._mapping)) for r in rows]


def sub_rows(engine: Engine, run_id: str, node_id: str, fan_index: int, limit: int = 400) -> list[dict[str, Any]]:
    """An agent node's turns and tool calls (``node@2``, ``node@2.1``) and its compensation rows,
    with their outputs (a turn's output holds the model's answer: usage, stop reason, tool uses),
    by start: read by key (``item_pages.sub_rows``), not through the view."""
    with reading(run_id, nodes.name), engine.connect() as conn:
        return item_sub_rows(conn, run_id, node_id, fan_index, limit, _ALL_NAMES)


def agent_tokens(engine: Engine, run_id: str, step: str) -> int:
    """The tokens (input + output, as the run's ``tokens_used`` counts them) the model turns of
    agent step ``step`` used, over every item of a mapped agent: one aggregate over its turn rows
    (``step@N`` at every ``fan_index``; its tool calls ``step@N.M`` and compensations left out),
    with no limit, plus the usage of each answer kept as a blob (its row holds only the digest),
    read by digest. A turn row or blob that holds no usage counts 0."""
    dialect = engine.dialect.name
    turns = and_(nodes.c.run_key == run_key_of(run_id), has_prefix(nodes.c.node_id, step + AGENT_SEP, dialect),
                 nodes.c.node_id.not_like("%.%"), nodes.c.node_id.not_like("%:%"))
    query = (select(nodes.c.output_digest, func.count(), func.sum(_turn_tokens(dialect)))
             .where(turns).group_by(nodes.c.output_digest))
    with reading(run_id, nodes.name), engine.connect() as conn:
        groups = conn.execute(query).all()
        blobbed = {str(d): int(n) for d, n, _ in groups if d is not None}  # NULL output: the answer is a blob
        total = sum(int(t or 0) for d, _, t in groups if d is None)
        for digest, data in _blobs(conn, list(blobbed)).items():
            total += blobbed[digest] * _usage_tokens(data)
    return total


def agent_counts(engine: Engine, run_id: str, steps: Iterable[str] | None = None) -> dict[str, dict[str, int]]:
    """Of each agent step (of ``steps``, or every one), its model turns (``step@N``) and tool calls
    (``step@N.M``) over every item of a mapped agent: one GROUP BY over their rows, compensations
    left out. The page's first rows hold only the first items of each, so counting those
    undercounted a mapped agent of more than ``ITEMS_SHOWN`` items."""
    wanted = None if steps is None else sorted(set(steps))
    if wanted == []:
        return {}
    dialect = engine.dialect.name
    where = [nodes.c.run_key == run_key_of(run_id), nodes.c.node_id.like("%" + AGENT_SEP + "%"),
             nodes.c.node_id.not_like("%:%")]
    if wanted is not None:
        where.append(or_(*(has_prefix(nodes.c.node_id, step + AGENT_SEP, dialect) for step in wanted)))
    out: dict[str, dict[str, int]] = {}
    with reading(run_id, nodes.name), engine.connect() as conn:
        for node_id, count in conn.execute(select(nodes.c.node_id, func.count()).where(*where)
                                           .group_by(nodes.c.node_id)).all():
            step, _, rest = str(node_id).partition(AGENT_SEP)
            entry = out.setdefault(step, {"turns": 0, "calls": 0})
            entry["calls" if "." in rest else "turns"] += int(count)
    return out


def _turn_tokens(dialect: str) -> Any:
    """SQL: a turn row's ``usage.input_tokens`` + ``usage.output_tokens`` (each 0 unless an integer)."""
    output = f"{nodes.name}.output"
    if dialect == "sqlite":
        def one(name: str) -> str:
            path = f"'$.usage.{name}'"
            return f"CASE WHEN json_type({output}, {path}) = 'integer' THEN json_extract({output}, {path}) ELSE 0 END"
        # an output that is not JSON (changed by hand) counts 0 rather than failing the view
        return literal_column(f"CASE WHEN json_valid({output}) THEN {one('input_tokens')} + {one('output_tokens')} "
                              "ELSE 0 END")

    def field(name: str) -> str:  # (json_typeof is NULL for a missing member, and for a non-object)
        return (f"CASE WHEN json_typeof({output} -> 'usage' -> '{name}') = 'number' "
                f"THEN CAST({output} -> 'usage' ->> '{name}' AS NUMERIC) ELSE 0 END")
    return literal_column(f"{field('input_tokens')} + {field('output_tokens')}")


def _blobs(conn: Connection, digests: list[str]) -> dict[str, bytes]:
    """The blobs of ``digests`` that exist and match their digest (a damaged one is left out: a
    view counts what it can read)."""
    if not digests:
        return {}
    try:
        return blob_rows.read(conn, digests)
    except BlobIntegrityError:
        found: dict[str, bytes] = {}
        for digest in digests:
            with contextlib.suppress(BlobIntegrityError):
                found.update(blob_rows.read(conn, [digest]))
        return found


def _usage_tokens(data: bytes) -> int:
    """Input + output tokens of a model answer's JSON (a blob), 0 if it holds no usage."""
    try:
        value = jsoncodec.loads(data)
    except (ValueError, UnicodeDecodeError):
        return 0
    usage = value.get("usage") if isinstance(value, dict) else None
    if not isinstance(usage, dict):
        return 0
    return sum(v for k in ("input_tokens", "output_tokens")
               if isinstance(v := usage.get(k), int) and not isinstance(v, bool))


def metrics(engine: Engine) -> dict[str, Any]:
    """Store-wide counts for ``/metrics`` beside ``Store.stats``: counted event kinds and ledger
    rows by status (two GROUP BY queries)."""
    with engine.connect() as conn:
        kinds = {str(k): int(n) for k, n in conn.execute(
            select(events.c.kind, func.count()).where(events.c.kind.in_(COUNTED_EVENTS))
            .group_by(events.c.kind)).all()}
        ledger = {str(s): int(n) for s, n in conn.execute(
            select(effects.c.status, func.count()).group_by(effects.c.status)).all()}
    return {"events": kinds, "effects": ledger}


class DashboardReads:
    """The ``Store`` interface's dashboard reads, for ``SqlStore`` (which mixes this in): each
    method is the function of the same name above on the store's read engine, nothing else."""

    reader: Engine

    def run_page(self, f: RunFilter) -> list[dict[str, Any]]:
        return run_page(self.reader, f)

    def run_counts(self, f: RunFilter | None = None) -> dict[str, int]:
        return run_counts(self.reader, f)

    def run_row(self, run_id: str) -> dict[str, Any] | None:
        return run_row(self.reader, run_id)

    def undriven_count(self, f: RunFilter | None, now: float) -> int:
        return undriven_count(self.reader, f, now)

    def driver_stops(self, run_ids: Iterable[str]) -> dict[str, DriverStop]:
        return driver_stops(self.reader, run_ids)

    def step_rows(self, run_id: str, items_cap: int) -> list[dict[str, Any]]:
        return step_rows(self.reader, run_id, items_cap)

    def fan_items(self, run_id: str, node_id: str, after: int = -1, limit: int = 500,
                  status: str | None = None) -> list[dict[str, Any]]:
        return items(self.reader, run_id, node_id, after, limit, status)

    def node_rows(self, run_id: str, keys: Iterable[tuple[str, int]]) -> list[dict[str, Any]]:
        return node_rows(self.reader, run_id, keys)

    def step_counts(self, run_id: str, node_ids: Iterable[str]) -> dict[str, dict[str, int]]:
        return step_counts(self.reader, run_id, node_ids)

    def node_row(self, run_id: str, node_id: str, fan_index: int) -> dict[str, Any] | None:
        return node_row(self.reader, run_id, node_id, fan_index)

    def fanout_sizes(self, run_id: str) -> dict[str, int]:
        return fanout_sizes(self.reader, run_id)

    def node_events(self, run_id: str, node_id: str, fan_index: int, limit: int = 500) -> list[EventRecord]:
        return node_events(self.reader, run_id, node_id, fan_index, limit)

    def node_effects(self, run_id: str, node_id: str, fan_index: int) -> list[EffectRecord]:
        return node_effects(self.reader, run_id, node_id, fan_index)

    def sub_rows(self, run_id: str, node_id: str, fan_index: int, limit: int = 400) -> list[dict[str, Any]]:
        return sub_rows(self.reader, run_id, node_id, fan_index, limit)

    def agent_tokens(self, run_id: str, step: str) -> int:
        return agent_tokens(self.reader, run_id, step)

    def agent_counts(self, run_id: str, steps: Iterable[str] | None = None) -> dict[str, dict[str, int]]:
        return agent_counts(self.reader, run_id, steps)

    def store_metrics(self) -> dict[str, Any]:
        return metrics(self.reader)


__all__ = ["COUNTED_EVENTS", "DashboardReads", "RunFilter", "agent_counts", "agent_tokens", "driver_stops",
           "fanout_sizes", "items", "metrics", "node_effects", "node_events", "node_row", "node_rows", "run_counts",
           "run_page", "run_row", "step_counts", "step_rows", "sub_rows", "undriven_count"]
