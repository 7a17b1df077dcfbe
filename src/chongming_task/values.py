"""What a store can hold: the checks every value passes where the user hands it over.

A value that reaches the store and cannot be written there fails on the write-through
path, where a failure is buffered and retried but never fails the task: the process says
``succeeded`` while the store stays ``running``, and a later ``reconcile()`` calls a
successful task ``lost`` (docs/design.md, "Results"). So every value that crosses into the
store is checked at the boundary where the user hands it over (``submit``, ``checkpoint``,
a task's return value, a control call's reason), against what the store can hold, and is
refused there with ``InvalidValue`` (a ``ValueError``) in the caller's own thread.

The rules every store shares: text is UTF-8 (no lone surrogates such as ``"\\udcff"``,
which ``os.fsdecode`` makes of undecodable bytes); JSON is strict (no NaN or Infinity,
string keys); numbers in progress are finite reals. One rule is the store's own: whether
text may hold NUL (``"\\x00"``). PostgreSQL's ``TEXT`` and ``JSONB`` refuse it, SQLite and
memory keep it. A store says so with a ``value_rules`` attribute; a store that says
nothing gets the strict rules, which every store can hold.

Text the runtime writes itself (failure messages made from a task's exception) is not the
user's to fix: ``storable_text`` makes it storable (escapes what cannot be kept, bounds
its length) instead of refusing it.
"""

from __future__ import annotations

import json
import math
import re
import traceback
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

from .errors import InvalidValue
from .limits import MAX_FAILURE_MESSAGE, MAX_PROGRESS_MESSAGE, MAX_TAG, MAX_TAGS, MAX_TRACEBACK
from .model import Progress
from .text import utf8_fault

__all__ = [
    "STRICT",
    "ValueRules",
    "check_bounded",
    "check_json",
    "check_progress",
    "check_tags",
    "check_text",
    "describe_exception",
    "describe_traceback",
    "storable_result",
    "storable_text",
    "too_long",
]

MAX_MESSAGE = MAX_FAILURE_MESSAGE
"""Characters kept of a message the runtime builds from an exception (failure, reason)."""


@dataclass(frozen=True, slots=True, kw_only=True)
class ValueRules:
    """What one store can hold beyond the rules every store shares."""

    nul_in_text: bool = False
    """Whether text (and strings inside JSON) may contain ``"\\x00"``."""


STRICT = ValueRules(nul_in_text=False)
"""What every store can hold; the rules of a store that declares none."""


# An escaped NUL in JSON text: "\u0000" preceded by an even number of backslashes (an odd
# count would make the backslash before "u" itself escaped, i.e. the literal text "\u0000").
_JSON_NUL = re.compile(r"(?<!\\)(?:\\\\)*\\u0000")


def _text_fault(value: str, rules: ValueRules) -> str | None:
    """Why ``value`` cannot be stored, or ``None``."""
    fault = utf8_fault(value)
    if fault is not None:
        bad = value[fault.start : fault.end]
        return (
            f"is not valid UTF-8 text ({bad!r} at position {fault.start}: a lone surrogate, "
            "as made from undecodable bytes)"
        )
    if "\x00" in value and not rules.nul_in_text:
        return "contains a NUL character (\\x00), which this store cannot hold"
    return None


def check_text(
    value: object, what: str, rules: ValueRules = STRICT, limit: int | None = None
) -> None:
    """Raise ``InvalidValue`` unless ``value`` is a ``str`` the store can hold, of at
    most ``limit`` characters (``chongming_task.limits``)."""
    if not isinstance(value, str):
        raise InvalidValue(f"{what} must be a str, got {type(value).__name__}")
    if limit is not None and len(value) > limit:
        raise InvalidValue(too_long(what, value, limit))
    fault = _text_fault(value, rules)
    if fault is not None:
        raise InvalidValue(f"{what} {fault}: {_shown(value)}")


def check_bounded(value: object, what: str, limit: int) -> None:
    """``value`` is text of at most ``limit`` characters (``InvalidValue``); what a
    store can hold of it is ``check_text``'s, against that store's rules."""
    if not isinstance(value, str):
        raise InvalidValue(f"{what} must be text, got {value!r}")
    if len(value) > limit:
        raise InvalidValue(too_long(what, value, limit))


def check_tags(tags: Iterable[object], what: str, rules: ValueRules | None = STRICT) -> None:
    """At most ``MAX_TAGS`` tags, each within ``MAX_TAG`` characters and text the store
    can hold; ``rules=None``: the bounds only (no store known yet)."""
    tags = list(tags)
    if len(tags) > MAX_TAGS:
        raise InvalidValue(f"{len(tags)} tags: at most {MAX_TAGS} (chongming_task.limits)")
    for tag in tags:
        if rules is None:
            check_bounded(tag, what, MAX_TAG)
        else:
            check_text(tag, what, rules, MAX_TAG)


def check_json(value: Any, what: str, rules: ValueRules = STRICT) -> str | None:
    """Encode ``value`` as the strict JSON text a store keeps; raise ``InvalidValue`` if
    the store could not hold it. Any failure of the encoder counts (``RecursionError``
    for a value nested too deep, a ``TypeError`` for a set, a ``ValueError`` for NaN or an
    ``int`` too long to print), so that no value can escape this check and fail later
    on the write-through path."""
    if value is None:
        return None
    try:
        text = json.dumps(value, ensure_ascii=False, allow_nan=False, separators=(",", ":"))
    except Exception as exc:  # the class of fault, not a list of known cases
        raise InvalidValue(
            f"{what} is not JSON a store can hold ({type(exc).__name__}: {_first(exc)})"
        ) from None
    fault = utf8_fault(text)
    if fault is not None:
        raise InvalidValue(
            f"{what} holds text that is not valid UTF-8 ({text[fault.start : fault.end]!r}: "
            "a lone surrogate, as made from undecodable bytes)"
        )
    if not rules.nul_in_text and "\\u0000" in text and _JSON_NUL.search(text):
        raise InvalidValue(f"{what} holds a NUL character (\\x00), which this store cannot hold")
    return text


def check_progress(progress: object, rules: ValueRules = STRICT) -> Progress:
    """The ``Progress`` a checkpoint may publish, or ``InvalidValue``: finite real numbers
    (``bool`` and ``Decimal`` are refused: neither survives the store as itself) and a
    message the store can hold."""
    if not isinstance(progress, Progress):
        if _finite(progress):
            return Progress(current=progress)  # type: ignore[arg-type]
        raise InvalidValue(
            f"progress must be a Progress or a finite number, got {_described(progress)}"
        )
    if not _finite(progress.current):
        raise InvalidValue(
            f"progress.current must be a finite number, got {_described(progress.current)}"
        )
    if progress.total is not None and not _finite(progress.total):
        raise InvalidValue(
            f"progress.total must be a finite number or None, got {_described(progress.total)}"
        )
    if progress.message is not None:
        check_text(progress.message, "progress.message", rules, MAX_PROGRESS_MESSAGE)
    return progress


def too_long(what: str, value: str, limit: int) -> str:
    """The one wording of a value past its bound."""
    return (
        f"{what} is {len(value):,} characters long: at most {limit:,} "
        f"(chongming_task.limits): {_shown(value)}"
    )


_SAFE_INT = 1 << 53  # ints below this need no check: every store holds them exactly


def storable_result(result: Any, rules: ValueRules = STRICT) -> Any:
    """A task's return value as the store will give it back (JSON: tuples become lists,
    keys become strings), or ``InvalidValue``."""
    kind = type(result)
    if result is None or kind is bool or (kind is int and -_SAFE_INT < result < _SAFE_INT):
        return result
    if kind is str:
        check_text(result, "the result", rules)
        return result
    text = check_json(result, "the result", rules)
    return None if text is None else json.loads(text)


def describe_exception(exc: BaseException) -> str:
    """``"Type: message"``, even for an exception whose ``__str__`` raises."""
    try:
        text = str(exc)
    except Exception:
        text = "<the exception's str() raised>"
    return f"{type(exc).__name__}: {text}"


def describe_traceback(exc: BaseException, rules: ValueRules = STRICT) -> str:
    """``exc``'s traceback as Python prints it, storable: when longer than
    ``MAX_TRACEBACK`` its last lines are kept (the raise is at the end)."""
    try:
        text = "".join(traceback.format_exception(exc))
    except Exception:  # a broken __str__ or a frame that cannot be read
        text = f"(traceback unavailable) {describe_exception(exc)}"
    if len(text) > MAX_TRACEBACK:
        cut = len(text) - MAX_TRACEBACK
        text = f"[... {cut} earlier characters]\n" + text[cut:]
    return storable_text(text, rules, limit=MAX_TRACEBACK + 64)


def storable_text(value: str, rules: ValueRules = STRICT, *, limit: int = MAX_MESSAGE) -> str:
    """``value`` made storable: lone surrogates backslash-escaped, NUL escaped where the
    store refuses it, cut to ``limit`` characters (an exception message can be huge)."""
    if len(value) > limit:
        value = value[:limit] + f"... [{len(value) - limit} more characters]"
    if _text_fault(value, rules) is None:
        return value
    value = value.encode("utf-8", "backslashreplace").decode("utf-8")
    return value.replace("\x00", "\\x00")


def _finite(value: object) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool) and math.isfinite(value)


def _described(value: object) -> str:
    return f"{type(value).__name__} {_shown(value)}"


def _shown(value: object, limit: int = 60) -> str:
    """A short, printable rendering of a bad value for an error message."""
    text = ascii(value)
    return text if len(text) <= limit else text[: limit - 3] + "..."


def _first(exc: BaseException) -> str:
    text = str(exc).strip()
    return storable_text(text.splitlines()[0], limit=200) if text else type(exc).__name__
