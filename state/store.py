"""The ``Store`` interface: everything raysaga keeps durably goes through it.

One implementation (``SqlStore``) serves SQLite and PostgreSQL. The orchestrator never
writes SQL; it hands the store a ``Batch`` under a ``Lease`` and the store applies it in
one transaction guarded by the lease's fence.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Iterable, Mapping
from typing import Any

from raysaga.state.models import (
    Batch,
    BreakerRecord,
    EffectRecord,
    EventRecord,
    Lease,
    MemoryEntry,
    NewRun,
    NodeRecord,
    RunRecord,
    RunSnapshot,
    RunStatus,
    RunSummary,
    SignalKind,
    SignalRecord,
)
from raysaga.state.prune import PruneReport
from raysaga.state.rate_limits import Admission, RateRule


class Store(ABC):
    """Durable state of runs. Every method is one transaction."""

    @abstractmethod
    def create_run(self, new: NewRun) -> RunRecord:
        """Insert a run in ``pending``; ``RunExistsError`` if the id is taken."""

    @abstractmethod
    def get_run(self, run_id: str, *, lenient: bool = False) -> RunRecord:
        """The run row; ``RunNotFoundError`` if absent. A run value (input, output) kept in a blob
        that is missing, altered or not JSON raises ``BlobIntegrityError``, unless ``lenient``:
        then it reads as None (its ``*_digest`` still names it), for status checks and operator
        commands (cancel, status) on a damaged run; never for data a step receives."""

    @abstractmethod
    def list_runs(self, status: RunStatus | None = None, limit: int = 50, *, workflow: str | None = None,
                  before: tuple[float, str] | None = None) -> list[RunSummary]:
        """Newest first, summary columns only, keyset-paged by ``before`` (a summary's ``cursor``);
        a row that cannot be read comes back with ``corrupt`` set instead of failing the list."""

    @abstractmethod
    def snapshot(self, run_id: str) -> RunSnapshot:
        """The run with all its nodes, effects and unconsumed signals, in a constant number of queries."""

    @abstractmethod
    def transition(
        self,
        run_id: str,
        expected_version: int,
        status: RunStatus,
        *,
        reason: str | None = None,
        data: Any = None,
    ) -> RunRecord:
        """Compare-and-set the run's status and append an event; for callers without a lease
        (operators). ``ConcurrencyConflict`` if the version moved, ``IllegalTransitionError``
        if the state machine forbids it."""

    @abstractmethod
    def claim(self, run_id: str, owner: str, ttl: float, *, take_from: str | None = None) -> Lease:
        """Take the run's lease if free or expired, incrementing its fence; else ``LeaseHeldError``.
        ``take_from``: an owner the caller proved dead (its process is gone); its lease is taken
        at once, in the same compare-and-set."""

    @abstractmethod
    def renew(self, lease: Lease) -> Lease:
        """Extend the lease; ``LeaseLostError`` if the fence moved."""

    @abstractmethod
    def release(self, lease: Lease) -> None:
        """Give the lease up (no error if it was already lost)."""

    @abstractmethod
    def commit(self, lease: Lease, batch: Batch) -> RunRecord | None:
        """Apply a driver's batch atomically under ``AND fence = ?``; ``LeaseLostError`` on a stale
        fence (nothing is written, breaker counts included). Returns the run row when the batch
        changed its status."""

    @abstractmethod
    def get_blobs(self, digests: Iterable[str]) -> dict[str, bytes]:
        """Blob bytes by digest, verified against it (``BlobIntegrityError`` on a mismatch); missing
        digests are absent from the result."""

    @abstractmethod
    def load_blobs(self, wanted: Mapping[str, str]) -> dict[str, Any]:
        """JSON values of blobs by digest (``wanted``: digest -> where it is used, for messages);
        ``BlobIntegrityError`` when one is missing, altered or not JSON."""

    @abstractmethod
    def put_blobs(self, blobs: dict[str, bytes]) -> None:
        """Store blobs by digest (insert-once; a row whose bytes were altered is repaired)."""

    @abstractmethod
    def nodes(self, run_id: str) -> list[NodeRecord]: ...

    @abstractmethod
    def effects(self, run_id: str) -> list[EffectRecord]: ...

    @abstractmethod
    def events(self, run_id: str, after_seq: int = 0, limit: int | None = None) -> list[EventRecord]: ...

    @abstractmethod
    def send_signal(self, run_id: str, kind: SignalKind | str, node_id: str | None = None,
                    payload: Any = None) -> SignalRecord:
        """Queue an operator signal (cancel, approve, reject) for the run's driver; ``UserError``
        for another kind."""

    @abstractmethod
    def pending_signals(self, run_id: str) -> list[SignalRecord]: ...

    @abstractmethod
    def memory_get(self, run_id: str, key: str) -> MemoryEntry:
        """A key of the run's shared blackboard (version 0 if never written)."""

    @abstractmethod
    def memory_cas(self, lease: Lease, key: str, value: Any, expected_version: int, writer: str) -> MemoryEntry:
        """Compare-and-set a blackboard key under the lease's fence; returns the entry as it stands."""

    @abstractmethod
    def breaker_get(self, name: str) -> BreakerRecord:
        """A circuit breaker's state (closed with no failures if never recorded)."""

    @abstractmethod
    def breaker_cas(self, record: BreakerRecord, expected_version: int) -> bool:
        """Store a breaker's new state unless another driver changed it first (for ``admit``'s
        probe; call outcomes are counted through ``Batch.breakers``)."""

    @abstractmethod
    def rate_acquire(self, rule: RateRule, now: float, hold: float) -> Admission:
        """Admit one call through a fleet-wide rate limit, or say how long to wait
        (``raysaga.state.rate_limits``)."""

    @abstractmethod
    def rate_release(self, grant: int, tokens: int, now: float) -> None:
        """A call admitted by ``grant`` ended at ``now`` having used ``tokens``: its slot is free."""

    @abstractmethod
    def rate_block(self, name: str, until: float, now: float) -> None:
        """Admit nothing through the limit ``name`` before ``until`` (a 429's retry-after)."""

    @abstractmethod
    def prune(self, older_than: float, statuses: Iterable[RunStatus | str] | None = None, batch_size: int = 500,
              dry_run: bool = False) -> PruneReport:
        """Delete runs at rest (terminal or parked) not updated for ``older_than`` seconds, with
        their nodes, events, effects, signals, memory and the blobs no other row references, in
        batches of ``batch_size`` runs (one short transaction each); ``dry_run`` only counts."""

    @abstractmethod
    def close(self) -> None: ...
