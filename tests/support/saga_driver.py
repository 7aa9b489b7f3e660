"""``crash_driver`` pointed at ``tests.support.saga_flows``, for the rollback tests.

Same script, same helpers; its driver processes exit 0 for any resting state (the tests read
which from the store): ``spawn``/``run_driver`` pass ``--flows tests.support.saga_flows --any-state-ok``.
"""

from __future__ import annotations

import functools

from tests.support import crash_driver

FLOWS = "tests.support.saga_flows"

Finished = crash_driver.Finished
finish = crash_driver.finish
stop = crash_driver.stop
wait_until = crash_driver.wait_until
wait_lease_expired = crash_driver.wait_lease_expired
load_flows = functools.partial(crash_driver.load_flows, FLOWS)
spawn = functools.partial(crash_driver.spawn, flows=FLOWS, any_state_ok=True)
run_driver = functools.partial(crash_driver.run_driver, flows=FLOWS, any_state_ok=True)
