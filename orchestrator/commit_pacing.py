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

from raysaga.state import Batch, NodeStatus

#: How long a plain item's completion may wait for others to share its commit.
WINDOW_S = 0.02
#: At most this many rows wait (a bound on the commit's size, and on what a crash re-runs).
MAX_ROWS = 4096


class CommitPacer:
    def __init__(self, window: float = WINDOW_S, max_rows: int = MAX_ROWS) -> None:
        self.window = window
        self.max_rows = max_rows
        self._since: float | None = None  # when the waiting batch got its first completion
        self._checked = (0, 0)  # its node writes and events already seen to be items' (O(1) a row)

    def may_wait(self, batch: Batch, shell: Batch, now: float) -> bool:
        """Whether ``batch`` (the machine's) may stay uncommitted for now; ``shell``: the
        driver's own pending writes, which never wait."""
        if (not shell.empty() or batch.run is not None or batch.effects or batch.blobs or batch.consumed_signals
                or batch.breakers or len(batch.nodes) + len(batch.items) >= self.max_rows
                or not (batch.nodes or batch.items)):
            return False
        nodes, events = self._checked
        if nodes > len(batch.nodes) or events > len(batch.events):
            nodes = events = 0  # not the batch seen last: look at all of it
        if any(n.fan_index < 0 or n.status != NodeStatus.COMPLETED for n in batch.nodes[nodes:]):
            return False
        if any(e.kind != "items_completed" for e in batch.events[events:]):
            return False
        self._checked = (len(batch.nodes), len(batch.events))
        if self._since is None:
            self._since = now
        return now - self._since < self.window

    def deadline(self) -> float | None:
        """When the waiting batch must be committed (None: nothing waits)."""
        return None if self._since is None else self._since + self.window

    def committed(self) -> None:
        self._since, self._checked = None, (0, 0)
