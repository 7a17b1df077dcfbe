"""PostgreSQL group commit: the write-through's writes of many threads, one statement.

Each caller hands over a ``GroupWrite``: a new task with its creation trail (a
``submit``), a task's compare-and-set with its trail (a transition), or trail rows alone.
While the leaders (a few threads, each on its own connection) have statements in flight,
other callers queue; the next statement carries every queued write (the ``group_*``
parts of ``queries.sql``: a batch of up to eight as per-row parts, a bigger one as JSON
rows; one round trip, one commit). A write has committed when its call returns.

One caller's fault never fails another's: a compare-and-set that finds another version,
or a new id that exists, writes nothing of that caller's rows (its trail rows are gated
on its own row being written) and raises for that caller alone. A statement that fails
as a whole (a value the server refuses, a deadlock) wrote nothing: each write of it is
then redone on its own. An outage fails every write of the batch, each with its own
exception.

Writes that may wait (``GroupCommit.behind``: a node's workers' starts and ends) are
queued and not waited for: they ride the next statement anyone leads (a submit's, say),
and ``serve()`` commits them on its caller's thread only when no statement is in flight.
A leader never hands its lead to one (nobody waits on it), and never commits one after
its own caller's write (that caller would wait for two commits).

Why leaders and not a writer thread: a caller that finds a leader's place free runs its
own write at once (no hand-off when uncontended), and when it is done it hands the lead
to the oldest queued caller, so no thread commits others' writes after its own returned.
Why a few leaders and not one: a statement waits for its WAL flush, and one statement in
flight at a time left the server idle meanwhile (bench/postgres_throughput.py: one
leader 655-705 tasks/s, two 681-927, three or four no better).
"""

from __future__ import annotations

import json
import threading
import time
from collections import deque
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from ...errors import ConcurrencyConflict, StoreError, StoreUnavailable, TaskAlreadyExists
from ...model import TaskSnapshot, Transition
from .. import codec

__all__ = [
    "Behind",
    "GroupCommit",
    "GroupWrite",
    "Shape",
    "batch_params",
    "group_statements",
    "numbered",
    "settle",
]

# The gate of a trail row: written always, if its task was inserted, if its task's
# compare-and-set won (queries.sql, group_trail).
_ALWAYS, _IF_NEW, _IF_WON = 0, 1, 2
_MAX_BATCH = 256
_LOOK_AGAIN = 0.002
"""Seconds between two looks of ``GroupCommit.settle`` at writes queued behind."""
_PAIRS_UP_TO = 8
"""Batches of up to this many new tasks and compare-and-sets use per-row parts
(``group_new_pair``, ``group_life_pair``)."""

Shape = tuple[int, int, bool]
"""A group statement's shape: (new tasks, compare-and-sets, per row). Per row, the
counts; as JSON rows, whether there are any (0 or 1)."""


class GroupWrite:
    """One caller's write of one task, encoded before it is queued."""

    __slots__ = (
        "behind",
        "error",
        "expect",
        "leads",
        "life",
        "new",
        "settled",
        "task_id",
        "trail",
        "wake",
    )

    def __init__(
        self,
        task_id: str,
        trail: Sequence[Transition],
        *,
        new: TaskSnapshot | None = None,
        life: TaskSnapshot | None = None,
        expect: int | None = None,
    ) -> None:
        self.task_id = task_id
        self.new = None if new is None else codec.snapshot_to_values(new)
        self.life = None if life is None else _life_values(life, expect)
        self.expect = expect
        gate = _IF_NEW if new is not None else _IF_WON if life is not None else _ALWAYS
        self.trail = [[*codec.transition_to_values(t), gate] for t in trail]
        self.error: BaseException | None = None
        self.settled = False
        self.leads = False  # its own thread commits it (no other leader takes it)
        self.behind = False  # queued by ``GroupCommit.behind``: no caller waits on it
        self.wake = threading.Lock()
        self.wake.acquire()  # released once settled, or when this caller is to lead


def _life_values(snapshot: TaskSnapshot, expect: int | None) -> list[Any]:
    """The columns a task's life changes (the identity columns are fixed at create)."""
    return [snapshot.task_id, expect, *codec.life_values(snapshot)]


def group_statements(sql: Mapping[str, str]) -> dict[Shape, bytes]:
    """The statement for each batch shape ``batch_params`` names: as JSON rows, built
    from ``queries.sql``'s ``group_*`` parts (a batch runs only the parts it needs);
    per row, for batches of up to ``_PAIRS_UP_TO`` new tasks and compare-and-sets, a
    ``group_new_pair`` for each new task, then a ``group_life_pair`` for each
    compare-and-set.

    Each is returned with the server's own placeholders (``$1``...), encoded, for a
    ``psycopg.RawCursor``: psycopg parses a ``%s`` query on every execution once it is
    longer than 4 KiB or has over 50 parameters (no cache; the statements of four pairs
    and more), and that parse cost more CPU than the rest of the write."""
    shapes: dict[Shape, str] = {
        (new, life, False): "WITH "
        + ",\n".join(
            [
                sql["group_new" if new else "group_no_new"],
                sql["group_life" if life else "group_no_life"],
                sql["group_trail"],
            ]
        )
        + "\n"
        + sql["group_outcome" if life else "group_outcome_new"]
        for new in (0, 1)
        for life in (0, 1)
    }
    trail = sql["group_pair_trail"]
    per_row = {  # each a task's part, then its trail's
        "group_new_pair": sql["group_new_pair"].replace("{insert_task}", sql["insert_task"])
        + ",\n"
        + trail.replace("{part}", "new"),
        "group_life_pair": sql["group_life_pair"] + ",\n" + trail.replace("{part}", "life"),
    }
    for new in range(_PAIRS_UP_TO + 1):
        for life in range(_PAIRS_UP_TO + 1 - new):
            if new + life == 0:
                continue
            parts = [("group_new_pair", k) for k in range(1, new + 1)]
            parts += [("group_life_pair", k) for k in range(1, life + 1)]
            shapes[(new, life, True)] = (
                "WITH "
                + ",\n".join(per_row[part].replace("{n}", str(k)) for part, k in parts)
                + "\n"
                + "\nUNION ALL\n".join(
                    sql[f"{part}_outcome"].replace("{n}", str(k)) for part, k in parts
                )
            )
    return {shape: numbered(statement) for shape, statement in shapes.items()}


def numbered(statement: str) -> bytes:
    """``statement`` with its ``%s`` placeholders as ``$1``, ``$2``... (it holds no other
    ``%``), encoded."""
    parts = statement.split("%s")
    if any("%" in part for part in parts):
        raise ValueError("a group statement holds a % that is not a %s placeholder")
    numbered = [parts[0]]
    for k, part in enumerate(parts[1:], 1):
        numbered += [f"${k}", part]
    return "".join(numbered).encode()


def batch_params(writes: Sequence[GroupWrite]) -> tuple[Shape, list[Any]]:
    """Which statement of ``group_statements`` and its parameters for ``writes`` (each
    task id once). Rows go in task id order (new tasks first), so two batches that touch
    the same tasks lock them in the same order."""
    ordered = sorted(writes, key=lambda w: w.task_id)
    if len(ordered) <= _PAIRS_UP_TO and all(
        w.new is not None or w.life is not None for w in ordered
    ):
        params: list[Any] = []
        lives = []
        for write in ordered:
            if write.new is not None:
                params += [*write.new, _ungated_trail(write)]
            else:
                lives.append(write)
        for write in lives:
            task_id, expect, *life = write.life  # type: ignore[misc]
            params += [*life, task_id, expect, _ungated_trail(write)]
        params += [w.task_id for w in lives]
        return (len(ordered) - len(lives), len(lives), True), params
    new = [w.new for w in ordered if w.new is not None]
    life = [w.life for w in ordered if w.life is not None]
    trail = [row for w in ordered for row in w.trail]
    params = [_dumps(new)] if new else []
    if life:
        ids = [row[0] for row in life]
        params += [_dumps(life), ids, _dumps(trail), ids]
    else:
        params.append(_dumps(trail))
    return (int(bool(new)), int(bool(life)), False), params


_dumps = json.JSONEncoder(ensure_ascii=False, separators=(",", ":")).encode


def _ungated_trail(write: GroupWrite) -> str:
    """A per-row part's trail rows (``group_pair_trail``), JSON: its gate is its part."""
    return _dumps([row[:-1] for row in write.trail])


def settle(writes: Sequence[GroupWrite], returned: Sequence[tuple[str, str, Any]]) -> None:
    """Each write's outcome from the rows the group statement returned: a new task
    that was not inserted exists already; a compare-and-set that did not win found
    another version (read by the same statement, so nothing after it can fail the
    batch)."""
    inserted = {task_id for kind, task_id, _ in returned if kind == "n"}
    won = {task_id for kind, task_id, _ in returned if kind == "l"}
    found = {task_id: version for kind, task_id, version in returned if kind == "v"}
    for write in writes:
        if write.new is not None and write.task_id not in inserted:
            write.error = TaskAlreadyExists(f"task {write.task_id} already exists")
        elif write.life is not None and write.task_id not in won:
            assert write.expect is not None
            write.error = ConcurrencyConflict.version_mismatch(
                write.task_id, write.expect, found.get(write.task_id)
            )


class Behind:
    """Writes queued by ``GroupCommit.behind``, not waited for: what the store's
    ``write_transitions_behind`` returns (``PendingWrites``)."""

    __slots__ = ("_group", "_writes", "queued_at")

    def __init__(self, group: GroupCommit, writes: Sequence[GroupWrite], at: float) -> None:
        self._group = group
        self._writes = writes
        self.queued_at = at

    @property
    def settled(self) -> bool:
        writes = self._writes  # (one write, from a node's worker: its own look first)
        return not writes or (writes[-1].settled and all(write.settled for write in writes))

    def errors(self) -> list[BaseException | None]:
        return [write.error for write in self._writes]

    def serve(self) -> None:
        if not self.settled:
            self._group.serve()

    def wait(self) -> None:
        self._group.settle(self._writes)


class GroupCommit:
    """Queue, lead and hand over (see the module docstring). ``apply(writes)`` runs one
    statement for ``writes`` and sets each one's ``error`` where it lost; it raises
    ``StoreError`` when the statement failed as a whole (nothing written).

    Up to ``leaders`` statements are in flight at once, each on its own connection: a
    caller that finds fewer leads at once; else it queues until a leader commits its
    write or hands it the lead. A leader commits one batch (its own write first, then
    the oldest queued ones) and hands the lead to the oldest waiting caller."""

    def __init__(self, apply: Callable[[Sequence[GroupWrite]], None], *, leaders: int) -> None:
        self._apply = apply
        self._max_leaders = leaders
        self._mutex = threading.Lock()
        self._queue: deque[GroupWrite] = deque()
        self._leaders = 0
        self.on_batch: Callable[[Sequence[GroupWrite]], None] | None = None
        """Told the writes of each statement before it runs (a bench or a test counting
        what statements carry), on the leader's thread."""

    @property
    def queued(self) -> int:
        """Writes waiting for a statement to carry them."""
        return len(self._queue)

    @property
    def leading(self) -> int:
        """Statements in flight (one a leader)."""
        return self._leaders

    def run(self, writes: Sequence[GroupWrite]) -> None:
        """Commit one caller's ``writes`` (each of another task), queued together so that
        one batch usually commits them all; returns once each is settled, its error left
        on it (``error``), none raised."""
        leading = None
        with self._mutex:
            self._queue.extend(writes)
            if self._leaders < self._max_leaders:
                self._leaders += 1
                leading = writes[0]
                leading.leads = True
        for write in writes:
            if write is not leading:  # (a lead handed over meanwhile released it too)
                write.wake.acquire()  # committed by a leader, or handed the lead
            if not write.settled:
                try:
                    self._commit(self._take(write))
                finally:
                    self._hand_over()

    def behind(self, writes: Sequence[GroupWrite]) -> Behind:
        """Queue ``writes`` as writes that may wait and return at once: they ride the
        next statement a caller leads, or ``serve()`` / ``settle()`` commits them."""
        for write in writes:
            write.behind = True
        at = time.monotonic()
        with self._mutex:
            self._queue.extend(writes)
        return Behind(self, writes, at)

    def serve(self) -> None:
        """Commit what is queued, on this thread, if no statement is in flight (then
        only writes that may wait are queued: a caller finding a leader's place free
        leads); else return at once, and they ride a statement led after it."""
        with self._mutex:
            if self._leaders or not self._queue:
                return
            own = self._queue[0]
            own.leads = True
            self._leaders += 1
        try:
            self._commit(self._take(own))
        finally:
            self._hand_over()

    def settle(self, writes: Sequence[GroupWrite]) -> None:
        """Return once each of ``writes`` (queued by ``behind``) is settled: committed
        here if no statement is in flight, else by a leader (looked at again every
        ``_LOOK_AGAIN``: a leader that took its batch before they were queued leaves
        them)."""
        for write in writes:
            if write.settled:
                continue
            self.serve()
            while not write.wake.acquire(timeout=_LOOK_AGAIN):
                self.serve()
            write.wake.release()  # settled: a later settle() passes at once

    def _take(self, own: GroupWrite) -> list[GroupWrite]:
        """``own`` and the oldest queued writes no other leader owns, each task once (a
        later write of a task waits for the next batch: it expects the version the
        earlier one writes)."""
        batch = [own]
        seen = {own.task_id}
        kept: list[GroupWrite] = []
        with self._mutex:
            queue = self._queue
            queue.remove(own)
            while queue and len(batch) < _MAX_BATCH:
                write = queue.popleft()
                if write.leads or write.task_id in seen:
                    kept.append(write)
                else:
                    seen.add(write.task_id)
                    batch.append(write)
            queue.extendleft(reversed(kept))
        return batch

    def _hand_over(self) -> None:
        with self._mutex:
            for write in self._queue:
                if not (write.leads or write.behind):
                    write.leads = True
                    write.wake.release()  # the oldest waiter leads next
                    return
            self._leaders -= 1

    def _commit(self, batch: list[GroupWrite]) -> None:
        if self.on_batch is not None:
            self.on_batch(batch)
        try:
            self._apply(batch)
        except StoreUnavailable as exc:  # an outage: every write of the batch fails
            _fail(batch, exc)
        except StoreError as exc:  # the statement failed, nothing was written
            if len(batch) == 1:
                batch[0].error = exc
            else:
                self._one_by_one(batch)  # so only the faulty caller fails
        except Exception as exc:
            _fail(batch, exc)
        except BaseException as exc:  # KeyboardInterrupt & co: release the waiters first
            _fail(batch, exc)
            _settle(batch)
            raise
        _settle(batch)

    def _one_by_one(self, batch: list[GroupWrite]) -> None:
        for done, write in enumerate(batch):
            if self.on_batch is not None:
                self.on_batch([write])
            try:
                self._apply([write])
            except StoreUnavailable as exc:  # the server went away meanwhile
                _fail(batch[done:], exc)
                return
            except Exception as exc:
                write.error = exc


def _fail(writes: Sequence[GroupWrite], exc: BaseException) -> None:
    """``exc`` for every write not yet decided, one exception per caller (each raises
    it on its own thread)."""
    for write in writes:
        if write.error is None:
            write.error = exc if len(writes) == 1 else _own_copy(exc)


def _settle(batch: Sequence[GroupWrite]) -> None:
    for write in batch:
        write.settled = True
        write.wake.release()


def _own_copy(exc: BaseException) -> BaseException:
    copy = (
        StoreUnavailable(str(exc))
        if isinstance(exc, StoreUnavailable)
        else StoreError(str(exc) or type(exc).__name__)
    )
    copy.__cause__ = exc
    return copy
