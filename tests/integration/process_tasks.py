"""Process tasks for the process-carrier tests: functions a worker process finds by their
module and name (a test module's own functions are found the same way)."""

from __future__ import annotations

import logging
import os
import signal
import time
from pathlib import Path
from typing import Any

from chongming_task import CancellationToken, Progress, current, task


def square(token: CancellationToken, x: int) -> dict[str, Any]:
    token.checkpoint()
    here = current()
    assert here is not None
    return {"square": x * x, "pid": os.getpid(), "task_id": here.task_id, "attempt": here.attempt}


def counted(token: CancellationToken, steps: int, tell: str) -> int:
    Path(tell).write_text(str(os.getpid()))
    for step in range(1, steps + 1):
        token.checkpoint(Progress(current=step, total=steps, message=f"step {step}"))
        token.sleep(0.02)
    return steps


def spin(token: CancellationToken, seconds: float, tell: str) -> str:
    """Pure work that never reaches a checkpoint."""
    Path(tell).write_text(str(os.getpid()))
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
