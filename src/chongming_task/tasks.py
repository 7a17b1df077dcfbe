"""``Task``: what ``@node.task`` and ``@chongming_task.task`` return, the one face a
task is submitted through (docs/design.md, "Submitting").

Every argument of ``submit`` goes to the task's function, always; how the task is
submitted (when, in what order, under which keys) is said once, in ``configure``, which
returns a ``ConfiguredTask`` with the same ``submit`` family. A task made by the
module-level decorator belongs to no node until one registers it
(``node.register(task)``); a task made by ``node.task`` submits to that node.
"""

from __future__ import annotations

import asyncio
import functools
from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import replace
from datetime import datetime
from typing import (
    TYPE_CHECKING,
    Any,
    Concatenate,
    Generic,
    Never,
    ParamSpec,
    Protocol,
    TypeAlias,
    overload,
)

from . import observe
from .definitions import Carrier, Definitions, TaskDefinition, TaskFunction, define
from .errors import ConfigurationError, InvalidValue
from .observe import submitted
from .options import OnDuplicate, SubmitOptions, celery_hint
from .policies import ExceptionClasses, RetryPolicy

if TYPE_CHECKING:
    from .run.handle import TaskRun
    from .run.stored import StoredTask

__all__ = ["ConfiguredTask", "NodeTasks", "Runnable", "Task", "TaskSubmitter", "bind", "task"]

P = ParamSpec("P")

_DEFAULTS = SubmitOptions()


class TaskSubmitter(Protocol):
    """The node's side of a submit (``node.submission.Submitter``), as a task sees it."""

    def accepting(self) -> bool: ...

    def submit(
        self, task: TaskDefinition, args: tuple[Any, ...], kwargs: dict[str, Any]
    ) -> TaskRun: ...

    def submit_with(
        self,
        options: SubmitOptions,
        task: TaskDefinition,
        args: tuple[Any, ...],
        kwargs: dict[str, Any],
    ) -> TaskRun | StoredTask: ...

    def submit_many(
        self, task: TaskDefinition, calls: Iterable[tuple[Any, ...]]
    ) -> list[TaskRun]: ...

    def submit_many_with(
        self, options: SubmitOptions, task: TaskDefinition, calls: Iterable[tuple[Any, ...]]
    ) -> list[TaskRun | StoredTask]: ...


class Task(Generic[P]):
    """A task a node can run: ``submit(*args, **kwargs)`` queues one run of it (every
    argument is the function's own), ``configure(...)`` says how to submit it, and
    calling it calls the function (``task(token, ...)``, for tests)."""

    __slots__ = ("_node", "definition")

    def __init__(self, definition: TaskDefinition, node: TaskSubmitter | None = None) -> None:
        self.definition = definition
        self._node = node

    def __repr__(self) -> str:
        where = "" if self._node is not None else ", not registered on a node"
        return f"<Task {self.definition.name}{where}>"

    if not TYPE_CHECKING:  # at run time only: a type checker still flags a misspelt name

        def __getattr__(self, name: str) -> Any:
            """Only for names it does not have: Celery's are answered with ours."""
            raise AttributeError(f"{type(self).__name__} has no {name!r}{celery_hint(name)}")

    @property
    def name(self) -> str:
        return self.definition.name

    def __call__(self, token: Any, /, *args: P.args, **kwargs: P.kwargs) -> Any:
        return self.definition.func(token, *args, **kwargs)

    def _submitter(self) -> TaskSubmitter:
        """The node this task submits to; ``ConfigurationError`` if none registered it."""
        node = self._node
        if node is None:
            raise ConfigurationError(
                f"task {self.definition.name} is registered on no node: call "
                "node.register(task) first (or define it with @node.task)"
            )
        return node

    # -- submit ------------------------------------------------------------------------------

    def submit(self, *args: P.args, **kwargs: P.kwargs) -> TaskRun:
        """Queue one run with these arguments (all the function's own); its handle.
        A missing, extra or misspelt argument is a ``TypeError`` here, nothing stored;
        ``StoreError`` if the store refuses the task."""
        node = self._submitter()
        if (watch := observe.watcher) is not None:
            return submitted(watch, "submit", node.submit, self.definition, args, kwargs)
        return node.submit(self.definition, args, kwargs)

    async def asubmit(self, *args: P.args, **kwargs: P.kwargs) -> TaskRun:
        """``submit``, the store write on a thread: the caller's event loop never waits."""
        return await asyncio.to_thread(functools.partial(self.submit, *args, **kwargs))

    def submit_many(self, calls: Iterable[tuple[Any, ...]], /) -> list[TaskRun]:
        """Queue one run per tuple of positional arguments in ``calls``: all stored in
        one transaction where the store can (the built-in SQL stores), or none."""
        node = self._submitter()
        if (watch := observe.watcher) is not None:
            return submitted(watch, "submit_many", node.submit_many, self.definition, calls)
        return node.submit_many(self.definition, calls)

    async def asubmit_many(self, calls: Iterable[tuple[Any, ...]], /) -> list[TaskRun]:
        """``submit_many``, the store write on a thread."""
        return await asyncio.to_thread(self.submit_many, list(calls))

    def configure(
        self,
        *,
        delay: float | None = None,
        run_at: datetime | None = None,
        priority: int = 0,
        dedupe_key: str | None = None,
        on_duplicate: OnDuplicate = "return",
        dedupe_window: float | None = None,
        concurrency_key: str | None = None,
        bucket_key: str | None = None,
        tags: Iterable[str] = (),
        **unknown: Never,
    ) -> ConfiguredTask[P]:
        """This task with submit options: start ``delay`` seconds from now or at
        ``run_at`` (an aware datetime); ``priority`` (higher first in the node's queue);
        ``dedupe_key`` (at most one unfinished task in the store holds it: a duplicate
        answers with that task's handle, or ``TaskAlreadyExists`` with
        ``on_duplicate="raise"``; ``dedupe_window``: a success keeps the key that many
        seconds more); ``concurrency_key`` (the runs sharing it count against the task's
        ``max_per_key``); ``bucket_key`` (a business key, such as a tenant id, that
        picks the bucket); extra ``tags``. A bad option is an ``InvalidValue`` here; an
        unknown one a ``TypeError`` (Celery's ``countdown``/``eta`` named as ours)."""
        if unknown:
            _refuse_unknown(unknown)
        if isinstance(tags, str):
            raise InvalidValue(f"tags must be an iterable of text, not the text {tags!r}")
        options = SubmitOptions(
            delay=delay,
            run_at=run_at,
            priority=priority,
            dedupe_key=dedupe_key,
            on_duplicate=on_duplicate,
            dedupe_window=dedupe_window,
            concurrency_key=concurrency_key,
            bucket_key=bucket_key,
            tags=tags if type(tags) is frozenset else frozenset(tags),
        )
        return ConfiguredTask(self, options)


def bind(task: Task[P], node: TaskSubmitter) -> Task[P]:
    """``task`` submitting to ``node`` (``node.register``): the task itself if it had no
    node yet or its node has closed, else a second ``Task`` of the same definition."""
    current = task._node
    if current is None or current is node or not current.accepting():
        task._node = node
        return task
    return Task(task.definition, node)


class ConfiguredTask(Generic[P]):
    """A ``Task`` with submit options (``task.configure(...)``): the same ``submit``
    family, each run submitted with them. With a ``dedupe_key`` another task holds, a
    submit answers with that task's handle: a ``TaskRun`` if this node holds it, else a
    ``StoredTask`` following it in the store."""

    __slots__ = ("options", "task")

    def __init__(self, task: Task[P], options: SubmitOptions) -> None:
        self.task = task
        self.options = options

    def __repr__(self) -> str:
        chosen = {
            name: value
            for name in SubmitOptions.__dataclass_fields__
            if (value := getattr(self.options, name)) != getattr(_DEFAULTS, name)
        }
        return f"<ConfiguredTask {self.task.name} {chosen}>"

    def configure(self, **options: Any) -> ConfiguredTask[P]:
        """These options with some changed: ``task.configure(bucket_key="a")
        .configure(priority=5)``."""
        if isinstance(options.get("tags"), str):
            raise InvalidValue(
                f"tags must be an iterable of text, not the text {options['tags']!r}"
            )
        unknown = {k: v for k, v in options.items() if k not in SubmitOptions.__dataclass_fields__}
        if unknown:
            _refuse_unknown(unknown)
        return ConfiguredTask(self.task, replace(self.options, **options))

    if not TYPE_CHECKING:  # at run time only: a type checker still flags a misspelt name

        def __getattr__(self, name: str) -> Any:
            """Only for names it does not have: Celery's are answered with ours."""
            raise AttributeError(f"{type(self).__name__} has no {name!r}{celery_hint(name)}")

    def submit(self, *args: P.args, **kwargs: P.kwargs) -> TaskRun | StoredTask:
        """``Task.submit`` with these options."""
        node = self.task._submitter()
        definition = self.task.definition
        if (watch := observe.watcher) is not None:
            return submitted(
                watch, "submit", node.submit_with, self.options, definition, args, kwargs
            )
        return node.submit_with(self.options, definition, args, kwargs)

    async def asubmit(self, *args: P.args, **kwargs: P.kwargs) -> TaskRun | StoredTask:
        """``submit``, the store write on a thread."""
        return await asyncio.to_thread(functools.partial(self.submit, *args, **kwargs))

    def submit_many(self, calls: Iterable[tuple[Any, ...]], /) -> list[TaskRun | StoredTask]:
        """``Task.submit_many`` with these options (with a ``dedupe_key``: one by one,
        each as ``submit``)."""
        node = self.task._submitter()
        definition = self.task.definition
        if (watch := observe.watcher) is not None:
            submit = node.submit_many_with
            return submitted(watch, "submit_many", submit, self.options, definition, calls)
        return node.submit_many_with(self.options, definition, calls)

    async def asubmit_many(self, calls: Iterable[tuple[Any, ...]], /) -> list[TaskRun | StoredTask]:
        """``submit_many``, the store write on a thread."""
        return await asyncio.to_thread(self.submit_many, list(calls))


def _refuse_unknown(unknown: dict[str, Any]) -> None:
    words = ", ".join(f"{k}{celery_hint(k, option=True)}" for k in sorted(unknown))
    raise TypeError(f"configure() got options it does not take: {words}")


Runnable: TypeAlias = "Task[Any] | TaskDefinition | TaskFunction"
"""What ``node.submit`` takes: a ``Task``, a definition, or a plain function."""


class NodeTasks(Mapping[str, Task[Any]]):
    """``node.tasks``: the tasks a node runs, by name (``node.tasks["report"].submit(3)``
    for a task defined in code the caller does not import). An unknown name is an
    ``UnknownTask`` (a ``KeyError``)."""

    __slots__ = ("_definitions", "_node")

    def __init__(self, definitions: Definitions, node: TaskSubmitter) -> None:
        self._definitions = definitions
        self._node = node

    def __getitem__(self, name: str) -> Task[Any]:
        return Task(self._definitions.get(name), self._node)

    def __iter__(self) -> Iterator[str]:
        return iter(self._definitions.names())

    def __len__(self) -> int:
        return len(self._definitions.names())

    def __repr__(self) -> str:
        return f"<NodeTasks {self._definitions.names()}>"


@overload
def task(
    func: Callable[Concatenate[Any, P], Any],
    /,
    *,
    name: str | None = None,
    retries: int | None = None,
    backoff: RetryPolicy | None = None,
    retry_on: ExceptionClasses | None = None,
    give_up_on: ExceptionClasses | None = None,
    timeout: float | None = None,
    timeout_grace: float = 5.0,
    tags: Iterable[str] = (),
    max_per_key: int | None = None,
    carrier: Carrier = "thread",
    suspend: bool = False,
) -> Task[P]: ...


@overload
def task(
    func: None = None,
    /,
    *,
    name: str | None = None,
    retries: int | None = None,
    backoff: RetryPolicy | None = None,
    retry_on: ExceptionClasses | None = None,
    give_up_on: ExceptionClasses | None = None,
    timeout: float | None = None,
    timeout_grace: float = 5.0,
    tags: Iterable[str] = (),
    max_per_key: int | None = None,
    carrier: Carrier = "thread",
    suspend: bool = False,
) -> Callable[[Callable[Concatenate[Any, P], Any]], Task[P]]: ...


def task(
    func: TaskFunction | None = None,
    /,
    *,
    name: str | None = None,
    retries: int | None = None,
    backoff: RetryPolicy | None = None,
    retry_on: ExceptionClasses | None = None,
    give_up_on: ExceptionClasses | None = None,
    timeout: float | None = None,
    timeout_grace: float = 5.0,
    tags: Iterable[str] = (),
    max_per_key: int | None = None,
    carrier: Carrier = "thread",
    suspend: bool = False,
) -> Task[Any] | Callable[[TaskFunction], Task[Any]]:
    """Define a task before any node exists (in a module of tasks, say):
    ``@chongming_task.task(retries=3)``. It submits once a node registers it
    (``node.register(task)``); the arguments are ``define``'s and ``node.task``'s."""

    def decorate(f: TaskFunction) -> Task[Any]:
        definition = define(
            f,
            name=name,
            retries=retries,
            backoff=backoff,
            retry_on=retry_on,
            give_up_on=give_up_on,
            timeout=timeout,
            timeout_grace=timeout_grace,
            tags=tags,
            max_per_key=max_per_key,
            carrier=carrier,
            suspend=suspend,
        )
        return Task(definition)

    return decorate(func) if func is not None else decorate
