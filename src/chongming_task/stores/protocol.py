"""``TaskStore``: the persistence contract, method by method.

Implement these 14 methods and prove it with
``chongming_task.testing.store_contract.StoreContract``; no inheritance or registration is
needed. ``docs/stores.md`` explains the why of each rule; a test keeps its method list equal
to this protocol.
"""

from __future__ import annotations

from datetime import datetime
from typing import Protocol, runtime_checkable

from ..model import Command, Progress, TaskQuery, TaskSnapshot, TaskStatus, Transition

__all__ = ["TaskStore"]


@runtime_checkable
class TaskStore(Protocol):
    """Where task snapshots, their audit trail and cross-process commands live.

    Every method may raise ``StoreError`` when the backend fails or after ``close()``.
    A store is shared by the threads of one controller; it must be thread-safe.
    """

    # -- task snapshots (optimistic concurrency) -------------------------------------------

    def create(self, snapshot: TaskSnapshot) -> None:
        """Insert a new task, lease columns included.

        Raises ``TaskAlreadyExists`` (a ``StoreError``) if the task id is stored already;
        never overwrites: a second create would reset a running task's state while its
        carrier keeps running.
        """
        ...

    def save(self, snapshot: TaskSnapshot, *, expect_version: int) -> None:
        """Replace the stored task if its ``status_version`` equals ``expect_version``.

        Check and write are one atomic step (``UPDATE ... WHERE status_version = ?``).
        The new version may jump by more than one (write-through catch-up); only equality
        with ``expect_version`` is required. Writes every column except ``lease_owner`` and
        ``lease_until``, which belong to ``touch``. Raises ``ConcurrencyConflict`` on a
        version mismatch or a missing task, leaving the stored row unchanged; never retries.
        """
        ...

    def get(self, task_id: str) -> TaskSnapshot | None:
        """The stored task, or ``None`` if there is none (not an error)."""
        ...

    def query(self, query: TaskQuery | None = None) -> list[TaskSnapshot]:
        """Tasks passing every filter of ``query`` (``None``: all), filtered in the backend.

        Ordered by ``created_at`` ascending, ties in insertion order; ``newest_first`` is
        the exact reverse. At most ``limit`` rows. ``tag`` matches exactly.
        """
        ...

    def counts(self) -> dict[TaskStatus, int]:
        """Number of tasks per status; statuses with no task may be absent."""
        ...

    # -- audit trail (append only) ----------------------------------------------------------

    def append(self, transition: Transition) -> None:
        """Append a transition; idempotent on ``(task_id, version)`` (replays add no row)."""
        ...

    def history(self, task_id: str, *, since_version: int = 0) -> list[Transition]:
        """Transitions of ``task_id`` with ``version > since_version``, version ascending.

        An unknown task has an empty history.
        """
        ...

    # -- high-frequency side channel (never touches status_version) -------------------------

    def touch(
        self,
        task_id: str,
        *,
        progress: Progress | None = None,
        heartbeat_at: datetime | None = None,
        lease_owner: str | None = None,
        lease_until: datetime | None = None,
    ) -> None:
        """Update only the given columns; ``None`` means "leave as is".

        Does not check or bump ``status_version``. A missing task, or one in a terminal
        status, is silently left as is (a late heartbeat is not an error, and a finished
        task's lease and heartbeat stay what they were when it ended). Heartbeat and
        lease are stored exactly as given, never derived from each other.
        """
        ...

    # -- control commands (cross-process) ---------------------------------------------------

    def submit_command(self, command: Command) -> None:
        """Store a command. The store carries it; it never interprets or executes it."""
        ...

    def claim_commands(
        self, *, now: datetime, lease_seconds: float, limit: int = 50
    ) -> list[Command]:
        """Atomically pick unfinished commands with no live lease and lease them.

        A command is claimable when ``finished_at`` is unset, ``lease_until`` is unset
        or ``<= now``, and no earlier unfinished command of its task has a live lease.
        Picked in the order the store received them (never by ``created_at``: that is
        the sender's clock), at most ``limit``, and never a command without every
        earlier unfinished one of its task; each gets ``lease_until = now +
        lease_seconds``. Pick and lease are one atomic step, so two claimers never get
        the same command while its lease lives.
        """
        ...

    def complete_command(
        self, command_id: str, *, now: datetime, outcome: str | None = None
    ) -> None:
        """Mark a command finished with ``outcome``; it is never claimed again.

        An unknown command id is ignored.
        """
        ...

    def release_command(self, command_id: str, *, now: datetime) -> None:
        """Give a claimed command back: clear its lease, do not finish it.

        For a claimer that does not hold the command's task, so that the real holder can
        claim it at once. An unknown or finished command is left as is.
        """
        ...

    # -- operations -------------------------------------------------------------------------

    def prune(self, *, keep_terminal: int) -> int:
        """Delete the oldest terminal tasks beyond the newest ``keep_terminal``, with their
        history; return how many tasks were deleted. Never touches a non-terminal task.
        """
        ...

    def close(self) -> None:
        """Release connections and file handles. Idempotent; any other call afterwards
        raises ``StoreError``.
        """
        ...
