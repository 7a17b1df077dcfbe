from __future__ import annotations

import contextlib
import sys
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import IO

import pytest

from chongming_task import (
    Controller,
    CurrentTask,
    InMemoryTaskStore,
    SqliteTaskStore,
    TaskRun,
    TaskStatus,
    TaskStore,
    current,
)
from chongming_task.run.life import Run
from chongming_task.stores import open_store


@pytest.fixture(autouse=True)
def _sigpipe_as_it_was() -> Iterator[None]:
    """The CLI's ``main()`` lets SIGPIPE kill the process (``ps | head`` ends quietly);
    called in a test, it would leave pytest to die at its next write to a closed socket
    or pipe (a test proxy's, say). Every test gets back the handler it started with."""
    import signal

    pipe = signal.getsignal(signal.SIGPIPE)
    yield
    signal.signal(signal.SIGPIPE, pipe)


def here() -> CurrentTask:
    """The task running here (inside a task function): its id and attempt."""
    running = current()
    assert running is not None, "called outside a task"
    return running


def run_of(handle: TaskRun) -> Run:
    """The node's run behind a handle: for the tests that look at the engine itself."""
    return handle._run


def wait_until(predicate: Callable[[], bool], timeout: float = 10.0, what: str = "") -> None:
    """Re-check ``predicate`` until it holds; fail the test after ``timeout`` seconds."""
    deadline = time.monotonic() + timeout
    tick = threading.Event()
    while not predicate():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout}s waiting for {what or predicate}")
        tick.wait(0.005)


class Lines:
    """A process's output, line by line as it comes: a thread reads ``stream`` to its
    end, so a test waits for what it expects to be printed, not a guessed while."""

    def __init__(self, stream: IO[str]) -> None:
        self._lines: list[str] = []
        self._lock = threading.Lock()
        self._thread = threading.Thread(target=self._read, args=(stream,), daemon=True)
        self._thread.start()

    def _read(self, stream: IO[str]) -> None:
        for line in stream:
            with self._lock:
                self._lines.append(line)

    def text(self) -> str:
        """What was printed so far (after ``close()``: all of it)."""
        with self._lock:
            return "".join(self._lines)

    def wait_for(
        self, predicate: Callable[[str], bool], timeout: float = 20.0, what: str = ""
    ) -> None:
        """Until ``predicate`` holds for what was printed so far."""
        wait_until(lambda: predicate(self.text()), timeout=timeout, what=what)

    def close(self, timeout: float = 20.0) -> str:
        """Once the stream has ended (its process exited): everything printed."""
        self._thread.join(timeout)
        return self.text()


def stored_status(db: Path | str, task_id: str) -> TaskStatus:
    """Task ``task_id``'s status as the store at ``db`` (a file or a DSN) holds it now,
    read through a store opened for the read, as another process would."""
    store = open_store(str(db))
    try:
        snapshot = store.get(task_id)
        assert snapshot is not None, f"no task {task_id} in {db}"
        return snapshot.status
    finally:
        store.close()


@pytest.fixture(params=["memory", "sqlite"])
def store(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[TaskStore]:
    s: TaskStore = (
        InMemoryTaskStore() if request.param == "memory" else SqliteTaskStore(tmp_path / "t.db")
    )
    yield s
    s.close()


@pytest.fixture
def make_controller() -> Iterator[Callable[..., Controller]]:
    made: list[Controller] = []

    def make(store: TaskStore | None = None, **kwargs: object) -> Controller:
        kwargs.setdefault("activity_interval", 0.02)
        c = Controller(store if store is not None else InMemoryTaskStore(), **kwargs)  # type: ignore[arg-type]
        made.append(c)
        return c

    yield make
    for c in made:
        c.close(timeout=5)


# -- nothing left behind ----------------------------------------------------------------
#
# A test writes only inside its own temporary directory, and every process it starts
# ends with it. An audit hook sees every file this process opens for writing and every
# SQLite database it connects to: one inside the directory the session ran from fails
# the session (tool caches aside). Files other processes make there (the demo
# run beside the tests, say) are theirs. A process the tests started (at any depth) that
# is still alive at the end fails the session too, and is killed.

_ROOT = Path.cwd().resolve()
_ALLOWED = {".pytest_cache", ".hypothesis", ".mypy_cache", ".ruff_cache", "__pycache__"}
_WRITTEN: set[str] = set()


def _outside_tmp(target: object) -> None:
    """Note ``target`` if it lies in the session's directory, outside what is allowed."""
    if not isinstance(target, str | Path):
        return
    if str(target) in ("", ":memory:") or str(target).startswith("file:"):
        return
    try:
        path = (_ROOT / target).resolve()
        relative = path.relative_to(_ROOT)
    except (ValueError, OSError):
        return
    # pytest's cache is written through a temporary folder renamed into .pytest_cache.
    if relative.parts and relative.parts[0].startswith("pytest-cache-files-"):
        return
    if not _ALLOWED.intersection(relative.parts):
        _WRITTEN.add(str(relative))


def _audit(event: str, args: tuple[object, ...]) -> None:
    import os

    if event == "sqlite3.connect":
        _outside_tmp(args[0])
    elif event == "open" and len(args) == 3:
        path, mode, flags = args
        writing = (
            any(c in mode for c in "wax+")
            if isinstance(mode, str)
            else isinstance(flags, int) and bool(flags & (os.O_WRONLY | os.O_RDWR | os.O_CREAT))
        )
        if writing:
            _outside_tmp(path)


sys.addaudithook(_audit)


def _descendants(root: int) -> list[tuple[int, str]]:
    """Live processes below ``root`` (Linux ``/proc``; elsewhere none are found)."""
    children: dict[int, list[int]] = {}
    names: dict[int, str] = {}
    for entry in Path("/proc").glob("[0-9]*"):
        try:
            stat = (entry / "stat").read_text()
        except OSError:
            continue
        name_end = stat.rindex(")")
        state, ppid = stat[name_end + 2 :].split()[:2]
        if state != "Z":
            pid = int(entry.name)
            children.setdefault(int(ppid), []).append(pid)
            names[pid] = stat[stat.index("(") + 1 : name_end]
    found: list[tuple[int, str]] = []
    stack = list(children.get(root, []))
    while stack:
        pid = stack.pop()
        found.append((pid, names[pid]))
        stack.extend(children.get(pid, []))
    return found


def _stop_multiprocessing_helpers() -> None:
    """The fork server and resource tracker that process tasks' worker pools start live
    as long as the interpreter (as for any ``multiprocessing`` user); stopped here, with
    the methods ``multiprocessing`` keeps for its own tests, before the check that no
    process outlived the tests."""
    from multiprocessing import forkserver, resource_tracker

    with contextlib.suppress(Exception):
        forkserver._forkserver._stop()
    with contextlib.suppress(Exception):
        resource_tracker._resource_tracker._stop()


def pytest_sessionfinish(session: pytest.Session, exitstatus: int) -> None:
    import os
    import signal

    if hasattr(session.config, "workerinput"):
        return
    _stop_multiprocessing_helpers()
    alive = _descendants(os.getpid())
    for pid, _ in alive:
        with contextlib.suppress(OSError):
            os.kill(pid, signal.SIGKILL)
    problems = []
    if _WRITTEN:
        problems.append(
            f"tests wrote outside their temporary directories: {', '.join(sorted(_WRITTEN))}"
        )
    if alive:
        named = ", ".join(f"{name} ({pid})" for pid, name in alive)
        problems.append(f"processes the tests started outlived them (now killed): {named}")
    if problems:
        reporter = session.config.pluginmanager.get_plugin("terminalreporter")
        for problem in problems:
            if reporter is not None:
                reporter.write_line(f"FAILED (left behind): {problem}", red=True)
        session.exitstatus = pytest.ExitCode.TESTS_FAILED


# -- a PostgreSQL for the Postgres tests ---------------------------------------------------
#
# With CHONGMING_TEST_POSTGRES set, the Postgres tests use that server. Without it, and
# where PostgreSQL's server binaries (initdb, pg_ctl) are installed, the session starts a
# throwaway cluster of its own in a temporary directory on a free port, points the tests
# at it and removes it at the end, so a newcomer's `uv run pytest` proves what CI proves.
# CHONGMING_TEST_POSTGRES=none skips the Postgres tests (visibly) instead.

_THROWAWAY: list[object] = []


def pytest_configure(config: pytest.Config) -> None:
    import os

    from tests.integration import postgres_support
    from tests.integration.pg_cluster import start_throwaway, unavailable_reason

    if os.environ.get(postgres_support.ENV) or hasattr(config, "workerinput"):
        postgres_support.password_to_environment()
        return
    reason = unavailable_reason()
    try:
        import psycopg  # noqa: F401
    except ImportError:
        reason = reason or "psycopg is not installed (the [postgres] extra)"
    if reason is not None:
        postgres_support.NO_SERVER_REASON = f"no throwaway PostgreSQL: {reason}"
        return
    try:
        cluster = start_throwaway()
    except Exception as exc:
        postgres_support.NO_SERVER_REASON = f"the throwaway PostgreSQL did not start: {exc}"
        return
    _THROWAWAY.append(cluster)
    os.environ[postgres_support.ENV] = cluster.dsn


def pytest_report_header(config: pytest.Config) -> str:
    import os

    from tests.integration import postgres_support

    if _THROWAWAY:
        return f"postgres: a throwaway cluster of this run at {os.environ[postgres_support.ENV]}"
    dsn = os.environ.get(postgres_support.ENV)
    if dsn and dsn != "none":
        return f"postgres: {postgres_support.ENV}={dsn}"
    return f"postgres: none ({postgres_support.NO_SERVER_REASON or 'CHONGMING_TEST_POSTGRES=none'})"


def pytest_unconfigure(config: pytest.Config) -> None:
    from tests.integration.pg_cluster import ThrowawayCluster

    for cluster in _THROWAWAY:
        assert isinstance(cluster, ThrowawayCluster)
        cluster.remove()
    _THROWAWAY.clear()
