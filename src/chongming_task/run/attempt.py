"""What one attempt's ending becomes: a result, an exception, a stop, a timeout, a crash
of the runtime. Pure decisions over values; the run (``handle``) applies them under its
lock, through the one state table."""

from __future__ import annotations

from typing import Any

from ..errors import CarrierCrashed, InvalidValue
from ..model import Failure, FailureKind, JSONValue, TaskStatus
from ..values import ValueRules, describe_exception, describe_traceback, storable_result
from ..values import storable_text as _storable_text

__all__ = [
    "abandoned_after_stop",
    "abandoned_after_timeout",
    "crash_failure",
    "exception_failure",
    "result_outcome",
    "stopped_end",
]


def _type_name(exc: BaseException) -> str:
    return f"{type(exc).__module__}.{type(exc).__qualname__}"


def result_outcome(result: Any, rules: ValueRules) -> tuple[JSONValue, Failure | None]:
    """A return value as the store will give it back (JSON: tuples become lists, keys
    become strings), so this process and the store say the same thing; or, if the store
    cannot hold it (nested too deep, text that is not UTF-8, NaN, not JSON), the failure
    ``result_invalid``, never retried. Checked *before* success: a value the write could
    not write once left the store at ``running`` while the process said ``succeeded``
    (docs/design.md, "Results")."""
    if result is None:
        return None, None
    if hasattr(result, "__await__"):  # a sync function that returned a coroutine, say
        close = getattr(result, "close", None)
        if callable(close):
            close()  # never awaited: no "was never awaited" warning later
        return None, Failure(
            kind=FailureKind.RESULT_INVALID,
            message=f"the function returned an awaitable ({type(result).__name__}), not a "
            "result: define the task with `async def` so the node awaits it",
            exception_type="builtins.TypeError",
        )
    try:
        return storable_result(result, rules), None
    except Exception as exc:  # InvalidValue, or anything the check itself hit
        message = str(exc) if isinstance(exc, InvalidValue) else f"{exc!r}"
        return None, Failure(
            kind=FailureKind.RESULT_INVALID,
            message=_storable_text(message, rules),
            exception_type=_type_name(exc),
        )


def exception_failure(exc: BaseException, rules: ValueRules) -> Failure:
    """The failure an exception raised by the task's function records."""
    return Failure(
        kind=FailureKind.CRASHED if isinstance(exc, CarrierCrashed) else FailureKind.EXCEPTION,
        message=_storable_text(describe_exception(exc), rules),
        exception_type=_type_name(exc),
        traceback=describe_traceback(exc, rules),
    )


def crash_failure(exc: BaseException, rules: ValueRules) -> Failure:
    """The failure recorded when the runtime itself failed while carrying a task."""
    return Failure(
        kind=FailureKind.EXCEPTION,
        message=_storable_text(
            f"the runtime failed while carrying this task: {describe_exception(exc)}", rules
        ),
        exception_type=_type_name(exc),
    )


def stopped_end(
    kind: str | None, was: TaskStatus, timeout: float | None, how: str
) -> tuple[TaskStatus, Failure | None, str]:
    """How a task that obeyed a stop ends: the status, its failure, the trail's reason.
    ``kind`` is the token's stop kind; ``was`` what it was doing when asked; ``how`` what
    ended the attempt, in words: ``stopped at a checkpoint``, ``cancelled at an await``
    (a coroutine the runtime cancelled) or what a forced end did (``its worker process
    1234 was terminated``)."""
    if kind == "timeout":
        failure = Failure(kind=FailureKind.TIMEOUT, message=f"timed out after {timeout}s ({how})")
        return TaskStatus.FAILED, failure, "timeout"
    if kind == "cancel":
        forced = "" if how in _OBEYED else f": {how}"
        return TaskStatus.CANCELLED, None, f"cancelled while {was.value}{forced}"
    return TaskStatus.STOPPED, None, how


AT_A_CHECKPOINT = "stopped at a checkpoint"
AT_AN_AWAIT = "cancelled at an await"
_OBEYED = (AT_A_CHECKPOINT, AT_AN_AWAIT)


def _still_running(is_async: bool) -> str:
    """What may still run, by the carrier that ran the task."""
    if is_async:
        return (
            "its coroutine refused cancellation and may still be running on the node's event loop"
        )
    return "its thread may still be running (threads cannot be killed)"


def abandoned_after_timeout(timeout: float | None, grace: float, *, is_async: bool) -> Failure:
    """The honest failure of a task that ignored its timeout's stop (a thread) or its
    cancellation (a coroutine) for ``grace`` seconds: its carrier may still run."""
    return Failure(
        kind=FailureKind.TIMEOUT,
        message=f"timed out after {timeout}s and did not stop within {grace}s; "
        + _still_running(is_async),
        carrier_may_run=True,
    )


def abandoned_after_stop(
    kind: str | None, waited: float, *, is_async: bool
) -> tuple[TaskStatus, Failure, str]:
    """How a task ends whose carrier did not end ``waited`` seconds after it was asked to
    stop (a coroutine cancelled after its grace, or left at a close): ended as the stop
    asked, saying its carrier may still run. A timeout's is ``abandoned_after_timeout``."""
    asked = "cancel" if kind == "cancel" else "stop"
    failure = Failure(
        kind=FailureKind.ABANDONED,
        message=f"asked to {asked}, it did not end within {waited:g}s; " + _still_running(is_async),
        carrier_may_run=True,
    )
    to = TaskStatus.CANCELLED if kind == "cancel" else TaskStatus.STOPPED
    return to, failure, f"{asked}; carrier abandoned"
