"""``AsyncFace``: the controller's face for a program that already runs an event loop
(docs/design.md, "One async rule"): every call that waits or touches the store has an
awaited twin named with an ``a`` (``await_for`` for ``wait_for``), with the same
arguments and answer, the blocking call on a thread so the caller's loop never waits;
``async with`` closes the node."""

from __future__ import annotations

import asyncio
import functools
from collections.abc import Callable, Iterable
from typing import TYPE_CHECKING, Any, Self

if TYPE_CHECKING:
    from ..definitions import TaskRef
    from ..model import ControlReceipt, TaskQuery, TaskSnapshot, TaskStatus, Transition
    from ..pipelines import Pipeline, PipelineRun
    from ..run.handle import TaskRun
    from ..run.stored import StoredTask
    from ..schedules import Overlap, Schedule, Trigger
    from ..tasks import Runnable
    from .supervision import ReconcileReport

__all__ = ["AsyncFace"]


class AsyncFace:
    """Mixed into ``Controller``: the awaited twins of its calls."""

    __slots__ = ()

    if TYPE_CHECKING:

        def submit(self, task: Runnable, /, *args: Any, **kwargs: Any) -> TaskRun: ...
        def submit_many(
            self, task: Runnable, calls: Iterable[tuple[Any, ...]], /
        ) -> list[TaskRun]: ...
        def submit_pipeline(self, pipeline: Pipeline) -> PipelineRun: ...
        def schedule(
            self,
            name: str,
            task: TaskRef,
            trigger: Trigger,
            /,
            *,
            args: Iterable[Any] = (),
            kwargs: dict[str, Any] | None = None,
            overlap: Overlap = "skip",
            misfire_grace: float | None = None,
            jitter: float = 0.0,
            bucket_key: str | None = None,
            tags: Iterable[str] = (),
            priority: int = 0,
            dedupe_key: str | None = None,
        ) -> Schedule: ...
        def unschedule(self, name: str) -> None: ...
        def tick_schedules(self) -> list[TaskRun | StoredTask]: ...
        def stop(self, task_id: str, *, reason: str | None = None) -> ControlReceipt: ...
        def pause(self, task_id: str, *, reason: str | None = None) -> ControlReceipt: ...
        def resume(self, task_id: str, *, reason: str | None = None) -> ControlReceipt: ...
        def cancel(self, task_id: str, *, reason: str | None = None) -> ControlReceipt: ...
        def poll_commands_once(self) -> int: ...
        def get(self, task_id: str) -> TaskSnapshot: ...
        def history(self, task_id: str, *, since_version: int = 0) -> list[Transition]: ...
        def list_tasks(self, query: TaskQuery | None = None) -> list[TaskSnapshot]: ...
        def stats(self) -> dict[TaskStatus, int]: ...
        def bucket_counts(self) -> dict[int | None, int]: ...
        def wait_for(
            self,
            task_id: str,
            predicate: Callable[[TaskSnapshot], bool] = ...,
            *,
            timeout: float = 30.0,
            poll: float = 0.05,
        ) -> TaskSnapshot: ...
        def wait_idle(self, timeout: float | None = None) -> bool: ...
        def reconcile(self, *, dry_run: bool = False) -> ReconcileReport: ...
        def close(self, timeout: float = 10.0, *, drain: float | None = None) -> None: ...

    async def __aenter__(self) -> Self:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await asyncio.to_thread(self.close)

    # -- submit and schedule -----------------------------------------------------------------

    async def asubmit(self, task: Runnable, /, *args: Any, **kwargs: Any) -> TaskRun:
        return await asyncio.to_thread(functools.partial(self.submit, task, *args, **kwargs))

    async def asubmit_many(
        self, task: Runnable, calls: Iterable[tuple[Any, ...]], /
    ) -> list[TaskRun]:
        return await asyncio.to_thread(self.submit_many, task, list(calls))

    async def asubmit_pipeline(self, pipeline: Pipeline) -> PipelineRun:
        return await asyncio.to_thread(self.submit_pipeline, pipeline)

    async def aschedule(
        self,
        name: str,
        task: TaskRef,
        trigger: Trigger,
        /,
        *,
        args: Iterable[Any] = (),
        kwargs: dict[str, Any] | None = None,
        overlap: Overlap = "skip",
        misfire_grace: float | None = None,
        jitter: float = 0.0,
        bucket_key: str | None = None,
        tags: Iterable[str] = (),
        priority: int = 0,
        dedupe_key: str | None = None,
    ) -> Schedule:
        call = functools.partial(
            self.schedule,
            name,
            task,
            trigger,
            args=args,
            kwargs=kwargs,
            overlap=overlap,
            misfire_grace=misfire_grace,
            jitter=jitter,
            bucket_key=bucket_key,
            tags=tags,
            priority=priority,
            dedupe_key=dedupe_key,
        )
        return await asyncio.to_thread(call)

    async def aunschedule(self, name: str) -> None:
        await asyncio.to_thread(self.unschedule, name)

    async def atick_schedules(self) -> list[TaskRun | StoredTask]:
        return await asyncio.to_thread(self.tick_schedules)

    # -- control ---------------------------------------------------------------------------

    async def astop(self, task_id: str, *, reason: str | None = None) -> ControlReceipt:
        return await asyncio.to_thread(functools.partial(self.stop, task_id, reason=reason))

    async def apause(self, task_id: str, *, reason: str | None = None) -> ControlReceipt:
        return await asyncio.to_thread(functools.partial(self.pause, task_id, reason=reason))

    async def aresume(self, task_id: str, *, reason: str | None = None) -> ControlReceipt:
        return await asyncio.to_thread(functools.partial(self.resume, task_id, reason=reason))

    async def acancel(self, task_id: str, *, reason: str | None = None) -> ControlReceipt:
        return await asyncio.to_thread(functools.partial(self.cancel, task_id, reason=reason))

    async def apoll_commands_once(self) -> int:
        return await asyncio.to_thread(self.poll_commands_once)

    # -- reads and waits -------------------------------------------------------------------

    async def aget(self, task_id: str) -> TaskSnapshot:
        return await asyncio.to_thread(self.get, task_id)

    async def ahistory(self, task_id: str, *, since_version: int = 0) -> list[Transition]:
        return await asyncio.to_thread(
            functools.partial(self.history, task_id, since_version=since_version)
        )

    async def alist_tasks(self, query: TaskQuery | None = None) -> list[TaskSnapshot]:
        return await asyncio.to_thread(self.list_tasks, query)

    async def astats(self) -> dict[TaskStatus, int]:
        return await asyncio.to_thread(self.stats)

    async def abucket_counts(self) -> dict[int | None, int]:
        return await asyncio.to_thread(self.bucket_counts)

    async def await_for(
        self,
        task_id: str,
        predicate: Callable[[TaskSnapshot], bool] | None = None,
        *,
        timeout: float = 30.0,
        poll: float = 0.05,
    ) -> TaskSnapshot:
        """``wait_for``, awaited (default: until the task ended)."""
        call = (
            functools.partial(self.wait_for, task_id, timeout=timeout, poll=poll)
            if predicate is None
            else functools.partial(self.wait_for, task_id, predicate, timeout=timeout, poll=poll)
        )
        return await asyncio.to_thread(call)

    async def await_idle(self, timeout: float | None = None) -> bool:
        return await asyncio.to_thread(self.wait_idle, timeout)

    async def areconcile(self, *, dry_run: bool = False) -> ReconcileReport:
        return await asyncio.to_thread(functools.partial(self.reconcile, dry_run=dry_run))

    async def aclose(self, timeout: float = 10.0, *, drain: float | None = None) -> None:
        await asyncio.to_thread(functools.partial(self.close, timeout, drain=drain))
