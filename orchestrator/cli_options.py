"""The options several ``raysaga`` commands share (typer annotations)."""

from __future__ import annotations

from typing import Annotated

import typer

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
