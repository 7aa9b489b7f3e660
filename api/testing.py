"""Testing agent workflows without a network: a scripted model and a guard against the real API.

    from raysaga.testing import ScriptedModel, forbid_real_api, text_reply, tool_reply

    model = ScriptedModel({"Summarize: x": [tool_reply(("search", {"query": "x"})), text_reply("done")]})

    forbid_real_api()                 # from here on, this process may not call api.anthropic.com
    with forbid_real_api():           # ... or only inside the block (the old value comes back)
        ...

``ScriptedModel`` answers a conversation (keyed by its first user message) turn by turn, the same
on every replay, so a resumed run sees exactly what the crashed one saw. ``forbid_real_api`` sets
``RAYSAGA_FORBID_REAL_API=1``, which ``AnthropicModel`` checks before building its client: a call
that would reach the real API fails at once with ``raysaga.Permanent`` (never retried), while a
``base_url`` pointing elsewhere (a local Messages API stand-in) still works. The variable is read
where the model call runs: Ray workers of a cluster started with ``ray start`` need it in their
own environment (export it before starting the cluster); a local Ray started by the driver
inherits the driver's environment when it starts.
"""

from __future__ import annotations

import os
from types import TracebackType

from raysaga.agents.models import FORBID_ENV, ScriptedModel, text_reply, tool_reply

__all__ = ["FORBID_ENV", "ScriptedModel", "forbid_real_api", "text_reply", "tool_reply"]


class RealApiForbidden:
    """The guard, already set; as a context manager it restores the previous value on exit."""

    def __init__(self) -> None:
        self._previous = os.environ.get(FORBID_ENV)
        os.environ[FORBID_ENV] = "1"

    def __enter__(self) -> RealApiForbidden:
        return self

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        self.restore()

    def restore(self) -> None:
        """Put back what ``RAYSAGA_FORBID_REAL_API`` was before (unset if it was unset)."""
        if self._previous is None:
            os.environ.pop(FORBID_ENV, None)
        else:
            os.environ[FORBID_ENV] = self._previous


def forbid_real_api() -> RealApiForbidden:
    """Forbid calls to the real Anthropic API in this process, now.

    Call it once (a ``conftest.py`` is a good place) to forbid them for the rest of the process,
    or use it as ``with forbid_real_api(): ...`` to forbid them for a block only.
    """
    return RealApiForbidden()
