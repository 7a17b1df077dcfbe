"""Command wake-ups between the processes sharing one SQLite file
(``CommandChannel``; docs/design.md, "Commands").

SQLite runs on one machine, so a process can wake another directly: each subscriber
owns a named pipe (FIFO) in a directory beside the file (``<file>-wake/``) and a thread
that blocks reading it; a process that submits a command writes one byte to every pipe
there once its command is committed. An idle node spends nothing waiting (its thread is
blocked in ``read``), and a stop sent from another process is heard in milliseconds, not
at the next poll. A pipe whose reader is gone (its process was killed) refuses to open
for writing, and the writer removes it. Polling stays the truth: a lost wake-up costs
one poll interval.

Where named pipes do not exist (Windows) or the directory cannot be made, there are no
wake-ups and nodes poll, as before.

The directory is anybody's to tamper with who can write beside the file, so it is
trusted only as this process's user made it: created ``0700``, refused (no wake-ups,
nodes poll) if it is a symlink, another user owns it, or group or others may write it;
and only named pipes in it are written to (opened ``O_NOFOLLOW``, their type checked
on the open descriptor), never a file a symlink points at."""

from __future__ import annotations

import contextlib
import errno
import itertools
import logging
import os
import stat
import threading
from collections.abc import Callable
from pathlib import Path

__all__ = ["announce", "subscribe", "wake_directory"]

log = logging.getLogger("chongming_task.store")

_SEQ = itertools.count()


def wake_directory(database: str) -> Path | None:
    """Where the pipes of ``database``'s processes live (``None``: an in-memory file, or
    no named pipes on this system)."""
    if database in ("", ":memory:") or database.startswith("file:") or not hasattr(os, "mkfifo"):
        return None
    return Path(database + "-wake")


def subscribe(directory: Path, wake: Callable[[], None], *, name: str) -> Callable[[], None] | None:
    """Call ``wake()`` whenever a process ``announce``s in ``directory``; returns the
    function that stops it (and removes the pipe), or ``None`` where no pipe can be made
    (the subscriber then polls often)."""
    try:
        directory.mkdir(mode=0o700, exist_ok=True)
        why = untrusted(directory)
        if why is not None:
            log.warning("no command wake-ups through %s: %s; nodes poll", directory, why)
            return None
        pipe = directory / f"{os.getpid()}-{next(_SEQ)}"
        os.mkfifo(pipe, 0o600)
        # Read and write: the pipe then never reads as ended while no writer has it
        # open, and a writer's non-blocking open finds a reader while this one lives.
        fd = os.open(pipe, os.O_RDWR)
    except OSError as exc:
        log.debug("no command wake-ups through %s (%s): nodes poll", directory, exc)
        return None
    stopping = threading.Event()

    def listen() -> None:
        while True:
            try:
                os.read(fd, 512)  # blocks until a process announces (or stop writes)
            except OSError:
                return
            if stopping.is_set():
                return
            try:
                wake()
            except Exception:  # a wake-up that fails costs one poll interval
                log.exception("command wake-up failed")

    thread = threading.Thread(target=listen, name=name, daemon=True)
    thread.start()

    def stop() -> None:
        if stopping.is_set():
            return
        stopping.set()
        with contextlib.suppress(OSError):
            os.write(fd, b"\0")  # unblocks the read
        thread.join(5)
        os.close(fd)
        with contextlib.suppress(OSError):
            pipe.unlink(missing_ok=True)
        with contextlib.suppress(OSError):  # another process's pipe is there: it stays
            directory.rmdir()

    return stop


def untrusted(directory: Path) -> str | None:
    """Why ``directory`` may not carry wake-ups (``None``: it may): it must be a real
    directory of this process's user that neither group nor others may write."""
    try:
        found = os.lstat(directory)
    except OSError as exc:
        return f"cannot read it ({exc.strerror})"
    if not stat.S_ISDIR(found.st_mode):
        return "it is not a directory (a symlink?)"
    if hasattr(os, "getuid") and found.st_uid != os.getuid():
        return f"another user (uid {found.st_uid}) owns it"
    if found.st_mode & 0o022:
        return f"group or others may write it (mode {stat.S_IMODE(found.st_mode):o})"
    return None


def announce(directory: Path) -> None:
    """A command was committed: one byte to every pipe in ``directory``. Never raises
    and never blocks; a pipe without a reader is removed. Nothing but a named pipe is
    ever opened, nor a directory that ``untrusted`` refuses."""
    if untrusted(directory) is not None:
        return  # nobody has subscribed on this file, or nobody may
    try:
        entries = list(os.scandir(directory))
    except OSError:
        return
    for entry in entries:
        try:
            if not stat.S_ISFIFO(entry.stat(follow_symlinks=False).st_mode):
                continue
            fd = os.open(entry.path, os.O_WRONLY | os.O_NONBLOCK | os.O_NOFOLLOW)
        except OSError as exc:
            if exc.errno == errno.ENXIO:  # no reader: its process is gone
                with contextlib.suppress(OSError):
                    os.unlink(entry.path)
            continue
        try:
            if stat.S_ISFIFO(os.fstat(fd).st_mode):  # the same file that was looked at
                os.write(fd, b"!")
        except OSError:  # full: a wake-up is already waiting to be read
            pass
        finally:
            os.close(fd)
