"""The dashboard against a hostile page and a careless hand, as a real server process:
a request naming another host (DNS rebinding), a control from another origin, framing,
weak and guessed tokens, a redirect off the site, input no handler expects, a
question that counted fewer tasks than the answer acted on, results of megabytes in a
list, and paging deep into a large store."""

from __future__ import annotations

import html
import http.client
import json
import os
import re
import subprocess
import sys
import urllib.parse
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest

from chongming_task import SqliteTaskStore, TaskSnapshot, TaskStatus, Transition
from chongming_task.stores.capabilities import Capabilities
from tests.conftest import stored_status, wait_until
from tests.integration.test_cross_process import Node
from tests.integration.test_web import Web

pytest.importorskip("starlette", reason="the [web] extra is not installed")

TOKEN = "a-long-enough-token-1234"


def raw(
    web: Web, method: str, path: str, *, body: str | None = None, **headers: str
) -> tuple[int, dict[str, str], str]:
    """One request exactly as given (urllib would set the Host itself)."""
    conn = http.client.HTTPConnection("127.0.0.1", web.port, timeout=30)
    try:
        sent = {k.replace("_", "-"): v for k, v in headers.items()}
        if body is not None:
            sent.setdefault("Content-Type", "application/x-www-form-urlencoded")
        conn.putrequest(method, path, skip_host="Host" in sent, skip_accept_encoding=True)
        for name, value in sent.items():
            conn.putheader(name, value)
        data = None if body is None else body.encode()
        if data is not None:
            conn.putheader("Content-Length", str(len(data)))
        conn.endheaders(data)
        response = conn.getresponse()
        return response.status, dict(response.getheaders()), response.read().decode()
    finally:
        conn.close()


def snapshot(task_id: str, *, name: str = "loop", at: datetime, **more: object) -> TaskSnapshot:
    fields: dict[str, object] = {"status": TaskStatus.QUEUED, "status_version": 1, **more}
    return TaskSnapshot(task_id=task_id, name=name, created_at=at, **fields)  # type: ignore[arg-type]


def create_many(db: Path, snapshots: list[TaskSnapshot]) -> None:
    """Store ``snapshots`` in one transaction, each with its first transition."""
    store = SqliteTaskStore(db)
    try:
        Capabilities(store).create_many(
            [
                (
                    s,
                    Transition(
                        task_id=s.task_id,
                        version=1,
                        from_status=None,
                        to_status=s.status,
                        at=s.created_at,
                    ),
                )
                for s in snapshots
            ]
        )
    finally:
        store.close()


def test_a_request_naming_another_host_is_refused_and_changes_nothing(tmp_path: Path) -> None:
    db = tmp_path / "rebind.db"
    SqliteTaskStore(db).close()
    node = Node(db, "--submit", "loop")
    web = Web(db)
    (task_id,) = node.task_ids
    try:
        wait_until(lambda: stored_status(db, task_id) is TaskStatus.RUNNING, what="running")
        evil = f"rebind.attacker.example:{web.port}"
        # A rebinding page's request: its own name, resolved to 127.0.0.1, with a forged
        # double-submit pair.
        status, _, body = raw(
            web,
            "POST",
            f"/tasks/{task_id}/cancel",
            body="csrf=zz",
            Host=evil,
            Origin=f"http://{evil}",
            Cookie="cm_csrf=zz",
        )
        assert status == 400 and "does not answer to the host" in body
        status, _, _ = raw(web, "GET", "/", Host=evil)
        assert status == 400
        # The right host, but a control from another origin (or site).
        here = f"127.0.0.1:{web.port}"
        for origin in (f"http://{evil}", "null", f"http://127.0.0.1:{web.port + 1}"):
            status, _, body = raw(
                web,
                "POST",
                f"/tasks/{task_id}/cancel",
                body="csrf=zz",
                Host=here,
                Origin=origin,
                Cookie="cm_csrf=zz",
            )
            assert status == 403 and "own pages" in body, (origin, status)
        status, _, _ = raw(
            web,
            "POST",
            f"/tasks/{task_id}/cancel",
            body="csrf=zz",
            Host=here,
            Sec_Fetch_Site="cross-site",
            Cookie="cm_csrf=zz",
        )
        assert status == 403
        for name in ("localhost", "127.0.0.1", "LOCALHOST."):
            assert raw(web, "GET", "/healthz", Host=f"{name}:{web.port}")[0] == 200, name
        assert stored_status(db, task_id) is TaskStatus.RUNNING
    finally:
        web.close()
        node.finish()


def test_an_allowed_host_is_answered_and_a_wildcard_bind_needs_one(tmp_path: Path) -> None:
    db = tmp_path / "allowed.db"
    SqliteTaskStore(db).close()
    web = Web(db, "--allowed-host", "dash.example.com", "--allowed-host", ".corp.example")
    try:
        for name in ("dash.example.com", "a.corp.example", "corp.example"):
            assert raw(web, "GET", "/healthz", Host=name)[0] == 200, name
        for name in ("example.com", "evilcorp.example", "x.dash.example.com"):
            assert raw(web, "GET", "/healthz", Host=name)[0] == 400, name
    finally:
        web.close()
    wildcard = ["web", "--host", "0.0.0.0"]
    refused = subprocess.run(
        [sys.executable, "-m", "chongming_task", "--db", str(db), *wildcard],
        capture_output=True,
        text=True,
        timeout=30,
        env={**os.environ, "CHONGMING_WEB_TOKEN": TOKEN},
    )
    assert refused.returncode == 2 and "--allowed-host" in refused.stderr
    assert refused.stderr.count("\n") == 1


def test_every_answer_forbids_framing_and_foreign_scripts(tmp_path: Path) -> None:
    db = tmp_path / "frame.db"
    SqliteTaskStore(db).close()
    web = Web(db)
    try:
        for path in ("/", "/tasks", "/tasks/abcdef123456", "/nodes", "/static/dashboard.js"):
            status, headers, _ = raw(web, "GET", path)
            assert status in (200, 404), path
            policy = headers["content-security-policy"]
            assert "frame-ancestors 'none'" in policy and "script-src 'self'" in policy
            assert "unsafe-inline" not in policy and "unsafe-eval" not in policy
            assert headers["x-frame-options"] == "DENY"
            assert headers["x-content-type-options"] == "nosniff"
    finally:
        web.close()


@pytest.mark.parametrize(
    ("env", "args", "said"),
    [
        ({"CHONGMING_WEB_TOKEN": "a"}, ["--host", "0.0.0.0", "--allowed-host", "*"], "16 or more"),
        ({"CHONGMING_WEB_TOKEN": " "}, [], "blank"),
        ({"CHONGMING_WEB_TOKEN": " "}, ["--host", "0.0.0.0", "--allowed-host", "*"], "blank"),
        ({}, ["--token", TOKEN], "--token: a token on the command line is readable"),
        ({}, [f"--token={TOKEN}"], "give it in CHONGMING_WEB_TOKEN or in a file"),
        ({"CHONGMING_WEB_TOKEN": TOKEN}, ["--trusted-proxy", "*"], "no address"),
        ({"CHONGMING_WEB_TOKEN": "short"}, ["--trusted-proxy", "127.0.0.1"], "16+"),
        ({}, ["--token-file", "/nonexistent/token"], "--token-file /nonexistent/token"),
    ],
)
def test_weak_tokens_secrets_on_the_command_line_and_blind_trust_are_refused(
    tmp_path: Path, env: dict[str, str], args: list[str], said: str
) -> None:
    db = tmp_path / "weak.db"
    SqliteTaskStore(db).close()
    result = subprocess.run(
        [sys.executable, "-m", "chongming_task", "--db", str(db), "web", *args],
        capture_output=True,
        text=True,
        timeout=30,
        env={**os.environ, **env},
    )
    assert result.returncode == 2 and said in result.stderr, result.stderr
    assert result.stderr.count("\n") == 1


def test_guessing_the_token_is_slowed_and_never_a_500(tmp_path: Path) -> None:
    db = tmp_path / "guess.db"
    SqliteTaskStore(db).close()
    strong, short = Web(db, token=TOKEN), Web(db, token="s3cret")
    try:
        for web in (strong, short):
            codes = [raw(web, "GET", "/", Authorization=f"Bearer wrong-{n}")[0] for n in range(15)]
            assert codes[:10] == [401] * 10
            assert codes[10:] == [429] * 5  # the rest wait
            assert raw(web, "GET", "/healthz")[0] == 200  # a probe is never held back
        # A strong token is looked at first: others' guesses from the same address never
        # lock its holders out (its length keeps it from being guessed).
        status, _, _ = raw(strong, "GET", "/", Authorization=f"Bearer {TOKEN}")
        assert status == 200
        assert raw(strong, "GET", f"/?token={TOKEN}")[0] == 303
        # A short one (loopback only) is not even looked at while its client waits.
        status, headers, _ = raw(short, "GET", "/", Authorization="Bearer s3cret")
        assert status == 429 and int(headers["retry-after"]) > 0
    finally:
        strong.close()
        short.close()


def test_forwarding_headers_count_only_from_a_proxy_named_trusted(tmp_path: Path) -> None:
    db = tmp_path / "proxy.db"
    SqliteTaskStore(db).close()
    direct = Web(db, token=TOKEN)
    proxied = Web(db, "--trusted-proxy", "127.0.0.1", token=TOKEN)
    try:
        # Nobody named: each guess's own X-Forwarded-For changes nothing, one client.
        codes = [
            raw(direct, "GET", "/", Authorization="Bearer no", X_Forwarded_For=f"10.0.0.{n}")[0]
            for n in range(12)
        ]
        assert codes == [401] * 10 + [429] * 2
        # The proxy named: the client is the address it forwarded for.
        for n in range(12):
            guessed = raw(
                proxied, "GET", "/", Authorization="Bearer no", X_Forwarded_For="10.9.9.9"
            )
            assert guessed[0] == (401 if n < 10 else 429)
        other = raw(proxied, "GET", "/", Authorization="Bearer no", X_Forwarded_For="10.8.8.8")
        assert other[0] == 401  # another client, its own count
        # Secure cookies where the proxy says the client came over TLS.
        status, headers, _ = raw(
            proxied,
            "GET",
            f"/?token={TOKEN}",
            X_Forwarded_Proto="https",
            X_Forwarded_For="10.7.7.7",
        )
        assert status == 303 and "secure" in headers["set-cookie"].lower()
        status, headers, _ = raw(direct, "GET", f"/?token={TOKEN}", X_Forwarded_Proto="https")
        assert status == 303 and "secure" not in headers["set-cookie"].lower()  # not believed
    finally:
        direct.close()
        proxied.close()


def test_the_token_is_read_from_a_file(tmp_path: Path) -> None:
    db = tmp_path / "file.db"
    SqliteTaskStore(db).close()
    secret = tmp_path / "token"
    secret.write_text(TOKEN + "\n")
    web = Web(db, "--token-file", str(secret))
    try:
        assert raw(web, "GET", "/")[0] == 401
        assert raw(web, "GET", "/", Authorization=f"Bearer {TOKEN}")[0] == 200
        cmdline = Path(f"/proc/{web.proc.pid}/cmdline").read_bytes()
        assert TOKEN.encode() not in cmdline
    finally:
        web.close()


def test_odd_text_in_tokens_ids_times_and_globs_is_a_4xx_never_a_500(tmp_path: Path) -> None:
    db = tmp_path / "fivehundred.db"
    SqliteTaskStore(db).close()
    plain = Web(db)
    guarded = Web(db, token=TOKEN)
    odd = Web(db, token="tökén-ünïcode-øø-1234")
    try:
        for path in (
            "/tasks?q=a%F4%8F%BF%BF",
            "/tasks?until=0001-01-01T00:00:00%2B14:00&before=ab",
            "/tasks?until=9999-12-31T23:59:59-14:00&before=ab",
            "/tasks?until=yesterday&before=ab",
            "/tasks?until=2026-01-01T00:00:00%2B00:00",
            "/tasks?name=%5Bz-a%5D*",
            "/tasks?status=",
            "/tasks?bucket=%D9%A3",  # an Arabic-Indic three: a digit, but not ours
            "/tasks/%F4%8F%BF%BF",
            "/pipelines/%ff%fe",
        ):
            status, _, body = raw(plain, "GET", path)
            assert status < 500, (path, status, body[-300:])
        for header in (
            {"Authorization": "Bearer tökén"},
            {"Cookie": "cm_token=t%C3%B6k"},
            {"Cookie": "cm_token=tök"},
        ):
            assert raw(guarded, "GET", "/", **header)[0] == 401, header
        status, _, _ = raw(guarded, "GET", "/?token=t%C3%B6k%C3%A9n")
        assert status == 401
        status, headers, _ = raw(
            odd, "GET", "/?token=" + urllib.parse.quote("tökén-ünïcode-øø-1234")
        )
        assert status == 303  # a token beyond ASCII works
        cookie = headers["set-cookie"].split(";")[0]
        assert raw(odd, "GET", "/tasks", Cookie=cookie)[0] == 200
        form = "csrf=" + urllib.parse.quote("tökén")
        status, _, _ = raw(
            plain, "POST", "/tasks/abcdef/pause", body=form, Cookie="cm_csrf=t%C3%B6k"
        )
        assert status == 403
    finally:
        plain.close()
        guarded.close()
        odd.close()


def test_redirects_stay_on_the_dashboard(tmp_path: Path) -> None:
    db = tmp_path / "redirect.db"
    SqliteTaskStore(db).close()
    web = Web(db, token=TOKEN)
    try:
        for path, to in (
            (f"//evil.example/?token={TOKEN}", "/evil.example/"),
            (f"/\\evil.example/?token={TOKEN}", "/evil.example/"),
            (f"/tasks?token={TOKEN}", "/tasks"),
        ):
            status, headers, _ = raw(web, "GET", path)
            assert status == 303 and headers["location"] == to, (path, headers)
    finally:
        web.close()


def _hidden(page: str, name: str) -> str:
    found = re.search(rf'<input type="hidden" name="{name}" value="([^"]*)">', page)
    assert found is not None, name
    return html.unescape(found[1])


def test_acting_on_every_matching_task_leaves_tasks_made_after_the_question(
    tmp_path: Path,
) -> None:
    db = tmp_path / "question.db"
    SqliteTaskStore(db).close()
    node = Node(db, "--submit", "loop", "--submit", "loop")
    web = Web(db)
    try:
        for task_id in node.task_ids:
            wait_until(lambda t=task_id: stored_status(db, t) is TaskStatus.RUNNING, what="run")
        status, page = web.get("/tasks?name=loop")
        assert status == 200 and "All 2 task(s) matching this filter" in page
        fields = {n: _hidden(page, n) for n in ("filter", "counted_ids")}
        assert sorted(json.loads(fields["counted_ids"])) == sorted(node.task_ids)
        # Made after the question by a node whose clock is five minutes slow: stamped
        # as if they came before it, and left alone all the same.
        slow = datetime.now(UTC) - timedelta(minutes=5)
        create_many(db, [snapshot(f"{n:032x}", at=slow) for n in range(300)])
        status, answer = web.request("/tasks/matching/pause", {"csrf": web.csrf(), **fields})
        assert status == 200, answer
        assert answer.count("request accepted") == 2
        assert "2 task(s) acted on; the question counted 2" in answer
        for bad in ("not json", "[]", '"one"', json.dumps(["x"] * 1001), "[1, 2]"):
            status, said = web.request(
                "/tasks/matching/stop", {"csrf": web.csrf(), **fields, "counted_ids": bad}
            )
            assert status == 400 and "question&#39;s tasks are missing" in said, bad
        store = SqliteTaskStore(db)
        try:
            left = [s.status for s in store.query() if s.task_id not in node.task_ids]
            assert left == [TaskStatus.QUEUED] * 300
            assert not Capabilities(store).commands.pending(f"{0:032x}")
        finally:
            store.close()
    finally:
        web.close()
        node.finish()


def test_lists_read_no_results_and_a_task_page_shows_a_bounded_preview(tmp_path: Path) -> None:
    db = tmp_path / "heavy.db"
    store = SqliteTaskStore(db)
    now = datetime.now(UTC)
    heavy = {"rows": ["x" * 1000] * 5000}  # 5 MB each
    for n in range(4):
        store.create(
            snapshot(
                f"{n:02d}" + "e" * 30,
                name="heavy",
                at=now + timedelta(seconds=n),
                status=TaskStatus.SUCCEEDED,
                status_version=4,
                outcome=heavy,
                ended_at=now,
            )
        )
    store.close()
    web = Web(db)
    try:
        status, page = web.get("/tasks?status=all")
        assert status == 200 and page.count("heavy") >= 4
        assert "xxxxxxxxxx" not in page and len(page) < 100_000
        task_id = "00" + "e" * 30
        status, page = web.get(f"/tasks/{task_id}")
        assert status == 200 and len(page) < 100_000
        assert f'href="/tasks/{task_id}/result"' in page and "the whole result" in page
        assert 'hx-get="/tasks/' not in page  # finished: the page fetches itself no more
        status, whole = web.get(f"/tasks/{task_id}/result")
        assert status == 200 and len(whole) > 5_000_000
    finally:
        web.close()


def test_paging_is_by_key_and_reads_one_page_however_deep(tmp_path: Path) -> None:
    db = tmp_path / "deep.db"
    now = datetime.now(UTC)
    # 130 tasks, 60 of them created at one instant (a batch), the rest a second apart.
    made = [snapshot(f"a{n:031x}", at=now) for n in range(60)]
    made += [snapshot(f"b{n:031x}", at=now - timedelta(seconds=n + 1)) for n in range(70)]
    create_many(db, made)
    web = Web(db)
    try:
        seen: list[str] = []
        path = "/tasks?status=all"
        pages = 0
        while path:
            status, page = web.get(path)
            assert status == 200
            pages += 1
            seen += re.findall(r'href="/tasks/([0-9a-f]{32})"', page)
            older = re.search(r'class="older" href="([^"]+)"', page)
            path = "" if older is None else older[1].replace("&amp;", "&")
        assert pages == 3
        assert len(seen) == len(set(seen)) == 130  # each once, none skipped
        status, _ = web.get("/tasks?status=all&until=2026-01-01T00:00:00%2B00:00")
        assert status == 400  # half a key
        status, _ = web.get("/tasks?status=all&skip=100000")
        assert status == 200  # an old link's offset is no work at all
    finally:
        web.close()


def test_the_overview_writes_a_nodes_buckets_as_ranges(tmp_path: Path) -> None:
    db = tmp_path / "ranges.db"
    SqliteTaskStore(db).close()
    node = Node(db, "--owned", "0-63", "--submit", "loop")
    web = Web(db)
    try:
        wait_until(lambda: "0-63" in web.get("/live/overview")[1], 15, "the node's buckets")
        assert "0,1,2" not in web.get("/live/overview")[1]
    finally:
        web.close()
        node.finish()
