"""``AsyncFace``: the controller's face for a program that already runs an event loop
(docs/design.md, "Async tasks"): each call is its blocking twin on a thread, so the
caller's loop never waits on the store, and ``async with`` closes the node."""

from __future__ import annotations

import asyncio
from typing import TYPE_CHECKING, Self

if TYPE_CHECKING:
    from ..model import ControlReceipt

__all__ = ["AsyncFace"]


class AsyncFace:
    """Mixed into ``Controller``: the awaitable twins of its calls."""

    __slots__ = ()

    if TYPE_CHECKING:

        def stop(self, task_id: str, *, reason: str | None = None) -> ControlReceipt: ...
        def pause(self, task_id: str, *, reason: str | None = None) -> ControlReceipt: ...
        def resume(self, task_id: str, *, reason: str | None = None) -> ControlReceipt: ...
        def cancel(self, task_id: str, *, reason: str | None = None) -> ControlReceipt: ...
        def close(self, timeout: float = 10.0) -> None: ...

    async def __aenter__(self) -> Self:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await asyncio.to_thread(self.close)

    async def astop(self, task_id: str, *, reason: str | None = None) -> ControlReceipt:
        return await asyncio.to_thread(self.stop, task_id, reason=reason)

    async def apause(self, task_id: str, *, reason: str | None = None) -> ControlReceipt:
        return await asyncio.to_thread(self.pause, task_id, reason=reason)

    async def aresume(self, task_id: str, *, reason: str | None = None) -> ControlReceipt:
        return await asyncio.to_thread(self.resume, task_id, reason=reason)

    async def acancel(self, task_id: str, *, reason: str | None = None) -> ControlReceipt:
        return await asyncio.to_thread(self.cancel, task_id, reason=reason)
