"""The deduping fake payment/email provider the tests' workflows call over HTTP.

It is ``examples.order.fake_services``: the examples' workflows call it too, so it lives beside
them, and the tests import it from here only. A daemon-thread HTTP server (``FakeServices``)
that any process can call (a driver subprocess, a Ray worker) while the test reads its log:
per key how many calls arrived (``raw``) and took effect (``effective``), per subject how many
effects happened (``by_subject``). A test whose steps all run in its own process can use the
in-memory ``raysaga.testing.FakeProvider`` instead.
"""

from __future__ import annotations

from examples.order.fake_services import FakeServices, get_log, post, reset, response_id

__all__ = ["FakeServices", "get_log", "post", "reset", "response_id"]
