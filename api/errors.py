"""Every error raysaga raises, under one root.

    RaySagaError
    ├── UserError                 a mistake in how raysaga is called; fix the call
    │   ├── WorkflowDefinitionError   bad DAG: cycle, unknown dependency, duplicate step...
    │   ├── InvalidInputError         run input that is not JSON or fails validation
    │   │   └── InputTooLargeError        run input above the configured size cap
    │   ├── WorkflowLoadError         MODULE:WORKFLOW that cannot be imported
    │   ├── InvalidOptionError        an option (RunOptions, RetryPolicy, a CLI flag) out of range
    │   │   └── UnknownOptionError        a keyword no option has (a typo), or arguments that do not fit
    │   ├── SecretUnavailableError    a secret the run needs is not available to this process
    │   ├── DefinitionChangedError    a resume under a workflow definition other than the run's
    │   └── ForkError                 a fork or replay that cannot be made (a live run, an unknown node)
    ├── StoreError                the durable store refused or could not do something
    │   ├── RunNotFoundError
    │   ├── RunExistsError
    │   ├── ConcurrencyConflict       a compare-and-set lost to another writer
    │   ├── IllegalTransitionError    a run state change the state machine forbids
    │   ├── LeaseHeldError            another driver owns the run right now
    │   ├── LeaseLostError            this driver's fence is stale: stop at once
    │   ├── SchemaVersionError        a schema this raysaga cannot use: newer, or older when read-only
    │   ├── StoreUnavailableError     the store cannot be opened or reached
    │   │   └── StoreOutageError          it stopped answering under a driver: resume the run later
    │   ├── CorruptRecordError        a stored row cannot be read back (only its run is affected)
    │   └── BlobIntegrityError        a blob is missing or does not match its content address
    ├── DriverInterrupted         SIGINT/SIGTERM: the driver settled and released its lease
    ├── InfeasibleResourcesError  no node of the cluster can ever hold a step's resource request
    ├── NotJSONableError          a value that cannot be stored as JSON
    └── StepFailure               raised by user step code to classify its own failure
        ├── Permanent                 never retried
        │   └── InputTypeError            a step's input is not the type its parameter declares
        └── Transient                 retried with backoff

``InvalidOptionError`` is also a ``ValueError``, and ``UnknownOptionError`` also a ``TypeError``:
what these mistakes raised before they had classes of their own, so ``except ValueError`` (or
``TypeError``) around raysaga calls keeps working.

Exceptions carrying constructor arguments define ``__reduce__`` so they survive the
pickling Ray does when a task raises them.
"""

from __future__ import annotations

import shlex
from typing import Any


class RaySagaError(Exception):
    """Root of every raysaga error."""


class UserError(RaySagaError):
    """The caller used raysaga wrongly; the message says how to fix it."""


class WorkflowDefinitionError(UserError):
    """The workflow's DAG or a step's declaration is invalid."""


class InvalidInputError(UserError):
    """A run input that is not JSON, or does not match the declared input type."""


class WorkflowLoadError(UserError):
    """A ``MODULE:WORKFLOW`` reference that cannot be imported or is not a Workflow."""


class InputTooLargeError(InvalidInputError):
    """A run input above the configured size cap."""


class InvalidOptionError(UserError, ValueError):
    """An option (``RunOptions``, ``RetryPolicy``, a CLI flag) outside its allowed range.

    A ``UserError`` (the CLI prints it as a usage error) and, for callers that caught the
    ``ValueError`` these options raised before, a ``ValueError`` too."""


class UnknownOptionError(InvalidOptionError, TypeError):
    """A keyword that names no option (``RetryPolicy(max_attempt=3)``), or positional arguments an
    option object does not take. The message lists the options there are."""


class SecretUnavailableError(UserError):
    """A secret the run needs is not available to this process (never stored: re-supply it)."""


class DefinitionChangedError(UserError):
    """The run was started by another definition of its workflow; the message names the steps
    that changed (resume with the old code, or allow the change: ``--allow-changed``)."""


class ForkError(UserError):
    """A fork or a replay that cannot be made: a live run, an unknown node, a run with nothing to replay."""


class NotJSONableError(RaySagaError):
    """A value (a step output, an input) that cannot be stored as strict JSON."""


class OutputTypeError(RaySagaError):
    """A step returned a value that is not its declared return type (a permanent failure of
    that step: running it again returns the same)."""


class StoreError(RaySagaError):
    """The durable store refused an operation."""


class RunNotFoundError(StoreError):
    def __init__(self, run_id: str) -> None:
        super().__init__(f"no run with id {run_id!r}: `raysaga list` shows the runs in this store")
        self.run_id = run_id

    def __reduce__(self) -> Any:
        return (type(self), (self.run_id,))


class RunExistsError(StoreError):
    def __init__(self, run_id: str) -> None:
        super().__init__(f"a run with id {run_id!r} already exists: resume it or choose another --run-id")
        self.run_id = run_id

    def __reduce__(self) -> Any:
        return (type(self), (self.run_id,))


class ConcurrencyConflict(StoreError):
    """A compare-and-set found another version than expected: someone else wrote first."""


class IllegalTransitionError(StoreError):
    """The run state machine forbids this transition (terminal states never change)."""


class LeaseHeldError(StoreError):
    """Another live driver holds the run's lease; this one must back off."""


class LeaseLostError(StoreError):
    """This driver's fence is stale: another driver took the run. Make no further calls."""


class SchemaVersionError(StoreError):
    """A schema this raysaga cannot use: newer than it understands, or older when opened read-only
    (``raysaga db upgrade`` migrates it)."""


class StoreUnavailableError(StoreError):
    """The store cannot be opened or reached: a bad URL, a file that is not a database, a
    directory, a read-only location, a server that refuses, a missing database driver."""


class StoreOutageError(StoreUnavailableError):
    """The store stopped answering (a server restarting, a dropped connection) while a driver ran
    ``run_id``: the driver stopped as after a crash. What was committed is intact, and resuming the
    run once the store answers continues it (its lease, unrenewed, lets the next driver in)."""

    def __init__(self, run_id: str, cause: str) -> None:
        self.run_id = run_id
        self.cause = cause
        super().__init__(f"the store stopped answering while run {run_id!r} was driven ({cause}); what was "
                         f"committed is intact: `raysaga resume {shlex.quote(run_id)}` (raysaga.resume in "
                         "Python) continues the run once the store answers")

    def __reduce__(self) -> tuple[Any, ...]:
        return (StoreOutageError, (self.run_id, self.cause))


class CorruptRecordError(StoreError):
    """A stored row cannot be read back (not JSON, an unknown status): only its run is affected."""


class BlobIntegrityError(StoreError):
    """A blob is missing or its bytes do not match their content address; the data is never used."""

    def __init__(self, digest: str, problem: str, where: str = "") -> None:
        super().__init__(f"blob {digest} {problem}" + (f" ({where})" if where else "")
                         + ": the store was changed outside raysaga; the data is not used")
        self.digest, self.problem, self.where = digest, problem, where

    def __reduce__(self) -> Any:
        return (type(self), (self.digest, self.problem, self.where))


class DriverInterrupted(RaySagaError):
    """The driver was stopped by SIGINT or SIGTERM: it stopped dispatching, settled what was in
    flight and released its lease, so ``raysaga resume`` (or another driver) continues at once."""

    def __init__(self, run_id: str, signal_name: str) -> None:
        super().__init__(f"run {run_id!r}: driver stopped by {signal_name}; its lease is released and "
                         f"`raysaga resume {shlex.quote(run_id)}` continues it")
        self.run_id, self.signal_name = run_id, signal_name

    def __reduce__(self) -> Any:
        return (type(self), (self.run_id, self.signal_name))


class InfeasibleResourcesError(RaySagaError):
    """No node of the Ray cluster can ever hold a step's resource request: the node fails
    permanently at once (not after a scheduling wait), naming what was asked and what there is."""


class StepFailure(RaySagaError):
    """Raised from step code to say how a failure must be treated."""

    transient: bool = False

    def __init__(self, message: str = "") -> None:
        super().__init__(message)
        self.message = message

    def __reduce__(self) -> Any:
        return (type(self), (self.message,))


class Permanent(StepFailure):
    """A failure that retrying cannot fix (bad input, refused, not found)."""

    transient = False


class InputTypeError(Permanent):
    """A step's input is not the type its parameter declares: the value it was given (a step's
    stored output, the run's input) was made under another contract (the definition changed
    since, with ``--allow-changed``, or the producer declares another type). Permanent: the
    same value comes again on every attempt. The message names the step, the parameter and the
    step the value came from."""


class Transient(StepFailure):
    """A failure worth retrying (a timeout, an overloaded dependency)."""

    transient = True
