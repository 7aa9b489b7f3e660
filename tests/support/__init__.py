"""What the tests share: fakes, harnesses, and the helper modules that driver subprocesses run.

Always imported as ``tests.support.<module>``: the repository root is on ``sys.path`` (pytest's
``pythonpath = ["."]``; driver subprocesses start there with ``python -m tests.support.<module>``,
and Ray workers get the driver's ``sys.path``). Nothing here is collected as a test.

- ``postgres``: a database of its own on the test server (the session's, or one per case);
- ``files``: import a flow module a test generated into its ``tmp_path``;
- ``services``: the deduping fake payment/email provider, served over HTTP (any process can call
  it; the test reads its log), the one the examples' workflows call;
- ``models``: module-level views of ``raysaga.testing.RecordingModel`` journals;
- ``crash_driver``: a driver process a test can kill (``RAYSAGA_FAULTS``) and the helpers that
  launch and poll it; ``saga_driver`` is the same pointed at ``saga_flows``;
- ``kill_sweep``: kill a driver at a crash point, resume the run in a new process, check;
- ``crash_flows``, ``saga_flows``, ``agent_undo_flows``: the workflows those drivers run;
- ``agent_flows``: an agent workflow on the real ``anthropic`` SDK, and its own driver process;
- ``messages_server``: a local stand-in for Anthropic's Messages API;
- ``cli``: invoking the CLI in-process.
- ``store_template``: a migrated empty SQLite store to copy where a test needs one, not a migration.

The helpers a user needs to test their own workflows (a recording model, a deduping in-memory
provider, crash points) live in ``raysaga.testing``; these modules build on them.
"""

from __future__ import annotations

from pathlib import Path

#: The repository root (the folder holding ``pyproject.toml``, ``examples/`` and ``tests/``).
REPO = Path(__file__).resolve().parents[2]
