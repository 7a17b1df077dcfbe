"""The node's fork server: the one process a node starts to fork its worker processes
from, and what ends them all when the node is gone (docs/design.md, "Process carriers").

``ForkServer`` is the node's side; ``main`` is the server's own loop, in a fresh
interpreter the node starts (never a ``fork`` of the threaded node). The server imports
the worker's code once and forks each worker from there: a worker starts warm, in a
process group of its own (so a forced end reaches the processes its task started), with
a parent-death signal against the server (single-threaded, so the signal is sound). The
server holds the only other end of the node's control socket: when the node closes it,
or dies (``kill -9`` included), the server ends every worker's process tree with
``SIGKILL`` (a stopped worker included: ``SIGKILL`` needs no continue) and exits. It
imports the program's ``__main__`` only in a worker that is sent a function defined
there (``child.load_main``).

Each worker's exit code comes back to the node over a pipe of its own, written by the
server when it reaps the worker; once a worker is reaped the server ends what is left of
its process group (what its task started and left running).
"""

from __future__ import annotations

import contextlib
import errno
import json
import os
import select
import signal
import socket
import struct
import subprocess
import sys
import threading
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ..run.child import Wire, serve

__all__ = ["ForkServer", "Worker", "end_tree", "main"]

_PID = struct.Struct("!q")
_CODE = struct.Struct("!i")

_BOOT = (
    "import json, sys; settings = json.loads(sys.argv[2]); sys.path[:] = settings['path']; "
    "from chongming_task.node.forkserver import main; main(int(sys.argv[1]), settings)"
)


@dataclass(frozen=True, slots=True)
class Settings:
    """What every worker of one node shares."""

    niceness: int
    main: tuple[str, str] | None
    """Where the node's ``__main__`` is (``("path", script)`` or ``("name", module)``),
    for a worker sent a function defined there."""


class Worker:
    """The node's handle on one worker process: its pid (the id of its process group
    too), its wire and its exit code once the server reaped it."""

    __slots__ = ("_code", "_status", "pid", "wire")

    def __init__(self, pid: int, wire: Wire, status: int) -> None:
        self.pid = pid
        self.wire = wire
        self._status = status
        self._code: int | None = None

    def exit_code(self, timeout: float) -> int | None:
        """Its exit code (negative: the signal that ended it), waiting up to ``timeout``
        seconds for it to end; ``None`` if it has not, or the server is gone."""
        if self._code is None and self._status != -1:
            ready, _, _ = select.select([self._status], [], [], timeout)
            if not ready:
                return None
            data = b""
            with contextlib.suppress(OSError):
                data = os.read(self._status, _CODE.size)
            os.close(self._status)
            self._status = -1
            if len(data) == _CODE.size:
                self._code = _CODE.unpack(data)[0]
        return self._code

    @property
    def reaped(self) -> bool:
        return self._status == -1

    def end(self, sent: signal.Signals) -> int:
        """Send ``sent`` to its whole process tree; how many processes besides the
        worker got it (see ``end_tree``). Nothing once it was reaped: its pid may be
        another process's by then."""
        if self.reaped:
            return 0
        return end_tree(self.pid, sent)

    def close(self) -> None:
        self.wire.close()
        if self._status != -1:
            os.close(self._status)
            self._status = -1


class ForkServer:
    """The node's side of its fork server, started with the first worker asked for. Safe
    to use from several threads (one fork request at a time)."""

    def __init__(self, *, niceness: int, main: tuple[str, str] | None) -> None:
        self._settings = Settings(niceness, main)
        self._lock = threading.Lock()
        self._control: socket.socket | None = None
        self._process: subprocess.Popen[bytes] | None = None
        self._closed = False

    @property
    def pid(self) -> int | None:
        return None if self._process is None else self._process.pid

    def fork(self) -> Worker:
        """A new worker process, started from the server (the server first, if it is not
        running or has died). ``RuntimeError`` once closed; ``OSError`` if no process can
        be started."""
        ours, theirs = socket.socketpair()
        status_r, status_w = os.pipe()
        try:
            with self._lock:
                if self._closed:
                    raise RuntimeError("the node's worker processes are closed")
                try:
                    pid = self._ask(theirs, status_w)
                except (OSError, EOFError):  # the server died: once more, with a new one
                    self._stop_server()
                    pid = self._ask(theirs, status_w)
        except BaseException:
            ours.close()
            os.close(status_r)
            raise
        finally:
            theirs.close()
            os.close(status_w)
        return Worker(pid, Wire(ours), status_r)

    def _ask(self, theirs: socket.socket, status_w: int) -> int:
        """Caller holds ``_lock``."""
        control = self._control or self._start()
        socket.send_fds(control, [b"F"], [theirs.fileno(), status_w])
        data = b""
        while len(data) < _PID.size:
            more = control.recv(_PID.size - len(data))
            if not more:
                raise EOFError("the fork server closed its end")
            data += more
        pid: int = _PID.unpack(data)[0]
        if pid < 0:
            raise OSError(-pid, f"the fork server could not start a worker: {os.strerror(-pid)}")
        return pid

    def _start(self) -> socket.socket:
        """Caller holds ``_lock``."""
        ours, theirs = socket.socketpair()
        settings = {
            "path": list(sys.path),
            "niceness": self._settings.niceness,
            "main": self._settings.main,
        }
        command = [sys.executable]
        if sys.flags.dont_write_bytecode:
            command.append("-B")
        command += ["-c", _BOOT, str(theirs.fileno()), json.dumps(settings)]
        try:
            self._process = subprocess.Popen(
                command, pass_fds=[theirs.fileno()], stdin=subprocess.DEVNULL
            )
        finally:
            theirs.close()
        self._control = ours
        return ours

    def _stop_server(self) -> None:
        """Caller holds ``_lock``: the control socket closed (the server ends every
        worker and exits) and the server waited for."""
        if self._control is not None:
            self._control.close()
            self._control = None
        if self._process is not None:
            try:
                self._process.wait(5.0)
            except subprocess.TimeoutExpired:
                self._process.kill()
                self._process.wait()
            self._process = None

    def close(self) -> None:
        """End the server, and with it every worker still running."""
        with self._lock:
            self._closed = True
            self._stop_server()


# -- ending a process tree --------------------------------------------------------------------


def descendants(pid: int) -> list[int]:
    """The processes below ``pid`` now (Linux: read from ``/proc``; elsewhere none). Each
    process's own list of its children where the kernel keeps one (0.03 ms for a worker
    and its child, against 1.3 for a scan of every process on a machine of 150)."""
    try:
        return _below(pid)
    except OSError:  # a kernel without the lists: every process's parent, read
        return _below_by_scan(pid)


def _below(pid: int) -> list[int]:
    found: list[int] = []
    todo = [pid]
    while todo:
        each = todo.pop()
        try:
            threads = os.listdir(f"/proc/{each}/task")
        except FileNotFoundError:
            continue  # gone meanwhile
        for thread in threads:
            try:
                text = Path(f"/proc/{each}/task/{thread}/children").read_text()
            except FileNotFoundError:
                if not Path(f"/proc/{each}").exists():
                    break  # the process went meanwhile
                raise  # the kernel keeps no such list
            for child in text.split():
                found.append(int(child))
                todo.append(int(child))
    return found


def _below_by_scan(pid: int) -> list[int]:
    parents: dict[int, list[int]] = {}
    try:
        entries = os.listdir("/proc")
    except OSError:
        return []
    for entry in entries:
        if not entry.isdigit():
            continue
        try:
            stat = Path(f"/proc/{entry}/stat").read_text()
        except OSError:
            continue
        fields = stat[stat.rfind(")") + 2 :].split()
        parents.setdefault(int(fields[1]), []).append(int(entry))
    found: list[int] = []
    below = parents.get(pid, [])
    while below:
        found.extend(below)
        below = [child for each in below for child in parents.get(each, [])]
    return found


def end_tree(pid: int, sent: signal.Signals) -> int:
    """Send ``sent`` to the process group ``pid`` leads and to every process below
    ``pid`` (those that left its group included: read before the signal, since a killed
    parent's children move away); how many processes besides ``pid`` got it."""
    below = descendants(pid)
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(pid, sent)
    reached = 0
    for each in (pid, *below):
        try:
            os.kill(each, sent)
        except (ProcessLookupError, PermissionError):
            continue
        reached += each != pid
    return reached


# -- the server's side ------------------------------------------------------------------------


def main(control_fd: int, settings: dict[str, Any]) -> None:
    """The fork server's life: a worker forked per request until the node's end of the
    control socket closes; then every worker's process tree ended, and exit."""
    for ignored in (signal.SIGINT, signal.SIGTERM):  # the node decides when it ends
        signal.signal(ignored, signal.SIG_IGN)
    control = socket.socket(fileno=control_fd)
    woken_r, woken_w = os.pipe()
    os.set_blocking(woken_r, False)
    os.set_blocking(woken_w, False)
    signal.set_wakeup_fd(woken_w)
    signal.signal(signal.SIGCHLD, lambda *_: None)
    where = settings["main"]
    worker_settings = Settings(
        settings["niceness"], None if where is None else (where[0], where[1])
    )
    server = os.getpid()
    prctl = _prctl()  # loaded once here: every worker forked after has it
    statuses: dict[int, int] = {}  # pid -> the write end of its status pipe
    try:
        while True:
            ready, _, _ = select.select([control.fileno(), woken_r], [], [])
            if woken_r in ready:
                with contextlib.suppress(OSError):
                    os.read(woken_r, 4096)
                _reap(statuses)
            if control.fileno() in ready:
                try:
                    data, fds, _, _ = socket.recv_fds(control, 1, 2)
                except OSError:
                    data, fds = b"", []
                if not data:
                    return  # the node is gone, or closed
                if len(fds) != 2:
                    for fd in fds:
                        os.close(fd)
                    control.sendall(_PID.pack(-errno.EINVAL))
                    continue
                conn, status_w = fds
                closing = [control.fileno(), woken_r, woken_w, *statuses.values()]
                try:
                    pid = os.fork()
                except OSError as exc:
                    os.close(conn)
                    os.close(status_w)
                    control.sendall(_PID.pack(-(exc.errno or errno.EAGAIN)))
                    continue
                if pid == 0:
                    _worker(conn, closing, worker_settings, server, prctl)  # never returns
                with contextlib.suppress(OSError):  # it sets its own group too: whoever is first
                    os.setpgid(pid, pid)
                os.close(conn)
                statuses[pid] = status_w
                control.sendall(_PID.pack(pid))
    finally:
        for pid in list(statuses):
            end_tree(pid, signal.SIGKILL)
        for pid in list(statuses):
            with contextlib.suppress(ChildProcessError):
                os.waitpid(pid, 0)
            _reaped(statuses, pid, None)


def _reap(statuses: dict[int, int]) -> None:
    """Every worker that has ended: what is left of its process group ended (while the
    unreaped worker still holds its pid, so the group's id cannot be another's), then
    its exit code to the node."""
    while True:
        try:
            ended = os.waitid(os.P_ALL, 0, os.WEXITED | os.WNOHANG | os.WNOWAIT)
        except ChildProcessError:
            return
        if ended is None:
            return
        pid = ended.si_pid
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(pid, signal.SIGKILL)  # what its task started and left behind
        _, status = os.waitpid(pid, 0)
        _reaped(statuses, pid, os.waitstatus_to_exitcode(status))


def _reaped(statuses: dict[int, int], pid: int, code: int | None) -> None:
    status_w = statuses.pop(pid, None)
    if status_w is None:
        return
    if code is not None:
        with contextlib.suppress(OSError):
            os.write(status_w, _CODE.pack(code))
    os.close(status_w)


def _worker(
    conn: int,
    closing: list[int],
    settings: Settings,
    server: int,
    prctl: Callable[[int, int], int] | None,
) -> None:
    """A forked worker: its own process group, dead with the server, then ``serve``."""
    code = 1
    try:
        os.setpgid(0, 0)
        _die_with_parent(server, prctl)
        for fd in closing:
            with contextlib.suppress(OSError):
                os.close(fd)
        signal.set_wakeup_fd(-1)
        signal.signal(signal.SIGCHLD, signal.SIG_DFL)
        signal.signal(signal.SIGTERM, signal.SIG_DFL)
        signal.signal(signal.SIGINT, signal.default_int_handler)
        serve(Wire(socket.socket(fileno=conn)), niceness=settings.niceness, main=settings.main)
        code = 0
    except BaseException:
        import traceback

        traceback.print_exc()
    finally:
        with contextlib.suppress(Exception):
            sys.stdout.flush()
            sys.stderr.flush()
        os._exit(code)


def _prctl() -> Callable[[int, int], int] | None:
    """libc's ``prctl`` (Linux), or ``None`` where there is none."""
    try:
        import ctypes

        found: Callable[[int, int], int] = ctypes.CDLL(None, use_errno=True).prctl
    except (OSError, AttributeError):
        return None
    return found


_PR_SET_PDEATHSIG = 1


def _die_with_parent(server: int, prctl: Callable[[int, int], int] | None) -> None:
    """Linux: the kernel kills this process when its parent, the fork server, dies (it
    is single-threaded: the signal is tied to the thread that forked, which is its one),
    even while it is stopped. Then the parent checked: it may have died before."""
    if prctl is not None:
        prctl(_PR_SET_PDEATHSIG, signal.SIGKILL)
    if os.getppid() != server:
        os._exit(1)
