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
absorbs the clocks of different machines. Grants are deleted once no window can count them any
more (``KEEP_ENDED_S``), not as soon as the window of the rule asking has passed.
"""

from __future__ import annotations

from collections.abc import Collection
from dataclasses import dataclass

from sqlalchemy import Connection, Engine, Select, case, delete, func, insert, select, union_all, update

from raysaga.state.schema import rate_grants, rate_limits
from raysaga.state.statements import insert_for

#: Longest a caller is told to wait for a concurrency slot before asking again (a call that ends
#: frees its slot before its hold expires).
SLOT_POLL = 0.25
#: Seconds a grant is kept after it stopped counting for the rule that prunes it. Limits with one
#: name are one limit, but two declarations of it may differ (two workflows on one store; within a
#: workflow it is refused): a rule with a short window deleted the grants a longer one still
#: counted (2 per minute became 2 per second). Kept at least this long, and as long as the widest
#: window this process has used for the name, a grant outlives any window up to an hour.
KEEP_ENDED_S = 3600.0
_widest: dict[str, float] = {}  # a limit's name -> the widest window (per + margin) acquired with here


@dataclass(frozen=True)
class RateRule:
    """One declared limit, by name. ``None``: that dimension is not limited."""

    name: str
    requests: int | None = None
    tokens: int | None = None
    per: float = 60.0
    concurrent: int | None = None
    margin: float = 1.0


#: Why an admission was refused (``Admission.why``): a provider's 429 ``retry-after`` blocks the
#: limit; its own window of requests or tokens is full; its ``concurrent=`` slots are all taken.
BLOCKED, WINDOW, SLOTS = "blocked", "window", "slots"
_WHY_TEXT = {BLOCKED: "blocked: a provider's retry-after", WINDOW: "paced: its own limit's window is full",
             SLOTS: "paced: its concurrent calls are all under way"}


@dataclass(frozen=True)
class Admission:
    """``grant``: the grant's id (release it when the call ends), or None with ``wait``: seconds
    until asking again may succeed, and ``why`` (``BLOCKED``, ``WINDOW`` or ``SLOTS``: the longest wait's)."""

    grant: int | None
    wait: float = 0.0
    why: str = ""


def waiting_reason(limits: Collection[str], whys: Collection[str]) -> str:
    """A run's status reason while it rests at its rate limits: said as it is, a provider's block or
    the limit's own pacing (a run paced by its own window read "blocked: a provider's retry-after")."""
    said = [_WHY_TEXT[w] for w in (BLOCKED, WINDOW, SLOTS) if w in whys] or ["paced: its own limit"]
    return f"waiting for rate limit {', '.join(limits)} ({'; '.join(said)})"


def acquire(engine: Engine, rule: RateRule, now: float, hold: float) -> Admission:
    """Admit one call through ``rule`` at ``now`` (counting as under way for at most ``hold``
    seconds if it is never released), or say how long to wait."""
    window = rule.per + rule.margin
    since = now - window  # a call that ended before this counts no more
    widest = _widest[rule.name] = max(window, _widest.get(rule.name, 0.0))
    with engine.begin() as conn:
        blocked = conn.execute(
            insert_for(conn, rate_limits).values(name=rule.name, blocked_until=0.0, version=1, updated_at=now)
            .on_conflict_do_update(index_elements=["name"],
                                   set_={"version": rate_limits.c.version + 1, "updated_at": now})
            .returning(rate_limits.c.blocked_until)).scalar_one()
        if blocked > now:  # a 429's retry-after, for the whole fleet
            return Admission(None, blocked - now, BLOCKED)
        g = rate_grants.c
        mine = g.name == rule.name
        under_way = g.ended_at.is_(None) & (g.expires_at > now)
        # counted: ended within the window, or not ended and held within it (``under_way`` among them);
        # two index ranges of (name, ended_at), as grants older than the window stay (``KEEP_ENDED_S``)
        ended = select(g.tokens, g.ended_at).where(mine, g.ended_at > since)
        counted = union_all(ended, select(g.tokens, g.ended_at).where(mine, g.ended_at.is_(None),
                                                                       g.expires_at > since)).subquery()
        waits: list[tuple[float, str]] = []
        poll = min(SLOT_POLL, rule.per / 4)  # a call under way frees its place when it ends: ask again soon
        if rule.requests is not None or rule.tokens is not None:
            count, used, busy = conn.execute(
                select(func.count(), func.coalesce(func.sum(counted.c.tokens), 0),
                       func.count().filter(counted.c.ended_at.is_(None)))).one()
            if rule.requests is not None and count >= rule.requests:
                waits.append((poll if busy else _ends_leaving(conn, ended, count - rule.requests) - since, WINDOW))
            if rule.tokens is not None and used >= rule.tokens:
                waits.append((poll if busy else _ends_leaving(conn, ended, 0) - since, WINDOW))
        if rule.concurrent is not None:
            held = conn.execute(select(func.count()).where(mine, under_way)).scalar_one()
            if held >= rule.concurrent:
                waits.append((poll, SLOTS))
        if waits:
            wait, why = max(waits)
            return Admission(None, max(wait, 0.001), why)
        # grants that count for nothing any more, under any window a rule of this name may have
        gone = now - max(widest, KEEP_ENDED_S)
        conn.execute(delete(rate_grants).where(mine, g.ended_at <= gone))
        conn.execute(delete(rate_grants).where(mine, g.ended_at.is_(None), g.expires_at <= gone))
        grant = conn.execute(insert(rate_grants).values(name=rule.name, granted_at=now, expires_at=now + hold,
                                                        tokens=0).returning(g.id)).scalar_one()
        return Admission(int(grant))


def _ends_leaving(conn: Connection, ended: Select[tuple[int, float]], offset: int) -> float:
    """When the ``offset``-th earliest-ended counted call ended (all counted calls have ended)."""
    column = ended.selected_columns.ended_at
    return float(conn.execute(ended.with_only_columns(column).order_by(column).offset(offset).limit(1)).scalar_one())


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
