"""The ``Store`` interface: everything raysaga keeps durably goes through it.

One implementation (``SqlStore``) serves SQLite and PostgreSQL. The orchestrator never
writes SQL; it hands the store a ``Batch`` under a ``Lease`` and the store applies it in
one transaction guarded by the lease's fence.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Collection, Iterable, Mapping, Sequence
from typing import Any

from raysaga.state.claims import Claim
from raysaga.state.dashboard_reads import RunFilter
from raysaga.state.decisions import Decision, Verdict, WaitingApproval
from raysaga.state.models import (
    Batch,
    BreakerRecord,
    EffectRecord,
    EventRecord,
    Lease,
    MemoryEntry,
    NewRun,
    NodeRecord,
    NodeWrite,
    RunRecord,
    RunSnapshot,
    RunStatus,
    RunSummary,
    SignalKind,
    SignalRecord,
)
from raysaga.state.pruning import PruneReport
from raysaga.state.rate_limits import Admission, RateRule
from raysaga.state.stats import Stats
from raysaga.state.worker_rows import WorkerRecord


class Store(ABC):
    """Durable state of runs. Every method is one transaction."""

    @abstractmethod
    def create_run(self, new: NewRun) -> RunRecord:
        """Insert a run in ``pending``; ``RunExistsError`` if the id is taken."""

    @abstractmethod
    def create_claimed(self, new: NewRun, owner: str, ttl: float) -> tuple[RunRecord, Lease]:
        """``create_run``, ``claim`` (by ``owner`` for ``ttl`` s) and the move to ``running``, in
        one transaction: for a driver that creates the run it drives. The same rows and events."""

    @abstractmethod
    def get_run(self, run_id: str, *, lenient: bool = False) -> RunRecord:
        """The run row; ``RunNotFoundError`` if absent. A run value (input, output) kept in a blob
        that is missing, altered or not JSON raises ``BlobIntegrityError``, unless ``lenient``:
        then it reads as None (its ``*_digest`` still names it), for status checks and operator
        commands (cancel, status) on a damaged run; never for data a step receives."""

    @abstractmethod
    def list_runs(self, status: RunStatus | None = None, limit: int = 50, *, workflow: str | None = None,
                  before: tuple[float, str] | None = None, labels: Mapping[str, str] | None = None) -> list[RunSummary]:
        """Newest first, summary columns only, keyset-paged by ``before`` (a summary's ``cursor``),
        with ``labels`` only runs that carry every one of them; a row that cannot be read comes
        back with ``corrupt`` set instead of failing the list."""

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
    def decide(self, run_id: str, node: str, verdict: Verdict, *, by: str, fan_index: int = -1,
               answer: Any = None, comment: str | None = None, decision_id: str | None = None) -> Decision:
        """Record a human decision on a waiting approval node, checked against its stored request
        (``raysaga.state.decisions``); ``UserError`` saying why when it is refused. The same
        ``decision_id`` again returns the decision already recorded."""

    @abstractmethod
    def waiting_approvals(self, approver: str | None = None, run_id: str | None = None) -> list[WaitingApproval]:
        """Approval nodes waiting for a decision (``raysaga inbox``)."""

    @abstractmethod
    def claim_next(self, owner: str, ttl: float, workflows: Mapping[str, str | tuple[str, str]], *,
                   limits: Mapping[str, int] | None = None) -> Claim | None:
        """A worker's claim of the next runnable run of ``workflows`` (name -> definition hash):
        ``raysaga.state.claims``."""

    @abstractmethod
    def claim_of(self, owner: str, ttl: float) -> Claim | None:
        """The claim ``owner`` holds if its ``claim_next`` committed (its answer may have been lost):
        ``raysaga.state.claims.claim_of``."""

    @abstractmethod
    def wake(self, run_id: str, statuses: Iterable[RunStatus], reason: str, kind: str,
             data: Any = None) -> bool:
        """Make a run resting without a driver in one of ``statuses`` due now (a worker takes it up),
        appending an event ``kind``; False when it is not in one of them."""

    @abstractmethod
    def stats(self, since: float | None = None) -> Stats:
        """Operational figures (``raysaga.state.stats``)."""

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
    def rate_extend(self, grants: Collection[int], expires_at: float) -> None:
        """The calls admitted by ``grants`` are still under way: each keeps its place (its
        concurrency slot) until ``expires_at`` at least. A driver that died renews nothing."""

    @abstractmethod
    def worker_register(self, record: WorkerRecord) -> None:
        """Write a starting worker's row (``worker_rows``); rows silent for a week are deleted."""

    @abstractmethod
    def worker_beat(self, worker_id: str, at: float, busy: int) -> bool:
        """Record a worker's beat and its busy slots; False when its row is gone (register again)."""

    @abstractmethod
    def worker_stop(self, worker_id: str, at: float) -> None:
        """Record a worker's clean exit (``stopped_at``)."""

    @abstractmethod
    def workers(self, since: float | None = None) -> list[WorkerRecord]:
        """Every worker row, or those that beat or stopped since ``since``; oldest start first."""

    @abstractmethod
    def prune(self, older_than: float, statuses: Iterable[RunStatus | str] | None = None, batch_size: int = 500,
              dry_run: bool = False) -> PruneReport:
        """Delete runs at rest (terminal or parked) not updated for ``older_than`` seconds, with
        their nodes, events, effects, signals, memory and the blobs no other row references, in
        batches of ``batch_size`` runs (one short transaction each); ``dry_run`` only counts."""

    # Forks and definition pins (raysaga.state.fork_rows; raysaga.orchestrator.fork and .versions).
    @abstractmethod
    def fork_run(self, new: NewRun, inherited: list[tuple[str, int]], data: dict[str, Any]) -> RunRecord:
        """Create the forked run ``new`` with its parent's rows ``inherited`` (``(node_id,
        fan_index)``) copied in (each marked with the run that executed it), and a ``run_forked``
        event holding ``data``, in one transaction; ``RunExistsError`` if the id is taken."""

    @abstractmethod
    def node_states(self, run_id: str) -> list[NodeRecord]:
        """A run's node rows without their outputs (what a fork decides from)."""

    @abstractmethod
    def inherited_effects(self, run_id: str) -> list[EffectRecord]:
        """The ledger rows of the nodes a fork inherited (they stay with the runs that wrote them)."""

    @abstractmethod
    def children(self, run_id: str) -> list[dict[str, Any]]:
        """The runs forked from ``run_id``, oldest first (``run_id``, ``status``, ``forked_from``, ``created_at``)."""

    def lineage(self, roots: set[str]) -> list[str]:
        """Every run of the trees rooted at ``roots`` (the roots, their forks, the forks' forks...):
        the runs that may share a compensation key with a fork of them. One ``children`` read a run."""
        queue, seen = sorted(roots), set(roots)
        found: list[str] = []
        while queue:
            other = queue.pop()
            found.append(other)
            for child in self.children(other):
                if child["run_id"] not in seen:
                    seen.add(child["run_id"])
                    queue.append(child["run_id"])
        return found

    @abstractmethod
    def repin_definition(self, lease: Lease, definition_hash: str, step_hashes: dict[str, str],
                         data: dict[str, Any], *, workflow: tuple[str, str, str | None] | None = None,
                         nodes: Sequence[NodeWrite] = ()) -> RunRecord:
        """Pin the run to another workflow definition (fenced), with a ``definition_changed`` event;
        ``workflow``: the (name, version, module ref) it now records; ``nodes``: rows of removed
        steps closed in the same transaction."""

    # The dashboard's reads (raysaga.state.dashboard_reads; rows as dicts of their columns).
    @abstractmethod
    def run_page(self, f: RunFilter) -> list[dict[str, Any]]:
        """Runs newest first under a filter, summary columns only, keyset-paged."""

    @abstractmethod
    def run_counts(self, f: RunFilter | None = None) -> dict[str, int]:
        """Runs by status under a filter (its status and cursor ignored)."""

    @abstractmethod
    def run_row(self, run_id: str) -> dict[str, Any] | None:
        """A run's summary columns, or None."""

    @abstractmethod
    def step_rows(self, run_id: str, items_cap: int) -> list[dict[str, Any]]:
        """A run's node rows without outputs; of each fan-out only the first ``items_cap`` items."""

    @abstractmethod
    def fan_items(self, run_id: str, node_id: str, after: int = -1, limit: int = 500,
                  status: str | None = None) -> list[dict[str, Any]]:
        """A fan-out's items by index after ``after`` (no outputs)."""

    @abstractmethod
    def node_rows(self, run_id: str, keys: Iterable[tuple[str, int]]) -> list[dict[str, Any]]:
        """The named (node_id, fan_index) rows, no outputs."""

    @abstractmethod
    def step_counts(self, run_id: str, node_ids: Iterable[str]) -> dict[str, dict[str, int]]:
        """Items by status of each named fan-out step."""

    @abstractmethod
    def fanout_sizes(self, run_id: str) -> dict[str, int]:
        """How many items each of the run's fan-outs expanded into."""

    @abstractmethod
    def node_row(self, run_id: str, node_id: str, fan_index: int) -> dict[str, Any] | None:
        """One node row with its output (or its blob's digest) and error."""

    @abstractmethod
    def node_events(self, run_id: str, node_id: str, fan_index: int, limit: int = 500) -> list[EventRecord]:
        """The events naming one node, oldest first."""

    @abstractmethod
    def node_effects(self, run_id: str, node_id: str, fan_index: int) -> list[EffectRecord]:
        """A node's ledger rows, its agent tool calls' and its compensation's included."""

    @abstractmethod
    def sub_rows(self, run_id: str, node_id: str, fan_index: int, limit: int = 400) -> list[dict[str, Any]]:
        """An agent node's turns and tool calls, and its compensation rows, with outputs."""

    @abstractmethod
    def store_metrics(self) -> dict[str, Any]:
        """Store-wide figures for ``/metrics``."""

    @abstractmethod
    def close(self) -> None: ...
