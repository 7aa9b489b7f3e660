"""Fleet-wide rate limits, kept in the store so every driver and worker sharing it respects them.

A limit (``RateRule``: requests and tokens per ``per`` seconds, calls at once) is a row that
admissions serialise on, and every admitted call is a grant row. ``acquire`` locks the limit's row
with its first statement (an upsert: SQLite's write lock, a PostgreSQL row lock), counts the
grants, and either records a grant or says how long to wait. The store rather than a Ray actor:
drivers on different clusters, and one started after a crash, share it, and it needs no process
to stay alive (the circuit breakers made the same choice).

When a granted request reaches the provider is not known here: between the grant and the
request lie a worker's start, an SDK's import, a connection (a second, measured, for a process's
first call). So a grant counts from the moment it is made until ``per`` seconds after its call
*ended* (``release``), when its request has certainly arrived: whatever the delays, no window of
``per`` seconds at the provider sees more than ``requests`` of them. The price is the calls'
latency: a limit of 60 per minute on calls of 3 s paces at most 60 per 63 s. A call that never
ends (its driver died) counts until its hold expires; a driver still waiting for its call renews
the hold (``extend``), so a live call longer than its hold keeps its slot. ``margin`` (up to 1 s)
absorbs the clocks of different machines.
"""

from __future__ import annotations

from collections.abc import Collection
from dataclasses import dataclass

from sqlalchemy import ColumnElement, Connection, Engine, case, delete, func, insert, or_, select, update

from raysaga.state.schema import rate_grants, rate_limits
from raysaga.state.statements import insert_for

#: Longest a caller is told to wait for a concurrency slot before asking again (a call that ends
#: frees its slot before its hold expires).
SLOT_POLL = 0.25


@dataclass(frozen=True)
class RateRule:
    """One declared limit, by name. ``None``: that dimension is not limited."""

    name: str
    requests: int | None = None
    tokens: int | None = None
    per: float = 60.0
    concurrent: int | None = None
    margin: float = 1.0


@dataclass(frozen=True)
class Admission:
    """``grant``: the grant's id (release it when the call ends), or None with ``wait``: seconds
    until asking again may succeed."""

    grant: int | None
    wait: float = 0.0


def acquire(engine: Engine, rule: RateRule, now: float, hold: float) -> Admission:
    """Admit one call through ``rule`` at ``now`` (counting as under way for at most ``hold``
    seconds if it is never released), or say how long to wait."""
    since = now - (rule.per + rule.margin)  # a call that ended before this counts no more
    with engine.begin() as conn:
        blocked = conn.execute(
            insert_for(conn, rate_limits).values(name=rule.name, blocked_until=0.0, version=1, updated_at=now)
            .on_conflict_do_update(index_elements=["name"],
                                   set_={"version": rate_limits.c.version + 1, "updated_at": now})
            .returning(rate_limits.c.blocked_until)).scalar_one()
        if blocked > now:  # a 429's retry-after, for the whole fleet
            return Admission(None, blocked - now)
        g = rate_grants.c
        mine = g.name == rule.name
        under_way = g.ended_at.is_(None) & (g.expires_at > now)
        counting = mine & (under_way | (g.ended_at > since) | (g.ended_at.is_(None) & (g.expires_at > since)))
        waits: list[float] = []
        poll = min(SLOT_POLL, rule.per / 4)  # a call under way frees its place when it ends: ask again soon
        if rule.requests is not None or rule.tokens is not None:
            count, used, busy = conn.execute(
                select(func.count(), func.coalesce(func.sum(g.tokens), 0),
                       func.count().filter(g.ended_at.is_(None))).where(counting)).one()
            if rule.requests is not None and count >= rule.requests:
                waits.append(poll if busy else _ends_leaving(conn, counting, count - rule.requests) - since)
            if rule.tokens is not None and used >= rule.tokens:
                waits.append(poll if busy else _ends_leaving(conn, counting, 0) - since)
        if rule.concurrent is not None:
            held = conn.execute(select(func.count()).where(mine, under_way)).scalar_one()
            if held >= rule.concurrent:
                waits.append(poll)
        if waits:
            return Admission(None, max(max(waits), 0.001))
        # grants that count for nothing any more
        conn.execute(delete(rate_grants).where(mine, or_(g.ended_at <= since,
                                                          g.ended_at.is_(None) & (g.expires_at <= since))))
        grant = conn.execute(insert(rate_grants).values(name=rule.name, granted_at=now, expires_at=now + hold,
                                                        tokens=0).returning(g.id)).scalar_one()
        return Admission(int(grant))


def _ends_leaving(conn: Connection, counting: ColumnElement[bool], offset: int) -> float:
    """When the ``offset``-th earliest-ended counted call ended (all have ended)."""
    return float(conn.execute(select(rate_grants.c.ended_at).where(counting)
                              .order_by(rate_grants.c.ended_at).offset(offset).limit(1)).scalar_one())


def release(engine: Engine, grant: int, tokens: int, now: float) -> None:
    """The call admitted by ``grant`` ended at ``now`` having used ``tokens``."""
    with engine.begin() as conn:
        conn.execute(update(rate_grants).where(rate_grants.c.id == grant).values(ended_at=now, tokens=tokens))


def block(engine: Engine, name: str, until: float, now: float) -> None:
    """Admit nothing through ``name`` before ``until`` (a provider's 429 said ``retry-after``)."""
    with engine.begin() as conn:
        conn.execute(
            insert_for(conn, rate_limits).values(name=name, blocked_until=until, version=1, updated_at=now)
            .on_conflict_do_update(index_elements=["name"], set_={
                "blocked_until": case((rate_limits.c.blocked_until > until, rate_limits.c.blocked_until),
                                      else_=until),
                "version": rate_limits.c.version + 1, "updated_at": now}))


def extend(engine: Engine, grants: Collection[int], expires_at: float) -> None:
    """The calls admitted by ``grants`` are still under way: each holds its place until ``expires_at``
    at least (a grant already released, or held longer, is left as it is)."""
    if not grants:
        return
    with engine.begin() as conn:
        g = rate_grants.c
        conn.execute(update(rate_grants).where(g.id.in_(list(grants)), g.ended_at.is_(None),
                                               g.expires_at < expires_at).values(expires_at=expires_at))


class RateRows:
    """``Store``'s fleet-wide rate limits on ``engine`` (mixed into ``SqlStore``)."""

    engine: Engine

    def rate_acquire(self, rule: RateRule, now: float, hold: float) -> Admission:
        return acquire(self.engine, rule, now, hold)

    def rate_release(self, grant: int, tokens: int, now: float) -> None:
        release(self.engine, grant, tokens, now)

    def rate_block(self, name: str, until: float, now: float) -> None:
        block(self.engine, name, until, now)

    def rate_extend(self, grants: Collection[int], expires_at: float) -> None:
        extend(self.engine, grants, expires_at)
