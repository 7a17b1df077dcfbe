"""A PgBouncer of the test's own, in transaction pooling mode, in front of the test
server: Debian's ``pgbouncer``, started on a free port from a configuration in a
temporary directory, and stopped and removed afterwards. Without the program the tests
skip (and fail in CI, which installs it)."""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest

PROGRAM = shutil.which("pgbouncer") or (
    "/usr/sbin/pgbouncer" if os.path.exists("/usr/sbin/pgbouncer") else None
)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _require() -> str:
    if PROGRAM is None:
        reason = "PgBouncer is not installed (Debian: apt-get install pgbouncer)"
        if os.environ.get("CI"):
            pytest.fail(reason)
        pytest.skip(reason)
    return PROGRAM


@contextmanager
def pgbouncer(dsn: str, *, clients: int = 500, pool_size: int = 20) -> Iterator[str]:
    """A PgBouncer in transaction mode in front of ``dsn``'s server, taking up to
    ``clients`` client connections onto ``pool_size`` server connections; yields the DSN
    that reaches the same database through it."""
    import psycopg
    from psycopg.conninfo import conninfo_to_dict

    program = _require()
    info = conninfo_to_dict(dsn)
    host, port = str(info.get("host", "127.0.0.1")), str(info.get("port", 5432))
    user, dbname = str(info.get("user", "postgres")), str(info.get("dbname", "postgres"))
    upstream = f"host={host} port={port} dbname={dbname} user={user}"
    password = info.get("password") or os.environ.get("PGPASSWORD")
    if password:
        upstream += f" password={password}"
    # Readable by the user PgBouncer runs as (it refuses to run as root).
    home = Path(tempfile.mkdtemp(prefix="chongming-pgbouncer-"))
    home.chmod(0o755)
    listen = _free_port()
    (home / "users.txt").write_text(f'"{user}" ""\n')
    (home / "pgbouncer.ini").write_text(
        "[databases]\n"
        f"{dbname} = {upstream}\n"
        "[pgbouncer]\n"
        "listen_addr = 127.0.0.1\n"
        f"listen_port = {listen}\n"
        "unix_socket_dir =\n"
        "auth_type = trust\n"
        f"auth_file = {home / 'users.txt'}\n"
        "pool_mode = transaction\n"
        f"max_client_conn = {clients}\n"
        f"default_pool_size = {pool_size}\n"
        "ignore_startup_parameters = extra_float_digits\n"
        "log_connections = 0\n"
        "log_disconnections = 0\n"
        f"logfile = {home / 'pgbouncer.log'}\n"
    )
    for name in ("users.txt", "pgbouncer.ini"):
        (home / name).chmod(0o644)
    command = [program]
    if os.geteuid() == 0:
        command += ["-u", "postgres"]
        shutil.chown(home, user="postgres")
    # Its log goes to the log file only (-q): a pipe nobody reads would fill after 64 KB
    # of lines and stop PgBouncer dead in the middle of a write.
    proc = subprocess.Popen(
        [*command, "-q", str(home / "pgbouncer.ini")],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    through = f"postgresql://{user}@127.0.0.1:{listen}/{dbname}"  # it trusts its clients
    try:
        deadline = time.monotonic() + 15
        while True:
            try:
                with psycopg.connect(through, connect_timeout=2, prepare_threshold=None) as c:
                    c.execute("SELECT 1")
                break
            except psycopg.OperationalError:
                if proc.poll() is not None or time.monotonic() > deadline:
                    log = home / "pgbouncer.log"
                    said = log.read_text() if log.exists() else ""
                    raise AssertionError(f"PgBouncer did not start: {said[-2000:]}") from None
                time.sleep(0.1)
        yield through
    finally:
        proc.terminate()
        try:
            proc.wait(10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(10)
        shutil.rmtree(home, ignore_errors=True)
