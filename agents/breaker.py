"""Circuit breakers on agent tools: the transition rule lives with the breaker's row in the store.

closed → open after ``threshold`` consecutive failures → half-open once ``cooldown`` has
passed (one probe call goes through) → closed on its success, open again on its failure. The
state is a store row shared by every driver (``raysaga.state.breakers``), and the store applies
the rule itself when it counts a call's outcome in the driver's fenced batch; it is re-exported
here, where agents configure their breakers.
"""

from __future__ import annotations

from raysaga.state.breakers import BreakerPolicy, admit, after_call

__all__ = ["BreakerPolicy", "admit", "after_call"]
