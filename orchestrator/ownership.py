"""Who drives a run: the lease owner's identity (host, pid, boot id) and whether it is provably gone.

STUB: the interface is fixed here; the implementation is being written.
"""

from __future__ import annotations

from raysaga.state import RunRecord


def describe_lease(run: RunRecord, now: float) -> str:
    """One human line: "live driver pid 123 on host-a (lease 12s left)" or "no live driver since <time>"."""
    if run.lease_owner is None:
        return "no live driver"
    return f"driver {run.lease_owner}"
