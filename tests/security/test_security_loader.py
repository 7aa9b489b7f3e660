"""The database does not decide which code an operator runs (item 5).

A run row records ``workflow_ref``; ``raysaga resume``/``retry`` without ``--workflow`` import it.
Whoever can write one row must not be able to make the next operator execute a file: a recorded
ref is a dotted module name that resolves from the operator's own ``sys.path``, never a path.
Each CLI test runs ``python -m raysaga`` in a real subprocess, in the operator's folder.
"""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
from sqlalchemy import create_engine, update

import raysaga
from raysaga.errors import WorkflowLoadError
from raysaga.orchestrator.loader import load_recorded_workflow, load_workflow, recordable_ref
from raysaga.state import RunStatus
from raysaga.state.schema import runs

FLOW = textwrap.dedent('''
    import os
    from raysaga import Permanent, Workflow

    wf = Workflow("loader_demo")

    @wf.step()
    def only() -> int:
        if os.environ.get("LOADER_DEMO_FAIL"):
            raise Permanent("failing on purpose")
        return 7
''')


def evil_module(folder: Path, marker: Path) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / "evil.py"
    path.write_text(f"open({str(marker)!r}, 'w').write('imported')\nwf = None\n")
    return path


def cli(cwd: Path, *args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    full = {**os.environ, **(env or {})}
    full.pop("PYTHONPATH", None)  # the operator's own environment: the installed package, their folder
    return subprocess.run([sys.executable, "-m", "raysaga", *args], cwd=cwd, env=full, capture_output=True,
                          text=True, timeout=120)


@pytest.fixture
def failed_run(tmp_path: Path) -> tuple[Path, str, str]:
    """An operator folder with flows.py, and a failed run of it (so both resume and retry apply)."""
    work = tmp_path / "operator"
    work.mkdir()
    (work / "flows.py").write_text(FLOW)
    db = f"sqlite:///{tmp_path / 'store.db'}"
    wf = load_workflow(f"{work / 'flows.py'}:wf")
    os.environ["LOADER_DEMO_FAIL"] = "1"
    try:
        record = raysaga.run(wf, store=db, run_id="r1", executor="inline", workflow_ref="flows:wf")
    finally:
        del os.environ["LOADER_DEMO_FAIL"]
    assert record.status == RunStatus.FAILED
    return work, db, "r1"


def set_ref(db: str, run_id: str, ref: str | None) -> None:
    engine = create_engine(db)
    try:
        with engine.begin() as conn:
            conn.execute(update(runs).where(runs.c.run_id == run_id).values(workflow_ref=ref))
    finally:
        engine.dispose()


def set_status(db: str, run_id: str, status: RunStatus) -> None:
    engine = create_engine(db)
    try:
        with engine.begin() as conn:
            conn.execute(update(runs).where(runs.c.run_id == run_id).values(status=status.value))
    finally:
        engine.dispose()


@pytest.mark.parametrize("command", ["retry", "resume"])
@pytest.mark.parametrize("ref_kind", ["absolute path", "relative path", "module beside the file"])
def test_a_stored_file_ref_is_never_imported(failed_run: tuple[Path, str, str], tmp_path: Path, command: str,
                                              ref_kind: str) -> None:
    work, db, run_id = failed_run
    marker = tmp_path / "IMPORTED"
    evil = evil_module(tmp_path / "attacker", marker)
    ref = {"absolute path": f"{evil}:wf",
           "relative path": f"{os.path.relpath(evil, work)}:wf",
           "module beside the file": "evil:wf"}[ref_kind]  # not on the operator's sys.path
    set_ref(db, run_id, ref)
    if command == "resume":  # a failed run is at rest: `resume` leaves it (no load); make it resumable
        set_status(db, run_id, RunStatus.RUNNING)

    done = cli(work, command, run_id, "--db", db, "--executor", "inline", "--quiet")

    assert not marker.exists(), f"`raysaga {command}` imported {ref}"
    assert done.returncode == 2, done.stderr
    assert "workflow_ref" in done.stderr and ref in done.stderr and "--workflow" in done.stderr


def test_load_recorded_workflow_refuses_paths_without_importing(tmp_path: Path) -> None:
    marker = tmp_path / "IMPORTED"
    evil = evil_module(tmp_path / "attacker", marker)
    for ref in [f"{evil}:wf", "attacker/evil.py:wf", "evil.py:wf", ".evil:wf", "..attacker.evil:wf",
                "attacker\\evil:wf", "evil:wf", "evil:wf:x", "evil", ""]:
        with pytest.raises(WorkflowLoadError, match="--workflow"):
            load_recorded_workflow(ref, "r9")
    assert not marker.exists()


def test_a_module_ref_importable_by_the_operator_still_resumes(failed_run: tuple[Path, str, str]) -> None:
    work, db, run_id = failed_run
    done = cli(work, "retry", run_id, "--db", db, "--executor", "inline", "--json")
    assert done.returncode == 0, done.stderr
    assert '"completed"' in done.stdout


def test_workflow_option_overrides_a_poisoned_ref(failed_run: tuple[Path, str, str], tmp_path: Path) -> None:
    work, db, run_id = failed_run
    marker = tmp_path / "IMPORTED"
    set_ref(db, run_id, f"{evil_module(tmp_path / 'attacker', marker)}:wf")
    done = cli(work, "retry", run_id, "--db", db, "--executor", "inline", "--workflow", "flows.py:wf", "--quiet")
    assert done.returncode == 0, done.stderr
    assert not marker.exists()


def test_recordable_ref_keeps_only_module_refs(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    work = tmp_path / "op"
    (work / "pkg").mkdir(parents=True)
    (work / "flows.py").write_text(FLOW)
    (work / "pkg" / "__init__.py").write_text("")
    (work / "pkg" / "order.py").write_text(FLOW)
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    (elsewhere / "far.py").write_text(FLOW)
    monkeypatch.chdir(work)
    assert recordable_ref("flows.py:wf") == "flows:wf"
    assert recordable_ref(f"{work / 'flows.py'}:wf") == "flows:wf"
    assert recordable_ref("pkg/order.py:wf") == "pkg.order:wf"
    assert recordable_ref("examples.order.workflow:wf") == "examples.order.workflow:wf"
    assert recordable_ref(f"{elsewhere / 'far.py'}:wf") is None  # not importable from here: record none
    assert recordable_ref("../elsewhere/far.py:wf") is None
    assert recordable_ref("flows:not-an-identifier") is None


@pytest.mark.parametrize("ref", ["venv.__main__:wf", "unittest.__main__:wf", "this:wf", "antigravity:wf",
                                 "json.tool:wf", "raysaga.__main__:wf", "raysaga.orchestrator.cli:wf",
                                 "test.regrtest:wf"])
def test_a_stored_ref_to_a_program_or_the_stdlib_runs_nothing(tmp_path: Path, ref: str,
                                                               monkeypatch: pytest.MonkeyPatch) -> None:
    """Importing ``venv.__main__`` creates virtualenvs, ``unittest.__main__`` runs tests, ``this``
    prints the Zen, ``antigravity`` opens a browser: a recorded ref naming a ``__main__`` module,
    the standard library or raysaga itself is refused before anything is imported."""
    work = tmp_path / "empty-operator-folder"
    work.mkdir()
    db = f"sqlite:///{tmp_path / 'store.db'}"
    (tmp_path / "src").mkdir()
    (tmp_path / "src" / "flows.py").write_text(FLOW)
    wf = load_workflow(f"{tmp_path / 'src' / 'flows.py'}:wf")
    raysaga.create_run(wf, store=db, run_id="r1")
    set_ref(db, "r1", ref)  # a pending run: `resume` must load its workflow

    done = cli(work, "resume", "r1", "--db", db, "--executor", "inline", "--quiet",
               env={"BROWSER": "true"})

    assert done.returncode == 2, done.stdout + done.stderr
    assert list(work.iterdir()) == [], "the refused ref ran a program in the operator's folder"
    assert done.stdout == "" and "Beautiful is better" not in done.stderr
    assert "workflow_ref" in done.stderr and ref in done.stderr and "--workflow" in done.stderr
    monkeypatch.chdir(work)  # in this process too: were it imported, what it wrote would land here
    monkeypatch.setattr(sys, "argv", ["raysaga"])
    with pytest.raises(WorkflowLoadError, match="--workflow"):
        load_recorded_workflow(ref, "r1")
    assert list(work.iterdir()) == []
    if not ref.startswith("test."):  # refused by where it is found (the stdlib folder), not by name
        assert recordable_ref(ref) is None
