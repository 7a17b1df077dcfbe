"""The one place exceptions become a one-line message and an exit code: 0 ok, 1 failed
(unknown task, store error, wait timed out), 2 bad usage, 130 interrupted (and 3 from
``doctor`` when an alarm fires: that is an answer, not an error). No traceback
reaches a user for a user's mistake."""

from __future__ import annotations

import contextlib
import sys
from collections.abc import Iterator

from ..errors import ChongmingTaskError, InvalidValue, StoreError, WaitTimeout
from ..text import printable
from .parser import PROG, UsageError

__all__ = ["errors_mapped"]


@contextlib.contextmanager
def errors_mapped(exit_code: list[int]) -> Iterator[None]:
    """The one place that turns exceptions into a message line and an exit code."""

    def fail(code: int, message: str) -> None:
        print(f"{PROG}: error: {printable(message)}", file=sys.stderr)
        exit_code[0] = code

    try:
        yield
    except (UsageError, InvalidValue) as exc:
        fail(2, str(exc))
    except (LookupError, WaitTimeout, StoreError, ChongmingTaskError) as exc:
        fail(1, str(exc).splitlines()[0] if str(exc) else type(exc).__name__)
    except KeyboardInterrupt:
        fail(130, "interrupted")
    except BrokenPipeError:
        exit_code[0] = 0  # e.g. piped into head
