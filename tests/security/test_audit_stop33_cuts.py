"""Stop 33 audit: a piece of a secret left where text was cut before the store's scrub.

Errors are scrubbed before they are cut (docs/security.md), but two cuts ran first:

- a fan-out policy's reason (``Fail(reason)``, ``Continue(reason)``, what ``on_partial_failure``
  raised) was cut to 2,000 characters by ``sagas.policy`` before anything scrubbed it: a secret
  across the cut lost its tail, and the store's scrub, which looks for whole values and whole
  shapes, let its first characters into the step's error, the run's error and the event log;
- a value declared secret in the driver only (a ``Secret`` input's value, ``register_secret``)
  is unknown to the Ray worker that scrubs and cuts a failed attempt's message
  (``test_audit_stop33_ray``), and the driver cuts the run's reason from that message again.

Now a policy's reason is scrubbed before it is cut, and ``scrub_text`` masks the piece of a
declared secret a cut leaves at a text's end (its first 8+ characters) or start (its last 8+).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

import raysaga
from raysaga import Permanent, Workflow, on_partial_failure
from raysaga.sagas import Continue, Decision, Fail
from raysaga.state import SqlStore
from raysaga.state.redact import MARKER, register_secret, register_secret_env, scrub, scrub_text
from tests.support.store_scan import rows_holding

DECLARED = "audit33-declared-" + "d" * 24
IN_ENV = "audit33-env-value-" + "e" * 24


def pieces(secret: str, size: int = 10) -> list[str]:
    return [secret[i:i + size] for i in range(len(secret) - size + 1)]


@pytest.fixture
def secret(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> str:
    if request.param == "declared":
        register_secret(DECLARED)
        return DECLARED
    monkeypatch.setenv("AUDIT33_VENDOR_TOKEN", IN_ENV)  # a secret-named variable: every process knows it
    return IN_ENV


def _flow(name: str, decide: Any) -> Workflow:
    wf = Workflow(name)

    @wf.step()
    def plan(input: int) -> list[int]:
        return [0, 1]

    @wf.map("plan", policy=on_partial_failure(decide))
    def item(plan: int) -> int:
        if plan == 1:
            raise Permanent("item 1 is out of stock")
        return plan

    return wf


@pytest.mark.parametrize("secret", ["declared", "env"], indirect=True)
@pytest.mark.parametrize("verdict", ["fail", "continue", "raise"])
def test_a_policy_reason_cut_across_a_secret_leaves_no_piece_of_it(tmp_path: Path, secret: str,
                                                                   verdict: str) -> None:
    def decide(result: Any) -> Decision:
        # the cut at 2,000 characters falls inside the secret (raised: after "on_partial_failure raised ...: ")
        if verdict == "raise":
            raise RuntimeError("x" * (1985 - len("on_partial_failure raised RuntimeError: ")) + secret)
        return (Fail if verdict == "fail" else Continue)("x" * 1985 + secret)

    url = f"sqlite:///{tmp_path / 'policy.db'}"
    store = SqlStore(url)
    try:
        record = raysaga.run(_flow(f"audit_stop33_policy_{verdict}", decide), 1, store=store, executor="inline")
    finally:
        store.close()
    assert record.status.value == ("completed" if verdict == "continue" else "failed")
    assert rows_holding(url, pieces(secret)) == ""
    assert rows_holding(url, [MARKER]), "the reason is kept, with the secret masked"


def test_a_cut_declared_secret_is_masked_at_either_end_of_a_text() -> None:
    register_secret(DECLARED)
    head, tail = DECLARED[:12], DECLARED[-12:]
    assert scrub_text("x" * 30 + head) == "x" * 30 + MARKER  # text[:n] cut after its start
    assert scrub_text(tail + " and the rest") == MARKER + " and the rest"  # text[-n:] cut before its end
    assert scrub({"message": "boom " + DECLARED[:-1], "n": 3}) == {"message": "boom " + MARKER, "n": 3}
    # a cut marked inside a longer text: "holds {repr(value)[:77]}...: Expecting ..."
    assert scrub_text(f"holds '{head}...: not JSON") == f"holds '{MARKER}...: not JSON"
    assert scrub_text(f"the model declined: {head!r}") == f"the model declined: '{MARKER}'"  # f"{text[:n]!r}"
    # shorter than a secret can be, or not at an end: text, not a piece (and a whole one is masked anyway)
    for text in ("x" + DECLARED[:7], DECLARED[-7:] + "y", head + " in the middle", "[redacted] " + MARKER):
        assert scrub_text(text) == text
    assert scrub_text(f"a {DECLARED} b") == f"a {MARKER} b"


def test_a_cut_secret_of_a_registered_variable_is_masked(monkeypatch: pytest.MonkeyPatch) -> None:
    value = "audit33-cred-" + "c" * 20
    monkeypatch.setenv("AUDIT33_VENDOR_CRED", value)  # not a secret-named variable: declared by name
    register_secret_env("AUDIT33_VENDOR_CRED")
    assert scrub_text("login failed for " + value[:15]) == "login failed for " + MARKER


def test_a_long_declared_secret_is_found_in_pieces_too() -> None:
    """A 4 KB private key given as a ``Secret``: its prefixes as one pattern nest too deep for
    ``re`` (RecursionError at registration), so pieces are found by their first characters."""
    from raysaga.state.redact import _pieces

    key = "-----BEGIN PRIVATE KEY-----" + "".join(chr(65 + (i * 7) % 26) for i in range(4000))
    pieces = _pieces(frozenset({key}))
    assert pieces is not None
    assert pieces.sub("x" * 10 + key[:3000]) == "x" * 10 + MARKER
    assert pieces.sub(key[-2500:] + " (end)") == MARKER + " (end)"
    assert pieces.sub("nothing of it here") == "nothing of it here"
