"""The options several ``raysaga`` commands share (typer annotations), and the checks of them
that several commands make."""

from __future__ import annotations

from typing import Annotated

import typer

from raysaga.errors import UserError

DbOpt = Annotated[str | None, typer.Option(
    "--db", envvar="RAYSAGA_DB",
    help="Store URL (default: $RAYSAGA_HOME/raysaga.db or ~/.raysaga/raysaga.db; `raysaga --version` shows it).")]
ExecutorOpt = Annotated[str, typer.Option("--executor", help="ray (default) or inline (in this process).")]
AddressOpt = Annotated[str | None, typer.Option("--address", envvar="RAY_ADDRESS",
                                                help="Ray cluster to join (default: a local Ray started on demand).")]
LeaseOpt = Annotated[float, typer.Option("--lease-ttl", help="Seconds a dead driver's lease blocks a takeover.")]
RunIdArg = Annotated[str, typer.Argument(metavar="RUN", help="The run's id.")]
WorkflowOpt = Annotated[str | None, typer.Option("--workflow", help="MODULE:WORKFLOW (default: as recorded)")]
MaxDeathsOpt = Annotated[int | None, typer.Option(
    "--max-driver-deaths", help="The run's own crash-loop limit: drivers of it that die in a row before it commits "
    "any step's outcome, then it is parked (default 3, or the limit of whoever drives it); recorded with the run.")]
LabelOpt = Annotated[list[str] | None, typer.Option(
    "--label", help="KEY=VALUE: a label of the new run (repeatable): `status` shows it, `list --label` finds the run "
    "by it.")]
LabelFilterOpt = Annotated[list[str] | None, typer.Option(
    "--label", help="KEY=VALUE: only runs with this label (repeatable: runs with every one).")]


def check_address(executor: str, address: str | None, ctx: typer.Context | None = None) -> None:
    """Refuse ``--address`` given on the command line with ``--executor inline`` (it joins no Ray
    cluster: the option was silently ignored, and a typo in it went unnoticed); a ``RAY_ADDRESS``
    in the environment (a Ray job's) is left alone. A malformed address for the Ray executor is
    refused before anything is opened or imported (the executor checks it again, and probes it,
    before Ray starts). ``ctx``: the command's, telling the command line from the environment."""
    if executor == "inline" and address and given_on_command_line(ctx, "address"):
        raise UserError("--address names a Ray cluster to join, and --executor inline joins none (its steps run in "
                        "this process): drop --address, or use --executor ray to run on that cluster")
    if executor == "ray" and address:
        from raysaga.orchestrator.ray_address import host_port

        host_port(address)


def given_on_command_line(ctx: typer.Context | None, name: str) -> bool:
    """Whether the parameter ``name`` of the command came from its command line (not from its
    environment variable, nor its default); True when there is no context to tell."""
    return ctx is None or getattr(ctx.get_parameter_source(name), "name", None) == "COMMANDLINE"
