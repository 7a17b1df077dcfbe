"""Process tasks for the process-carrier tests: functions a worker process finds by their
module and name (a test module's own functions are found the same way)."""

from __future__ import annotations

import contextlib
import logging
import os
import signal
import time
from pathlib import Path
from typing import Any

from chongming_task import CancellationToken, Controller, Progress, SqliteTaskStore, current, task


def node_on(path: Path, processes: int) -> Controller:
    """A node on a SQLite file with ``processes`` worker processes, its supervisor quick,
    its workers at its own CPU priority: on a loaded machine a worker at niceness 10 gets
    about a hundredth of a core, and a test's task would wait seconds for its first line
    (the default niceness has a test of its own)."""
    return Controller(
        SqliteTaskStore(path), max_processes=processes, activity_interval=0.05, process_niceness=0
    )


def told(path: str, text: str) -> None:
    """Write ``text`` to ``path`` whole: aside, then renamed, so a test that sees the file
    never reads it half written."""
    aside = f"{path}.{os.getpid()}.part"
    Path(aside).write_text(text)
    os.replace(aside, path)


def stat(pid: int) -> list[str]:
    """A process's ``/proc`` stat line after its name: its state, its parent's pid, ..."""
    return Path(f"/proc/{pid}/stat").read_text().split(")")[-1].split()


def alive(pid: int) -> bool:
    """Whether process ``pid`` runs (a zombie does not)."""
    try:
        os.kill(pid, 0)
        return stat(pid)[0] != "Z"
    except (ProcessLookupError, FileNotFoundError):
        return False


def square(token: CancellationToken, x: int) -> dict[str, Any]:
    token.checkpoint()
    here = current()
    assert here is not None
    return {"square": x * x, "pid": os.getpid(), "task_id": here.task_id, "attempt": here.attempt}


def counted(token: CancellationToken, steps: int, tell: str) -> int:
    told(tell, str(os.getpid()))
    for step in range(1, steps + 1):
        token.checkpoint(Progress(current=step, total=steps, message=f"step {step}"))
        token.sleep(0.02)
    return steps


def spin(token: CancellationToken, seconds: float, tell: str) -> str:
    """Pure work that never reaches a checkpoint."""
    told(tell, str(os.getpid()))
    end = time.monotonic() + seconds
    while time.monotonic() < end:
        pass
    return "spun"


def boom(token: CancellationToken) -> None:
    raise ValueError("boom in the worker process")


def unpicklable_error(token: CancellationToken) -> None:
    class Local(Exception):
        pass

    raise Local("a local exception")


def exits(token: CancellationToken, code: int) -> None:
    os._exit(code)


def killed(token: CancellationToken) -> None:
    os.kill(os.getpid(), signal.SIGKILL)


def pid(token: CancellationToken) -> int:
    return os.getpid()


def total(token: CancellationToken) -> int:
    return sum(int(v) for v in token.upstream.values())


@task(name="cube", carrier="process")
def cube(token: CancellationToken, x: int) -> int:
    return x * x * x


async def async_work(token: CancellationToken) -> None:
    await token.asleep(0)


def cpu_seconds(pid: int) -> float:
    """The process's user and system CPU time so far."""
    fields = Path(f"/proc/{pid}/stat").read_text().split(")")[-1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def chatty(token: CancellationToken, customer: str) -> str:
    logging.getLogger("reports").info("rendering the report of %s", customer)
    try:
        raise KeyError("missing column")
    except KeyError:
        logging.getLogger("reports").exception("a column was missing")
    logging.getLogger("reports").debug("not sent: below the node's level")
    return customer


def hungry(token: CancellationToken, megabytes: int) -> int:
    """Asks for more memory than its worker may have (a small address-space limit)."""
    import resource

    usage = int(Path("/proc/self/statm").read_text().split()[0]) * os.sysconf("SC_PAGE_SIZE")
    resource.setrlimit(resource.RLIMIT_AS, (usage + 64 * 2**20, resource.RLIM_INFINITY))
    block = bytearray(megabytes * 2**20)
    return len(block)


def checkpoints(token: CancellationToken) -> str:
    while True:
        token.checkpoint()
        time.sleep(0.01)


def bad_progress(token: CancellationToken) -> str:
    try:
        token.checkpoint(float("nan"))
    except ValueError as exc:
        return f"refused: {type(exc).__name__}"
    return "accepted"


_kept: list[bytearray] = []


def hoards(token: CancellationToken, megabytes: int) -> int:
    """Keeps ``megabytes`` in its worker after it returns (a cache that grows, say)."""
    block = bytearray(megabytes * 2**20)
    block[::4096] = b"x" * len(block[::4096])  # touched: resident, not just reserved
    _kept.append(block)
    return os.getpid()


def returns_a_set(token: CancellationToken) -> object:
    return {1, 2}


def returns_a_lock(token: CancellationToken) -> object:
    import threading

    return threading.Lock()


def held(token: CancellationToken, until: str) -> str:
    """Checkpoints until the file ``until`` exists."""
    while not Path(until).exists():
        token.sleep(0.01)
    return "released"


def note(token: CancellationToken, log: str, label: str) -> None:
    with open(log, "a") as out:
        out.write(label + "\n")


def traced(token: CancellationToken) -> dict[str, str]:
    """Makes a span of its own (with a provider of its own: the node's does not cross)
    and logs inside it; says the span's ids and its parent's."""
    from opentelemetry.sdk.trace import TracerProvider

    with TracerProvider().get_tracer("child").start_as_current_span("inside") as span:
        logging.getLogger("tests.process").warning("inside the child's span")
        made, parent = span.get_span_context(), span.parent  # type: ignore[attr-defined]
        return {
            "trace_id": format(made.trace_id, "032x"),
            "span_id": format(made.span_id, "016x"),
            "parent": format(parent.span_id, "016x"),
        }


# -- what a task can do to its worker's stream, and what it leaves running ---------------------


def _wire_fds() -> list[int]:
    """The worker's end of its node's stream (the one socket it holds)."""
    found = []
    for fd in os.listdir("/proc/self/fd"):
        with contextlib.suppress(OSError):
            if os.readlink(f"/proc/self/fd/{fd}").startswith("socket:"):
                found.append(int(fd))
    return found


def scribbles(token: CancellationToken, pid_file: str) -> str:
    """Writes bytes that are not a frame to its worker's stream, then returns."""
    told(pid_file, str(os.getpid()))
    for fd in _wire_fds():
        os.write(fd, b"these bytes are not a frame of the wire at all")
    time.sleep(0.3)
    return "the scribbler's value"


def forges(token: CancellationToken, pid_file: str) -> str:
    """Sends a well-formed frame of another job, saying it returned."""
    import socket

    from chongming_task.run import child

    told(pid_file, str(os.getpid()))
    for fd in _wire_fds():
        forged = child.Wire(socket.socket(fileno=os.dup(fd)))
        forged.send(child.RETURNED, 10_000, "a forged answer")
    time.sleep(0.3)
    return "the forger's value"


class Unloadable:
    """Pickles anywhere; cannot be rebuilt in the node (its rebuild raises)."""

    def __reduce__(self) -> tuple[Any, tuple[Any, ...]]:
        return (_refuse, ("rebuilt nowhere",))


def _refuse(why: str) -> None:
    raise ValueError(why)


def logs_unloadable_extra(token: CancellationToken) -> int:
    bad = {"bad": Unloadable()}
    logging.getLogger("tests.extra").warning("a record with a bad extra", extra=bad)
    time.sleep(0.2)
    raise ValueError("raised by the task that logged")


class BreaksInTheWorker:
    """Pickles in the node; rebuilding it in a worker process raises."""

    def __reduce__(self) -> tuple[Any, tuple[Any, ...]]:
        return (_rebuild_only_here, (os.getpid(),))


def _rebuild_only_here(pid: int) -> BreaksInTheWorker:
    if os.getpid() != pid:
        raise RuntimeError(f"made in process {pid}, cannot be rebuilt in another")
    return BreaksInTheWorker()


def takes(token: CancellationToken, value: object) -> int:
    return os.getpid()


def starts_a_child(token: CancellationToken, tell: str, session: bool = False) -> str:
    """Starts ``sleep 60`` (in a session of its own with ``session``), says its pid, then
    spins without a checkpoint."""
    import subprocess

    sleeper = subprocess.Popen(["sleep", "60"], start_new_session=session)
    told(tell, f"{os.getpid()} {sleeper.pid}")
    while True:
        pass


def niceness(token: CancellationToken) -> int:
    return os.getpriority(os.PRIO_PROCESS, 0)


def asks_again(token: CancellationToken) -> int:
    """Asks to run again once, then says which attempt it is."""
    from chongming_task import Retry

    here = current()
    assert here is not None
    if here.attempt == 1:
        raise Retry(after=0.01, reason="not yet")
    return here.attempt
