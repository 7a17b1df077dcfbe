"""Generated query strings, ids, form fields and headers thrown at the dashboard: every
answer is a page or a 4xx, never a 500. In-process through Starlette's test client, on
a SQLite store holding a few tasks (the browser and real-server tests are beside it)."""

from __future__ import annotations

import urllib.parse
from collections.abc import Iterator
from datetime import UTC, datetime
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from chongming_task import SqliteTaskStore, TaskSnapshot, TaskStatus

pytest.importorskip("starlette", reason="the [web] extra is not installed")
pytest.importorskip("httpx2", reason="Starlette's test client needs httpx2")

from starlette.testclient import TestClient

from chongming_task.web import Dashboard, create_app

TEXT = st.text(max_size=40) | st.sampled_from(
    ["", "all", "finished", "running", "[z-a]*", "0001-01-01T00:00:00+14:00", "\U0010ffff"]
)
KEYS = st.sampled_from(
    ["status", "name", "tag", "bucket", "pipeline", "node", "q", "until", "before", "skip"]
)


@pytest.fixture(scope="module")
def client(tmp_path_factory: pytest.TempPathFactory) -> Iterator[TestClient]:
    db = tmp_path_factory.mktemp("webprop") / "web.db"
    store = SqliteTaskStore(db)
    for n in range(3):
        store.create(
            TaskSnapshot(
                task_id=f"{n:02d}" + "d" * 30,
                name="job",
                status=TaskStatus.QUEUED,
                status_version=1,
                created_at=datetime.now(UTC),
            )
        )
    dashboard = Dashboard(store, where=str(db), allowed_hosts={"testserver"}, token=None)
    with TestClient(create_app(dashboard), raise_server_exceptions=True) as made:
        yield made
    store.close()


def _query(pairs: list[tuple[str, str]]) -> str:
    return urllib.parse.urlencode(pairs, encoding="utf-8", errors="surrogatepass")


SETTINGS = settings(
    max_examples=300,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)


@SETTINGS
@given(pairs=st.lists(st.tuples(KEYS, TEXT), max_size=5))
def test_any_tasks_query_is_a_page_or_a_4xx(
    client: TestClient, pairs: list[tuple[str, str]]
) -> None:
    answer = client.get("/tasks?" + _query(pairs))
    assert answer.status_code < 500, (pairs, answer.text[-300:])


@SETTINGS
@given(
    task_id=st.text(min_size=1, max_size=40).filter(
        lambda t: "/" not in t and t not in (".", "..")
    ),
    where=st.sampled_from(["/tasks/{}", "/tasks/{}/live", "/tasks/{}/result", "/pipelines/{}"]),
)
def test_any_id_in_a_path_is_a_page_or_a_4xx(client: TestClient, task_id: str, where: str) -> None:
    path = where.format(urllib.parse.quote(task_id.encode("utf-8", "surrogatepass"), safe=""))
    answer = client.get(path, follow_redirects=False)
    assert answer.status_code < 500, (path, answer.text[-300:])


@SETTINGS
@given(
    fields=st.lists(
        st.tuples(st.sampled_from(["csrf", "task_id", "filter", "newest", "counted"]), TEXT),
        max_size=5,
    ),
    action=st.sampled_from(["pause", "resume", "stop", "cancel", "frobnicate"]),
    cookie=TEXT,
)
def test_any_posted_form_is_an_answer_or_a_4xx(
    client: TestClient, fields: list[tuple[str, str]], action: str, cookie: str
) -> None:
    client.cookies.clear()
    client.cookies.set("cm_csrf", urllib.parse.quote(cookie))
    for path in (f"/tasks/00{'d' * 30}/{action}", f"/tasks/matching/{action}"):
        answer = client.post(
            path,
            content=_query(fields),
            headers={"content-type": "application/x-www-form-urlencoded"},
        )
        assert answer.status_code < 500, (path, fields, answer.text[-300:])


@SETTINGS
@given(host=TEXT, origin=TEXT, token=TEXT)
def test_any_host_origin_or_token_header_is_an_answer_or_a_4xx(
    client: TestClient, host: str, origin: str, token: str
) -> None:
    raw = {  # as a hostile client sends them: bytes, UTF-8 or not
        "host": host.encode("utf-8", "surrogatepass"),
        "origin": origin.encode("utf-8", "surrogatepass"),
        "authorization": b"Bearer " + token.encode("utf-8", "surrogatepass"),
    }
    headers = {k: v for k, v in raw.items() if not any(c in v for c in b"\r\n\x00")}
    answer = client.post("/tasks/00dddd/pause", headers=headers, content="csrf=x")
    assert answer.status_code < 500, (headers, answer.text[-300:])
    answer = client.get("/?token=" + urllib.parse.quote(token.encode("utf-8", "surrogatepass")))
    assert answer.status_code < 500


def test_the_property_dashboard_is_the_real_one(client: TestClient, tmp_path: Path) -> None:
    """The client above reaches the application the CLI serves: its pages and guards."""
    page = client.get("/tasks")
    assert page.status_code == 200 and "00dddddddddd" in page.text
    assert page.headers["x-frame-options"] == "DENY"
    assert client.get("/", headers={"host": "elsewhere.example"}).status_code == 400
