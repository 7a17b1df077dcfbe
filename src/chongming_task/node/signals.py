"""``NotedSignals``: Ctrl-C and SIGTERM noted instead of raised, for a thread that waits to
be told to stop (``Controller.serve()``, the demo node)."""

from __future__ import annotations

import signal
import time
from types import FrameType, TracebackType
from typing import Any, Self

__all__ = ["NotedSignals"]

_SIGNALS = (signal.SIGINT, signal.SIGTERM)


class NotedSignals:
    """While in ``with``: each SIGINT and SIGTERM is noted in ``caught`` (its name,
    ``"SIGINT"``...), never raised; the previous handlers come back after (or at
    ``restore()``). With ``install=False`` (off the main thread, where no signal
    arrives) it notes nothing; ``signals`` narrows which it takes.

    The handler takes no lock (an ``Event.set()`` takes one): a second signal runs it
    inside the first's call, on the same thread, and would wait on the first for ever
    (Ctrl-C twice, or SIGTERM from ``timeout`` to the group and again from ``uv run``).
    So waiters poll ``caught``."""

    def __init__(
        self, *, install: bool = True, signals: tuple[signal.Signals, ...] = _SIGNALS
    ) -> None:
        self.caught: list[str] = []
        self._install = install
        self._signals = signals
        self._previous: dict[signal.Signals, Any] = {}

    def __enter__(self) -> Self:
        if self._install:
            self._previous = {sig: signal.signal(sig, self._note) for sig in self._signals}
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.restore()

    def restore(self) -> None:
        """The previous handlers back (once; ``with`` ends with it)."""
        previous, self._previous = self._previous, {}
        for sig, handler in previous.items():
            if handler is not None:  # None: not set from Python, nothing to restore
                signal.signal(sig, handler)

    def _note(self, signum: int, frame: FrameType | None) -> None:
        self.caught.append(signal.Signals(signum).name)

    def wait(self, seconds: float) -> bool:
        """Whether a signal came, after up to ``seconds`` (a tenth at a time) waiting."""
        deadline = time.monotonic() + seconds
        while not self.caught and time.monotonic() < deadline:
            time.sleep(0.1)
        return bool(self.caught)
