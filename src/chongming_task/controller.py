"""``Controller``: a node. It owns task definitions, runs their tasks on its worker threads,
persists every transition, and routes control calls.

Control of a task this process holds acts directly on its ``TaskRun``; control of any
other task writes a ``Command`` to the store for the holder's poller. Background threads:
workers (started on the first submit), the supervisor (activity flush via ``touch``, lease
renewal, timeouts, write-through catch-up; started on the first submit) and the command
poller (from construction for a node that declares ``owned_buckets``, after the first
submit otherwise, never for a pure query client).
"""

from __future__ import annotations

import logging
import os
import queue
import random
import secrets
import socket
import threading
import time
import uuid
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from datetime import datetime, timedelta
from pathlib import Path
from types import TracebackType
from typing import Any, overload

from . import states
from .clock import Clock, SystemClock
from .definitions import TaskDefinition, TaskFunction, define
from .dispatch import make_dispatcher
from .errors import (
    ChongmingTaskError,
    ConcurrencyConflict,
    ConfigurationError,
    ControllerClosed,
    StoreUnavailable,
    TaskNotFound,
    UnknownTask,
    WaitTimeout,
)
from .model import (
    Command,
    CommandAction,
    ControlOutcome,
    ControlReceipt,
    Failure,
    FailureKind,
    TaskQuery,
    TaskSnapshot,
    TaskStatus,
    Transition,
    trusted_snapshot,
    trusted_transition,
    utc,
)
from .pipelines import Pipeline, PipelineRun
from .policies import DEFAULT_NUM_BUCKETS, BucketPolicy, RetryPolicy, format_buckets
from .run import TaskRun
from .schedules import IntervalTrigger, Overlap, Schedule, Trigger, schedule_tags
from .stores import open_store
from .stores.capabilities import Capabilities, PartialCreate
from .stores.protocol import TaskStore
from .values import check_text, storable_text

log = logging.getLogger("chongming_task.controller")

_RECONCILE_CHUNK = 500


def default_owner() -> str:
    return f"{socket.gethostname()}:{os.getpid()}"


_ids = random.Random(secrets.randbits(128))  # ids need uniqueness, not secrecy


def new_task_id() -> str:
    """32 hex digits: milliseconds since the epoch, then 80 random bits. Ids sort roughly by
    creation, which keeps B-tree inserts local, and never collide across nodes in practice
    (each process seeds its generator from the OS)."""
    return f"{time.time_ns() // 1_000_000:012x}{_ids.getrandbits(80):020x}"


@dataclass(frozen=True, slots=True, kw_only=True)
class ReconcileReport:
    """What ``reconcile()`` did (or, with ``dry_run``, would do)."""

    dry_run: bool
    examined: int
    lost: tuple[str, ...]
    let_go: tuple[str, ...]
    """Tasks whose version moved under reconcile: their supervisor is alive after all."""


class Controller:
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
        command_poll_interval: float = 0.5,
        command_lease: float = 30.0,
        lease_ttl: float = 30.0,
        activity_interval: float = 0.2,
        writethrough_buffer: int = 1000,
        clock: Clock | None = None,
        seed: int | None = None,
        poll_commands: bool | None = None,
        run_schedules: bool = True,
    ) -> None:
        self.bucket_policy = BucketPolicy(num_buckets)
        self.owned_buckets: frozenset[int] | None = (
            None if owned_buckets is None else self.bucket_policy.validate(owned_buckets)
        )
        if max_workers is None:
            max_workers = min(32, (os.cpu_count() or 1) + 4)
        if max_workers < 1:
            raise ConfigurationError(f"max_workers must be >= 1, got {max_workers}")
        if max_parallel_per_bucket is not None and max_parallel_per_bucket < 1:
            raise ConfigurationError(
                f"max_parallel_per_bucket must be >= 1 or None, got {max_parallel_per_bucket}"
            )
        for label, value in (
            ("command_poll_interval", command_poll_interval),
            ("command_lease", command_lease),
            ("lease_ttl", lease_ttl),
            ("activity_interval", activity_interval),
        ):
            if value <= 0:
                raise ConfigurationError(f"{label} must be > 0, got {value}")
        if isinstance(store, TaskStore):
            self.store: TaskStore = store
            self._owns_store = False
        else:
            self.store = open_store(store if store is not None else "chongming-task.db")
            self._owns_store = True
        # The store's optional capabilities, resolved once, each with its fallback.
        self.capabilities = Capabilities(self.store)
        # What the store can hold: every value handed over is checked against it.
        self.value_rules = self.capabilities.value_rules
        self.owner = owner or default_owner()
        check_text(self.owner, "owner", self.value_rules)
        self.clock: Clock = clock or SystemClock()
        self._now()  # a clock that gives naive times is refused now, not at the first task
        self.rng = random.Random(seed)
        self.max_workers = max_workers
        self.command_poll_interval = command_poll_interval
        self.command_lease = command_lease
        self.lease_ttl = lease_ttl
        self._lease_delta = timedelta(seconds=lease_ttl)
        self.activity_interval = activity_interval
        self.writethrough_buffer = writethrough_buffer

        self._lock = threading.RLock()  # RLock: its Condition checks ownership in C
        self._idle = threading.Condition(self._lock)
        self._idle_waiters = 0
        self._definitions: dict[str, TaskDefinition] = {}
        self._runs: dict[str, TaskRun] = {}  # held: non-terminal, or terminal but unwritten
        self._active: dict[str, TaskRun] = {}  # on a carrier right now
        self._behind: set[str] = set()
        self._desynced: set[str] = set()
        self._dispatcher = make_dispatcher(
            self.clock, max_parallel_per_bucket=max_parallel_per_bucket
        )
        self._workers: list[threading.Thread] = []
        self._worker_seq = 0
        self._closing = threading.Event()  # no new work accepted
        self._shutdown = threading.Event()  # background loops exit
        self._closed = False
        self._supervisor: threading.Thread | None = None
        self._next_lease = 0.0  # monotonic time of the supervisor's next lease renewal
        self._store_unreachable = False
        self._pipeline_thread: threading.Thread | None = None
        # Schedules fire from a thread of their own, or only through tick_schedules()
        # when run_schedules=False (tests with a fake clock drive them that way).
        self._run_schedules = run_schedules
        self._schedules: dict[str, Schedule] = {}
        self._schedule_lock = threading.Lock()
        self._schedule_wake = threading.Event()
        self._scheduler: threading.Thread | None = None
        self._pipeline_events: queue.SimpleQueue[TaskRun | None] = queue.SimpleQueue()
        self._poller: threading.Thread | None = None
        self._unsubscribe: Callable[[], None] | None = None
        self._poll_now = threading.Event()
        # None: the default rule (from construction with owned_buckets, else after the
        # first submit). False: never, for tools that act for a node without being one.
        self._polling_allowed = poll_commands is not False
        if self.owned_buckets is not None and self._polling_allowed:
            self._ensure_poller()

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
        return self.owned_buckets is None or len(self.owned_buckets) == self.num_buckets

    def owns_bucket(self, bucket: int) -> bool:
        """Whether ``bucket`` is this node's (says nothing about bucketless tasks)."""
        return self.owned_buckets is None or bucket in self.owned_buckets

    def _check_bucket_ownership(self, bucket_key: str | None) -> int | None:
        if bucket_key is None:
            if not self.owns_all_buckets:
                raise ConfigurationError(
                    f"node {self.owner} owns only buckets "
                    f"{format_buckets(self.owned_buckets or ())}: submit needs a bucket_key"
                )
            return None
        check_text(bucket_key, "bucket_key", self.value_rules)
        bucket = self.bucket_policy.bucket_for(bucket_key)
        if not self.owns_bucket(bucket):
            raise ConfigurationError(
                f"bucket_key {bucket_key!r} maps to bucket {bucket}, which node {self.owner} "
                f"does not own (owned: {format_buckets(self.owned_buckets or ())}); no node "
                f"would run it here: submit it on the node that owns bucket {bucket}"
            )
        return bucket

    # -- definitions ------------------------------------------------------------------------------

    def register(self, definition: TaskDefinition) -> TaskDefinition:
        if self._definitions.get(definition.name) is definition:
            return definition  # every submit passes here: no lock once registered
        # Checked once per node, against this node's store: every task of this definition
        # carries its name and tags into the store.
        check_text(definition.name, "task name", self.value_rules)
        for tag in definition.tags:
            check_text(tag, f"tag of task {definition.name!r}", self.value_rules)
        with self._lock:
            existing = self._definitions.get(definition.name)
            if existing is not None and existing is not definition:
                raise ConfigurationError(f"a task named {definition.name!r} is already defined")
            self._definitions[definition.name] = definition
        return definition

    @overload
    def task(self, func: TaskFunction, /) -> TaskDefinition: ...

    @overload
    def task(
        self,
        func: None = None,
        /,
        *,
        name: str | None = None,
        retries: int = 0,
        backoff: RetryPolicy | None = None,
        timeout: float | None = None,
        timeout_grace: float = 5.0,
        tags: Iterable[str] = (),
    ) -> Callable[[TaskFunction], TaskDefinition]: ...

    def task(
        self,
        func: TaskFunction | None = None,
        /,
        *,
        name: str | None = None,
        retries: int = 0,
        backoff: RetryPolicy | None = None,
        timeout: float | None = None,
        timeout_grace: float = 5.0,
        tags: Iterable[str] = (),
    ) -> TaskDefinition | Callable[[TaskFunction], TaskDefinition]:
        """Decorator defining a task on this node: ``@controller.task(retries=3)``.

        The function is called as ``func(token, *args, **kwargs)``.
        """

        def decorate(f: TaskFunction) -> TaskDefinition:
            return self.register(
                define(
                    f,
                    name=name,
                    retries=retries,
                    backoff=backoff,
                    timeout=timeout,
                    timeout_grace=timeout_grace,
                    tags=tags,
                )
            )

        return decorate(func) if func is not None else decorate

    def _resolve(self, task: TaskDefinition | str) -> TaskDefinition:
        """A name must be defined here; a definition is registered on first use."""
        return self.definition(task) if isinstance(task, str) else self.register(task)

    def definition(self, name: str) -> TaskDefinition:
        try:
            return self._definitions[name]
        except KeyError:
            raise UnknownTask(f"no task named {name!r} is defined on node {self.owner}") from None

    # -- submit -----------------------------------------------------------------------------------

    def submit(
        self,
        task: TaskDefinition | str,
        /,
        *args: Any,
        bucket_key: str | None = None,
        **kwargs: Any,
    ) -> TaskRun:
        """Queue one run of ``task`` with ``args``/``kwargs``; return its handle.

        ``bucket_key`` (a business key such as a tenant id) picks the bucket; a node that
        owns only some buckets refuses keys that map elsewhere (``ConfigurationError``).
        Raises ``StoreError`` if the store refuses the new task: then nothing was queued.
        """
        return self._submit(task, args, kwargs, bucket_key=bucket_key)

    def submit_many(
        self,
        task: TaskDefinition | str,
        calls: Iterable[tuple[Any, ...]],
        /,
        *,
        bucket_key: str | None = None,
    ) -> list[TaskRun]:
        """Queue one run of ``task`` per positional-argument tuple in ``calls``.

        With a store that can create in one transaction (the built-in SQL stores), all
        the tasks are stored, or none (``StoreError``).
        """
        prepared = [self._prepare(task, tuple(args), {}, bucket_key=bucket_key) for args in calls]
        self._persist_new(prepared)
        runs = [run for run, _ in prepared]
        for run in runs:
            self._dispatcher.put(run)
        return runs

    def submit_pipeline(self, pipeline: Pipeline) -> PipelineRun:
        """Submit every node of ``pipeline`` under one new ``pipeline_run_id``.

        Roots are queued at once, the others wait as ``pending`` for their dependencies.
        All nodes are created in one store transaction when the store offers ``atomic()``.
        """
        run_id = new_task_id()
        prepared = {
            key: self._prepare(
                node.task,
                node.args,
                dict(node.kwargs),
                bucket_key=node.bucket_key,
                pipeline_run_id=run_id,
                status=TaskStatus.QUEUED if not node.depends_on else TaskStatus.PENDING,
            )
            for key, node in pipeline.nodes.items()
        }
        self._persist_new(list(prepared.values()))
        nodes = {key: run for key, (run, _) in prepared.items()}
        handle = PipelineRun(pipeline, run_id, nodes, self._enqueue_pending)
        for key, run in nodes.items():
            run.pipeline, run.node_key = handle, key
        self._ensure_pipeline_thread()
        for run in nodes.values():
            if run.status is TaskStatus.QUEUED:
                self._dispatcher.put(run)
        return handle

    def _enqueue_pending(self, run: TaskRun, reason: str) -> bool:
        """Move a ``pending`` run to ``queued``: its dependencies are met."""
        with run._lock:
            if run.status is not TaskStatus.PENDING:
                return False
            run._apply(TaskStatus.QUEUED, reason=reason)
        self._dispatcher.put(run)
        return True

    def _ensure_pipeline_thread(self) -> None:
        with self._lock:
            if self._pipeline_thread is None:
                self._pipeline_thread = threading.Thread(
                    target=self._pipeline_loop, name=f"chongming-pipelines[{self.owner}]"
                )
                self._pipeline_thread.start()

    def _pipeline_loop(self) -> None:
        """Pipeline reactions, one at a time, holding no run's lock (a node's end may
        enqueue, cancel or stop other nodes: doing that inside the ending node's lock
        would order two run locks)."""
        while True:
            run = self._pipeline_events.get()
            if run is None:
                return
            try:
                if run.pipeline is not None:
                    run.pipeline._node_finished(run)
            except Exception:
                log.exception("pipeline reaction to task %s failed", run.task_id)

    def _submit(
        self,
        task: TaskDefinition | str,
        args: tuple[Any, ...],
        kwargs: dict[str, Any],
        *,
        bucket_key: str | None = None,
        tags: Iterable[str] = (),
    ) -> TaskRun:
        prepared = self._prepare(task, args, kwargs, bucket_key=bucket_key, tags=tags)
        self._persist_new([prepared])
        self._dispatcher.put(prepared[0])
        return prepared[0]

    def _prepare(
        self,
        task: TaskDefinition | str,
        args: tuple[Any, ...],
        kwargs: dict[str, Any],
        *,
        bucket_key: str | None = None,
        pipeline_run_id: str | None = None,
        status: TaskStatus = TaskStatus.QUEUED,
        tags: Iterable[str] = (),
    ) -> tuple[TaskRun, Transition]:
        """Build and register a run and its creation transition; nothing stored yet."""
        if self._closing.is_set():
            raise ControllerClosed(f"controller {self.owner} is closed")
        definition = self._resolve(task)
        bucket = self._check_bucket_ownership(bucket_key)
        now = self._now()
        # Every value here is already normalised (UTC times, frozenset tags): the trusted
        # builders skip re-validation on this hot path.
        snapshot: TaskSnapshot = trusted_snapshot(
            task_id=new_task_id(),
            name=definition.name,
            status=status,
            status_version=1,
            created_at=now,
            attempt=0,
            tags=frozenset(definition.tags).union(tags) if tags else frozenset(definition.tags),
            bucket=bucket,
            bucket_key=bucket_key,
            pipeline_run_id=pipeline_run_id,
            owner=self.owner,
            started_at=None,
            ended_at=None,
            last_heartbeat_at=None,
            progress=None,
            failure=None,
            outcome=None,
            lease_owner=self.owner,
            lease_until=now + self._lease_delta,
        )
        run = TaskRun(self, definition, snapshot, args, kwargs)
        run._lease_renew_at = self.clock.monotonic() + self.lease_ttl / 3
        # Before create: a command may follow at once. One dict operation, atomic on its
        # own: the submitting thread takes no lock the workers take (a lock held across a
        # GIL switch makes the other threads queue behind it).
        self._runs[snapshot.task_id] = run
        created: Transition = trusted_transition(
            task_id=snapshot.task_id,
            version=1,
            from_status=None,
            to_status=status,
            at=now,
            reason="submitted",
            actor=self.owner,
        )
        return run, created

    def _persist_new(self, prepared: list[tuple[TaskRun, Transition]]) -> None:
        """Store new runs (all in one transaction when the store can); on failure none
        is kept. Starts the worker threads on the first success."""
        items = [(run._snapshot, created) for run, created in prepared]
        try:
            appended = self.capabilities.create_many(items)
        except PartialCreate as exc:
            # No transaction to roll back: what was stored is recorded as cancelled (it
            # never ran), never left without a holder; the rest is forgotten.
            cause = exc.__cause__ or exc
            reason = storable_text(f"batch submit failed: {cause}", self.value_rules)
            for run, created in prepared[: exc.created]:
                run._created(created, appended=False)
                run.cancel(reason=reason)
            self._forget(prepared[exc.created :])
            raise cause from None
        except BaseException:
            self._forget(prepared)
            raise
        for run, created in prepared:
            run._created(created, appended=appended)
        self._start_threads()

    def _forget(self, prepared: list[tuple[TaskRun, Transition]]) -> None:
        with self._lock:
            for run, _ in prepared:
                self._runs.pop(run.task_id, None)

    # -- schedules ------------------------------------------------------------------------------

    def schedule(
        self,
        name: str,
        task: TaskDefinition | str,
        trigger: Trigger,
        /,
        *args: Any,
        overlap: Overlap = "skip",
        misfire_grace: float | None = None,
        jitter: float = 0.0,
        bucket_key: str | None = None,
        tags: Iterable[str] = (),
        **kwargs: Any,
    ) -> Schedule:
        """Fire ``task`` on ``trigger`` from this node.

        ``overlap="skip"`` (default) skips a firing while the previous run of this
        schedule is still active. After downtime the missed firings coalesce into one
        run, skipped if the latest missed one is more than ``misfire_grace`` seconds old
        (``None``: never too late). ``jitter`` delays each firing by up to that many
        seconds. Ownership is checked now: a key in another node's bucket is refused.
        """
        if self._closing.is_set():
            raise ControllerClosed(f"controller {self.owner} is closed")
        self._resolve(task)  # an unknown name fails now, not at the first firing
        for tag in schedule_tags(name, tags):
            check_text(tag, f"tag of schedule {name!r}", self.value_rules)
        self._check_bucket_ownership(bucket_key)
        if isinstance(trigger, IntervalTrigger) and trigger.start_at is None:
            trigger.start_at = self._now()
        entry = Schedule(
            name=name,
            task=task,
            trigger=trigger,
            args=args,
            kwargs=kwargs,
            overlap=overlap,
            misfire_grace=misfire_grace,
            jitter=jitter,
            bucket_key=bucket_key,
            tags=frozenset(tags),
        )
        with self._schedule_lock:
            if name in self._schedules:
                raise ConfigurationError(f"a schedule named {name!r} exists already")
            self._advance(entry, self._now())
            self._schedules[name] = entry
        if self._run_schedules:
            self._ensure_scheduler()
        self._schedule_wake.set()
        return entry

    def unschedule(self, name: str) -> None:
        with self._schedule_lock:
            if self._schedules.pop(name, None) is None:
                raise ConfigurationError(f"no schedule named {name!r}")

    @property
    def schedules(self) -> list[Schedule]:
        with self._schedule_lock:
            return list(self._schedules.values())

    def tick_schedules(self) -> list[TaskRun]:
        """Fire every schedule that is due by the clock now; return the runs submitted.

        The scheduler thread calls this; with ``run_schedules=False`` it is the only way
        schedules fire, which lets tests drive them with a fake clock, without sleeping.
        """
        now = self._now()
        fired: list[TaskRun] = []
        with self._schedule_lock:
            if self._closing.is_set():
                return fired
            for entry in self._schedules.values():
                if entry.due is None or entry.due > now:
                    continue
                latest = entry.trigger.latest_at_or_before(now) or entry.next_fire
                late = (now - latest).total_seconds() if latest is not None else 0.0
                if entry.overlap == "skip" and entry.active:
                    entry.skipped_overlap += 1
                    log.info("schedule %s: previous run still active, firing skipped", entry.name)
                elif entry.misfire_grace is not None and late > entry.misfire_grace:
                    entry.skipped_misfire += 1
                    log.warning("schedule %s: firing %.1fs late, skipped", entry.name, late)
                else:
                    try:
                        run = self._submit(
                            entry.task,
                            entry.args,
                            dict(entry.kwargs),
                            bucket_key=entry.bucket_key,
                            tags=schedule_tags(entry.name, entry.tags),
                        )
                    except ChongmingTaskError:
                        log.exception("schedule %s: submit failed; will try again", entry.name)
                        continue
                    entry.last_run = run
                    entry.fired += 1
                    fired.append(run)
                self._advance(entry, now)
        return fired

    def _advance(self, entry: Schedule, now: datetime) -> None:
        entry.next_fire = entry.trigger.next_after(now)
        delay = self.rng.uniform(0, entry.jitter) if entry.jitter else 0.0
        entry.due = entry.next_fire + timedelta(seconds=delay)

    def _ensure_scheduler(self) -> None:
        with self._lock:
            if self._scheduler is None and not self._closing.is_set():
                self._scheduler = threading.Thread(
                    target=self._schedule_loop, name=f"chongming-scheduler[{self.owner}]"
                )
                self._scheduler.start()

    def _schedule_loop(self) -> None:
        while not self._shutdown.is_set():
            try:
                self.tick_schedules()
            except Exception:
                log.exception("scheduler tick failed; continuing")
            dues = [e.due for e in self.schedules if e.due is not None]
            wait = 1.0
            if dues:
                wait = min(wait, max(0.01, (min(dues) - self._now()).total_seconds()))
            self._schedule_wake.wait(wait)
            self._schedule_wake.clear()

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
        check_text(task_id, "task id", self.value_rules)
        if reason is not None:
            check_text(reason, "reason", self.value_rules)
        run = self._runs.get(task_id)
        if run is not None:
            outcome = _act(run, action, reason, self.owner)
            return ControlReceipt(task_id=task_id, action=action, outcome=outcome)
        snapshot = self.store.get(task_id)
        if snapshot is None:
            raise TaskNotFound(f"no task {task_id} in {self.store!r}")
        if snapshot.is_terminal:
            return ControlReceipt(
                task_id=task_id, action=action, outcome=ControlOutcome.ALREADY_TERMINAL
            )
        command = Command(
            command_id=uuid.uuid4().hex,
            task_id=task_id,
            action=action,
            created_at=self._now(),
            issued_by=self.owner,
            reason=reason,
        )
        self.store.submit_command(command)
        return ControlReceipt(
            task_id=task_id,
            action=action,
            outcome=ControlOutcome.ACCEPTED,
            command_id=command.command_id,
        )

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
        out: dict[int | None, int] = {}
        for snapshot in self.store.query():
            out[snapshot.bucket] = out.get(snapshot.bucket, 0) + 1
        return out

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
        deadline = time.monotonic() + timeout
        tick = threading.Event()
        while True:
            snapshot = self.get(task_id)
            if predicate(snapshot):
                return snapshot
            if time.monotonic() >= deadline:
                raise WaitTimeout(f"task {task_id} still {snapshot.status.value} after {timeout}s")
            tick.wait(poll)

    @property
    def desynced_tasks(self) -> frozenset[str]:
        """Tasks another writer changed under us: write-through stopped for them."""
        with self._lock:
            return frozenset(self._desynced)

    def held(self) -> list[TaskRun]:
        """Runs this process holds (non-terminal, or not yet fully written)."""
        return list(self._runs.values())

    def wait_idle(self, timeout: float | None = None) -> bool:
        """Wait until every task this process holds is terminal; return whether it is."""
        return self._wait_all_done(timeout)

    def _wait_all_done(self, timeout: float | None) -> bool:
        with self._idle:
            self._idle_waiters += 1
            try:
                return self._idle.wait_for(
                    lambda: all(r.done() for r in list(self._runs.values())), timeout
                )
            finally:
                self._idle_waiters -= 1

    # -- reconcile --------------------------------------------------------------------------------

    def reconcile(self, *, dry_run: bool = False) -> ReconcileReport:
        """Mark tasks whose supervisor lease expired as ``lost``, in this node's buckets only.

        Never re-executes anything (the store holds states, not arguments). A version
        conflict means the supervisor came back: reconcile lets go of that task.
        """
        query = TaskQuery(
            statuses=states.NON_TERMINAL,
            buckets=None if self.owns_all_buckets else self.owned_buckets,
        )
        now = self._now()
        with self._lock:
            held = set(self._runs)
        candidates = [
            s
            for s in self.store.query(query)
            if s.task_id not in held and (s.lease_until is None or s.lease_until <= now)
        ]
        if dry_run:
            return ReconcileReport(
                dry_run=True,
                examined=len(candidates),
                lost=tuple(s.task_id for s in candidates),
                let_go=(),
            )
        lost: list[str] = []
        let_go: list[str] = []
        memo: dict[str | None, tuple[Failure, str]] = {}
        for offset in range(0, len(candidates), _RECONCILE_CHUNK):
            chunk = candidates[offset : offset + _RECONCILE_CHUNK]
            # Each task is still its own compare-and-set; a chunk only shares a commit.
            won = self.capabilities.mark_lost(
                [self._lost_marks(snapshot, now, memo) for snapshot in chunk]
            )
            for snapshot in chunk:
                (lost if snapshot.task_id in won else let_go).append(snapshot.task_id)
        return ReconcileReport(
            dry_run=False, examined=len(candidates), lost=tuple(lost), let_go=tuple(let_go)
        )

    def _lost_marks(
        self,
        snapshot: TaskSnapshot,
        now: datetime,
        memo: dict[str | None, tuple[Failure, str]] | None = None,
    ) -> tuple[TaskSnapshot, Transition]:
        """The ``lost`` snapshot and transition reconcile writes for ``snapshot``.

        ``memo`` shares one ``Failure`` and reason per lease owner across a reconcile (the
        lease's own expiry time stays visible on the snapshot)."""
        owner = snapshot.lease_owner
        cached = memo.get(owner) if memo is not None else None
        if cached is None:
            expired = f"supervisor lease of {owner or 'nobody'} expired"
            failure = Failure(
                kind=FailureKind.LOST,
                message=f"{expired}; result unknown: the task may have run, partly or "
                "fully, and may still be running",
                carrier_may_run=True,
            )
            cached = (failure, f"reconcile: {expired}")
            if memo is not None:
                memo[owner] = cached
        failure, reason = cached
        states.check(snapshot.task_id, snapshot.status, TaskStatus.LOST)
        version = snapshot.status_version + 1
        marked = snapshot.evolve(
            status=TaskStatus.LOST, status_version=version, ended_at=now, failure=failure
        )
        transition = Transition(
            task_id=snapshot.task_id,
            version=version,
            from_status=snapshot.status,
            to_status=TaskStatus.LOST,
            at=now,
            reason=reason,
            actor=self.owner,
        )
        return marked, transition

    # -- hooks called by runs ----------------------------------------------------------------------

    def _on_terminal(self, run: TaskRun) -> None:
        if run.pipeline is not None:
            self._pipeline_events.put(run)
        if not run._wt.behind(run._snapshot):
            self._runs.pop(run.task_id, None)
        # Read after the pop: a waiter counted itself under the lock before checking, so
        # either it sees the pop or we see it and wake it.
        if self._idle_waiters:
            with self._idle:
                self._idle.notify_all()

    def _on_desync(self, task_id: str, exc: ConcurrencyConflict) -> None:
        log.error(
            "task %s: another writer changed it in the store (%s); write-through stopped "
            "for this task",
            task_id,
            exc,
        )
        with self._lock:
            self._desynced.add(task_id)
            self._behind.discard(task_id)

    def _on_behind(self, task_id: str) -> None:
        with self._lock:
            self._behind.add(task_id)

    def _requeue(self, run: TaskRun, delay: float) -> None:
        self._dispatcher.schedule(run, delay)

    def _abandon(self, run: TaskRun) -> None:
        """A timed-out carrier ignored its stop: free its slot and start a new carrier."""
        with self._lock:
            self._active.pop(run.task_id, None)
        self._dispatcher.done(run)
        if not self._closing.is_set():
            self._spawn_worker()

    # -- threads ---------------------------------------------------------------------------------

    def _start_threads(self) -> None:
        if self._workers:
            return
        with self._lock:
            if self._workers:
                return
            for _ in range(self.max_workers):
                self._spawn_worker(locked=True)
            self._supervisor = threading.Thread(
                target=self._supervise, name=f"chongming-supervisor[{self.owner}]"
            )
            self._supervisor.start()
        self._ensure_poller()

    def _spawn_worker(self, *, locked: bool = False) -> None:
        def spawn() -> None:
            self._worker_seq += 1
            # Daemon: a carrier stuck in a task that ignores stop must not hang the
            # interpreter's exit; close() still joins every carrier it can.
            thread = threading.Thread(
                target=self._work, name=f"chongming-worker-{self._worker_seq}", daemon=True
            )
            self._workers.append(thread)
            thread.start()

        if locked:
            spawn()
        else:
            with self._lock:
                spawn()

    def _work(self) -> None:
        while True:
            run = self._dispatcher.get()
            if run is None:
                return
            self._active[run.task_id] = run  # single dict operations: atomic, no lock
            try:
                run._execute()
            except BaseException as exc:
                log.exception("task %s: carrier crashed", run.task_id)
                run._carrier_crashed(exc)  # never leave the task active with no carrier
            if run.abandoned:
                return  # _abandon released the slot and started a replacement carrier
            self._active.pop(run.task_id, None)
            self._dispatcher.done(run)

    def _ensure_poller(self) -> None:
        with self._lock:
            if self._poller is not None or self._closing.is_set() or not self._polling_allowed:
                return
            self._poller = threading.Thread(
                target=self._poll_commands, name=f"chongming-commands[{self.owner}]"
            )
            self._poller.start()
            # Stores that can push a wake-up (Postgres LISTEN/NOTIFY) shorten the wait;
            # the poll interval still bounds it when a notification is lost.
            self._unsubscribe = self.capabilities.subscribe_commands(self._poll_now.set)

    def _supervise(self) -> None:
        while not self._shutdown.wait(self.activity_interval):
            self._supervise_once()

    def _supervise_once(self) -> None:
        """One supervisor pass. Leases first: after a store outage they are the writes
        that keep other nodes' ``reconcile()`` off this node's live tasks. Every step, and
        every task within a step, is isolated: one task's store error is logged for that
        task and costs no other task its lease renewal, timeout check or progress. A
        store that is unreachable (``StoreUnavailable``) ends a step at once, so a pass
        stays short during an outage."""
        now = self.clock.monotonic()
        if now >= self._next_lease:
            renewed = self._step("lease renewal", self._renew_leases)
            # Renewal that did not complete is retried on the very next pass.
            self._next_lease = now + min(1.0, self.lease_ttl / 6) if renewed else now
        self._step("retry release", self._dispatcher.release_due)
        self._step("activity flush", self._flush_activity)
        for run in self._active_runs():
            try:
                run._check_timeout(now)
            except Exception:
                log.exception("task %s: timeout check failed; continuing", run.task_id)
        self._step("write-through catch-up", self._catch_up)

    def _step(self, what: str, step: Callable[[], object]) -> bool:
        """Run one supervisor step; ``False`` (logged, never raised) if it failed."""
        try:
            return step() is not False
        except StoreUnavailable as exc:
            self._store_down(exc)
        except Exception:
            log.exception("supervisor %s failed; continuing", what)
        return False

    def _store_down(self, exc: StoreUnavailable) -> None:
        if not self._store_unreachable:
            self._store_unreachable = True
            log.warning("store unreachable (%s); leases, progress and writes wait for it", exc)

    def _store_up(self) -> None:
        if self._store_unreachable:
            self._store_unreachable = False
            log.warning("store reachable again; leases renewed first")

    def _active_runs(self) -> list[TaskRun]:
        return list(self._active.values())

    def _flush_activity(self) -> None:
        """Progress and heartbeat go to the store through ``touch``, never ``save``."""
        for run in self._active_runs():
            if run.desynced:
                continue
            seq, progress, heartbeat = run.token.activity()
            if seq == run._flushed_activity:
                continue
            try:
                self.store.touch(run.task_id, progress=progress, heartbeat_at=heartbeat)
                self._store_up()
            except StoreUnavailable:
                raise  # nobody's activity can be written now: end the step
            except Exception:
                # This task's values cannot be written (checkpoint() checks them, so this
                # is a store fault): drop this reading, keep flushing the others.
                log.exception("task %s: progress/heartbeat not written; skipped", run.task_id)
            run._flushed_activity = seq

    def _renew_leases(self) -> bool:
        """Renew leases that have used a third of their TTL, in one transaction when the
        store offers ``atomic()`` (a fresh backlog of queued tasks costs nothing here).
        If that transaction fails, each lease is renewed on its own, so one task's fault
        never costs another task its lease. Returns whether every due lease was renewed.
        """
        mono = self.clock.monotonic()
        due = [
            run
            for run in self.held()
            if not run.done() and not run.desynced and run._lease_renew_at <= mono
        ]
        if not due:
            return True
        until = self._now() + timedelta(seconds=self.lease_ttl)
        renewed = due
        try:
            with self.capabilities.atomic():
                for run in due:
                    self.store.touch(run.task_id, lease_owner=self.owner, lease_until=until)
        except StoreUnavailable:
            raise
        except Exception:
            renewed = []
            for run in due:
                try:
                    self.store.touch(run.task_id, lease_owner=self.owner, lease_until=until)
                except StoreUnavailable:
                    raise
                except Exception:
                    log.exception("task %s: lease not renewed; will retry", run.task_id)
                else:
                    renewed.append(run)
        self._store_up()
        for run in renewed:
            run._lease_renew_at = mono + self.lease_ttl / 3
        return len(renewed) == len(due)

    def _catch_up(self) -> None:
        with self._lock:
            found = (self._runs.get(t) for t in self._behind)
            behind = [run for run in found if run is not None]
            self._behind.clear()
        for i, run in enumerate(behind):
            if run._catch_up():
                if run.done():
                    with self._idle:
                        self._runs.pop(run.task_id, None)
                        if self._idle_waiters:
                            self._idle.notify_all()
            elif not run.desynced:
                self._on_behind(run.task_id)
                if isinstance(run.write_error, StoreUnavailable):
                    # The store is away for everyone: the rest wait for the next pass.
                    for rest in behind[i + 1 :]:
                        self._on_behind(rest.task_id)
                    raise run.write_error

    def _poll_commands(self) -> None:
        while not self._shutdown.is_set():
            try:
                self.poll_commands_once()
            except StoreUnavailable as exc:
                log.debug("command poll: %s", exc)  # the supervisor reports the outage
            except Exception:
                log.exception("command poll failed; retrying in %ss", self.command_poll_interval)
            self._poll_now.wait(self.command_poll_interval)
            self._poll_now.clear()

    def poll_commands_once(self) -> int:
        """Claim open commands and act on those for tasks this process holds.

        A command for a task held elsewhere is released (never completed: the holder
        would never hear of it). Returns how many commands were completed here.
        """
        commands = self.store.claim_commands(now=self._now(), lease_seconds=self.command_lease)
        completed = 0
        for command in commands:
            run = self._runs.get(command.task_id)
            if run is not None:
                outcome = _act(run, command.action, command.reason, command.issued_by)
            else:
                stored = self.store.get(command.task_id)
                if stored is None:
                    outcome = ControlOutcome.UNKNOWN_TASK
                elif stored.is_terminal:
                    outcome = ControlOutcome.ALREADY_TERMINAL
                else:
                    self.store.release_command(command.command_id, now=self._now())
                    continue
            self.store.complete_command(command.command_id, now=self._now(), outcome=outcome.value)
            completed += 1
        return completed

    # -- shutdown ---------------------------------------------------------------------------------

    def close(self, timeout: float = 10.0) -> None:
        """Stop accepting work, cancel waiting tasks, stop running ones (waiting up to
        ``timeout`` seconds for them), write what is unwritten, and join the threads.

        A task that ignores its stop keeps its ``stopping`` status and lease; once the
        lease expires, a ``reconcile()`` marks it lost. Idempotent.
        """
        if self._closed:
            return
        self._closed = True
        self._closing.set()
        for run in self.held():
            if not run.done():
                run.stop(reason="controller closed")
        self._wait_all_done(timeout)
        self._dispatcher.close()
        self._shutdown.set()
        self._poll_now.set()
        if self._unsubscribe is not None:
            self._unsubscribe()
        self._pipeline_events.put(None)
        self._schedule_wake.set()
        threads = [self._scheduler, *self._workers, self._supervisor, self._poller]
        for thread in [*threads, self._pipeline_thread]:
            if thread is not None and thread is not threading.current_thread():
                thread.join(timeout)
        for run in self.held():
            run._catch_up()
        if self._owns_store:
            self.store.close()


def _act(
    run: TaskRun, action: CommandAction, reason: str | None, actor: str | None
) -> ControlOutcome:
    if action is CommandAction.STOP:
        return run.stop(reason, actor)
    if action is CommandAction.PAUSE:
        return run.pause(reason, actor)
    if action is CommandAction.RESUME:
        return run.resume(reason, actor)
    return run.cancel(reason, actor)
