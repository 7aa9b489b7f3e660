"""Stop 45, a review of the dashboard's server: with one shared token, a two-person approval was
decided by one person posting as each approver (``by`` was free text), and a non-approver's refusal
listed the approvers; a run started after its workflow's module changed was drawn from the
dashboard's stale import (its new steps missing) under a false note; a module that fails to import
was imported again on every read (its side effects with it); ``--host 0.0.0.0 --token T`` refused
the machine's own address as a Host, and ``--allow-host NAME:PORT`` never matched; a long
``Last-Event-ID`` was a 500; the Host 403 and token 401 were plain text; a path segment that is not
UTF-8 was looked up as U+FFFD; ``/items/STEP?status=bogus`` listed nothing, silently.

Everything over real HTTP (uvicorn on a free port, httpx) but the configuration's refusals.
"""

from __future__ import annotations

import importlib
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import httpx
import pytest

import raysaga
from raysaga import Approval, Ask, Workflow
from raysaga.errors import UserError
from raysaga.orchestrator.dashboard import security
from raysaga.orchestrator.dashboard.security import TOKEN_ENV, Guard
from raysaga.orchestrator.dashboard.server import build
from raysaga.orchestrator.runner import create_run
from raysaga.state import SqlStore
from tests.support.dashboard_serving import serving
from tests.support.files import import_file

MODULE = "tests.dashboard.test_dashboard_review_stop45"
USERS_ENV = "RAYSAGA_DASHBOARD_USERS"
LEAD, CFO, MALLORY = "lead-token-0123456789", "cfo-token-0123456789ab", "mallory-token-0123456789"
TOKEN = "a-long-enough-shared-token"

# ---------------------------------------------------------------- workflows

quorum45 = Workflow("quorum45", version="1")


@quorum45.approval(approvers=["finance-lead", "cfo"], quorum=2)
def bigrefund(input: Any) -> Ask:
    return Ask(prompt="Refund 1,000,000 cents? finance-lead AND cfo", payload=input)


@quorum45.step()
def pay(bigrefund: Approval) -> str:
    return "paid, approved by " + ",".join(bigrefund.by)


served = serving  # (tests/support/dashboard_serving.py: users= and host= go to build)


def _waiting_quorum(url: str, run_id: str) -> str:
    create_run(quorum45, {"amount": 1_000_000}, store=url, run_id=run_id, workflow_ref=f"{MODULE}:quorum45")
    raysaga.resume(quorum45, run_id, store=url, executor="inline")
    return run_id


def _act(http: httpx.Client, run_id: str, body: dict[str, Any], **headers: str) -> httpx.Response:
    csrf = http.get("/api/csrf", headers=headers).json()["csrf"]
    return http.post(f"/api/runs/{run_id}/actions/approve", json={"confirm": True, "node": "bigrefund", **body},
                     headers={"X-Raysaga-CSRF": csrf, **headers})


# ---------------------------------------------------------------- B1: who acts is who signed in


def test_with_users_an_action_is_done_as_the_one_signed_in(tmp_path: Path) -> None:
    """One person could meet a two-person rule by posting as each approver; with ``--user`` the
    token says who acts, a ``by`` naming someone else is a 403, and a non-approver's refusal does
    not list the approvers."""
    url = f"sqlite:///{tmp_path / 'raysaga.db'}"
    run_id = _waiting_quorum(url, "quorum45")
    store = SqlStore(url)
    try:
        users = {"finance-lead": LEAD, "cfo": CFO, "mallory": MALLORY}
        with served(store, users=users) as base, httpx.Client(base_url=base) as http:
            lead = {"Authorization": f"Bearer {LEAD}"}
            assert http.get("/api/runs").status_code == 401
            assert http.get("/api/runs", headers={"Authorization": f"Bearer {TOKEN}"}).status_code == 401
            assert http.get("/api/me", headers=lead).json()["user"] == "finance-lead"
            spoof = _act(http, run_id, {"by": "cfo"}, **lead)
            assert spoof.status_code == 403, spoof.text
            assert "you are signed in as 'finance-lead'" in spoof.json()["error"]
            mallory = _act(http, run_id, {}, Authorization=f"Bearer {MALLORY}")
            assert mallory.status_code == 400, mallory.text
            assert "mallory is not one of its approvers" in mallory.json()["error"]
            assert "cfo" not in mallory.json()["error"] and "finance-lead" not in mallory.json()["error"]
            done = _act(http, run_id, {}, **lead)  # absent `by`: filled in
            assert done.status_code == 200 and done.json()["by"] == "finance-lead", done.text
            # the page's way: ?token= once sets the cookie of that person; "dashboard" is the page's empty field
            first = http.get(f"/?token={CFO}", follow_redirects=False, headers={"Sec-Fetch-Site": "none"})
            assert first.status_code == 303 and CFO in first.headers["set-cookie"]
            assert http.get("/api/me").json()["user"] == "cfo"
            second = _act(http, run_id, {"by": "dashboard"})
            assert second.status_code == 200 and second.json()["by"] == "cfo", second.text
        finished = raysaga.resume(quorum45, run_id, store=url, executor="inline")
        assert finished.output == {"pay": "paid, approved by finance-lead,cfo"}
    finally:
        store.close()


def test_without_users_names_are_labels_as_before(tmp_path: Path) -> None:
    """Without users every holder of the shared token is one principal, and ``by`` is the name it
    gives (the docs say so); the refusal of a non-approver names no approver either."""
    url = f"sqlite:///{tmp_path / 'raysaga.db'}"
    run_id = _waiting_quorum(url, "labels45")
    store = SqlStore(url)
    try:
        with served(store, token=TOKEN) as base, httpx.Client(base_url=base) as http:
            auth = {"Authorization": f"Bearer {TOKEN}"}
            refused = _act(http, run_id, {"by": "mallory"}, **auth)
            assert refused.status_code == 400 and "cfo" not in refused.json()["error"], refused.text
            assert http.get("/api/me", headers=auth).json()["user"] is None
            assert _act(http, run_id, {"by": "cfo"}, **auth).json()["by"] == "cfo"
    finally:
        store.close()


def test_users_are_checked_before_the_dashboard_starts(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(TOKEN_ENV, raising=False)
    monkeypatch.delenv(USERS_ENV, raising=False)
    with pytest.raises(UserError, match="is not NAME=TOKEN"):
        security.resolve_users(["alice"])
    with pytest.raises(UserError, match="too short"):
        security.resolve_users(["alice=short"])
    with pytest.raises(UserError, match="given twice"):
        security.resolve_users([f"alice={LEAD}", f"alice={CFO}"])
    with pytest.raises(UserError, match="another user's too"):
        security.resolve_users([f"alice={LEAD}", f"bob={LEAD}"])
    with pytest.raises(UserError, match="drop the shared one"):
        security.check_bind("127.0.0.1", TOKEN, {"alice": LEAD})
    security.check_bind("0.0.0.0", None, {"alice": LEAD})  # users are a credential: a wide bind is allowed
    people = tmp_path / "users"
    people.write_text(f"# the on-call rota\nfinance-lead={LEAD}\n\n cfo = {CFO} \n")
    monkeypatch.setenv(USERS_ENV, str(people))
    assert security.resolve_users() == {"finance-lead": LEAD, "cfo": CFO}
    monkeypatch.setenv(USERS_ENV, str(tmp_path / "missing"))
    with pytest.raises(UserError, match="cannot read the dashboard's users file"):
        security.resolve_users()


def test_the_cli_takes_users_and_refuses_a_bad_one(tmp_path: Path) -> None:
    env = {k: v for k, v in os.environ.items() if k not in (TOKEN_ENV, USERS_ENV)}
    url = f"sqlite:///{tmp_path / 'x.db'}"
    SqlStore(url).close()
    done = subprocess.run([sys.executable, "-m", "raysaga", "dashboard", "--db", url,
                           "--port", "0", "--user", "alice=short"], capture_output=True, text=True, timeout=60,
                          env=env)
    assert done.returncode == 2, done.stderr
    assert "--user: the entry's token is missing or too short" in done.stderr


# ---------------------------------------------------------------- B2, B3: the graph of a changed or failing module

FLOW_V1 = '''
from raysaga import Workflow

wf = Workflow("evolve45", version="1")


@wf.step()
def first(input):  # noqa: ANN001 - any input
    return 1


@wf.step()
def second(first: int) -> int:
    return first + 1
'''
FLOW_V2 = FLOW_V1 + '''

@wf.step()
def third(second: int) -> int:
    return second + 1
'''


def test_a_run_of_a_changed_module_shows_its_new_steps_and_says_the_import_is_old(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The dashboard's import of a module is the one it made first: a run started from the module
    as changed since was drawn without its new step, under a note calling that import today's code."""
    source = tmp_path / "evolve45_flow.py"
    source.write_text(FLOW_V1)
    os.utime(source, (time.time() - 60, time.time() - 60))
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.delitem(sys.modules, "evolve45_flow", raising=False)
    url = f"sqlite:///{tmp_path / 'raysaga.db'}"
    old = importlib.import_module("evolve45_flow").wf
    create_run(old, None, store=url, run_id="old45", workflow_ref="evolve45_flow:wf")
    raysaga.resume(old, "old45", store=url, executor="inline")
    store = SqlStore(url)
    try:
        with served(store) as base, httpx.Client(base_url=base) as http:
            graph = http.get("/api/runs/old45").json()["graph"]
            assert [n["id"] for n in graph["nodes"]] == ["first", "second"] and not graph.get("note")
            source.write_text(FLOW_V2)  # the module changes while the dashboard runs
            written = time.time()  # (the file system's clock is coarser: a write within its tick looked older)
            os.utime(source, (written, written))
            new = import_file(source, "evolve45_flow_v2").wf  # a worker's fresh import
            create_run(new, None, store=url, run_id="new45", workflow_ref="evolve45_flow:wf")
            raysaga.resume(new, "new45", store=url, executor="inline")
            graph = http.get("/api/runs/new45").json()["graph"]
            assert [n["id"] for n in graph["nodes"]] == ["first", "second", "third"], graph
            assert "holds an older import of evolve45_flow" in graph["note"], graph["note"]
            assert "restart it" in graph["note"] and "today's code" not in graph["note"]
            assert http.get("/api/runs/old45").json()["graph"].get("note") is None
    finally:
        store.close()
        sys.modules.pop("evolve45_flow", None)


FAILS_ON_IMPORT = '''
import os
from pathlib import Path

with open(Path(__file__).with_suffix(".log"), "a") as log:
    log.write("imported\\n")
API = os.environ["RAYSAGA_TEST_ABSENT_45"]
'''


def test_a_module_that_fails_to_import_is_imported_once(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A failed import was not kept: every read of the run's page ran the module's top level again."""
    source = tmp_path / "sidefx45_flow.py"
    source.write_text(FLOW_V1.replace("evolve45", "sidefx45"))
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.delitem(sys.modules, "sidefx45_flow", raising=False)
    monkeypatch.delenv("RAYSAGA_TEST_ABSENT_45", raising=False)
    url = f"sqlite:///{tmp_path / 'raysaga.db'}"
    wf = importlib.import_module("sidefx45_flow").wf
    create_run(wf, None, store=url, run_id="sidefx45", workflow_ref="sidefx45_flow:wf")
    source.write_text(FAILS_ON_IMPORT)  # as the module reads where the dashboard runs
    del sys.modules["sidefx45_flow"]
    importlib.invalidate_caches()
    log = source.with_suffix(".log")
    store = SqlStore(url)
    try:
        with served(store) as base, httpx.Client(base_url=base) as http:
            for _ in range(3):
                graph = http.get("/api/runs/sidefx45").json()["graph"]
                assert graph["source"] == "rows" and "RAYSAGA_TEST_ABSENT_45" in graph["note"], graph
        assert log.read_text().splitlines() == ["imported"]
    finally:
        store.close()
        sys.modules.pop("sidefx45_flow", None)


# ---------------------------------------------------------------- B4: Host names and addresses


def test_with_a_token_an_ip_literal_host_is_answered(tmp_path: Path) -> None:
    """``--host 0.0.0.0 --token T`` refused the machine's own address as a Host (Debian's
    getaddrinfo(hostname) gives loopback only): with a credential an IP literal is accepted."""
    store = SqlStore(f"sqlite:///{tmp_path / 'raysaga.db'}")
    try:
        auth = {"Authorization": f"Bearer {TOKEN}"}
        with served(store, host="0.0.0.0", token=TOKEN) as base, httpx.Client(base_url=base) as http:
            for host in ("203.0.113.7:8780", "[2001:db8::7]:8780"):
                answer = http.get("/api/runs", headers={**auth, "Host": host})
                assert answer.status_code == 200, (host, answer.text)
            refused = http.get("/api/runs", headers={**auth, "Host": "rebound.example:8780"})
            assert refused.status_code == 403
            error = refused.json()["error"]
            assert "'rebound.example:8780'" in error and "--allow-host rebound.example" in error, error
            assert refused.headers["x-content-type-options"] == "nosniff"
            unsigned = http.get("/api/runs", headers={"Host": "203.0.113.7:8780"})
            assert unsigned.status_code == 401 and "a token is needed" in unsigned.json()["error"]
        with served(store) as base, httpx.Client(base_url=base) as http:  # loopback, no token: names only
            assert http.get("/api/runs", headers={"Host": "203.0.113.7"}).status_code == 403
    finally:
        store.close()


def test_the_interfaces_addresses_are_names_of_a_wide_bind() -> None:
    inet6 = Path("/proc/net/if_inet6")
    if not inet6.exists():
        pytest.skip("no /proc/net/if_inet6 on this machine")
    import ipaddress

    listed = {f"[{ipaddress.IPv6Address(bytes.fromhex(line.split()[0]))}]" for line in inet6.read_text().splitlines()}
    assert listed <= Guard.make("0.0.0.0", TOKEN).allowed_hosts


def test_an_allowed_host_with_a_port_matches(tmp_path: Path) -> None:
    store = SqlStore(f"sqlite:///{tmp_path / 'raysaga.db'}")
    try:
        with served(store, allow_hosts=["Dash.Example.com:443"]) as base, httpx.Client(base_url=base) as http:
            assert http.get("/api/runs", headers={"Host": "dash.example.com"}).status_code == 200
            assert http.get("/api/runs", headers={"Host": "dash.example.com:443"}).status_code == 200
        with pytest.raises(UserError, match="not a host name"):
            build(store, allow_hosts=["https://dash.example.com/"])
    finally:
        store.close()


# ---------------------------------------------------------------- B5 and the docs' gaps: refusals


def test_refusals_are_400s_in_the_error_form(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 'raysaga.db'}"
    run_id = _waiting_quorum(url, "refusals45")
    store = SqlStore(url)
    try:
        with served(store) as base, httpx.Client(base_url=base) as http:
            for digits in (20, 5000):  # a 500 with a traceback from 4,301 digits on (Python's int limit)
                answer = http.get(f"/api/runs/{run_id}/stream", headers={"Last-Event-ID": "9" * digits})
                assert answer.status_code == 400, (digits, answer.text[:200])
                assert answer.json()["error"].startswith("Last-Event-ID="), answer.text[:200]
            for path in (f"/api/runs/{run_id}/nodes/%FF", f"/api/runs/{run_id}/items/%ED%A0%80"):
                answer = http.get(path)
                assert answer.status_code == 400 and "not UTF-8" in answer.json()["error"], (path, answer.text)
            answer = http.get(f"/api/runs/{run_id}/items/bigrefund?status=bogus")
            assert answer.status_code == 400 and answer.json()["error"].startswith("status='bogus'"), answer.text
            assert http.get(f"/api/runs/{run_id}/items/bigrefund?status=waiting").status_code == 200
    finally:
        store.close()


def test_a_short_token_is_said_to_be_too_short_in_plain_words(tmp_path: Path) -> None:
    """The token was registered as a secret before its length was checked: ``raysaga dashboard
    --token short`` printed "the dashboard token is too [redacted]" (the CLI scrubs what it prints;
    the exception's own text was always plain)."""
    done = _dashboard_cli(tmp_path, "--token", "short")
    assert done.returncode == 2, done.stderr
    assert "the dashboard token is too short: use 16 characters or more" in done.stderr, done.stderr
    assert "[redacted]" not in done.stderr


def _dashboard_cli(tmp_path: Path, *args: str, **env: str) -> subprocess.CompletedProcess[str]:
    """``raysaga dashboard --db (a new store) --port 0 ARGS`` run to its refusal (it never serves)."""
    url = f"sqlite:///{tmp_path / 'cli.db'}"
    SqlStore(url).close()
    clean = {k: v for k, v in os.environ.items() if k not in (TOKEN_ENV, USERS_ENV)}
    return subprocess.run([sys.executable, "-m", "raysaga", "dashboard", "--db", url, "--port", "0", *args],
                          capture_output=True, text=True, timeout=60, env={**clean, **env})


# ---------------------------------------------------------------- diff review: what a refusal prints


def test_a_users_value_that_is_no_file_is_refused_without_quoting_it(tmp_path: Path) -> None:
    """``RAYSAGA_DASHBOARD_USERS='alice=TOKEN'`` (a user where a file belongs) was refused with
    "cannot read the dashboard's users file 'alice=TOKEN'", the token printed."""
    secret = "alice-secret-token-0123456789"
    done = _dashboard_cli(tmp_path, **{USERS_ENV: f"alice={secret}"})
    assert done.returncode == 2, done.stderr
    assert secret not in done.stderr and "alice-secret" not in done.stderr, done.stderr
    assert (f"the value of {USERS_ENV} / --users-file is not a readable file: it should name a file of NAME=TOKEN "
            "lines") in done.stderr, done.stderr


def test_a_users_line_that_is_a_token_alone_is_refused_by_its_number(tmp_path: Path) -> None:
    """A line holding only a base64 token split at its '=' padding, and the refusal quoted the token
    as the entry's name ("the token of 'c2VjcmV0...' is too short")."""
    alone = "c2VjcmV0LXRva2VuLWFsb25lLTAxMjM0NTY3ODk="
    people = tmp_path / "users"
    people.write_text(f"cfo={CFO}\n{alone}\n")
    people.chmod(0o600)
    with pytest.raises(UserError) as refused:
        security.resolve_users(file=str(people))
    message = str(refused.value)
    assert alone[:-1] not in message and alone[:8] not in message, message
    assert message.startswith(f"the users file {str(people)!r} line 2: the entry's token is missing or too short")
    for entry in ("c2VjcmV0LXRva2Vu==", f"{alone[:-1]}=short"):  # padding of two; a short token
        with pytest.raises(UserError) as refused:
            security.resolve_users([entry])
        assert "c2VjcmV0" not in str(refused.value) and "too short" in str(refused.value), str(refused.value)


def test_the_401_says_how_to_sign_in_unmasked(tmp_path: Path) -> None:
    """The 401 was scrubbed as a value is: "open /?token=[redacted] once, or send Authorization: Bearer [redacted]"."""
    store = SqlStore(f"sqlite:///{tmp_path / 'raysaga.db'}")
    try:
        with served(store, users={"cfo": CFO}) as base, httpx.Client(base_url=base) as http:
            answer = http.get("/api/runs")
            assert answer.status_code == 401
            assert answer.json() == {"error": "a token is needed: open /?token=<your token> once in this browser, or "
                                              "send the header Authorization: Bearer <your token>"}
    finally:
        store.close()


# ---------------------------------------------------------------- diff review: the users file's mode


def test_a_users_file_others_may_read_is_warned_of_at_start(tmp_path: Path) -> None:
    """The docs said "mode 600" and nothing checked it: the file holds every person's token."""
    people = tmp_path / "users"
    people.write_text(f"cfo={CFO}\n")
    people.chmod(0o644)
    warning = (f"warning: the users file {str(people)!r} is readable by others than its owner (mode 644) and holds "
               "every person's token: chmod 600 it")
    import socket

    with socket.socket() as busy:  # the dashboard stops at its port, after what it says at start
        busy.bind(("127.0.0.1", 0))
        busy.listen(1)
        port = str(busy.getsockname()[1])
        done = _dashboard_cli(tmp_path, "--users-file", str(people), "--port", port)
        assert done.returncode == 2 and f"port {port} is in use" in done.stderr, done.stderr
        assert warning in " ".join(done.stderr.split()), done.stderr
        people.chmod(0o600)
        done = _dashboard_cli(tmp_path, "--users-file", str(people), "--port", port)
        assert done.returncode == 2 and "warning" not in done.stderr, done.stderr


# ---------------------------------------------------------------- diff review: the graph's note


def test_a_run_of_older_code_than_the_dashboard_s_is_not_called_newer(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Any run created after the dashboard's import was said to show that import old ("restart
    it"): in a rolling deploy the dashboard holds v2 and a worker still on v1 starts a run; a run
    of v0 was said newer once v2 was written after the dashboard imported v1."""
    source = tmp_path / "rolling45_flow.py"
    source.write_text(FLOW_V2.replace("evolve45", "rolling45"))  # the new code, deployed before the dashboard started
    os.utime(source, (time.time() - 60, time.time() - 60))
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.delitem(sys.modules, "rolling45_flow", raising=False)
    url = f"sqlite:///{tmp_path / 'raysaga.db'}"
    older = tmp_path / "v1" / "rolling45_flow.py"
    older.parent.mkdir()
    older.write_text(FLOW_V1.replace("evolve45", "rolling45"))
    v1 = import_file(older, "rolling45_flow_v1").wf  # a worker not yet upgraded
    create_run(v1, None, store=url, run_id="before45", workflow_ref="rolling45_flow:wf")
    store = SqlStore(url)
    neutral = ("the run's definition differs from the code this dashboard imported (rolling45_flow): steps it does "
               "not know are drawn without edges")
    try:
        with served(store) as base, httpx.Client(base_url=base) as http:
            assert http.get("/api/runs/before45").json()["graph"]["note"] == neutral
            create_run(v1, None, store=url, run_id="after45", workflow_ref="rolling45_flow:wf")
            graph = http.get("/api/runs/after45").json()["graph"]
            assert graph["note"] == neutral, graph["note"]
            source.write_text(FLOW_V1.replace("evolve45", "rolling45") + "\n# v3\n")  # deployed after, no restart
            written = time.time()
            os.utime(source, (written, written))
            assert http.get("/api/runs/before45").json()["graph"]["note"] == neutral  # older than the change
            assert http.get("/api/runs/after45").json()["graph"]["note"] == neutral
    finally:
        store.close()
        sys.modules.pop("rolling45_flow", None)
