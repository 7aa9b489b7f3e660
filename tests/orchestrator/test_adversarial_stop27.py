"""Second adversarial round, the DSL and outputs: what was unchecked at definition time.

- ``Workflow(version=...)`` took anything (``str(version)``). Its run row's column holds 50
  characters of text: a version with NUL or longer than that ran on SQLite and failed every run
  on PostgreSQL with psycopg's ``DataError`` (a lone surrogate failed on both with
  ``UnicodeEncodeError``), long after the workflow was declared. Now a ``WorkflowDefinitionError``
  at ``Workflow(...)``, naming the workflow and the rule.
"""

from __future__ import annotations

from typing import Any

import pytest

import raysaga
from raysaga import RunStatus, Workflow
from raysaga.errors import WorkflowDefinitionError

BAD_VERSIONS = {"nul": "1\x00", "lone-surrogate": "v\ud800", "too-long": "v" * 51, "empty": "", "newline": "1\n2"}


@pytest.mark.parametrize("version", BAD_VERSIONS.values(), ids=list(BAD_VERSIONS))
def test_a_version_no_run_row_can_hold_is_refused_at_definition(version: str) -> None:
    with pytest.raises(WorkflowDefinitionError, match=r"workflow 'shop': version=.* is not valid: use 1 to 50"):
        Workflow("shop", version=version)


@pytest.mark.parametrize("version", ["v" * 50, 2, "2026-05-01"])
def test_a_version_a_row_can_hold_runs_on_both_stores(store_url: str, version: Any) -> None:
    wf = Workflow("shop", version=version)

    @wf.step()
    def total(input: int) -> int:
        return input * 2

    record = raysaga.run(wf, 21, store=store_url, executor="inline")
    assert (record.status, record.output, record.workflow_version) == (RunStatus.COMPLETED, {"total": 42}, str(version))
