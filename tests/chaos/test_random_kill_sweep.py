"""Invariants 1, 2 and 5 on random DAGs: a driver faulted anywhere and resumed ends as the golden run.

Hypothesis draws workflows (``tests.support.chaos_gen``: 5-50 steps, effects, compensations,
fan-outs with partial-failure policies, non-critical steps, permanent and transient failures);
per DAG a golden run goes uninterrupted in a driver process, then each case faults a driver
at a (point, node) pair the golden run passes, drawn at random, and a new process resumes the
run to rest. ``tests.support.chaos_sweep.check`` compares it with the golden run: status,
output, error, node statuses, ledger keys (none pending), one effective call per golden key
and no other key, repeats only of calls uncertain at the fault, and the compensations' order
(nodes that raced a failure may differ, within limits: see ``chaos_sweep.raced``; the sweep
counts the cases where some did).

Most faults are SIGKILLs; one in four raises ``FaultInjected`` out of the driver instead. CI:
a few DAGs of 5-20 steps, the same ones each time (derandomised); ``RAYSAGA_FULL_SWEEP=1``:
200 random DAGs of 5-50 steps (``RAYSAGA_CHAOS_DAGS`` and ``RAYSAGA_CHAOS_KILLS`` override the
counts). A failing example prints its spec and its golden run.
"""

from __future__ import annotations

import itertools
import json
import os
import random
from collections.abc import Iterator

import pytest
from hypothesis import HealthCheck, Phase, given, note, settings
from hypothesis import strategies as st

from tests.support.chaos_gen import dag_specs, describe
from tests.support.chaos_sweep import fault_case, golden_run
from tests.support.kill_sweep import FULL_SWEEP
from tests.support.services import FakeServices

LONG = 4 * 3600  # seconds: a full sweep's own time limit
DAGS = int(os.environ.get("RAYSAGA_CHAOS_DAGS", "200" if FULL_SWEEP else "3"))
KILLS = int(os.environ.get("RAYSAGA_CHAOS_KILLS", "2"))
MAX_STEPS = 50 if FULL_SWEEP else 20
_counter = itertools.count()
STATS: dict[str, int] = {"dags": 0, "faults": 0, "kills": 0, "raises": 0, "raced": 0, "rolled_back": 0}


@pytest.fixture(scope="module")
def services() -> Iterator[FakeServices]:
    with FakeServices() as fake:
        yield fake


@pytest.fixture(scope="module", autouse=True)
def report_counts() -> Iterator[None]:
    yield
    print(f"\nrandom kill sweep: {STATS}")


@pytest.mark.timeout(LONG if FULL_SWEEP else 300)  # the suite-wide 300 s stops a full sweep
@settings(max_examples=DAGS, deadline=None, derandomize=not FULL_SWEEP, database=None,
          phases=[Phase.explicit, Phase.generate],  # no shrinking: each example is real processes
          suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
@given(spec=dag_specs(5, MAX_STEPS), seed=st.integers(0, 2**32 - 1))
def test_random_dags_faulted_anywhere_end_as_golden(spec: dict[str, object], seed: int, services: FakeServices,
                                                    tmp_path_factory: pytest.TempPathFactory) -> None:
    note(describe(spec))
    note("SPEC " + json.dumps(spec, sort_keys=True))
    folder = tmp_path_factory.mktemp(f"dag{next(_counter)}")
    golden = golden_run(spec, folder, services)
    note(f"golden: {golden.run['status']}, {len(golden.nodes)} nodes, {len(golden.ledger)} ledger rows, "
         f"compensations {golden.undo_order}")
    # the faults come from a drawn seed, not from draws that depend on the golden run's shape
    rng = random.Random(seed)
    kills = rng.sample(golden.reachable, min(KILLS, len(golden.reachable)))
    STATS["dags"] += 1
    STATS["rolled_back"] += golden.run["status"] == "compensated"
    for i, kill in enumerate(kills):
        mode = rng.choice(["kill", "kill", "kill", "raise"])
        note(f"fault {i}: {kill} ({mode})")
        case = folder / f"case{i}"
        case.mkdir()
        race = fault_case(golden, kill, mode, services, case)
        note(f"fault {i}: nodes that raced the failure: {sorted(race)}")
        STATS["faults"] += 1
        STATS["raced"] += bool(race)
        STATS["kills" if mode == "kill" else "raises"] += 1
