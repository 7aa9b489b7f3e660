"""``crash_driver`` pointed at ``tests/saga_flows.py``, for the rollback tests.

Same script, same helpers; its driver processes exit 0 for any resting state (the tests read
which from the store): ``spawn``/``run_driver`` pass ``--flows saga_flows --any-state-ok``.
"""

from __future__ import annotations

import functools
import importlib.util
import sys
from pathlib import Path
from types import ModuleType

FLOWS = "saga_flows"


def _crash_driver() -> ModuleType:
    if "crash_driver" in sys.modules:  # tests/conftest.py's load_helper registers it by this name
        return sys.modules["crash_driver"]
    spec = importlib.util.spec_from_file_location("crash_driver", Path(__file__).with_name("crash_driver.py"))
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules["crash_driver"] = module
    spec.loader.exec_module(module)
    return module


crash_driver = _crash_driver()
Finished = crash_driver.Finished
finish = crash_driver.finish
stop = crash_driver.stop
wait_until = crash_driver.wait_until
wait_lease_expired = crash_driver.wait_lease_expired
load_flows = functools.partial(crash_driver.load_flows, FLOWS)
spawn = functools.partial(crash_driver.spawn, flows=FLOWS, any_state_ok=True)
run_driver = functools.partial(crash_driver.run_driver, flows=FLOWS, any_state_ok=True)
