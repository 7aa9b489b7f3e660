"""Group commit over a short window for a fan-out's plain items.

A wide fan-out of short items comes back as a stream of small chunks. Committing each one as it
arrives made a 10,000-item fan-out pay ~100 fsync'd transactions, during which the driver neither
absorbs nor sends, and the workers run dry. Plain items are at-least-once (a crash before their
commit re-runs them, as it re-runs the ones in flight), so their completions may wait a few
milliseconds for the next ones and share one commit.

Only a batch made of nothing but completed items waits: a ledger row, a run transition or
counter, a retry's timer, a failure, an agent's turn or anything of a rollback is committed at
once, as before. A batch waits at most ``window`` seconds from its first completion, and at most
``max_rows`` rows.
"""

from __future__ import annotations

from raysaga.state import Batch

#: How long a plain item's completion may wait for others to share its commit.
WINDOW_S = 0.02
#: At most this many rows wait (a bound on the commit's size, and on what a crash re-runs).
MAX_ROWS = 4096


class CommitPacer:
    def __init__(self, window: float = WINDOW_S, max_rows: int = MAX_ROWS) -> None:
        self.window = window
        self.max_rows = max_rows
        self._since: float | None = None  # when the waiting batch got its first completion
        self._events_seen = 0  # its events already seen to be items_completed (O(1) an event)

    def may_wait(self, batch: Batch, shell: Batch, now: float) -> bool:
        """Whether ``batch`` (the machine's) may stay uncommitted for now; ``shell``: the
        driver's own pending writes, which never wait.

        Only the compact rows of plain items (``Batch.items``) wait: any ``NodeWrite`` (an
        agent's turn, an approval, a failure, a 'running' row) is committed at once."""
        if (not batch.items or batch.nodes or batch.run is not None or batch.effects or batch.blobs
                or batch.consumed_signals or batch.breakers or not shell.empty()
                or len(batch.items) >= self.max_rows):
            return False
        seen = self._events_seen if self._events_seen <= len(batch.events) else 0
        if any(e.kind != "items_completed" for e in batch.events[seen:]):
            return False
        self._events_seen = len(batch.events)
        if self._since is None:
            self._since = now
        return now - self._since < self.window

    def deadline(self) -> float | None:
        """When the waiting batch must be committed (None: nothing waits)."""
        return None if self._since is None else self._since + self.window

    def committed(self) -> None:
        self._since, self._events_seen = None, 0
