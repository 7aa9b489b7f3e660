"""Whether what a caller gives with an existing run is what the run recorded: its identity options
(labels, deadline, retry budget, queue, its own ``max_driver_deaths``) are fixed when it is
recorded, so ``raysaga run`` resuming it by run id, a retried ``submit`` and ``launch --run-id``
refuse a differing one, naming the option, the recorded value and the given one, where it used
to be silently ignored."""

from __future__ import annotations

from raysaga.errors import UserError
from raysaga.orchestrator.options import RunOptions
from raysaga.state import RunRecord
from raysaga.state.models import MAX_STORED_DEATHS
from raysaga.state.redact import scrub_text


def own_limit(deaths: int) -> int | None:
    """The run's stored ``max_driver_deaths``: None for the default (whoever drives it decides),
    a huge one (``RunOptions`` takes any) as the largest the column holds: never reached either."""
    return None if deaths == RunOptions.max_driver_deaths else min(deaths, MAX_STORED_DEATHS)


def same_labels(existing: RunRecord, given: dict[str, str], what: str) -> None:
    """The labels a retried submit gives (or ``run``, when it gives any) must be the recorded run's
    (``UserError`` naming those that differ): labels are how the run is found (``raysaga list
    --label``), so returning the run as if it matched would leave the caller believing it is tagged
    as asked, and lose the tags. Values are shown scrubbed and cut at 40 characters, given and
    recorded alike (a run recorded before labels holding a secret were refused may hold one)."""
    recorded = existing.labels
    if given == recorded:
        return
    differ = sorted(k for k in set(given) | set(recorded) if given.get(k) != recorded.get(k))
    shown = "; ".join(f"{k!r:.40}: recorded {_value(recorded, k)}, given {_value(given, k)}" for k in differ[:5])
    more = f" (and {len(differ) - 5} more)" if len(differ) > 5 else ""
    raise UserError(f"run {existing.run_id!r} exists with other labels ({shown}{more}): {what} again with the "
                    "labels it was recorded with, or choose another run_id")


#: How far a given ``RunOptions.deadline`` may be from the recorded one (``deadline_at`` minus the
#: run's creation: the two times are taken a moment apart) and still be the same deadline.
DEADLINE_SLACK = 1.0


def same_options(existing: RunRecord, options: RunOptions | None, what: str, *, queue: str | None = None) -> None:
    """The identity options given with an existing run (``run`` resuming it by ``run_id``, a
    retried submit) must be the recorded run's, else ``UserError`` naming the option, the recorded
    value and the given one: they were fixed when the run was recorded, and a differing one was
    silently ignored (the run went on under the recorded ones). An option left at its default (no
    labels, None) is not given: the run resumes as it was recorded.

    Identity, recorded with the run when it is created: ``labels`` (how it is found:
    ``same_labels``), ``deadline`` (recorded as ``deadline_at``: the creation time plus it;
    compared within ``DEADLINE_SLACK`` seconds), ``retry_budget`` (the run's retries, counted
    against the recorded budget) and, for a submit, its ``queue`` (a run recorded without one is
    never claimed by a worker while ``pending``). Per drive, taken by each drive and free to
    change on a resume: ``lease_ttl``, ``release_after``, ``blob_threshold``, ``max_output_bytes``
    (outputs written from then on), ``allow_changed``, ``max_driver_deaths`` of a run recorded
    without its own (the limit of the process that drives it: ``docs/operations.md``), and
    ``token_budget`` / ``cost_budget`` (raising a spent one on resume lets a paused run go on).
    A run that recorded its own ``max_driver_deaths`` keeps it whatever a resume asks, so a
    differing one given is refused (``same_own_deaths``); the default (3) is not given here, as
    ``RunOptions`` cannot tell it from one left out (the CLI, which can, checks an explicit
    ``--max-driver-deaths 3`` itself)."""
    options = options or RunOptions()
    if options.labels:
        same_labels(existing, options.labels, what)
    differ: list[tuple[str, str, str]] = []
    if queue is not None and queue != existing.queue:
        differ.append(("queue", _shown(existing.queue), _shown(queue)))
    if options.deadline is not None:
        recorded = None if existing.deadline_at is None else existing.deadline_at - existing.created_at
        if recorded is None or abs(recorded - options.deadline) > DEADLINE_SLACK:
            differ.append(("deadline", "none" if recorded is None else f"{recorded:.1f}s", f"{options.deadline:g}s"))
    if options.retry_budget is not None and options.retry_budget != existing.retry_budget:
        differ.append(("retry_budget", _shown(existing.retry_budget), _shown(options.retry_budget)))
    if differ:
        shown = "; ".join(f"{name}: recorded {recorded}, given {given}" for name, recorded, given in differ)
        raise UserError(f"run {existing.run_id!r} exists with other options ({shown}): they are fixed when a run is "
                        f"recorded; {what} again without them (or with the recorded ones), or choose another run_id")
    given = options.max_driver_deaths
    same_own_deaths(existing, None if given == RunOptions.max_driver_deaths else given, what)


def same_own_deaths(existing: RunRecord, given: int | None, what: str) -> None:
    """A resume's ``max_driver_deaths`` (``given``; None: not given) must be the run's own limit
    when it recorded one (``UserError`` naming both): the run keeps it whatever a resume asks, so a
    differing one went unheeded, and the caller believed the run parked after their count of
    deaths. A run recorded without one takes any (it is the driving process's limit: per drive).
    A value above the column's largest compares as that largest (``own_limit``)."""
    recorded = existing.max_driver_deaths
    if given is None or recorded is None or own_limit(given) == recorded:
        return
    raise _deaths_differ(existing, given, what)


def same_deaths(existing: RunRecord, options: RunOptions, what: str) -> None:
    """A retried submit's ``max_driver_deaths`` must be the run's own (``UserError`` naming both),
    given or not, as its labels are: the run keeps the limit it was recorded with whatever a later
    call asks, so returning it as if it matched would leave the caller believing it is parked after
    their count of deaths. The default (3) is no limit of its own (recorded as none), and a value
    above the column's largest compares as that largest (``own_limit``)."""
    if own_limit(options.max_driver_deaths) == existing.max_driver_deaths:
        return
    raise _deaths_differ(existing, options.max_driver_deaths, what)


def _deaths_differ(existing: RunRecord, given: int, what: str) -> UserError:
    """The refusal of ``same_deaths`` and ``same_own_deaths``, one wording: a retried submit goes
    through both (``same_options`` first), and is told the same whichever refuses it. The fix named
    (the recorded limit) holds for both; a resume may also leave the limit out."""
    own = existing.max_driver_deaths
    recorded = "none (the driving process's limit)" if own is None else str(own)
    again = "no --max-driver-deaths" if own is None else f"--max-driver-deaths {own}"
    return UserError(f"run {existing.run_id!r} exists with other options (max_driver_deaths: recorded {recorded}, "
                     f"given {given}): it is fixed when a run is recorded; {what} again with {again} "
                     "(RunOptions.max_driver_deaths), or choose another run_id")


def _shown(value: object) -> str:
    return "none" if value is None else f"{scrub_text(str(value), short_values=False)!r:.60}" \
        if isinstance(value, str) else str(value)


def _value(labels: dict[str, str], key: str) -> str:
    # scrubbed: a run recorded before labels holding a secret were refused (6867918) may hold one
    return f"{scrub_text(labels[key], short_values=False)!r:.40}" if key in labels else "none"
