"""Signal dispositions for the processes a test starts (``preexec_fn=`` of ``subprocess.Popen``).

A child inherits an ignored SIGINT, and a driver or worker keeps an inherited SIG_IGN for SIGINT
(``raysaga.orchestrator.stop_signals``). A test suite started in the background (``nohup
.ci/run &``: a non-interactive shell starts a background job with SIGINT ignored) would then pass
that on to every driver it starts, and a test that stops one with SIGINT would wait in vain. A
test that sends SIGINT starts its child with ``preexec_fn=sigint_default``, so it passes in the
foreground and in the background alike; ``sigint_ignored`` starts one the way such a shell does.
"""

from __future__ import annotations

import signal


def sigint_default() -> None:
    """In the child, before exec: SIGINT's default disposition, whatever the test run inherited."""
    signal.signal(signal.SIGINT, signal.SIG_DFL)


def sigint_ignored() -> None:
    """In the child, before exec: SIGINT ignored, as ``cmd &`` in a non-interactive shell leaves it."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)
