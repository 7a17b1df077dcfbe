"""``Controller``: a node. It owns task definitions and composes the services that run
their tasks (``NodeServices``: submission's workers, supervision, the command poller, the
beacon, the schedule runner and the pipeline runner, started and stopped in one place).

Control of a task this process holds acts directly on its ``Run``; control of any
other task writes a ``Command`` to the store for the holder's poller.
"""

from __future__ import annotations

import atexit
import logging
import math
import os
import random
import threading
import time
from collections.abc import Callable, Iterable, Mapping
from datetime import UTC, datetime, timedelta
from pathlib import Path
from types import TracebackType
from typing import Any, Concatenate, Literal, ParamSpec, overload

from .. import observe
from ..clock import Clock, SystemClock
from ..current import install_log_context
from ..definitions import (
    Carrier,
    Definitions,
    TaskDefinition,
    TaskFunction,
    TaskRef,
    check_arguments,
    define,
    main_module,
)
from ..errors import ConfigurationError, InvalidValue, StoreError, TaskNotFound
from ..health import HealthMonitor, NodeHealth
from ..limits import MAX_OWNER, MAX_SCHEDULE_NAME
from ..model import (
    CommandAction,
    ControlReceipt,
    TaskQuery,
    TaskSnapshot,
    TaskStatus,
    Transition,
    utc,
)
from ..observe import submitted
from ..options import SubmitOptions
from ..pipelines import Pipeline, PipelineRun
from ..policies import DEFAULT_NUM_BUCKETS, BucketPolicy, ExceptionClasses, RetryPolicy
from ..run.child import NICENESS
from ..run.handle import TaskRun
from ..run.life import CANCEL_WAIT, Run
from ..run.stored import StoredTask
from ..schedules import Overlap, Schedule, Trigger, schedule_tags, slot_task_id
from ..stores import open_store
from ..stores.capabilities import Capabilities
from ..stores.protocol import TaskStore
from ..tasks import NodeTasks, Runnable, Task, bind
from ..values import check_text
from .aface import AsyncFace
from .commands import ControlRouter
from .dispatch import make_dispatcher
from .host import NodeHost
from .leaseclock import LeaseClock
from .lifecycle import NodeServices
from .processes import ProcessPool
from .registry import RunRegistry
from .retention import retention_rules
from .services import NodeContext
from .signals import NotedSignals
from .submission import Ownership, Submitter, default_owner, new_task_id
from .supervision import Reconciler, ReconcileReport

__all__ = ["Controller", "ReconcileReport", "default_owner", "new_task_id"]

log = logging.getLogger("chongming_task.controller")

# The process a node lives in: the controllers still open (closed at the interpreter's
# exit, forgotten in a forked child), and the settings checked at construction.

OPEN: set[Controller] = set()
"""Controllers with a service started and not yet closed (their threads hold them)."""


def close_at_exit() -> None:
    """A program that ends without ``close()`` still ends, and leaves its tasks true in
    the store: each controller still open is closed as by ``close()`` (running tasks
    asked to stop, waiting ones cancelled, every transition written). ``atexit`` runs
    once the program's own non-daemon threads have ended, so a controller serves as
    long as its program runs; its threads are daemon threads, so that the interpreter
    reaches this point at all (concurrent.futures joins its workers at the same stage)."""
    for controller in list(OPEN):
        if controller.schedules:
            log.warning(
                "%r was not closed and has schedules: closing it at interpreter exit, so "
                "they fire no more; to keep a node serving, end its program with "
                "node.serve() (until Ctrl-C or SIGTERM)",
                controller,
            )
        else:
            log.info("%r was not closed: closing it at interpreter exit", controller)
        try:
            controller.close()
        except Exception:
            log.exception("closing %r at interpreter exit failed", controller)


atexit.register(close_at_exit)
# A forked child holds copies of its parent's controllers, without their threads: closing
# them at the child's exit would write "controller closed" over the parent's tasks.
os.register_at_fork(after_in_child=OPEN.clear)


def check_settings(
    max_workers: int | None, max_parallel_per_bucket: int | None, **positive: float | None
) -> int:
    """Refuse impossible settings at construction; return the worker count."""
    if max_workers is None:
        max_workers = min(32, (os.cpu_count() or 1) + 4)
    if max_workers < 1:
        raise ConfigurationError(f"max_workers must be >= 1, got {max_workers}")
    if max_parallel_per_bucket is not None and max_parallel_per_bucket < 1:
        raise ConfigurationError(
            f"max_parallel_per_bucket must be >= 1 or None, got {max_parallel_per_bucket}"
        )
    for label, value in positive.items():
        if value is not None and value <= 0:
            raise ConfigurationError(f"{label} must be > 0, got {value}")
    return max_workers


def check_processes(
    max_processes: int | None,
    max_tasks_per_process: int | None,
    max_memory_per_process: int | None,
    niceness: int = NICENESS,
) -> int:
    """Refuse impossible worker process settings at construction; return the count."""
    processes = (os.cpu_count() or 1) if max_processes is None else max_processes
    if processes < 1:
        raise ConfigurationError(f"max_processes must be >= 1, got {max_processes}")
    if isinstance(niceness, bool) or not isinstance(niceness, int) or not 0 <= niceness <= 19:
        raise ConfigurationError(
            f"process_niceness must be an int from 0 (the node's own CPU priority) to 19 "
            f"(the lowest), got {niceness!r}"
        )
    for name, limit in (
        ("max_tasks_per_process", max_tasks_per_process),
        ("max_memory_per_process", max_memory_per_process),
    ):
        if limit is not None and (isinstance(limit, bool) or not isinstance(limit, int)):
            raise ConfigurationError(f"{name} must be an int or None, got {limit!r}")
        if limit is not None and limit < 1:
            raise ConfigurationError(f"{name} must be >= 1 or None, got {limit}")
    return processes


P = ParamSpec("P")


QUIET = 1.0
"""Seconds a closing node waits for its tasks to stop before it names them."""
_DRAIN_POLL = 0.05  # seconds between two looks at what a drain waits for


def _check_drain(seconds: object) -> None:
    if (
        isinstance(seconds, bool)
        or not isinstance(seconds, int | float)
        or not math.isfinite(seconds)
        or seconds < 0
    ):
        raise InvalidValue(f"drain must be a finite number of seconds >= 0, got {seconds!r}")


_NAMED = 20
"""Tasks named one by one in the closing lines (more: counted, not named)."""


def _by_name(name: str) -> TypeError:
    return TypeError(
        f"node.submit takes a task or a function, not a name: node.tasks[{name!r}]"
        ".submit(...) submits the task of that name"
    )


def _described(run: Run) -> str:
    return f"{run.name} {run.task_id[:12]} ({run.status.value})"


def _fate(run: Run) -> str:
    """What became of a task the close waited for, in a few words."""
    if run.done():
        failure = run.snapshot().failure
        if failure is not None and failure.carrier_may_run:
            return f"{run.name} {run.task_id[:12]} {run.status.value}: {failure.message}"
        return f"{run.name} {run.task_id[:12]} {run.status.value}"
    return (
        f"{run.name} {run.task_id[:12]} still {run.status.value}: it never reached a "
        "checkpoint; its thread is left running until the process ends, and once its "
        "lease expires a reconcile marks it lost"
    )


class Controller(AsyncFace):
    """A node: definitions, workers, ownership of buckets, and control routing."""

    def __init__(
        self,
        store: TaskStore | str | Path | None = None,
        *,
        owner: str | None = None,
        owned_buckets: Iterable[int] | None = None,
        num_buckets: int = DEFAULT_NUM_BUCKETS,
        max_workers: int | None = None,
        max_parallel_per_bucket: int | None = None,
        command_poll_interval: float | None = None,
        command_lease: float = 30.0,
        lease_ttl: float = 30.0,
        activity_interval: float = 0.2,
        writethrough_buffer: int = 1000,
        clock: Clock | None = None,
        seed: int | None = None,
        poll_commands: bool | None = None,
        run_schedules: bool = True,
        reconcile_interval: float | Literal["lease_ttl"] | None = "lease_ttl",
        max_async: int = 1000,
        retention: Mapping[str | TaskStatus, timedelta] | None = None,
        max_processes: int | None = None,
        max_tasks_per_process: int | None = None,
        max_memory_per_process: int | None = None,
        process_niceness: int = NICENESS,
    ) -> None:
        """Make a node on ``store``.

        ``store``: a ``TaskStore``, or what ``open_store`` opens (a SQLite path or a
        ``postgresql://`` DSN; default ``chongming-task.db``), which the node then
        closes with itself.
        ``owner``: the node's name in the store, the trail and ``nodes`` (default
        ``host:pid``). ``num_buckets``: the deployment's bucket count, the same on every
        node (default 64). ``owned_buckets``: the buckets this node runs; ``None`` runs
        every bucket. A node that owns only some needs a ``bucket_key`` on every submit,
        pipeline step and schedule, so that its tasks land in its own buckets.

        ``max_workers``: worker threads (default ``min(32, cores + 4)``);
        ``max_processes``: worker processes for ``carrier="process"`` tasks (default:
        the machine's cores; forked on a first such task by a fork server of the node's), each
        replaced after ``max_tasks_per_process`` tasks, or once a task leaves one holding
        more than ``max_memory_per_process`` bytes (its resident set; ``None``: never),
        at ``process_niceness`` below the node's CPU priority (10; 0: the same);
        ``max_parallel_per_bucket``: at most that many of one bucket's tasks at once
        (``None``: no limit); ``max_async``: ``async def`` attempts at once on the
        node's event loop (1000).

        ``lease_ttl``: seconds a task's supervisor lease lasts (30); the node renews it
        every third, and the fleet judges a node dead once its declaration is that old.
        ``reconcile_interval``: seconds between the node's own reconciles of its buckets
        (``"lease_ttl"``, the default; ``None``: never on its own).
        ``activity_interval``: seconds between the supervisor's passes (0.2): progress
        and heartbeats written, timeouts checked, failed writes caught up.
        ``writethrough_buffer``: transitions a task keeps while the store refuses its
        writes (1000). ``retention``: finished tasks of its buckets deleted once that
        old, by status (``{"*": timedelta(days=7), "failed": timedelta(days=30)}``).

        ``command_poll_interval``: seconds between polls for controls sent from other
        processes (``None``: 0.5, or 10 to 60 where the store wakes the node);
        ``command_lease``: seconds a claimed command stays this node's (30);
        ``poll_commands``: ``False`` for a tool that acts for nodes and takes no
        commands (``None``: as a node does). ``run_schedules``: ``False`` to fire
        schedules only by hand (tests). ``clock`` and ``seed``: the node's clock and its
        random choices (backoff jitter), for tests.
        """
        install_log_context()  # records made while a task runs name it
        self.bucket_policy = BucketPolicy(num_buckets)
        self.owned_buckets: frozenset[int] | None = (
            None if owned_buckets is None else self.bucket_policy.validate(owned_buckets)
        )
        max_workers = check_settings(
            max_workers,
            max_parallel_per_bucket,
            command_poll_interval=command_poll_interval,
            command_lease=command_lease,
            lease_ttl=lease_ttl,
            activity_interval=activity_interval,
        )
        if max_async < 1:
            raise ConfigurationError(f"max_async must be >= 1, got {max_async}")
        processes = check_processes(
            max_processes, max_tasks_per_process, max_memory_per_process, process_niceness
        )
        if reconcile_interval == "lease_ttl":
            reconcile_interval = lease_ttl
        elif reconcile_interval is not None and reconcile_interval <= 0:
            raise ConfigurationError(
                f"reconcile_interval must be > 0 or None, got {reconcile_interval}"
            )
        if isinstance(store, TaskStore):
            self.store: TaskStore = store
            self._owns_store = False
        else:
            self.store = open_store(store if store is not None else "chongming-task.db")
            self._owns_store = True
        # The store's roles, resolved once, each with its fallback.
        self.capabilities = Capabilities(self.store)
        # What the store can hold: every value handed over is checked against it.
        self.value_rules = self.capabilities.value_rules
        self.owner = owner or default_owner()
        check_text(self.owner, "owner", self.value_rules, MAX_OWNER)
        self.clock: Clock = clock or SystemClock()
        self._now()  # a clock that gives naive times is refused now, not at the first task
        self.rng = random.Random(seed)
        self.max_workers = max_workers
        self.command_lease = command_lease
        self.lease_ttl = lease_ttl
        self.activity_interval = activity_interval
        self.writethrough_buffer = writethrough_buffer
        self._ownership = Ownership(self.bucket_policy, self.owned_buckets, self.owner)
        self._definitions = Definitions(self.owner, self.value_rules)
        self._registry = RunRegistry()
        self._dispatcher = make_dispatcher(
            self.clock, max_parallel_per_bucket=max_parallel_per_bucket
        )
        node = NodeContext(
            owner=self.owner,
            clock=self.clock,
            now=self._now,
            registry=self._registry,
            capabilities=self.capabilities,
            leases=LeaseClock(self.capabilities, self._now, self.clock.monotonic),
            health=HealthMonitor(
                logging.getLogger("chongming_task.health"),
                now=self._now,
                monotonic=self.clock.monotonic,
            ),
        )
        self._health = node.health
        self._reconciler = Reconciler(
            node, buckets=None if self._ownership.owns_all else self.owned_buckets
        )
        # None: the default rule (NodeServices); False: never poll commands, for tools
        # that act for a node without being one.
        self._services = services = NodeServices(
            node,
            dispatcher=self._dispatcher,
            workers=max_workers,
            lease_ttl=lease_ttl,
            activity_interval=activity_interval,
            command_lease=command_lease,
            command_poll_interval=command_poll_interval,
            buckets=self.owned_buckets,
            num_buckets=num_buckets,
            rng=self.rng,
            fire=self._fire,
            owns=self._ownership.owns_key,
            follow=lambda task_id: self._submitter.follow(task_id),
            polling=poll_commands is not False,
            started=lambda: OPEN.add(self),
            reconciler=self._reconciler,
            reconcile_interval=reconcile_interval,
            max_async=max_async,
            # How long its buckets' finished tasks are kept, by status ("*": the others).
            retention=None if retention is None else retention_rules(retention),
            processes=ProcessPool(
                processes,
                max_tasks_per_process=max_tasks_per_process,
                max_memory_per_process=max_memory_per_process,
                niceness=process_niceness,
                main=main_module(),
            ),
        )
        # What each run needs from this node: settings, and where it reports.
        host = NodeHost(
            owner=self.owner,
            clock=self.clock,
            rng=self.rng,
            capabilities=self.capabilities,
            writethrough_buffer=writethrough_buffer,
            registry=self._registry,
            dispatcher=self._dispatcher,
            workers=services.workers,
            pipelines=services.pipelines,
            writer=services.writer,
            faults=node.health.faults,
            aio=services.aio,
            processes=services.processes,
        )
        self._router = ControlRouter(node)
        if services.polling:
            self._router.wake = services.poller.wake
        self._submitter = Submitter(
            node,
            host=host,
            dispatcher=self._dispatcher,
            ownership=self._ownership,
            lease_ttl=lease_ttl,
            resolve=self._definitions.resolve,
            accepting=services.accepting,
            refusal=services.refusal,
            stored=services.start_work,
            control=self._router.route,
        )
        # Schedules fire from the scheduler's thread, or only through tick_schedules()
        # when run_schedules=False (tests with a fake clock drive them that way).
        self._run_schedules = run_schedules

    def __repr__(self) -> str:
        return f"Controller(owner={self.owner!r}, store={self.store!r})"

    def __enter__(self) -> Controller:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()

    def _now(self) -> datetime:
        """The clock's reading in UTC; a naive reading is a configuration fault."""
        now = self.clock.now()
        if now.tzinfo is UTC:  # SystemClock's reading: nothing to convert
            return now
        try:
            return utc(now, "clock.now()")
        except (ValueError, AttributeError):
            raise ConfigurationError(
                f"the clock of node {self.owner} returned {now!r}: a clock must return "
                "timezone-aware datetimes (SystemClock does)"
            ) from None

    # -- ownership --------------------------------------------------------------------------------

    @property
    def num_buckets(self) -> int:
        return self.bucket_policy.num_buckets

    @property
    def owns_all_buckets(self) -> bool:
        """No partition: no buckets declared, or every bucket declared."""
        return self._ownership.owns_all

    def owns_bucket(self, bucket: int) -> bool:
        """Whether ``bucket`` is this node's (says nothing about bucketless tasks)."""
        return self._ownership.owns(bucket)

    # -- definitions ------------------------------------------------------------------------------

    @overload
    def task(
        self,
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
        self,
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
        self,
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
        """Define a task on this node: ``@node.task(retries=3)`` or ``node.task(fn)``;
        a ``Task`` to submit (``.submit(...)``, ``.configure(...).submit(...)``). The
        function is called as ``func(token, *args, **kwargs)``.

        ``name``: its name in the store (default ``module.qualname``). ``retries``: how
        many times a failed attempt is retried; ``backoff``: the ``RetryPolicy`` that
        shapes the delays between them (give the count once: in either, or the same in
        both); ``retry_on``: the exceptions worth a retry (default: every ``Exception``),
        ``give_up_on``: those never retried (each one class or a tuple). The function may
        also ``raise Retry(after=30)`` to run again later without counting a failure.
        ``timeout``: seconds an attempt may run (paused time not counted) before
        it is asked to stop, and ``timeout_grace`` more before it is abandoned.
        ``tags``: on every run. ``max_per_key``: at most that many of its runs sharing
        one ``concurrency_key`` (``configure``) run at once on this node. ``carrier``:
        ``"process"`` runs the function in one of the node's worker processes
        (``max_processes``), for work that needs a core of its own or a stop that
        ends it for certain; the function must be importable by its module and name.
        ``suspend``: a process task that reaches no checkpoint within ``timeout_grace``
        of a pause is suspended where it stands (its worker stopped) until resumed.
        """

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
            return Task(self._definitions.register(definition), self._submitter)

        return decorate(func) if func is not None else decorate

    def register(self, task: Task[P] | TaskDefinition) -> Task[P]:
        """Make ``task`` (from ``@chongming_task.task``, or a ``define``d definition) one
        this node runs; the ``Task`` that submits to it. A task no open node registered
        before submits to this one from now on; one another open node registered keeps
        submitting there, and the ``Task`` returned submits here."""
        if isinstance(task, TaskDefinition):
            return Task(self._definitions.register(task), self._submitter)
        self._definitions.register(task.definition)
        return bind(task, self._submitter)

    @property
    def tasks(self) -> NodeTasks:
        """The tasks this node runs, by name: ``node.tasks["report"].submit(3)``."""
        return NodeTasks(self._definitions, self._submitter)

    # -- submit -----------------------------------------------------------------------------------

    def submit(self, task: Runnable, /, *args: Any, **kwargs: Any) -> TaskRun:
        """Queue one run of ``task`` (a ``Task``, or a plain function, defined here on
        first use with the defaults) with ``args``/``kwargs``, every one the function's
        own; its handle. A submit with options is ``node.task(fn).configure(...)
        .submit(...)``; a task by its name, ``node.tasks[name].submit(...)``.

        A missing, extra or misspelt argument is a ``TypeError`` here; ``StoreError`` if
        the store refuses the new task. Either way nothing was queued.
        """
        if type(task) is Task:  # its definition: the submitter's fast path
            task = task.definition
        elif isinstance(task, str):
            raise _by_name(task)
        if (watch := observe.watcher) is not None:
            return submitted(watch, "submit", self._submitter.submit, task, args, kwargs)
        return self._submitter.submit(task, args, kwargs)

    def submit_many(self, task: Runnable, calls: Iterable[tuple[Any, ...]], /) -> list[TaskRun]:
        """Queue one run of ``task`` (as ``submit`` takes it) per positional-argument
        tuple in ``calls``.

        With a store that can create in one transaction (the built-in SQL stores), all
        the tasks are stored, or none (``StoreError``).
        """
        if type(task) is Task:
            task = task.definition
        elif isinstance(task, str):
            raise _by_name(task)
        if (watch := observe.watcher) is not None:
            return submitted(watch, "submit_many", self._submitter.submit_many, task, calls)
        return self._submitter.submit_many(task, calls)

    def submit_pipeline(self, pipeline: Pipeline) -> PipelineRun:
        """Submit every node of ``pipeline`` under one new ``pipeline_run_id``.

        Roots are queued at once, the others wait as ``pending`` for their dependencies.
        All nodes are created in one store transaction when the store offers ``atomic()``.
        """
        submit = self._submitter.submit_pipeline
        watch = observe.watcher
        handle = submit(pipeline) if watch is None else submitted(watch, "submit", submit, pipeline)
        self._services.start(self._services.pipelines)
        return handle

    # -- schedules ------------------------------------------------------------------------------

    def schedule(
        self,
        name: str,
        task: TaskRef,
        trigger: Trigger,
        /,
        *,
        args: Iterable[Any] = (),
        kwargs: Mapping[str, Any] | None = None,
        overlap: Overlap = "skip",
        misfire_grace: float | None = None,
        jitter: float = 0.0,
        bucket_key: str | None = None,
        tags: Iterable[str] = (),
        priority: int = 0,
        dedupe_key: str | None = None,
    ) -> Schedule:
        """Fire ``task`` on ``trigger`` from this node, called with ``args`` and
        ``kwargs`` (checked now against its function).

        ``overlap="skip"`` (default) skips a firing while the previous run of this
        schedule is still active. After downtime the missed firings coalesce into one
        run, skipped if the latest missed one is more than ``misfire_grace`` seconds old
        (``None``: never too late). ``jitter`` delays each firing by up to that many
        seconds. ``bucket_key``, ``tags``, ``priority`` and ``dedupe_key`` apply to each
        firing as ``task.configure`` does.

        Every node that defines a schedule of this name reaches the same slots (an
        ``IntervalTrigger`` without ``start_at`` counts from 1970-01-01 UTC), and each
        slot creates one task in the whole store: the first node to reach it fires it.
        With a ``bucket_key`` only the node that owns the key's bucket fires it; another
        node keeps the schedule and leaves its slots to that owner.
        """
        # Checked now (an unknown name, a bad tag or key), not at the first firing.
        check_text(name, "schedule name", self.value_rules, MAX_SCHEDULE_NAME)
        if isinstance(tags, str):
            raise InvalidValue(f"tags must be an iterable of text, not the text {tags!r}")
        args, kwargs = tuple(args), dict(kwargs or {})
        definition, _ = self._submitter.check(
            task, bucket_key, schedule_tags(name, tags), here=False
        )
        check_arguments(definition, args, kwargs)  # every firing would fail otherwise
        self._submitter.check_keys(SubmitOptions(priority=priority, dedupe_key=dedupe_key))
        entry = Schedule(
            name=name,
            task=definition,
            trigger=trigger,
            args=args,
            kwargs=kwargs,
            overlap=overlap,
            misfire_grace=misfire_grace,
            jitter=jitter,
            bucket_key=bucket_key,
            tags=frozenset(tags),
            priority=priority,
            dedupe_key=dedupe_key,
            task_name=definition.name,
        )
        self._services.scheduler.add(entry)
        if self._run_schedules:
            self._services.start(self._services.scheduler)
        return entry

    def unschedule(self, name: str) -> None:
        self._services.scheduler.remove(name)

    @property
    def schedules(self) -> list[Schedule]:
        return self._services.scheduler.entries()

    def tick_schedules(self) -> list[TaskRun | StoredTask]:
        """Fire every schedule that is due by the clock now; return the runs submitted.

        The scheduler thread calls this; with ``run_schedules=False`` it is the only way
        schedules fire, which lets tests drive them with a fake clock, without sleeping.
        """
        return self._services.scheduler.tick()

    def _fire(self, entry: Schedule, slot: datetime) -> TaskRun | StoredTask | None:
        watch = observe.watcher
        if watch is None:
            return self._fire_one(entry, slot)
        with watch.firing(entry.name):  # a trace of its own
            return submitted(watch, "submit", self._fire_one, entry, slot)

    def _fire_one(self, entry: Schedule, slot: datetime) -> TaskRun | StoredTask | None:
        chosen = SubmitOptions(
            priority=entry.priority,
            dedupe_key=entry.dedupe_key,
            bucket_key=entry.bucket_key,
            tags=schedule_tags(entry.name, entry.tags),
        )
        return self._submitter.submit_once(
            slot_task_id(entry.name, slot), chosen, entry.task, entry.args, dict(entry.kwargs)
        )

    # -- control ----------------------------------------------------------------------------------

    def stop(self, task_id: str, *, reason: str | None = None) -> ControlReceipt:
        """Stop a task: a running one stops at its next checkpoint, a waiting one is
        cancelled. For a task held elsewhere the answer is "request accepted"."""
        return self._control(task_id, CommandAction.STOP, reason)

    def pause(self, task_id: str, *, reason: str | None = None) -> ControlReceipt:
        return self._control(task_id, CommandAction.PAUSE, reason)

    def resume(self, task_id: str, *, reason: str | None = None) -> ControlReceipt:
        return self._control(task_id, CommandAction.RESUME, reason)

    def cancel(self, task_id: str, *, reason: str | None = None) -> ControlReceipt:
        """Cancel: recorded as ``cancelled`` (never ``failed``), running or not."""
        return self._control(task_id, CommandAction.CANCEL, reason)

    def _control(self, task_id: str, action: CommandAction, reason: str | None) -> ControlReceipt:
        return self._router.route(task_id, action, reason)

    @property
    def command_poll_interval(self) -> float:
        """Seconds between two command polls: as given, else 10 where the store wakes
        the poller (the poll is then a safety net) and 0.5 where it cannot, settled once
        polling starts (``CommandPoller``)."""
        return self._services.poller.interval

    def poll_commands_once(self) -> int:
        """Claim open commands and act on those for tasks this process holds.

        A command for a task held elsewhere is released (never completed: the holder
        would never hear of it). Returns how many commands were completed here.
        """
        return self._services.poller.poll_once()

    # -- reads (through the store) ---------------------------------------------------------------

    def get(self, task_id: str) -> TaskSnapshot:
        snapshot = self.store.get(task_id)
        if snapshot is None:
            raise TaskNotFound(f"no task {task_id} in {self.store!r}")
        return snapshot

    def history(self, task_id: str, *, since_version: int = 0) -> list[Transition]:
        return self.store.history(task_id, since_version=since_version)

    def list_tasks(self, query: TaskQuery | None = None) -> list[TaskSnapshot]:
        return self.store.query(query)

    def stats(self) -> dict[TaskStatus, int]:
        """Tasks per status in the store, every status present (zero where none)."""
        counts = self.store.counts()
        return {status: counts.get(status, 0) for status in TaskStatus}

    def bucket_counts(self) -> dict[int | None, int]:
        """Tasks per bucket in the store (``None``: tasks submitted without a key)."""
        counted: dict[int | None, int] = self.capabilities.count_tasks("bucket")
        return counted  # one GROUP BY where the store can: it reads no task

    def wait_for(
        self,
        task_id: str,
        predicate: Callable[[TaskSnapshot], bool] = lambda s: s.is_terminal,
        *,
        timeout: float = 30.0,
        poll: float = 0.05,
    ) -> TaskSnapshot:
        """Poll the store until ``predicate(snapshot)`` holds (default: terminal).

        For tasks held anywhere, e.g. to see the effect of an accepted command.
        """
        return self._router.store.wait_for(task_id, predicate, timeout=timeout, poll=poll)

    def health(self) -> NodeHealth:
        """What this node says of itself (also written in its declaration, for ``nodes``,
        ``doctor`` and the dashboard): store writes failing, service threads that died,
        runs the store has moved on from."""
        return self._health.report(desynced=len(self.desynced_tasks))

    @property
    def desynced_tasks(self) -> frozenset[str]:
        """Tasks another writer changed under us: write-through stopped for them."""
        return self._registry.desynced()

    def held(self) -> list[TaskRun]:
        """The tasks this process holds (unfinished, or not yet fully written)."""
        return [self._submitter.handle(run) for run in self._registry.held()]

    def wait_idle(self, timeout: float | None = None) -> bool:
        """Wait until every task this process holds is terminal; return whether it is."""
        return self._registry.wait_all_done(timeout)

    def serve(self, until: threading.Event | None = None, *, drain: float | None = None) -> str:
        """Keep this node serving (its schedules, its workers, commands from other
        processes) until Ctrl-C or SIGTERM, or until ``until`` is set; then ``close()``
        it, with ``drain`` (``close(drain=S)``: the tasks it runs may finish for up to S
        seconds first; a second Ctrl-C ends the drain, a repeated SIGTERM does not).
        Returns what ended it: ``"SIGINT"``, ``"SIGTERM"`` or ``"until"``.

        For a program whose main code has nothing left to do but be a node: without it,
        the program ends and the node is closed at interpreter exit. The signal handlers
        are this call's while it runs, the close included (a second Ctrl-C does not cut
        the close short), then the previous ones come back; off the main thread, where
        no signal arrives, ``until`` is required.
        """
        if drain is not None:
            _check_drain(drain)  # now, not once a signal has come
        on_main = threading.current_thread() is threading.main_thread()
        if until is None and not on_main:
            raise ConfigurationError(
                "serve() off the main thread needs until= (signals reach only the main "
                "thread, so nothing else could end it)"
            )
        with NotedSignals(install=on_main) as signals:
            while not signals.caught:
                if until is None:
                    signals.wait(0.1)
                elif until.wait(0.1):
                    break
            # A second Ctrl-C ends a drain, never the close itself.
            self._close(10.0, drain, lambda: signals.caught[1:].count("SIGINT") > 0)
        return signals.caught[0] if signals.caught else "until"

    def _drain(self, seconds: float, cut: Callable[[], bool] | None) -> bool:
        """Take no new work and wait up to ``seconds`` for the work held to finish (see
        ``close``); whether some was left running when the drain ended."""
        _check_drain(seconds)
        if not self._services.begin_drain():
            return False
        services = self._services
        deadline = time.monotonic() + seconds
        if services.draining():
            log.info("node %s draining: up to %g s for its running tasks", self.owner, seconds)
        idle = 0  # two idle readings in a row: a run between the queue and its worker is seen
        while idle < 2 and time.monotonic() < deadline and not (cut is not None and cut()):
            idle = 0 if services.draining() else idle + 1
            time.sleep(min(_DRAIN_POLL, max(0.0, deadline - time.monotonic())))
        return services.draining()

    def reconcile(self, *, dry_run: bool = False) -> ReconcileReport:
        """Mark tasks whose supervisor lease expired as ``lost``, in this node's buckets only.

        Never re-executes anything (the store holds states, not arguments). A version
        conflict means the supervisor came back: reconcile lets go of that task.
        """
        return self._reconciler.run(dry_run=dry_run)

    # -- shutdown ---------------------------------------------------------------------------------

    def close(self, timeout: float = 10.0, *, drain: float | None = None) -> None:
        """Stop accepting work, cancel waiting tasks, stop running ones (waiting up to
        ``timeout`` seconds for them), write what is unwritten, and stop every service.

        ``drain=S`` (a deploy's warm shutdown) first lets the work held finish: for up
        to S seconds the node takes no new task (a submit raises ``ControllerClosed``
        saying it is draining; no schedule fires) while its running tasks, and those
        ready to start, run on; the drain ends once none is left. Then the close goes
        on as without it: what still runs is stopped at its checkpoints, its trail
        saying the drain ran out, and tasks waiting for a later time are cancelled (no
        other node can run them).

        A task that ignores its stop keeps its ``stopping`` status and lease; once the
        lease expires, a ``reconcile()`` marks it lost. Idempotent.

        Tasks still running after ``QUIET`` seconds are named at once, with how long it
        waits for them, and at the end it says what became of each (the
        ``chongming_task.controller`` log, as warnings: printed to stderr where logging
        is not set up). Tasks that stop promptly close the node without a word.
        """
        self._close(timeout, drain, None)

    def _close(self, timeout: float, drain: float | None, cut: Callable[[], bool] | None) -> None:
        """``close``; ``cut`` ends its drain early when it says so (a second Ctrl-C)."""
        why = "controller closed"
        if drain is not None and self._drain(drain, cut):
            why = f"controller closed: its drain of {drain:g} s ran out"
        if not self._services.begin_close():
            return
        unfinished = [run for run in self._registry.held() if not run.done()]
        for run in unfinished:
            run.stop(reason=why)
        deadline = time.monotonic() + timeout
        # A coroutine is cancelled within the close's time, leaving it CANCEL_WAIT to end.
        soon = max(0.0, timeout - CANCEL_WAIT)
        for run in unfinished:
            if run.definition.is_async and run.definition.timeout_grace > soon:
                self._services.aio.cancel(run, after=soon)
        slow: list[Run] = []
        if not self._registry.wait_all_done(min(QUIET, timeout)):
            slow = [run for run in unfinished if not run.done()]
            log.warning(
                "node %s closing: waiting up to %.0f s more for %d task(s) to stop at a "
                "checkpoint: %s",
                self.owner,
                max(0.0, deadline - time.monotonic()),
                len(slow),
                ", ".join(_described(run) for run in slow[:_NAMED]),
            )
            self._registry.wait_all_done(max(0.0, deadline - time.monotonic()))
        # A coroutine still running was cancelled and refused it: it is ended as its
        # stop asked, saying it may still run (a thread task keeps ``stopping``).
        for run in unfinished:
            if not run.done():
                run.left_at_close(timeout)
        stuck = [run for run in unfinished if not run.done()]
        # A carrier still in a task that never checkpoints will not end: no join waits
        # for it (its thread is abandoned, as a timeout abandons one). The services
        # share what is left of ``timeout``.
        self._services.stop(deadline, carriers_stuck=bool(stuck))
        for run in self._registry.held():
            run.catch_up()
        try:  # a create whose commit went unheard: ended now if it landed
            self._services.supervisor.doubtful.run_once(time.monotonic())
        except StoreError as exc:
            left = len(self._registry.doubtful())
            log.warning(
                "node %s closed with %d failed submit(s) unresolved (%s): if they were "
                "stored, a reconcile marks them lost once their lease ends",
                self.owner,
                left,
                exc,
            )
        if slow:
            log.warning(
                "node %s closed: %s", self.owner, "; ".join(_fate(run) for run in slow[:_NAMED])
            )
        self._services.retire()
        if self._owns_store:
            self.store.close()
        OPEN.discard(self)
