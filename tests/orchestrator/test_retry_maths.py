"""Retry maths and classification (pure), then retries as the driver performs them.

The driver-level tests use the inline executor and a SQLite file: every assertion reads
the store, the only truth. Backoffs there use tiny ``base``/``cap`` so the durable timers
fire within milliseconds. The crash test runs a real driver in a subprocess, SIGKILLs it
(``RAYSAGA_FAULTS``) right after the commit that scheduled a retry, and resumes the run.
"""

from __future__ import annotations

import os
import random
import statistics
import subprocess
import sys
import textwrap
import time
import uuid
from pathlib import Path
from typing import Any

import pytest

import raysaga
from raysaga import Permanent, RetryPolicy, RunOptions, RunStatus, StepContext, Transient, Workflow
from raysaga.errors import InvalidOptionError
from raysaga.orchestrator.retry import backoff_delay, http_status, is_transient
from raysaga.state import NodeStatus, SqlStore
from tests.support.files import import_file

# ---------------------------------------------------------------------------- backoff


def _ceiling(policy: RetryPolicy, attempt: int) -> float:
    growth: float = 2 ** (attempt - 1)
    return min(policy.cap, policy.base * growth)


@pytest.mark.parametrize("attempt", [1, 2, 3, 4, 6, 9, 20])
def test_full_jitter_stays_within_the_ceiling_and_spreads(attempt: int) -> None:
    policy = RetryPolicy(base=0.5, cap=30.0)
    rng = random.Random(1234 + attempt)
    ceiling = _ceiling(policy, attempt)
    draws = [backoff_delay(attempt, policy, rng) for _ in range(2000)]
    assert all(0.0 <= d <= ceiling for d in draws), (min(draws), max(draws), ceiling)
    # uniform(0, c): mean c/2, stdev c/sqrt(12); with 2000 draws the mean's stdev is ~0.0065c
    assert statistics.fmean(draws) == pytest.approx(ceiling / 2, rel=0.05)
    assert statistics.pstdev(draws) == pytest.approx(ceiling / 12 ** 0.5, rel=0.08)
    # it really spreads over the whole range: both ends are reached
    assert min(draws) < 0.02 * ceiling and max(draws) > 0.98 * ceiling


def test_ceiling_doubles_then_caps() -> None:
    policy = RetryPolicy(base=1.0, cap=10.0)
    rng = random.Random(7)
    maxima = [max(backoff_delay(a, policy, rng) for _ in range(500)) for a in range(1, 7)]
    expected = [1, 2, 4, 8, 10, 10]
    for got, ceiling in zip(maxima, expected, strict=True):
        assert 0.9 * ceiling < got <= ceiling


def test_backoff_is_reproducible_from_the_seed() -> None:
    policy = RetryPolicy(base=2.0, cap=60.0)
    one = [backoff_delay(a % 5 + 1, policy, random.Random(99)) for a in range(10)]
    two = [backoff_delay(a % 5 + 1, policy, random.Random(99)) for a in range(10)]
    assert one == two
    seq_a, seq_b = random.Random(5), random.Random(6)
    assert [backoff_delay(3, policy, seq_a) for _ in range(5)] != [backoff_delay(3, policy, seq_b) for _ in range(5)]


def test_zero_base_means_no_wait() -> None:
    policy = RetryPolicy(base=0.0, cap=10.0)
    assert {backoff_delay(a, policy, random.Random(a)) for a in range(1, 6)} == {0.0}


@pytest.mark.parametrize("kwargs", [{"max_attempts": 0}, {"base": -1.0}, {"cap": -0.5}])
def test_policy_refuses_nonsense(kwargs: dict[str, Any]) -> None:
    with pytest.raises(ValueError):
        RetryPolicy(**kwargs)


# ---------------------------------------------------------------------------- classification


class HTTPFailure(Exception):
    """Like httpx/anthropic errors: the status on the exception."""

    def __init__(self, status_code: int) -> None:
        super().__init__(f"HTTP {status_code}")
        self.status_code = status_code


class _Response:
    def __init__(self, status_code: int) -> None:
        self.status_code = status_code


class ResponseHolder(Exception):
    """Like ``requests.HTTPError``: the status on ``.response``."""

    def __init__(self, status_code: int) -> None:
        super().__init__(f"HTTP {status_code}")
        self.response = _Response(status_code)


@pytest.mark.parametrize("status", [408, 425, 429, 500, 502, 503, 504, 529])
@pytest.mark.parametrize("kind", [HTTPFailure, ResponseHolder])
def test_transient_http_statuses(kind: type[Exception], status: int) -> None:
    exc = kind(status)
    assert http_status(exc) == status
    assert is_transient(exc)


@pytest.mark.parametrize("status", [400, 401, 403, 404, 409, 413, 422])
@pytest.mark.parametrize("kind", [HTTPFailure, ResponseHolder])
def test_permanent_http_statuses(kind: type[Exception], status: int) -> None:
    assert not is_transient(kind(status))


@pytest.mark.parametrize(
    "exc",
    [TimeoutError("slow"), ConnectionError("down"), ConnectionResetError("reset"), ConnectionRefusedError(),
     BrokenPipeError(), Transient("overloaded")],
    ids=lambda e: type(e).__name__,
)
def test_transient_exceptions(exc: BaseException) -> None:
    assert is_transient(exc)


@pytest.mark.parametrize(
    "exc",
    [ValueError("bad"), KeyError("k"), TypeError("t"), ZeroDivisionError(), Permanent("refused"),
     raysaga.NotJSONableError("x"), raysaga.UserError("wrong call"), RuntimeError("boom")],
    ids=lambda e: type(e).__name__,
)
def test_permanent_exceptions(exc: BaseException) -> None:
    assert not is_transient(exc)


def test_library_exception_names_are_transient() -> None:
    class WorkerCrashedError(Exception):
        pass

    class ReadTimeout(Exception):
        pass

    class SubclassOfIt(WorkerCrashedError):
        pass

    assert is_transient(WorkerCrashedError())
    assert is_transient(ReadTimeout())
    assert is_transient(SubclassOfIt())


def test_ray_worker_crash_is_transient() -> None:
    ray_exceptions = pytest.importorskip("ray.exceptions")
    assert is_transient(ray_exceptions.WorkerCrashedError())
    assert is_transient(ray_exceptions.GetTimeoutError())


def test_anthropic_sdk_errors_are_classified() -> None:
    anthropic = pytest.importorskip("anthropic")
    # the SDK ships its own httpx fork in some versions; use whatever it imports
    httpx_mod = sys.modules.get("httpx2") or pytest.importorskip("httpx")
    request = httpx_mod.Request("POST", "https://api.anthropic.com/v1/messages")

    def status_error(cls: type[Exception], status: int) -> Exception:
        return cls("boom", response=httpx_mod.Response(status, request=request), body=None)  # type: ignore[call-arg]

    assert is_transient(anthropic.APIConnectionError(request=request))
    assert is_transient(anthropic.APITimeoutError(request=request))
    assert is_transient(status_error(anthropic.RateLimitError, 429))
    assert is_transient(status_error(anthropic.InternalServerError, 500))
    assert is_transient(status_error(anthropic.APIStatusError, 529))  # overloaded
    if hasattr(anthropic, "OverloadedError"):
        assert is_transient(status_error(anthropic.OverloadedError, 529))
    assert not is_transient(status_error(anthropic.BadRequestError, 400))
    assert not is_transient(status_error(anthropic.AuthenticationError, 401))
    assert not is_transient(status_error(anthropic.NotFoundError, 404))
    assert not is_transient(status_error(anthropic.UnprocessableEntityError, 422))


class QuotaError(Exception):
    pass


def test_policy_overrides_the_rules() -> None:
    assert not is_transient(QuotaError())
    assert is_transient(QuotaError(), RetryPolicy(transient=(QuotaError,)))
    assert not is_transient(TimeoutError(), RetryPolicy(permanent=(TimeoutError,)))
    # a subclass counts
    assert not is_transient(ConnectionResetError(), RetryPolicy(permanent=(ConnectionError,)))
    # permanent wins over transient when both match
    both = RetryPolicy(transient=(QuotaError,), permanent=(Exception,))
    assert not is_transient(QuotaError(), both)
    # the same class in both is a slip, refused (permanent would win silently)
    with pytest.raises(InvalidOptionError, match="QuotaError is in both transient= and permanent="):
        RetryPolicy(transient=(QuotaError, TimeoutError), permanent=(QuotaError,))
    # the user's declaration wins over raysaga's own markers and HTTP rules
    assert not is_transient(Transient("x"), RetryPolicy(permanent=(Transient,)))
    assert is_transient(HTTPFailure(404), RetryPolicy(transient=(HTTPFailure,)))
    # an unrelated policy leaves the rules alone
    assert is_transient(TimeoutError(), RetryPolicy(permanent=(QuotaError,)))


# ---------------------------------------------------------------------------- the driver


def _run(wf: Workflow, url: str, input: Any = None, **options: Any) -> raysaga.RunRecord:
    return raysaga.run(wf, input, store=url, executor="inline", options=RunOptions(**options))


def _node(store: SqlStore, run_id: str, node: str) -> Any:
    return next(n for n in store.nodes(run_id) if n.node_id == node and n.fan_index == -1)


FAST = RetryPolicy(max_attempts=3, base=0.02, cap=0.03)


def test_transient_failures_are_retried_until_success(sqlite_url: str) -> None:
    attempts: list[int] = []
    wf = Workflow("flaky")

    @wf.step()
    def prepare(input: int) -> int:
        return input + 1

    @wf.step(retry=FAST)
    def call(ctx: StepContext, prepare: int) -> int:
        attempts.append(ctx.attempt)
        if ctx.attempt < 3:
            raise ConnectionError(f"attempt {ctx.attempt} dropped")
        return prepare * 10

    record = _run(wf, sqlite_url, 4)
    assert record.status == RunStatus.COMPLETED
    assert record.output == {"call": 50}
    assert attempts == [1, 2, 3]
    store = SqlStore(sqlite_url)
    node = _node(store, record.run_id, "call")
    assert (node.status, node.attempt, node.output) == (NodeStatus.COMPLETED, 3, 50)
    assert _node(store, record.run_id, "prepare").attempt == 1
    retries = [e for e in store.events(record.run_id) if e.kind == "retry_scheduled"]
    assert [(e.node_id, e.data["attempt"]) for e in retries] == [("call", 1), ("call", 2)]
    for event in retries:
        assert 0.0 <= event.data["delay"] <= _ceiling(FAST, event.data["attempt"])
        assert "dropped" in event.data["error"]["message"]
    assert store.get_run(record.run_id).retries_used == 2
    store.close()


def test_transient_failures_exhaust_the_attempts(sqlite_url: str) -> None:
    calls: list[int] = []
    wf = Workflow("always-down")

    @wf.step(retry=FAST)
    def call(ctx: StepContext) -> int:
        calls.append(ctx.attempt)
        raise TimeoutError("upstream timed out")

    record = _run(wf, sqlite_url)
    assert record.status == RunStatus.FAILED
    assert calls == [1, 2, 3]
    store = SqlStore(sqlite_url)
    node = _node(store, record.run_id, "call")
    assert (node.status, node.attempt) == (NodeStatus.FAILED, 3)
    assert node.error["type"] == "TimeoutError" and node.error["reason"] == "3 attempts exhausted"
    assert "'call'" in (record.status_reason or "")
    store.close()


@pytest.mark.parametrize("error", [ValueError("bad amount"), Permanent("card declined"), HTTPFailure(422)],
                         ids=["ValueError", "Permanent", "HTTP422"])
def test_permanent_error_is_not_retried(sqlite_url: str, error: Exception) -> None:
    calls: list[int] = []
    wf = Workflow("permanent")

    @wf.step()
    def ok(input: int) -> int:
        return input

    @wf.step(retry=RetryPolicy(max_attempts=5, base=0.01, cap=0.01))
    def charge(ctx: StepContext, ok: int) -> int:
        calls.append(ctx.attempt)
        raise error

    record = _run(wf, sqlite_url, 1)
    assert calls == [1]
    assert record.status == RunStatus.FAILED
    assert "'charge'" in (record.status_reason or ""), record.status_reason
    assert record.error is not None
    assert record.error["node"] == "charge"
    store = SqlStore(sqlite_url)
    node = _node(store, record.run_id, "charge")
    assert (node.status, node.attempt) == (NodeStatus.FAILED, 1)
    assert node.error["type"] == type(error).__name__ and node.error["transient"] is False
    assert _node(store, record.run_id, "ok").status == NodeStatus.COMPLETED
    kinds = [e.kind for e in store.events(record.run_id)]
    assert "retry_scheduled" not in kinds and "node_failed" in kinds
    assert store.get_run(record.run_id).retries_used == 0
    store.close()


def test_retry_budget_is_shared_across_nodes(sqlite_url: str) -> None:
    calls: dict[str, list[int]] = {"first": [], "second": []}
    generous = RetryPolicy(max_attempts=10, base=0.01, cap=0.01)
    wf = Workflow("budget")

    @wf.step(retry=generous)
    def first(ctx: StepContext) -> int:
        calls["first"].append(ctx.attempt)
        if ctx.attempt == 1:
            raise Transient("blip")
        return 1

    @wf.step(retry=generous)
    def second(ctx: StepContext, first: int) -> int:
        calls["second"].append(ctx.attempt)
        raise Transient("still down")

    record = _run(wf, sqlite_url, retry_budget=2)
    assert record.status == RunStatus.FAILED
    # one retry spent by 'first', one by 'second', then the budget is gone
    assert calls == {"first": [1, 2], "second": [1, 2]}
    store = SqlStore(sqlite_url)
    node = _node(store, record.run_id, "second")
    assert (node.status, node.attempt) == (NodeStatus.FAILED, 2)
    assert node.error["reason"] == "retry budget exhausted"
    assert "'second'" in (record.status_reason or "")
    assert store.get_run(record.run_id).retries_used == 2
    assert len([e for e in store.events(record.run_id) if e.kind == "retry_scheduled"]) == 2
    store.close()


def test_non_critical_failure_skips_only_its_dependents(sqlite_url: str) -> None:
    called: list[str] = []
    wf = Workflow("optional")

    @wf.step()
    def root(input: int) -> int:
        called.append("root")
        return input

    @wf.step(critical=False)
    def enrich(root: int) -> int:
        called.append("enrich")
        raise Permanent("enrichment service refused")

    @wf.step()
    def use_enriched(enrich: int) -> int:
        called.append("use_enriched")
        return enrich

    @wf.step()
    def report(use_enriched: int, core2: int) -> int:
        called.append("report")
        return use_enriched + core2

    @wf.step()
    def core(root: int) -> int:
        called.append("core")
        return root * 2

    @wf.step()
    def core2(core: int) -> int:
        called.append("core2")
        return core + 1

    record = _run(wf, sqlite_url, 5)
    assert record.status == RunStatus.COMPLETED
    assert record.output == {}  # the only sink, 'report', was skipped
    assert sorted(called) == ["core", "core2", "enrich", "root"]
    store = SqlStore(sqlite_url)
    status = {n.node_id: n for n in store.nodes(record.run_id)}
    assert status["enrich"].status == NodeStatus.FAILED and status["enrich"].attempt == 1
    for skipped in ("use_enriched", "report"):
        assert status[skipped].status == NodeStatus.SKIPPED
        error = status[skipped].error
        assert error is not None
        assert "'enrich'" in error["reason"]
    assert [status[s].output for s in ("root", "core", "core2")] == [5, 10, 11]
    assert {status[s].status for s in ("root", "core", "core2")} == {NodeStatus.COMPLETED}
    skipped_events = {e.node_id for e in store.events(record.run_id) if e.kind == "node_skipped"}
    assert skipped_events == {"use_enriched", "report"}
    store.close()


def test_non_critical_failure_with_an_independent_sink(sqlite_url: str) -> None:
    wf = Workflow("optional-sink")

    @wf.step(critical=False, retry=FAST)
    def flaky(input: int) -> int:
        raise ConnectionError("gone")

    @wf.step()
    def after_flaky(flaky: int) -> int:
        return flaky

    @wf.step()
    def main(input: int) -> int:
        return input + 100

    record = _run(wf, sqlite_url, 1)
    assert record.status == RunStatus.COMPLETED
    assert record.output == {"main": 101}
    store = SqlStore(sqlite_url)
    node = _node(store, record.run_id, "flaky")
    assert (node.status, node.attempt) == (NodeStatus.FAILED, 3)
    assert _node(store, record.run_id, "after_flaky").status == NodeStatus.SKIPPED
    store.close()


def test_non_critical_fan_out_item_failure_skips_only_dependents(sqlite_url: str) -> None:
    """Items finish in one batch; one fails for good: its siblings in the batch must not crash the driver."""
    wf = Workflow("optional-fanout")

    @wf.step()
    def plan(input: int) -> list[int]:
        return list(range(input))

    @wf.map("plan", critical=False)
    def item(plan: int) -> int:
        if plan == 1:
            raise Permanent(f"item {plan} refused")
        return plan * 10

    @wf.step()
    def gather(item: list[int]) -> int:
        return sum(item)

    @wf.step()
    def count(plan: list[int]) -> int:
        return len(plan)

    record = _run(wf, sqlite_url, 3)
    assert record.status == RunStatus.COMPLETED
    assert record.output == {"count": 3}
    store = SqlStore(sqlite_url)
    nodes = {n.label: n for n in store.nodes(record.run_id)}
    assert nodes["item[1]"].status == NodeStatus.FAILED
    assert nodes["item[1]"].error is not None
    assert "item 1 refused" in nodes["item[1]"].error["message"]
    assert nodes["item"].status == NodeStatus.FAILED
    assert nodes["gather"].error is not None
    assert nodes["gather"].status == NodeStatus.SKIPPED and "'item'" in nodes["gather"].error["reason"]
    assert nodes["count"].status == NodeStatus.COMPLETED
    store.close()


# ---------------------------------------------------------------------------- a crash during backoff

FLOW = '''
from pathlib import Path

from raysaga import RetryPolicy, StepContext, Transient, Workflow

wf = Workflow("backoff_crash")


@wf.step()
def first(input: dict) -> int:
    return 1


@wf.step(retry=RetryPolicy(max_attempts=3, base=BASE, cap=BASE))
def flaky(ctx: StepContext, input: dict, first: int) -> int:
    with open(input["log"], "a") as fh:
        fh.write(f"{ctx.attempt}\\n")
    if ctx.attempt == 1:
        raise Transient("first attempt fails")
    return first + ctx.attempt
'''

DRIVER = '''
import random
import sys

# the flow module was written next to this script, whose folder Python puts first on sys.path
from {module} import wf

from raysaga import RunOptions, create_run
from raysaga.orchestrator import Driver, InlineExecutor
from raysaga.state import SqlStore

store = SqlStore(sys.argv[2])
options = RunOptions(lease_ttl=0.6)
create_run(wf, {{"log": sys.argv[4]}}, store=store, run_id=sys.argv[3], options=options)
Driver(wf, store, InlineExecutor(), sys.argv[3], options=options, rng=random.Random(int(sys.argv[5]))).drive()
print("NOT KILLED")
'''

BASE = 3.0


def _seed_with_delay_between(low: float, high: float) -> int:
    """A seed whose first full-jitter draw after attempt 1 lies in [low, high] seconds."""
    for seed in range(1000):
        if low <= random.Random(seed).uniform(0.0, BASE) <= high:
            return seed
    raise AssertionError("no seed found")



def test_crash_during_backoff_resumes_the_wait_not_a_new_attempt(tmp_path: Path, sqlite_url: str) -> None:
    module = f"flow_{uuid.uuid4().hex[:8]}"
    (tmp_path / f"{module}.py").write_text(FLOW.replace("BASE", repr(BASE)))
    script = tmp_path / "driver.py"
    script.write_text(textwrap.dedent(DRIVER.format(module=module)))
    log = tmp_path / "attempts.log"
    run_id = "backoff-crash-1"
    seed = _seed_with_delay_between(1.6, 2.4)
    env = {**os.environ, "RAYSAGA_FAULTS": "after_commit:flaky"}
    # the first commit naming 'flaky' is the one that schedules its retry: inline, non-effect
    proc = subprocess.run([sys.executable, str(script), str(tmp_path), sqlite_url, run_id, str(log), str(seed)],
                          env=env, capture_output=True, text=True, timeout=120)
    assert proc.returncode == -9, (proc.returncode, proc.stdout, proc.stderr)
    assert "NOT KILLED" not in proc.stdout

    store = SqlStore(sqlite_url)
    crashed = _node(store, run_id, "flaky")
    assert (crashed.status, crashed.attempt) == (NodeStatus.RETRYING, 1)
    assert crashed.not_before is not None
    not_before = crashed.not_before
    events = [e for e in store.events(run_id) if e.kind == "retry_scheduled"]
    assert [(e.node_id, e.data["attempt"]) for e in events] == [("flaky", 1)]
    assert 1.6 <= events[0].data["delay"] <= 2.4
    assert log.read_text().split() == ["1"]
    run = store.get_run(run_id)
    assert run.status == RunStatus.RUNNING and run.retries_used == 1

    # The dead driver's lease runs out after lease_ttl: waiting for that is the lease contract.
    assert run.lease_expires_at is not None
    time.sleep(max(0.0, run.lease_expires_at - time.time()) + 0.05)
    resumed_at = time.time()
    assert resumed_at < not_before, "the backoff must still be pending when the resume starts"

    wf = import_file(tmp_path / f"{module}.py", module).wf
    record = raysaga.resume(wf, run_id, store=store, executor="inline")
    assert record.status == RunStatus.COMPLETED, record
    assert record.output == {"flaky": 3}  # first + attempt 2
    assert log.read_text().split() == ["1", "2"]  # attempt 2 next, not a fresh attempt 1
    node = _node(store, run_id, "flaky")
    assert (node.status, node.attempt) == (NodeStatus.COMPLETED, 2)
    assert node.started_at is not None and node.started_at >= not_before
    assert len([e for e in store.events(run_id) if e.kind == "retry_scheduled"]) == 1
    assert store.get_run(run_id).retries_used == 1
    assert _node(store, run_id, "first").attempt == 1  # restored, not re-run
    store.close()


def test_the_colours_ray_adds_are_not_stored_a_users_own_escapes_are() -> None:
    """Ray colours its task errors' ``ray::name()`` prefix: ``status`` showed ``\\x1b[36m``. A
    user's own escapes are kept as raised (shown escaped: tests/security/test_audit_stop33_terminal.py)."""
    from ray.exceptions import RayTaskError

    from raysaga.orchestrator.retry import message_of

    class Coloured(RayTaskError):
        def __init__(self, text: str) -> None:
            Exception.__init__(self, text)

        def __str__(self) -> str:
            return str(self.args[0])

    text = "\x1b[36mray::w-1:a()\x1b[39m (pid=7, ip=10.0.0.1) RuntimeError: failed to import"
    assert message_of(Coloured(text)) == "ray::w-1:a() (pid=7, ip=10.0.0.1) RuntimeError: failed to import"
    assert message_of(RuntimeError(text)) == text
