"""``raysaga fork`` and ``raysaga replay`` (registered on the app in ``cli.py``; docs/fork.md).

Each imports the store, the workflow DSL and (for fork) the driver only when it runs.
"""

from __future__ import annotations

import json
import sys
from typing import TYPE_CHECKING, Annotated, Any

import typer

from raysaga.errors import UserError
from raysaga.orchestrator import cli_input
from raysaga.orchestrator.cli_errors import EXIT_NOT_COMPLETED, err, errors, out, say
from raysaga.orchestrator.cli_options import (
    AddressOpt,
    DbOpt,
    ExecutorOpt,
    LeaseOpt,
    MaxDeathsOpt,
    RunIdArg,
    WorkflowOpt,
    check_address,
)

if TYPE_CHECKING:
    from raysaga.orchestrator.options import RunOptions


def _workflow(store: Any, run_id: str, ref: str | None) -> Any:
    from raysaga.orchestrator.loader import load_recorded_workflow, load_workflow

    return load_workflow(ref) if ref else load_recorded_workflow(store.get_run(run_id).workflow_ref, run_id)


def _patch(text: str | None) -> Any:
    """The patch ``--input-patch`` gives: ``NO_PATCH`` when left out (``null`` is a patch: it makes
    the input null, RFC 7396, which the input type check then judges)."""
    if text is None:
        from raysaga.orchestrator.fork import NO_PATCH

        return NO_PATCH
    try:  # strict JSON, as --input: Python's NaN and Infinity would reach the new run's input as null
        return cli_input.strict_loads(text)
    except json.JSONDecodeError as exc:
        raise UserError(f"--input-patch is not JSON ({exc.msg} at character {exc.pos}): pass a JSON merge patch, "
                        "e.g. '{\"question\": \"...\"}'") from None
    except ValueError as exc:
        constant = str(exc).endswith("is not JSON")  # NaN, Infinity
        raise UserError(f"--input-patch is not JSON ({exc})" + (": JSON has no NaN or infinity; use null (removes "
                        "the key) or a string" if constant else "")) from None


def _fork_options(lease_ttl: float, max_driver_deaths: int | None) -> RunOptions:
    """The fork's options (its own ``--max-driver-deaths``, given or not, goes to ``fork.fork`` as
    ``max_driver_deaths``: without it the fork keeps its parent's own limit)."""
    from raysaga.orchestrator.options import RunOptions

    return RunOptions(lease_ttl=lease_ttl, max_driver_deaths=cli_input.run_limit(max_driver_deaths))


def fork(
    ctx: typer.Context,
    run_id: Annotated[str, typer.Argument(metavar="RUN", help="The run at rest to fork.")],
    from_node: Annotated[str, typer.Option(
        "--from", help="The node to re-run from (with everything downstream): STEP, STEP[ITEM] or AGENT@TURN[ITEM].")],
    input_patch: Annotated[str | None, typer.Option(
        "--input-patch", help="A JSON merge patch of the run's input, seen by the nodes that run afresh.")] = None,
    workflow: WorkflowOpt = None,
    run_id_new: Annotated[str | None, typer.Option("--run-id", help="Id of the new run (default: generated).")] = None,
    db: DbOpt = None,
    executor: ExecutorOpt = "ray",
    address: AddressOpt = None,
    lease_ttl: LeaseOpt = 15.0,
    no_drive: Annotated[bool, typer.Option("--no-drive", help="Record the fork as pending; do not drive it.")] = False,
    as_json: Annotated[bool, typer.Option("--json")] = False,
    max_driver_deaths: MaxDeathsOpt = None,
) -> None:
    """Start a new run from RUN's node --from: what is upstream of it starts completed with RUN's
    outputs (no step, model call or effect repeated), the node and everything downstream run afresh."""
    with errors():
        cli_input.check_run_id(run_id)
        check_address(executor, address, ctx)
        if run_id_new is not None:
            cli_input.check_run_id(run_id_new)
        cli_input.positive_seconds("--lease-ttl", lease_ttl)
        deaths = cli_input.max_driver_deaths(max_driver_deaths)
        patch = _patch(input_patch)
        from raysaga.orchestrator import cli_status, cli_store
        from raysaga.orchestrator.fork import fork as do_fork
        from raysaga.orchestrator.fork import input_reruns
        from raysaga.orchestrator.loader import recordable_ref

        store = cli_store.open_for_writes(db, run_id)
        wf = _workflow(store, run_id, workflow)
        for step, why in input_reruns(wf, store, run_id, from_node, patch):
            kind = "approval" if wf.steps[step].kind == "approval" else "effect step"
            cause = "--input-patch changes the input it reads" if why == "input" else \
                "it reads a step the patch runs again"
            again = "a human is asked again" if kind == "approval" else \
                "its effect is made again under the new run's keys"
            say(err, f"note: {kind} {step!r} (upstream of --from {from_node}) runs again: {cause}, so {again}")
        record = do_fork(wf, run_id, from_node=from_node, input_patch=patch, store=store, new_run_id=run_id_new,
                         executor=executor, address=address, options=_fork_options(lease_ttl, deaths),
                         workflow_ref=(recordable_ref(workflow) or "") if workflow else None, drive=not no_drive,
                         max_driver_deaths=deaths)
        say(err, f"forked {run_id} from {from_node}: run {record.run_id} is {record.status.value}")
        record = store.get_run(record.run_id)
        if as_json:
            cli_status.stream_json(store, record, sys.stdout)
        else:
            cli_status.print_status(out, store, record, store_text=cli_store.describe(store.url))
    if not no_drive and record.status.value != "completed":
        raise typer.Exit(EXIT_NOT_COMPLETED)


def replay(
    run_id: RunIdArg,
    until: Annotated[str | None, typer.Option("--until", help="Replay only this step and what is upstream of it.")]
    = None,
    workflow: WorkflowOpt = None,
    db: DbOpt = None,
    as_json: Annotated[bool, typer.Option("--json")] = False,
) -> None:
    """Re-execute a finished run's steps in this process against its recorded inputs (effects and
    model calls served from the ledger and the stored turns: nothing reaches the outside world) and
    report every node whose output now differs. Exit 1 when one differs."""
    with errors():
        cli_input.check_run_id(run_id)
        from raysaga.orchestrator import cli_store, status_text
        from raysaga.orchestrator.replay import replay as do_replay

        store = cli_store.open_for_reads(db, run_id)
        wf = _workflow(store, run_id, workflow)
        report = do_replay(wf, run_id, store=store, until=until)
        if as_json:
            sys.stdout.write(json.dumps(report.as_data(), sort_keys=True, default=str) + "\n")
        else:
            for node in report.nodes:
                # a step's error as one line (its newlines drew lines of their own), cut: --json has it whole
                detail = status_text.one_line(node.detail, more=" (--json shows it whole)")
                say(out, f"{node.label:<28} {node.verdict:<9} {detail}".rstrip())
            differing = report.differing
            say(out, f"{len(differing)} of {len(report.nodes)} nodes differ"
                     + (f": {', '.join(n.label for n in differing)}" if differing else ""))
    if report.differing:
        raise typer.Exit(EXIT_NOT_COMPLETED)
