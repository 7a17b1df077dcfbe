"""Guessing the dashboard's token, with forwarding headers: the limiter holds, and the
right token is never refused.

    uv run python bench/web_guessing.py [--guesses 3000] [--then REV]

``chongming-task web`` with a strong token (in the environment) serves an empty SQLite
store; one client on loopback sends ``--guesses`` wrong tokens, each with an
``X-Forwarded-For`` of its own, and after every 100th a request with the right token
(alone, as another client would send it, and also with a forwarding header). Run twice:
with no proxy named (every header is ignored: one client), and with 127.0.0.1 named
``--trusted-proxy`` (each forwarded address its own client: the proxy is trusted to say
who it forwards for). With ``--then``, the first run again with that commit's code
(``src/`` from this checkout's history), whose server believed 127.0.0.1's headers.

Printed for each: wrong tokens answered 401 (looked at) and 429 (held back), the right
token's answers (every one must be 200), the wall time and the guesses a second; then
twenty wrong tokens without a header and the right token from the same address (every
client behind a proxy nobody named): it must still answer 200.
"""

from __future__ import annotations

import argparse
import http.client
import os
import secrets
import socket
import subprocess
import sys
import tempfile
import time
from collections import Counter
from pathlib import Path

from throughput_then_now import NOW, extract  # bench/ is on sys.path when run as a script

TOKEN = secrets.token_urlsafe(24)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _ask(port: int, token: str, forwarded: str | None) -> int:
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=30)
    try:
        headers = {"Authorization": f"Bearer {token}"}
        if forwarded is not None:
            headers["X-Forwarded-For"] = forwarded
        conn.request("GET", "/tasks", headers=headers)
        response = conn.getresponse()
        response.read()
        return response.status
    finally:
        conn.close()


def run(src: Path, db: Path, guesses: int, proxies: list[str]) -> dict[str, object]:
    port = _free_port()
    env = {**os.environ, "PYTHONPATH": str(src), "CHONGMING_WEB_TOKEN": TOKEN}
    command = [sys.executable, "-m", "chongming_task", "--db", str(db), "web"]
    command += ["--port", str(port)]
    for proxy in proxies:
        command += ["--trusted-proxy", proxy]
    web = subprocess.Popen(command, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, env=env)
    try:
        for _ in range(300):
            try:
                _ask(port, TOKEN, None)
                break
            except OSError:
                time.sleep(0.1)
        wrong: Counter[int] = Counter()
        right: Counter[int] = Counter()
        began = time.perf_counter()
        for n in range(guesses):
            forwarded = f"10.{n // 65536 % 256}.{n // 256 % 256}.{n % 256}"
            wrong[_ask(port, f"wrong-{n}", forwarded)] += 1
            if n % 100 == 99:
                right[_ask(port, TOKEN, None)] += 1
                right[_ask(port, TOKEN, "10.255.255.255")] += 1
        took = time.perf_counter() - began
        # Then twenty wrong tokens from the address itself, no header: the right token
        # from that address (every client behind an unnamed proxy) must still get in.
        for n in range(20):
            _ask(port, f"plain-wrong-{n}", None)
        after = _ask(port, TOKEN, None)
        return {"wrong": wrong, "right": right, "took": took, "after": after}
    finally:
        web.terminate()
        web.wait(30)


def _made(src: Path, db: Path) -> None:
    """An empty store at ``db``, made by the package under ``src`` (its own schema)."""
    script = f"from chongming_task import SqliteTaskStore; SqliteTaskStore({str(db)!r}).close()"
    env = {**os.environ, "PYTHONPATH": str(src)}
    subprocess.run([sys.executable, "-c", script], check=True, env=env)


def show(label: str, found: dict[str, object], guesses: int) -> bool:
    wrong, right, took = found["wrong"], found["right"], found["took"]
    assert isinstance(wrong, Counter) and isinstance(right, Counter) and isinstance(took, float)
    refused = sum(n for code, n in right.items() if code != 200)
    print(
        f"{label}: wrong tokens {wrong[401]:,} looked at (401), {wrong[429]:,} held back "
        f"(429); the right token {right[200]} of {sum(right.values())} answered 200; "
        f"{took:.1f} s, {guesses / took:,.0f} guesses/s; the right token after 20 wrong "
        f"ones from its own address, no header: {found['after']}"
    )
    return refused == 0 and found["after"] == 200


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--guesses", type=int, default=3000)
    parser.add_argument("--then", help="an earlier commit, run beside (no proxy named)")
    args = parser.parse_args()
    ok = True
    with tempfile.TemporaryDirectory(prefix="web-guessing-") as folder:
        db = Path(folder) / "empty.db"
        _made(NOW, db)
        ok &= show("no proxy named", run(NOW, db, args.guesses, []), args.guesses)
        trusted = run(NOW, db, args.guesses, ["127.0.0.1"])
        ok &= show("127.0.0.1 named a trusted proxy", trusted, args.guesses)
        if args.then:
            then = extract(args.then, Path(folder) / "then")
            older = Path(folder) / "then.db"
            _made(then, older)
            show(f"{args.then}, no proxy named", run(then, older, args.guesses, []), args.guesses)
    sys.exit(0 if ok else 1)


if __name__ == "__main__":
    main()
