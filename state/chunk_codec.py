"""The items of a ``raysaga_item_chunks`` row (schema 12) back into values, checked: one decoder.

A chunk's ``items`` is a JSON array whose element ``i`` is item ``first_index + i`` as
``[start, duration, output]`` (the attempt after them when it is not 1): the times whole ticks of
``TICKS_PER_SECOND`` (exact), ``output`` the item's JSON text as a JSON string, or null
(``schema.item_chunks`` says more). Every reader of chunks in Python (the driver's commit when it
replaces a chunk, a fork copying its parent's, the readers by key of ``item_pages``, the
whole-run readers of ``node_reads``) decodes them here, so a chunk changed outside raysaga is the
same ``CorruptRecordError`` naming the run, the table, the node and the item whichever read
meets it; never a ``TypeError`` or a wrong value from one of them and another error from the
other. (The view ``raysaga_node_rows``, for plain SQL, decodes them in SQL: migration 0012.)
"""

from __future__ import annotations

from typing import Any, NoReturn

from raysaga.errors import CorruptRecordError, NotJSONableError
from raysaga.state import jsoncodec

#: A chunk's times are whole numbers of these (2**22 a second): an epoch time from 2004 to 2038
#: (2**30 to 2**31 s) is one, its float's last bit being 2**-22 s (later ones too, as even numbers),
#: so ``int(t * TICKS_PER_SECOND)`` holds ``t`` exactly and ``ticks / TICKS_PER_SECOND`` gives it
#: back to the bit. An int's text is cheaper to write than a float's shortest one (half a
#: 10,000-item fan-out's chunk encoding, measured), and shorter: a start and a duration, ~16 and
#: ~1-6 digits.
TICKS_PER_SECOND = 4194304.0
#: Where chunks live, as messages name it.
ITEMS_COLUMN = "raysaga_item_chunks.items"
#: What a ``CorruptRecordError`` about a stored row advises (``decoding.reading`` adds it too).
ADVICE = (": the row was changed outside raysaga; only this run is affected (restore the row from a "
          "backup, or delete the run's rows)")

#: A decoded item: (start ticks, duration ticks, output as JSON text or None, attempt).
Element = tuple[int, int, str | None, int]


def corrupt(run_id: str, detail: str) -> CorruptRecordError:
    """The error for a stored value that cannot be read, naming the run (as ``decoding.reading`` words it)."""
    return CorruptRecordError(f"run {run_id!r}: {detail}{ADVICE}")


def elements(run_id: str, node_id: str, first_index: int, items: Any) -> list[Element]:
    """The items of a chunk of ``node_id`` starting at ``first_index``, checked: ``items`` as read
    back (JSON text on SQLite, already decoded on PostgreSQL). ``CorruptRecordError`` naming the
    run when the text is not JSON, not an array, or an element is not ``[start, duration,
    output(, attempt)]`` with whole-number times, a string or null output, a whole-number attempt."""
    if isinstance(items, str | bytes):
        try:
            items = jsoncodec.loads(items)
        except (ValueError, NotJSONableError) as exc:
            raise corrupt(run_id, f"{ITEMS_COLUMN} holds text that is not JSON ({_short(items)}) for the chunk "
                                  f"of {node_id!r} at {first_index}: {exc}") from None
    if type(items) is not list:
        raise corrupt(run_id, f"{ITEMS_COLUMN} holds {_short(items)} for the chunk of {node_id!r} at "
                              f"{first_index}, not an array of items")
    out: list[Element] = []
    for place, e in enumerate(items):
        # ``type(v) is int``: a bool (True is an int to isinstance) or a float is no tick count
        if type(e) is list and 3 <= len(e) <= 4 and type(e[0]) is int and type(e[1]) is int \
                and (e[2] is None or type(e[2]) is str) and (len(e) == 3 or type(e[3]) is int):
            out.append((e[0], e[1], e[2], e[3] if len(e) == 4 else 1))
        else:
            _not_an_item(run_id, node_id, first_index + place, e)
    return out


def as_stored(items: list[Element]) -> list[list[Any]]:
    """Decoded items as a chunk's ``items`` array holds them again (the attempt only when not 1)."""
    return [[start, took, output] if attempt == 1 else [start, took, output, attempt]
            for start, took, output, attempt in items]


def _not_an_item(run_id: str, node_id: str, index: int, item: Any) -> NoReturn:
    raise corrupt(run_id, f"{ITEMS_COLUMN} holds {_short(item)} for item {index} of {node_id!r}, "
                          "not [start, duration, output(, attempt)]")


def output_of(run_id: str, node_id: str, index: int, output: str | None) -> Any:
    """An item's output (its JSON text in the chunk) as its value; ``CorruptRecordError`` when the
    text is not JSON (as a row's ``output`` column that is not JSON is)."""
    if output is None:
        return None
    try:
        return jsoncodec.loads(output)
    except (ValueError, NotJSONableError) as exc:
        raise corrupt(run_id, f"{ITEMS_COLUMN} holds an output that is not JSON ({_short(output)}) for item "
                              f"{index} of {node_id!r}: {exc}") from None


def times(start: int, took: int) -> tuple[float, float, float]:
    """(started_at, finished_at, duration) of an item, as the view computes them: the tick sum in
    integers (exact), one conversion each, ``duration`` as ``finished - started`` (a row's)."""
    started, finished = start / TICKS_PER_SECOND, (start + took) / TICKS_PER_SECOND
    return started, finished, finished - started


def item_values(run_id: str, node_id: str, index: int, item: Element, origin: str | None,
                names: tuple[str, ...] | None = None, *, output: bool = True) -> dict[str, Any]:
    """A chunk's item (decoded by ``elements``) as the view ``node_rows`` shows it: its columns
    ``names``, or every column in the view's order (``output`` None unless ``output``), computed
    as migration 0012's SQL computes them (exact). Every reader of chunks by key (``item_pages``)
    and of whole runs (``node_reads``) builds an item's values here; the output is parsed only
    when asked for."""
    started, finished, duration = times(item[0], item[1])
    wanted = output if names is None else "output" in names
    values = {"run_id": run_id, "node_id": node_id, "fan_index": index, "status": "completed",
              "attempt": item[3], "not_before": None,
              "output": output_of(run_id, node_id, index, item[2]) if wanted else None,
              "output_digest": None, "error": None, "started_at": started, "finished_at": finished,
              "duration": duration, "origin_run_id": origin}
    # every column (a whole run's read): as built, in the view's order, no copy (14 ms of 10,000 items)
    return values if names is None else {name: values[name] for name in names}


def _short(value: Any) -> str:
    text = value if isinstance(value, str) else jsoncodec.dumps(value) if _dumpable(value) else repr(value)
    return repr(text[:77] + "..." if len(text) > 80 else text)


def _dumpable(value: Any) -> bool:
    try:
        jsoncodec.dumps(value)
    except (NotJSONableError, TypeError, ValueError):
        return False
    return True
