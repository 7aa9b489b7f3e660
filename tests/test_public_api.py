# The mistakes table below calls the API wrongly on purpose, to check what a user without a type
# checker gets at run time; that mypy refuses those calls too is what the typed options are for.
# mypy: disable-error-code="call-arg,arg-type,call-overload,list-item,dict-item,return-value"
"""The public API: what ``raysaga`` exports (grouped, documented, lazy), how its decorators are
typed, and that every mistake a user can make with it raises a ``RaySagaError``.

The call forms themselves live in ``test_public_api_forms.py``, which pytest runs and mypy
checks (``test_documented_forms_type_check`` below).
"""

from __future__ import annotations

import functools
import inspect
import re
import subprocess
import sys
import textwrap
from pathlib import Path
from typing import Any

import pytest

import raysaga
from raysaga import (
    FanOutResult,
    InvalidOptionError,
    RateLimit,
    RaySagaError,
    RetryPolicy,
    RunOptions,
    Secret,
    UserError,
    Workflow,
    WorkflowDefinitionError,
    min_success_ratio,
    on_partial_failure,
    quorum,
)
from raysaga.agents import Agent, LoopPolicy, ScriptedModel, tool
from raysaga.errors import UnknownOptionError
from raysaga.sagas.policy import FanOutPolicy, ItemFailure
from raysaga.state import NewRun
from raysaga.testing import CrashAt

HERE = Path(__file__).resolve()
REPO = next(d for d in HERE.parents if (d / "pyproject.toml").is_file())

# ----------------------------------------------------------------------------- the surface

#: ``raysaga.__all__``, group by group, in its order. Adding or removing an export is a
#: deliberate API change: it shows up here, in the root docstring and in docs/api.md.
GROUPS: dict[str, list[str]] = {
    "declaring a workflow": ["NOT_APPLIED", "Approval", "Ask", "RateLimit", "RetryPolicy", "Saga", "Secret",
                             "StepContext", "StepFailed", "Workflow"],
    "fan-out policies": ["ALL", "BEST_EFFORT", "Compensate", "Continue", "Fail", "FanOutResult", "RetryFailed",
                         "min_success_ratio", "on_partial_failure", "quorum"],
    "running": ["Client", "RunOptions", "Worker", "cancel", "configure_tracing", "create_run", "fork", "replay",
                "resume", "retry", "run"],
    "the store": ["RunRecord", "RunStatus", "RunView", "Store", "open_store", "prune"],
    "failing a step on purpose": ["Permanent", "StepFailure", "Transient"],
    "errors": ["RaySagaError", "UserError", "InvalidInputError", "InvalidOptionError", "NotJSONableError",
               "SecretUnavailableError", "WorkflowDefinitionError", "StoreError", "LeaseHeldError",
               "LeaseLostError", "RunExistsError", "RunNotFoundError", "StoreUnavailableError",
               "StoreOutageError", "DriverInterrupted"],
}


def test_the_exports_are_pinned_group_by_group() -> None:
    assert raysaga.__all__ == [name for names in GROUPS.values() for name in names]


def test_every_export_resolves_and_nothing_else_is_public() -> None:
    namespace: dict[str, Any] = {}
    exec("from raysaga import *", namespace)
    assert set(raysaga.__all__) <= namespace.keys()
    lazy = raysaga._LAZY
    assert set(lazy) <= set(raysaga.__all__), "a lazy name missing from __all__"
    for name, module in lazy.items():  # each lazy name is the object its module defines
        assert getattr(raysaga, name) is getattr(sys.modules[module], name)
    stray = [n for n in dir(raysaga) if not n.startswith("_") and n not in raysaga.__all__
             and not inspect.ismodule(getattr(raysaga, n))]
    assert not stray, f"public-looking names outside __all__: {stray}"


def test_every_export_is_documented() -> None:
    doc = (REPO / "docs" / "api.md").read_text()
    listed = set(re.findall(r"`([A-Za-z_]+)", doc))
    missing = [name for name in raysaga.__all__ if name not in listed or name not in (raysaga.__doc__ or "")]
    assert not missing, f"in raysaga.__all__ but not in docs/api.md and the root docstring: {missing}"


def test_every_error_descends_from_the_root() -> None:
    errors = [getattr(raysaga, n) for n in GROUPS["errors"] + GROUPS["failing a step on purpose"]]
    assert all(issubclass(e, RaySagaError) for e in errors)


def _public_callables() -> list[tuple[str, Any]]:
    import raysaga.agents
    import raysaga.testing

    found = [(f"raysaga.{n}", getattr(raysaga, n)) for n in raysaga.__all__]
    found += [(f"raysaga.agents.{n}", getattr(raysaga.agents, n)) for n in raysaga.agents.__all__]
    found += [(f"raysaga.testing.{n}", getattr(raysaga.testing, n)) for n in raysaga.testing.__all__]
    found += [(f"Workflow.{n}", getattr(Workflow, n)) for n in ("step", "map", "agent", "compensation")]
    found += [(f"Saga.{n}", getattr(raysaga.Saga, n)) for n in ("step", "run", "resume")]
    return [(name, obj) for name, obj in found if callable(obj) and not (
        isinstance(obj, type) and (issubclass(obj, BaseException) or getattr(obj, "_is_protocol", False)))]


@pytest.mark.parametrize(("name", "obj"), _public_callables(), ids=lambda v: v if isinstance(v, str) else "")
def test_no_public_callable_takes_untyped_keyword_options(name: str, obj: Any) -> None:
    try:
        params = inspect.signature(obj).parameters.values()
    except (TypeError, ValueError):  # a builtin or an enum: nothing to check
        return
    catch_all = [p.name for p in params if p.kind is p.VAR_KEYWORD]
    assert not catch_all, f"{name} takes **{catch_all[0]}: give each option its own typed keyword"


# ----------------------------------------------------------------------------- laziness


def _modules_after(code: str) -> list[str]:
    probe = f"{code}\nimport sys; print(' '.join(sorted(sys.modules)))"
    out = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, check=True, cwd=REPO)
    return out.stdout.split()


def _ray_and_driver(modules: list[str]) -> list[str]:
    return [m for m in modules if m == "ray" or m.startswith("ray.") or m.startswith("raysaga.orchestrator.driver")
            or m.startswith("raysaga.orchestrator.executor") or m == "anthropic"]


def test_import_raysaga_imports_only_the_errors() -> None:
    modules = _modules_after("import raysaga")
    assert [m for m in modules if m.startswith("raysaga")] == ["raysaga", "raysaga._lazy", "raysaga.errors"]
    assert not [m for m in modules if m.split(".")[0] in {"ray", "pydantic", "sqlalchemy", "networkx", "anthropic"}]


@pytest.mark.parametrize("code", [
    "import raysaga.state",
    "from raysaga import Workflow, RetryPolicy, quorum, open_store",
    "from raysaga.cli import app",  # what `raysaga --help` and `raysaga status RUN` import
])
def test_the_light_entry_points_load_neither_the_driver_nor_ray(code: str) -> None:
    assert not _ray_and_driver(_modules_after(code))


def test_the_cli_help_loads_no_store_and_no_dsl() -> None:
    """``raysaga --help`` pays for typer and rich, not SQLAlchemy, alembic or networkx."""
    modules = _modules_after("from raysaga.cli import app")
    heavy = {m.split(".")[0] for m in modules} & {"sqlalchemy", "alembic", "networkx", "ray", "anthropic"}
    assert not heavy, f"importing the CLI loads {sorted(heavy)}"
    assert "raysaga.orchestrator.workflow" not in modules


def test_raysaga_status_loads_neither_the_dsl_nor_the_driver(tmp_path: Path) -> None:
    """A read command imports the store, not the workflow DSL (networkx), the driver or Ray."""
    url = f"sqlite:///{tmp_path / 'store.db'}"
    store = raysaga.open_store(url)
    store.create_run(NewRun(run_id="r-1", workflow_name="w", workflow_version="1", definition_hash="0" * 64,
                            input={"x": 1}, trace_id="0" * 32))
    store.close()
    code = textwrap.dedent(f"""
        import sys
        from raysaga.cli import app
        try:
            app(["status", "r-1", "--db", {url!r}])
        except SystemExit as stop:
            assert stop.code in (0, 1), stop.code
    """)
    modules = _modules_after(code)
    assert "raysaga.orchestrator.cli_status" in modules and "sqlalchemy" in modules  # it did read the run
    assert not _ray_and_driver(modules)
    assert not {m.split(".")[0] for m in modules} & {"networkx", "alembic"}
    assert "raysaga.orchestrator.workflow" not in modules


def test_prune_stays_the_function_once_the_store_is_loaded() -> None:
    """``raysaga.prune`` resolves through ``raysaga.state``; a submodule of that name would replace
    the function with the module as soon as the driver or the store imported it."""
    code = textwrap.dedent("""
        import inspect, raysaga
        raysaga.run, raysaga.open_store  # loads the runner and the store, and every module they import
        import raysaga.state.sql_store, raysaga.state.store
        for name, value in (("raysaga.prune", raysaga.prune), ("raysaga.state.prune", raysaga.state.prune)):
            assert inspect.isfunction(value), f"{name} is {value!r}"
        assert raysaga.prune is raysaga.state.prune
    """)
    subprocess.run([sys.executable, "-c", code], check=True, cwd=REPO)


@pytest.mark.parametrize("package", ["raysaga", "raysaga.state", "raysaga.orchestrator"])
def test_no_submodule_shares_a_lazily_exported_name(package: str) -> None:
    """Importing ``package.x`` sets the attribute ``x`` to the module: a lazy name must never be one."""
    import importlib
    import pkgutil

    module = importlib.import_module(package)
    submodules = {info.name for info in pkgutil.iter_modules(module.__path__)}
    assert not submodules & set(module._LAZY), "rename the module: it shadows the export of the same name"


#: What users may import; everything else is implementation (api/__init__.py, docs/api.md).
PUBLIC_MODULES = {"raysaga", "raysaga.agents", "raysaga.testing", "raysaga.errors", "raysaga.types", "raysaga.state",
                  "raysaga.cli"}


def test_examples_and_docs_import_only_public_modules() -> None:
    """A user copies what the examples, the README and the docs do: none of them reaches into
    an implementation module."""
    found: dict[str, set[str]] = {}
    files = [*REPO.glob("examples/**/*.py"), *REPO.glob("docs/*.md"), REPO / "README.md",
             *REPO.glob("examples/**/*.md")]
    for path in files:
        for module in re.findall(r"^\s*(?:from|import) (raysaga[\w.]*)", path.read_text(), re.M):
            if module not in PUBLIC_MODULES:
                found.setdefault(module, set()).add(str(path.relative_to(REPO)))
    assert not found, f"implementation modules imported where users read: {found}"


# ----------------------------------------------------------------------------- errors raised to users


def _agent() -> Agent:
    return Agent("helper", ScriptedModel())


def _step(wf: Workflow, **options: Any) -> None:
    @wf.step(**options)
    def work(input: Any) -> int:
        return 1


def _raw(x: int) -> int:
    return x


MISTAKES: list[tuple[str, Any, type[RaySagaError], str]] = [
    # option objects
    ("RetryPolicy max_attempts=0", lambda: RetryPolicy(max_attempts=0), InvalidOptionError, "max_attempts"),
    ("RetryPolicy base='1'", lambda: RetryPolicy(base="1"), InvalidOptionError, "base"),
    ("RetryPolicy cap=nan", lambda: RetryPolicy(cap=float("nan")), InvalidOptionError, "cap"),
    ("RetryPolicy a typo", lambda: RetryPolicy(max_attempt=3), UnknownOptionError, "did you mean 'max_attempts'"),
    ("RetryPolicy positional", lambda: RetryPolicy(3), UnknownOptionError, "positional"),
    ("RetryPolicy transient='x'", lambda: RetryPolicy(transient=("x",)), InvalidOptionError, "exception classes"),
    ("RunOptions a typo", lambda: RunOptions(lease_tt=5), UnknownOptionError, "did you mean 'lease_ttl'"),
    ("RunOptions lease_ttl=0", lambda: RunOptions(lease_ttl=0), InvalidOptionError, "lease_ttl"),
    ("RunOptions labels", lambda: RunOptions(labels={"a": 1}), InvalidOptionError, "labels"),
    ("LoopPolicy then", lambda: LoopPolicy(then="stop"), InvalidOptionError, "then"),
    ("LoopPolicy window", lambda: LoopPolicy(window=0), InvalidOptionError, "window"),
    # fan-out policies
    ("quorum(0)", lambda: quorum(0), WorkflowDefinitionError, "quorum"),
    ("quorum('2')", lambda: quorum("2"), WorkflowDefinitionError, "whole number"),
    ("quorum(True)", lambda: quorum(True), WorkflowDefinitionError, "whole number"),
    ("min_success_ratio(2)", lambda: min_success_ratio(2), WorkflowDefinitionError, r"\(0, 1\]"),
    ("min_success_ratio('x')", lambda: min_success_ratio("x"), WorkflowDefinitionError, r"\(0, 1\]"),
    ("on_partial_failure(3)", lambda: on_partial_failure(3), WorkflowDefinitionError, "function"),
    ("FanOutPolicy by hand", lambda: FanOutPolicy("quorum"), WorkflowDefinitionError, "quorum\\(k\\)"),
    ("a decision that is none", lambda: on_partial_failure(lambda r: "yes").decide(
        FanOutResult(total=1, failures=[ItemFailure(index=0, error_type="E", message="m", attempts=1)])),
     UserError, "return Continue"),
    # workflow decorators
    ("Workflow(3)", lambda: Workflow(3), WorkflowDefinitionError, "workflow name"),
    ("Workflow: a typo", lambda: Workflow("w", versoin="2"), WorkflowDefinitionError, "did you mean 'version'"),
    ("Workflow: version by position", lambda: Workflow("w", "2"), WorkflowDefinitionError, "positional"),
    ("compensation: a typo", lambda: Workflow("w").compensation("pay", retires=2), WorkflowDefinitionError,
     "did you mean 'retry'"),
    ("step: a typo", lambda: _step(Workflow("w"), retires=3), WorkflowDefinitionError,
     r"step 'work': unknown option\(s\) \['retires'\].*did you mean 'retry'"),
    ("step: fn and a typo", lambda: Workflow("w").step(_raw, nmae="x"), WorkflowDefinitionError,
     r"step '_raw': unknown option\(s\) \['nmae'\]"),
    ("step: too many positionals", lambda: Workflow("w").step(_raw, _raw), WorkflowDefinitionError,
     "positional"),
    ("step: timeout='5'", lambda: _step(Workflow("w"), timeout="5"), WorkflowDefinitionError, "timeout"),
    ("step: timeout=inf", lambda: _step(Workflow("w"), timeout=float("inf")), WorkflowDefinitionError, "timeout"),
    ("step: retry=3", lambda: _step(Workflow("w"), retry=3), WorkflowDefinitionError, "RetryPolicy"),
    ("step: after=3", lambda: _step(Workflow("w"), after=3), WorkflowDefinitionError, "after="),
    ("step: after=[fn]", lambda: _step(Workflow("w"), after=[_raw]), WorkflowDefinitionError, "step names"),
    ("step: critical='no'", lambda: _step(Workflow("w"), critical="no"), WorkflowDefinitionError, "critical"),
    ("step: effect=1", lambda: _step(Workflow("w"), effect=1), WorkflowDefinitionError, "effect"),
    ("step: name=3", lambda: _step(Workflow("w"), name=3), WorkflowDefinitionError, "name"),
    ("step: reconcile=3", lambda: _step(Workflow("w"), effect=True, reconcile=3), WorkflowDefinitionError,
     "reconcile"),
    ("step: on_failure", lambda: _step(Workflow("w"), critical=False, on_failure="ignore"),
     WorkflowDefinitionError, "on_failure"),
    ("map: no step", lambda: Workflow("w").map(), WorkflowDefinitionError, "over"),
    ("map: not a name", lambda: Workflow("w").map(3), WorkflowDefinitionError, "name of the step"),
    ("map: a typo", lambda: Workflow("w").map("plan", gpus=1)(_raw), WorkflowDefinitionError,
     r"step '_raw': unknown option\(s\) \['gpus'\].*did you mean 'num_gpus'"),
    ("agent: not an Agent", lambda: Workflow("w").agent("helper"), WorkflowDefinitionError, "Agent"),
    ("agent: effect=True", lambda: Workflow("w").agent(_agent(), effect=True)(_raw), WorkflowDefinitionError,
     "not an effect itself"),
    ("agent: placement", lambda: Workflow("w").agent(_agent(), num_cpus=1)(_raw), WorkflowDefinitionError,
     "do not apply to an agent node"),
    ("compensation: retry=3", lambda: Workflow("w").compensation("pay", retry=3), WorkflowDefinitionError,
     "RetryPolicy"),
    # tools and agents
    ("tool: a typo", lambda: tool(nme="x")(_raw), WorkflowDefinitionError,
     r"tool '_raw': unknown option\(s\) \['nme'\].*did you mean 'name'"),
    ("tool: fn and a typo", lambda: tool(_raw, efect=True), WorkflowDefinitionError, "did you mean 'effect'"),
    ("tool: effect='yes'", lambda: tool(effect="yes")(_raw), WorkflowDefinitionError, "effect"),
    ("tool: key=[1]", lambda: tool(key=[1])(_raw), WorkflowDefinitionError, "key="),
    ("tool: key unknown", lambda: tool(key="y")(_raw), WorkflowDefinitionError, "unknown arguments"),
    ("tool: retry=3", lambda: tool(retry=3)(_raw), WorkflowDefinitionError, "RetryPolicy"),
    ("tool: timeout=0", lambda: tool(timeout=0)(_raw), WorkflowDefinitionError, "timeout"),
    ("tool: a partial", lambda: tool(functools.partial(_raw, 1)), WorkflowDefinitionError, "name="),
    ("Agent: a typo", lambda: Agent("a", ScriptedModel(), max_turn=3), UnknownOptionError,
     "did you mean 'max_turns'"),
    ("Agent: no model", lambda: Agent("a", "claude-sonnet-4-5"), InvalidOptionError, "model backend"),
    ("Agent: a bare function", lambda: Agent("a", ScriptedModel(), tools=(_raw,)), WorkflowDefinitionError,
     "decorate it with @tool"),
    ("Agent: max_turns='3'", lambda: Agent("a", ScriptedModel(), max_turns="3"), InvalidOptionError, "max_turns"),
    ("Agent: output_type", lambda: Agent("a", ScriptedModel(), output_type=dict), InvalidOptionError,
     "output_type"),
    ("Agent: loop", lambda: Agent("a", ScriptedModel(), loop="fail"), InvalidOptionError, "LoopPolicy"),
    ("RateLimit limits nothing", lambda: RateLimit(name="api"), InvalidOptionError, "limits nothing"),
    ("RateLimit requests=0", lambda: RateLimit(name="api", requests=0), InvalidOptionError, "requests"),
    ("RateLimit per=0", lambda: RateLimit(name="api", requests=5, per=0), InvalidOptionError, "per"),
    ("RateLimit name=''", lambda: RateLimit(name="", requests=5), InvalidOptionError, "name"),
    ("tool: rate_limit=60", lambda: tool(rate_limit=60)(_raw), WorkflowDefinitionError, "RateLimit"),
    ("Agent: rate_limit", lambda: Agent("a", ScriptedModel(), rate_limit=60), InvalidOptionError, "RateLimit"),
    # secrets and test helpers
    ("Secret.from_env('1A')", lambda: Secret.from_env("1A"), InvalidOptionError, "not an environment variable"),
    ("Secret() with neither", lambda: Secret(), InvalidOptionError, "Secret.from_env"),
    ("CrashAt a typo", lambda: CrashAt("before_pendng"), InvalidOptionError, "unknown crash point"),
]


@pytest.mark.parametrize(("mistake", "call", "error", "message"), MISTAKES, ids=[m[0] for m in MISTAKES])
def test_each_mistake_raises_a_raysaga_error_that_says_what_to_do(
        mistake: str, call: Any, error: type[RaySagaError], message: str) -> None:
    with pytest.raises(error, match=message) as caught:
        call()
    assert isinstance(caught.value, RaySagaError)


def test_option_errors_keep_the_builtin_classes_callers_caught() -> None:
    # what these raised before they had classes of their own: `except ValueError/TypeError` still works
    with pytest.raises(ValueError):
        RetryPolicy(max_attempts=0)
    with pytest.raises(TypeError):
        RetryPolicy(max_attempt=3)
    with pytest.raises(TypeError):
        RunOptions(deadlin=3)


def test_exception_classes_are_normalized_so_policies_stay_hashable() -> None:
    assert RetryPolicy(transient=TimeoutError).transient == (TimeoutError,)
    policy = RetryPolicy(transient=[TimeoutError, ConnectionError])
    assert policy.transient == (TimeoutError, ConnectionError)
    assert hash(policy) == hash(RetryPolicy(transient=(TimeoutError, ConnectionError)))


def test_the_guards_keep_signatures_and_docs() -> None:
    assert "retry" in inspect.signature(Workflow.step).parameters
    assert "Declare a step" in (Workflow.step.__doc__ or "")
    assert list(inspect.signature(RetryPolicy).parameters) == ["max_attempts", "base", "cap", "transient",
                                                               "permanent"]
    assert "name" in inspect.signature(tool).parameters


# ----------------------------------------------------------------------------- typing

#: Each line marked ``# E`` must be a mypy error: typos and wrong types are caught before running.
BAD_FORMS = textwrap.dedent("""\
    from raysaga import RetryPolicy, RunOptions, Workflow
    from raysaga.agents import Agent, tool
    from raysaga.testing import ScriptedModel

    wf = Workflow("bad")
    agent = Agent("helper", ScriptedModel())


    @wf.step(retires=3)  # E
    def a() -> list[int]:
        return [1]


    @wf.step(on_failure="ignore")  # E
    def b() -> int:
        return 1


    @wf.map("a", gpus=1)  # E
    def c(a: int) -> int:
        return a


    @wf.agent(agent, effect=True)  # E
    def d() -> str:
        return ""


    @tool(nme="x")  # E
    def t(x: int) -> int:
        return x


    @wf.step
    def kept(x: int) -> int:
        return x


    kept("1")  # E
    RetryPolicy(max_attempt=3)  # E
    RetryPolicy(3)  # E
    RunOptions(lease_tt=5)  # E
    wf.step(retry=3)  # E
""")


def test_documented_forms_type_check(tmp_path: Path) -> None:
    bad = tmp_path / "bad_forms.py"
    bad.write_text(BAD_FORMS)
    forms = HERE.with_name("test_public_api_forms.py")
    result = subprocess.run([sys.executable, "-m", "mypy", "--no-error-summary", "--show-error-codes", str(forms),
                             str(bad)], capture_output=True, text=True, cwd=REPO)
    errors = [line for line in result.stdout.splitlines() if ": error:" in line]
    assert not [e for e in errors if "test_public_api_forms.py" in e], (
        "a documented call form does not type-check:\n" + "\n".join(errors))
    expected = {n for n, line in enumerate(BAD_FORMS.splitlines(), 1) if line.endswith("# E")}
    flagged = {int(m.group(1)) for e in errors if (m := re.search(r"bad_forms\.py:(\d+):", e))}
    assert flagged == expected, f"mypy flagged lines {sorted(flagged)}, expected {sorted(expected)}:\n{result.stdout}"
