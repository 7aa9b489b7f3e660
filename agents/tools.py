"""Tools an agent may call: a function, its JSON schema, and how it touches the world.

A tool that changes the world declares ``effect=True``; its idempotency key comes from the
run, the agent node, the tool name and its canonical arguments (``key=`` narrows which
arguments count), never from the model's wording. A tool signals a *semantic* error (bad
arguments, not found, a refusal) by raising ``ToolError``: the model sees it as an
``is_error`` result and no code retries it. Any other exception is classified like a step's
failure: transient ones are retried with backoff, invisible to the model.
"""

from __future__ import annotations

import functools
import hashlib
import inspect
import math
import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, TypeGuard, overload

from pydantic import BaseModel, ValidationError, create_model

from raysaga.agents.awaiting import awaited
from raysaga.errors import NotJSONableError, RaySagaError, WorkflowDefinitionError
from raysaga.state import jsoncodec
from raysaga.state.redact import scrub_secret_values, scrub_text
from raysaga.types import RateLimit, RetryPolicy, checked_options, str_tuple, unknown_option_message


class ToolError(RaySagaError):
    """A semantic tool error: shown to the model as an ``is_error`` result, never retried in code."""

    def __init__(self, message: str) -> None:
        super().__init__(message)
        self.message = message

    def __reduce__(self) -> Any:
        return (type(self), (self.message,))


#: The Messages API's tool-name grammar, which also keeps raysaga's reserved characters out.
TOOL_NAME_RE = re.compile(r"[A-Za-z0-9_-]{1,64}")


@dataclass(frozen=True)
class Tool:
    name: str
    description: str
    fn: Callable[..., Any]
    input_model: type[BaseModel]
    effect: bool = False
    key: tuple[str, ...] | None = None
    """Arguments that identify the effect (default: all of them)."""
    retry: RetryPolicy | None = None
    timeout: float | None = None
    breaker: str | None = None
    """Name of the dependency whose circuit breaker guards this tool (default: its function's
    module-qualified name, so two unrelated tools both called ``search`` never share one; give
    several tools one ``breaker=`` name to share a breaker on purpose)."""
    rate_limit: RateLimit | None = None
    """The fleet-wide limit its calls go through (``RateLimit``): a call over it waits, holding nothing."""
    requires_approval: bool = False
    """Each call waits for a human's decision before it runs (approve, approve with edited
    arguments, or reject with a reason the model is shown); the model's turn is not asked again."""
    approvers: tuple[str, ...] | None = None
    """Who may decide its calls (None: anyone)."""
    compensate: Callable[..., Any] | None = None
    """Undoes one call of an effect tool when the run rolls back. It binds by name: the tool's own
    arguments, ``output`` (the call's result, decoded; None when its outcome is unknown) and
    ``ctx`` (a ``StepContext`` whose ``idempotency_key`` is the undo's own)."""

    @property
    def breaker_name(self) -> str:
        return self.breaker or default_breaker(self.fn, self.name)

    def definition(self) -> dict[str, Any]:
        """The tool as the Messages API takes it."""
        schema = self.input_model.model_json_schema()
        schema.pop("title", None)
        return {"name": self.name, "description": self.description, "input_schema": schema}

    def validate(self, args: Any) -> dict[str, Any]:
        """Check the model's arguments; ``ToolError`` (shown to the model) if they do not fit.

        Returns their JSON form (what keys, the store and the model see): ``model_dump(mode="json")``,
        keyed by parameter name as raysaga always made it, so an effect tool's idempotency key
        (``keys.effect_key``, ``key_args`` by parameter name) is the same for the same arguments across
        upgrades; read back by name and by alias (``_instance``). The function itself is called with
        ``typed`` values."""
        form: dict[str, Any] = self._instance(args).model_dump(mode="json")  # (what keys were always made of)
        return form

    def typed(self, args: Any) -> dict[str, Any]:
        """The arguments as the function's parameters declare them: a pydantic model, a ``date``,
        an ``Enum`` as such, not their JSON form (a tool taking ``order: Order`` got a dict)."""
        instance = self._instance(args)
        return {name: getattr(instance, name) for name in self.input_model.model_fields}

    def _instance(self, args: Any) -> BaseModel:
        if not isinstance(args, dict):
            raise ToolError(f"the input of {self.name} must be a JSON object, got {type(args).__name__}")
        try:  # by name too: a field with only a validation_alias has no dump its model reads by alias
            return self.input_model.model_validate(args, by_alias=True, by_name=True)  # (json_form.dump_options)
        except ValidationError as exc:
            problems = "; ".join(f"{'.'.join(map(str, e['loc'])) or 'input'}: {e['msg']}"
                                 for e in exc.errors(include_url=False))
            raise ToolError(f"invalid arguments for {self.name}: {problems}") from None

    def key_args(self, args: dict[str, Any]) -> dict[str, Any]:
        return {k: args.get(k) for k in self.key} if self.key else args


#: The store's breaker names are 200 characters at most (``raysaga_breakers.name``).
MAX_BREAKER_NAME = 200


def default_breaker(fn: Callable[..., Any], tool_name: str) -> str:
    """A tool's breaker when ``breaker=`` names none: its function's module-qualified name and the
    tool's (``module.qualname:tool``). The tool's name alone put unrelated tools called alike, in
    unrelated workflows, behind one breaker; the function's alone put tools made from one function
    (partials, lambdas, a factory's closures, a client's methods) behind one. Not part of a run's
    definition hash: a breaker is the fleet's state, not the run's."""
    target = inspect.unwrap(fn.func if isinstance(fn, functools.partial) else fn)
    module = getattr(target, "__module__", None) or "?"
    qualname = getattr(target, "__qualname__", None) or getattr(target, "__name__", None) or type(target).__qualname__
    name = f"{module}.{qualname}:{tool_name}"
    if len(name) <= MAX_BREAKER_NAME:
        return name
    digest = hashlib.sha256(name.encode()).hexdigest()[:16]
    return f"{name[:MAX_BREAKER_NAME - 17]}#{digest}"


def _unknown_tool_option(where: str, unknown: list[str], options: list[str]) -> WorkflowDefinitionError:
    return WorkflowDefinitionError(unknown_option_message(f"tool {where!r}", unknown, options))


@overload
def tool(fn: Callable[..., Any], /, *, name: str | None = None, description: str | None = None,
         effect: bool = False, key: Sequence[str] | None = None, retry: RetryPolicy | None = None,
         timeout: float | None = None, breaker: str | None = None, compensate: Callable[..., Any] | None = None,
         rate_limit: RateLimit | None = None, requires_approval: bool = False,
         approvers: Sequence[str] | None = None) -> Tool: ...


@overload
def tool(fn: None = None, /, *, name: str | None = None, description: str | None = None, effect: bool = False,
         key: Sequence[str] | None = None, retry: RetryPolicy | None = None, timeout: float | None = None,
         breaker: str | None = None, compensate: Callable[..., Any] | None = None,
         rate_limit: RateLimit | None = None, requires_approval: bool = False,
         approvers: Sequence[str] | None = None) -> Callable[[Callable[..., Any]], Tool]: ...


@functools.partial(checked_options, what="tool()", unknown=_unknown_tool_option, misfit=WorkflowDefinitionError,
                   decorator_factory=True, fn_param="fn")
def tool(fn: Callable[..., Any] | None = None, /, *, name: str | None = None, description: str | None = None,
         effect: bool = False, key: Sequence[str] | None = None, retry: RetryPolicy | None = None,
         timeout: float | None = None, breaker: str | None = None,
         compensate: Callable[..., Any] | None = None,
         rate_limit: RateLimit | None = None, requires_approval: bool = False,
         approvers: Sequence[str] | None = None) -> Tool | Callable[[Callable[..., Any]], Tool]:
    """Make a ``Tool`` from a typed function; its parameters become the JSON schema.

    Call forms: ``@tool``, ``@tool()``, ``@tool(effect=True, key=("order_id",))``, and
    ``tool(fn, name="search")`` for a function defined elsewhere (a ``functools.partial`` too).

    Args:
        name: the name the model calls it by (default: the function's name); 1-64 letters,
            digits, ``_`` or ``-``.
        description: what the model is told it does (default: the function's docstring).
        effect: the tool changes the world: each call gets an idempotency key and goes through
            the ledger, so a resume never repeats a committed call.
        key: the arguments that identify the effect (default: all of them); one name may be
            given as a plain string.
        retry: the ``RetryPolicy`` of its transient failures (default: the step default).
        timeout: seconds before a call is cancelled and counted a transient failure.
        breaker: the dependency whose circuit breaker guards it (default: the function's
            module-qualified name); tools given one name share a breaker.
        compensate: the undo of one call of an effect tool, run when the run rolls back.
        rate_limit: a ``RateLimit`` its calls go through, shared by every driver on the store.
        requires_approval: each call waits for a human (``raysaga approve|reject RUN NODE``):
            approved, approved with edited arguments (``--answer``), or rejected with a reason
            shown to the model; nothing runs before the decision and the model is not asked again.
        approvers: who may decide its calls (default: anyone).

    Raises:
        WorkflowDefinitionError: an option of the wrong type, an unknown option, or a function
            that cannot be described to a model; the message names the tool.
    """

    def build(func: Callable[..., Any]) -> Tool:
        tool_name = name or getattr(func, "__name__", None)
        if tool_name is None:
            raise WorkflowDefinitionError(
                f"tool(): {func!r} has no __name__ (a functools.partial?): name it with tool(fn, name=...)")
        if not isinstance(tool_name, str) or not TOOL_NAME_RE.fullmatch(tool_name):
            raise WorkflowDefinitionError(
                f"tool name {tool_name!r} is not valid: use 1-64 letters, digits, '_' or '-' (the Messages API's "
                "rule; ':', '@', '.', '[' and ']' are reserved in raysaga's node ids and effect keys)")
        if not callable(func):
            raise WorkflowDefinitionError(f"tool {tool_name!r}: @tool decorates functions, got {func!r}")
        key_names = _check_options(tool_name, description=description, effect=effect, key=key, retry=retry,
                                   timeout=timeout, breaker=breaker)
        if not isinstance(requires_approval, bool):
            raise WorkflowDefinitionError(f"tool {tool_name!r}: requires_approval= takes True or False")
        if approvers is not None and (isinstance(approvers, str) or not approvers
                                      or not all(isinstance(a, str) and a.strip() for a in approvers)):
            raise WorkflowDefinitionError(f"tool {tool_name!r}: approvers= takes a non-empty list of names, "
                                          f"got {approvers!r}")
        if approvers is not None and not requires_approval:
            raise WorkflowDefinitionError(f"tool {tool_name!r}: approvers= goes with requires_approval=True")
        if rate_limit is not None and not isinstance(rate_limit, RateLimit):
            raise WorkflowDefinitionError(f"tool {tool_name!r}: rate_limit= takes a RateLimit, e.g. "
                                          f"RateLimit(name='search-api', requests=60), got {rate_limit!r}")
        if rate_limit is not None and rate_limit.requests is None and rate_limit.concurrent is None:
            raise WorkflowDefinitionError(  # accepted, it limited nothing: a tool call counts no model tokens
                f"tool {tool_name!r}: rate_limit= {rate_limit!r} limits only tokens=, and a tool call counts no "
                f"model tokens, so it would never limit it: give requests= or concurrent=, e.g. "
                f"RateLimit(name={rate_limit.name!r}, requests=60)")
        fields: dict[str, Any] = {}
        for pname, param in _signature(tool_name, func).parameters.items():
            if pname == "idempotency_key":
                continue  # filled in by raysaga for effect tools, never by the model
            if param.kind in (param.VAR_POSITIONAL, param.VAR_KEYWORD):
                raise WorkflowDefinitionError(f"tool {tool_name!r}: *args/**kwargs cannot be described to a model")
            annotation = param.annotation if param.annotation is not inspect.Parameter.empty else Any
            default = param.default if param.default is not inspect.Parameter.empty else ...
            fields[pname] = (annotation, default)
        if key_names:
            unknown = set(key_names) - set(fields)
            if unknown:
                raise WorkflowDefinitionError(f"tool {tool_name!r}: key= names unknown arguments {sorted(unknown)}")
        if compensate is not None:
            _check_compensation(tool_name, compensate, effect, set(fields))
        model = _input_model(tool_name, fields)
        doc = description or inspect.getdoc(func) or tool_name
        return Tool(name=tool_name, description=doc, fn=func, input_model=model, effect=effect,
                    key=key_names or None, retry=retry, timeout=timeout, breaker=breaker, rate_limit=rate_limit,
                    compensate=compensate, requires_approval=requires_approval,
                    approvers=None if approvers is None else tuple(approvers))

    if fn is not None:
        return build(fn)
    return build


_TYPE_HINT = ("use a type JSON can carry (str, int, float, bool, None, a list, dict or Literal of those, a pydantic "
              "model), or keep the value out of the model's arguments (a closure or functools.partial)")


def _signature(tool_name: str, func: Callable[..., Any]) -> inspect.Signature:
    """``func``'s signature with its annotations resolved (``from __future__ import annotations``
    makes them strings, which pydantic resolved in raysaga's namespace, not the function's: a
    model class of the user's module was "not fully defined" at the first model call). A name that
    does not resolve is refused here, naming the parameter."""
    try:
        plain = inspect.signature(func)
    except (TypeError, ValueError):
        raise WorkflowDefinitionError(f"tool {tool_name!r}: {func!r} has no signature to describe") from None
    try:
        return inspect.signature(func, eval_str=True)
    except Exception:  # an annotation that does not evaluate: found below, naming its parameter
        pass
    # one annotation did not evaluate (the return type imported under TYPE_CHECKING, say): the
    # parameters, each resolved on its own, are what the model is told about (the return is not)
    target = inspect.unwrap(func.func if isinstance(func, functools.partial) else func)
    namespace = getattr(target, "__globals__", {})
    params = []
    for pname, param in plain.parameters.items():
        if isinstance(param.annotation, str):
            try:
                param = param.replace(annotation=eval(param.annotation, dict(namespace)))  # what eval_str does
            except Exception as exc:
                raise WorkflowDefinitionError(
                    f"tool {tool_name!r}: the type of parameter {pname!r}, {param.annotation!r}, cannot be resolved "
                    f"({type(exc).__name__}: {exc}): define or import it at module level, where the tool's function "
                    "can see it") from None
        params.append(param)
    return plain.replace(parameters=params, return_annotation=inspect.Signature.empty)


def _input_model(tool_name: str, fields: dict[str, Any]) -> type[BaseModel]:
    """The model of the tool's arguments, its JSON schema built now: a parameter that cannot be
    described to a model (a Callable, a class pydantic does not know) is refused here, naming it,
    rather than crashing the driver at the agent's first model call."""
    try:
        model: type[BaseModel] = create_model(f"{tool_name}_input", **fields)
        model.model_json_schema()
        return model
    except Exception as exc:  # pydantic raises several kinds: find the parameter at fault
        problem = exc
    for pname, field_def in fields.items():
        try:
            create_model(f"{tool_name}_{pname}", **{pname: field_def}).model_json_schema()
        except Exception as exc:
            raise WorkflowDefinitionError(
                f"tool {tool_name!r}: parameter {pname!r} of type {_type_name(field_def[0])} cannot be described to "
                f"a model as JSON schema ({type(exc).__name__}: {str(exc).splitlines()[0][:200]}): {_TYPE_HINT}"
            ) from None
    raise WorkflowDefinitionError(f"tool {tool_name!r}: its parameters cannot be described to a model as JSON "
                                  f"schema ({type(problem).__name__}: {str(problem).splitlines()[0][:200]}): "
                                  f"{_TYPE_HINT}") from None


def _type_name(annotation: Any) -> str:
    return annotation.__name__ if isinstance(annotation, type) else repr(annotation)


def _check_options(tool_name: str, *, description: Any, effect: Any, key: Any, retry: Any, timeout: Any,
                   breaker: Any) -> tuple[str, ...]:
    """Refuse an option of the wrong type (naming the tool); return ``key`` as a tuple of names."""
    if description is not None and not isinstance(description, str):
        raise WorkflowDefinitionError(f"tool {tool_name!r}: description= takes a str, got {description!r}")
    if not isinstance(effect, bool):
        raise WorkflowDefinitionError(f"tool {tool_name!r}: effect= takes True or False, got {effect!r}")
    if retry is not None and not isinstance(retry, RetryPolicy):
        raise WorkflowDefinitionError(
            f"tool {tool_name!r}: retry= takes a RetryPolicy, e.g. retry=RetryPolicy(max_attempts=5), got {retry!r}")
    if timeout is not None and (isinstance(timeout, bool) or not isinstance(timeout, int | float)
                                or not math.isfinite(timeout) or timeout <= 0):
        raise WorkflowDefinitionError(
            f"tool {tool_name!r}: timeout must be a finite number of seconds > 0, got {timeout!r}")
    if breaker is not None and (not isinstance(breaker, str) or not breaker or len(breaker) > MAX_BREAKER_NAME):
        raise WorkflowDefinitionError(
            f"tool {tool_name!r}: breaker= takes a dependency's name (a str of 1-{MAX_BREAKER_NAME} characters), "
            f"got {breaker!r}")
    if key is None:
        return ()
    return str_tuple(key, f"tool {tool_name!r}", "key", '("order_id",)', takes="argument names")


#: What a tool's compensation may take besides the tool's own arguments.
COMPENSATION_PARAMS = frozenset({"ctx", "output"})


def _check_compensation(tool_name: str, undo: Callable[..., Any], effect: bool, args: set[str]) -> None:
    if not effect:
        raise WorkflowDefinitionError(
            f"tool {tool_name!r}: compensate= needs effect=True (only an effect has something to undo)")
    try:
        params = inspect.signature(undo).parameters
    except (TypeError, ValueError):
        raise WorkflowDefinitionError(f"tool {tool_name!r}: compensate= must be a function") from None
    unknown = [p for p, param in params.items() if p not in args | COMPENSATION_PARAMS
               and param.default is inspect.Parameter.empty and param.kind not in (param.VAR_KEYWORD,
                                                                                   param.VAR_POSITIONAL)]
    if unknown:
        raise WorkflowDefinitionError(
            f"tool {tool_name!r}: its compensation {getattr(undo, '__name__', undo)!r} takes {unknown}, which "
            f"nothing provides: it may take the tool's arguments {sorted(args)}, 'output' and 'ctx'")


def tool_output(result: dict[str, Any]) -> Any:
    """A recorded call's result as the tool returned it: its text decoded when it is JSON."""
    content = result.get("content")
    if not isinstance(content, str):
        return content
    try:
        return jsoncodec.loads(content)
    except (ValueError, NotJSONableError):  # a str result that is not JSON text
        return content


def run_compensation(tool: Tool, args: dict[str, Any], output: Any, ctx: Any) -> Any:
    """Inside the Ray task: undo one call of ``tool``; its parameters are bound by name."""
    assert tool.compensate is not None
    available = {**tool.typed(args), "output": output, "ctx": ctx}
    params = inspect.signature(tool.compensate).parameters
    if any(p.kind == p.VAR_KEYWORD for p in params.values()):
        kwargs = available
    else:
        kwargs = {name: available[name] for name in params if name in available}
    return awaited(tool.compensate(**kwargs))  # an ``async def`` undo's coroutine, run to its end


def took_no_effect(result: Any) -> TypeGuard[dict[str, Any]]:
    """Whether a tool call's recorded result is a ``ToolError``'s answer (``run_tool``): the tool
    said it did nothing, so an effect tool's key is not committed and may run again."""
    return isinstance(result, dict) and result.get("is_error") is True


def run_tool(tool: Tool, args: dict[str, Any], idempotency_key: str | None) -> dict[str, Any]:
    """Inside the Ray task: call the tool. Semantic errors come back as data, others raise.

    ``args`` are the JSON form ``Tool.validate`` gave; the function gets them ``typed``. A result
    with no JSON form is returned as it is, for the task to refuse as the output it cannot store
    (``task._refused``): the function *returned*, so an effect tool's error says ``took_effect``
    and its key is not run again. (Raised here, it read as a failure of the call itself.)

    An ``async def`` tool is awaited here, in the call's task (``awaiting.awaited``): its body runs,
    with the call's timeout and retries as a plain tool's. (Its coroutine was once taken for the
    result: never run, refused as unstorable, and an effect tool's call recorded as done.)

    A ``ToolError``'s message has each lone surrogate replaced with U+FFFD, as the model's own text
    has: left in, the answer could not be stored, and an effect tool's call that took no effect
    was recorded as one that did (its retry refused, its undo called in a rollback)."""
    try:
        valid = tool.typed(args)
        fn_params = inspect.signature(tool.fn).parameters
        if "idempotency_key" in fn_params and "idempotency_key" not in valid:
            valid["idempotency_key"] = idempotency_key
        result = awaited(tool.fn(**valid))  # an ``async def`` tool's coroutine, run to its end
    except ToolError as exc:
        # an error: shown to the model, stored; never blank (the Messages API refuses an is_error
        # tool_result with empty content: 400, failing the agent's next model call for good)
        message = scrub_text(_SURROGATE.sub("\ufffd", exc.message)) if isinstance(exc.message, str) else ""
        return ToolErrorAnswer(content=message if message.strip() else empty_error(tool.name), is_error=True)
    if isinstance(result, str):
        content = result
    else:
        try:
            content = jsoncodec.dumps(result, f"result of tool {tool.name!r}")
        except NotJSONableError:
            return {"content": result, "is_error": False}  # refused by the task, which stores none of it
    # a secret value the tool read (a config file, an environment dump) stays out of the store and the model
    return {"content": scrub_secret_values(content), "is_error": False}


#: Half of a UTF-16 surrogate pair, alone (an ``os.listdir`` name that is not UTF-8, decoded with
#: ``surrogateescape``): no UTF-8 text, and so no store, can hold one.
_SURROGATE = re.compile("[\ud800-\udfff]")


class ToolErrorAnswer(dict[str, Any]):
    """``run_tool``'s answer to a ``ToolError``, a plain dict to every reader. Its type tells the
    task running the call (``task.execute``) that the tool took no effect: an answer above the
    output cap is cut to fit (``fitted``), and one that cannot be stored is never recorded as a
    result the tool returned, which took effect (its key refused again, its undo called)."""

    def fitted(self, max_bytes: int) -> str | None:
        """The answer's JSON text with its message cut so the whole is at most ``max_bytes`` bytes,
        a note saying so; None when not even the note fits (a cap of a few bytes)."""
        message = str(self.get("content", ""))

        def text(n: int) -> str:
            note = (f"\n[raysaga: this error message was cut at {n:,} of {len(message):,} characters, to fit "
                    "the run's output cap (RunOptions.max_output_bytes)]")
            return jsoncodec.dumps({"content": message[:n] + note, "is_error": True}, "tool error")

        low, high = -1, min(len(message), max_bytes) + 1  # (a character is at least one byte)
        while high - low > 1:  # the longest cut that fits (low): the size grows with the cut's length
            mid = (low + high) // 2
            low, high = (mid, high) if len(text(mid).encode("utf-8")) <= max_bytes else (low, mid)
        return text(low) if low >= 0 else None


def empty_error(tool_name: str) -> str:
    """What an ``is_error`` tool result without a message says instead (``ToolError("")``)."""
    return f"{tool_name} returned an error with no message"
