"""``raysaga fork --input-patch`` says, before the fork starts, which effect steps upstream of
--from run again because the patch changes the input they read (stop 44: the docs' own example
charged the card a second time without a word)."""

from __future__ import annotations

import json
from importlib import resources

import jsonschema

import raysaga
from examples.order import workflow as order
from raysaga import Approval, Ask, Workflow
from raysaga.state import RunStatus
from raysaga.testing import FakeProvider
from tests.support.cli import invoke
from tests.support.services import FakeServices
from tests.support.shop_flows import shop

ORDER = "examples.order.workflow:wf"


def test_a_patch_names_the_upstream_effect_steps_it_runs_again(sqlite_url: str) -> None:
    with FakeServices() as services:
        done = raysaga.run(order.wf, order.sample_input(services.url), store=sqlite_url, run_id="p",
                           executor="inline")
        assert done.status == RunStatus.COMPLETED
        services.reset()
        code, out, err = invoke("fork", "p", "--from", "send_email", "--workflow", ORDER, "--run-id", "c",
                                "--input-patch", '{"email": "grace@example.com"}', "--executor", "inline",
                                "--db", sqlite_url)
        assert code == 0, out + err
        notes = [line for line in err.splitlines() if line.startswith("note: ")]
        assert notes == [
            f"note: effect step {step!r} (upstream of --from send_email) runs again: --input-patch changes the "
            "input it reads, so its effect is made again under the new run's keys"
            for step in ("charge_card",)]
        assert err.index("note: ") < err.index("forked p from send_email")
        assert "charge" in services.log()["kinds"].values()  # what the note said: charged again
        # without a patch (or with one that changes nothing), no note
        code, out, err = invoke("fork", "p", "--from", "send_email", "--workflow", ORDER, "--run-id", "c2",
                                "--input-patch", '{}', "--executor", "inline", "--db", sqlite_url)
        assert code == 0, out + err
        assert "note: " not in err


def test_status_of_a_parent_names_the_fork_whose_rollback_undid_its_charge(sqlite_url: str) -> None:
    provider = FakeProvider()
    fails = {"ship": False}
    wf = shop("stop44_status", provider, fails)

    assert raysaga.run(wf, None, store=sqlite_url, run_id="p", executor="inline").status == RunStatus.COMPLETED
    fails["ship"] = True
    f1 = raysaga.fork(wf, "p", from_node="ship", store=sqlite_url, new_run_id="f1", executor="inline")
    assert f1.status == RunStatus.COMPENSATED
    code, out, err = invoke("status", "p", "--db", sqlite_url)
    assert code == 0, out + err
    assert "undone by forks: charge (undone by f1's rollback)" in out
    charge_line = next(line for line in out.splitlines() if line.startswith("charge "))
    assert "undone by f1's rollback" in charge_line
    code, out, err = invoke("status", "p", "--db", sqlite_url, "--json")
    assert code == 0, out + err
    assert json.loads(out)["undone_by_forks"] == [
        {"node": "charge", "run_id": "f1", "status": "completed"}]
    schema = json.loads(resources.files("raysaga.orchestrator.dashboard").joinpath("status.schema.json").read_text())
    for run_id in ("p", "f1"):  # the lineage keys, inherited nodes and effects are in the published schema
        code, out, err = invoke("status", run_id, "--db", sqlite_url, "--json")
        doc = json.loads(out)
        jsonschema.validate(doc, schema)
        named = set(schema["properties"])
        assert code == 0 and set(doc) <= named, (set(doc) - named, err)
    assert any(e.get("inherited_from") == "p" for e in json.loads(out)["effects"])


def test_status_node_of_an_inherited_approval_says_who_decided_it_and_where(sqlite_url: str) -> None:
    wf = Workflow("stop44_approval")

    @wf.step()
    def plan() -> str:
        return "plan"

    @wf.approval()
    def ok(plan: str) -> Ask:
        return Ask(prompt=f"ship {plan}?")

    @wf.step()
    def ship(ok: Approval) -> str:
        return f"shipped: {ok.approved}"

    assert raysaga.run(wf, None, store=sqlite_url, run_id="p", executor="inline").status == RunStatus.WAITING_HUMAN
    code, out, err = invoke("approve", "p", "ok", "--by", "ada", "--comment", "fine", "--db", sqlite_url)
    assert code == 0, out + err
    assert raysaga.resume(wf, "p", store=sqlite_url, executor="inline").status == RunStatus.COMPLETED
    assert raysaga.fork(wf, "p", from_node="ship", store=sqlite_url, new_run_id="c",
                        executor="inline").status == RunStatus.COMPLETED
    code, out, err = invoke("status", "c", "--node", "ok", "--db", sqlite_url)
    assert code == 0, out + err
    assert out.splitlines()[0] == "ok: completed (inherited from p, not run again: as decided there)"
    assert "approve by ada at " in out and ": fine" in out
    code, out, err = invoke("status", "c", "--node", "plan", "--db", sqlite_url)  # a plain step: nothing decided
    assert code == 0 and out.splitlines()[0] == "plan: completed (inherited from p, not run again)", out + err
    code, out, err = invoke("status", "c", "--node", "ok", "--db", sqlite_url, "--json")
    assert code == 0, out + err
    story = json.loads(out)
    assert story["inherited_from"] == "p"
    assert [(d["verdict"], d["by"], d["comment"]) for d in story["decisions"]] == [("approve", "ada", "fine")]


def test_a_patch_names_what_runs_again_downstream_of_a_step_it_reruns(sqlite_url: str) -> None:
    """A patch re-running ``charge`` re-runs ``reserve`` (an effect reading it) and asks ``ok``
    again: the note named ``charge`` alone while the provider saw two new calls."""
    from raysaga.orchestrator.fork import input_reruns
    from raysaga.state import SqlStore

    wf = Workflow("stop44_reruns")

    @wf.step(effect=True)
    def charge(input: dict[str, str]) -> str:
        return f"charged {input['acct']}"

    @wf.step(effect=True)
    def reserve(charge: str) -> str:
        return f"reserved after {charge}"

    @wf.step()
    def plan() -> str:
        return "plan"

    @wf.approval()
    def ok(reserve: str) -> Ask:
        return Ask(prompt=f"ship {reserve}?")

    @wf.step()
    def ship(ok: Approval, plan: str) -> str:
        return "shipped"

    assert raysaga.run(wf, {"acct": "A"}, store=sqlite_url, run_id="p", executor="inline").status == \
        RunStatus.WAITING_HUMAN
    code, out, err = invoke("approve", "p", "ok", "--by", "ada", "--db", sqlite_url)
    assert code == 0, out + err
    assert raysaga.resume(wf, "p", store=sqlite_url, executor="inline").status == RunStatus.COMPLETED
    store = SqlStore(sqlite_url)
    try:
        assert input_reruns(wf, store, "p", "ship", {"acct": "B"}) == [
            ("charge", "input"), ("reserve", "upstream"), ("ok", "upstream")]
        assert input_reruns(wf, store, "p", "ship", {"acct": "A"}) == []  # the same input: nothing
    finally:
        store.close()
