"""The variables of a driver's environment its steps get on a Ray cluster, by name.

A Ray task runs in the environment of the node's raylet, not of the process that submitted it:
a variable set in the shell that drives a run (``raysaga run --address``, ``resume``, a worker)
never reaches a step on another node, nor on this one. Ray carries variables in a job's
``runtime_env["env_vars"]``; which ones is the operator's choice, by name, never the whole
environment (it holds the laptop's keys for everything):

- ``raysaga launch --env NAME`` puts them in the Ray Job it starts;
- ``RAYSAGA_ENV=NAME,NAME`` in a driver's environment puts them in the ``runtime_env`` its
  ``ray.init`` passes (``RayExecutor``), for a run driven from outside the cluster and for a
  driver that takes a run over.

Values are only ever handed to Ray: never written to the store, the event log or the output.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterable, Mapping

from raysaga.errors import UserError

#: Names, comma-separated, of the variables a driver forwards to its steps.
ENV_VAR = "RAYSAGA_ENV"
#: Variables raysaga or Ray set for a driver or a job themselves: never forwarded.
RESERVED = frozenset({"RAYSAGA_DB", "RAY_ADDRESS", "PYTHONPATH", "RAY_JOB_CONFIG_JSON_ENV_VAR", ENV_VAR})
_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
#: Where Ray's job supervisor hands a job's driver its runtime_env.
_JOB_CONFIG = "RAY_JOB_CONFIG_JSON_ENV_VAR"


def pick(names: Iterable[str], environ: Mapping[str, str], option: str = "--env") -> dict[str, str]:
    """``{name: value}`` of each named variable of ``environ``; a bad, reserved or unset name is
    a ``UserError`` naming it (``option``: how the operator named them)."""
    out: dict[str, str] = {}
    missing = []
    for name in names:
        if not _NAME.fullmatch(name):
            raise UserError(f"{option} {name!r} is not a variable name: pass the NAME only (its value is read "
                            "from this environment, never typed on the command line)")
        if name in RESERVED:
            raise UserError(f"{option} {name}: raysaga or Ray sets {name} itself; drop it")
        if name not in environ:
            missing.append(name)
        else:
            out[name] = environ[name]
    if missing:
        them = "it" if len(missing) == 1 else "them"
        raise UserError(f"{option} {', '.join(missing)}: not set in this environment; export {them} first, "
                        f"or drop {them}")
    return out


def forwarded(environ: Mapping[str, str]) -> dict[str, str]:
    """The variables ``RAYSAGA_ENV`` names, less those the Ray Job this driver runs in already
    carries (Ray refuses a driver's runtime_env that sets a variable its job sets)."""
    names = [n.strip() for n in environ.get(ENV_VAR, "").split(",") if n.strip()]
    if not names:
        return {}
    picked = pick(names, environ, ENV_VAR)
    try:
        job_env = json.loads(environ.get(_JOB_CONFIG, "") or "{}").get("runtime_env", {}).get("env_vars") or {}
    except (ValueError, AttributeError):
        job_env = {}
    return {k: v for k, v in picked.items() if k not in job_env}
