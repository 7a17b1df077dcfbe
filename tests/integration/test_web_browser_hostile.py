"""The dashboard against hostile pages, in a real headless Chromium: a page under
another name that resolves to 127.0.0.1 (DNS rebinding), a page on another port of the
same host that frames a task's page or posts a control with a cookie it planted, and
the tasks page's own filter form, submitted as a person submits it."""

from __future__ import annotations

import http.server
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest

from chongming_task import SqliteTaskStore, TaskStatus
from tests.conftest import stored_status, wait_until
from tests.integration.test_cross_process import Node
from tests.integration.test_web import Web
from tests.integration.test_web_browser import _browser

EVIL = "rebind.attacker.example"


class _Page(http.server.BaseHTTPRequestHandler):
    """Serves the attacker's one page, whatever is asked."""

    body = b""

    def do_GET(self) -> None:
        self.send_response(200)
        self.send_header("Content-Type", "text/html")
        self.end_headers()
        self.wfile.write(self.body)

    def log_message(self, *args: object) -> None:
        return None


def serve(page: str) -> tuple[http.server.HTTPServer, int]:
    """The page on a port of its own. Threaded: a browser opens connections ahead of
    need, and a one-at-a-time server would wait on such an idle one forever."""
    handler = type("Handler", (_Page,), {"body": page.encode()})
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    server.daemon_threads = True
    threading.Thread(target=server.serve_forever, name="attacker-page", daemon=True).start()
    return server, int(server.server_address[1])


@pytest.fixture
def browser() -> Iterator[object]:
    driver = _browser(f"--host-resolver-rules=MAP {EVIL} 127.0.0.1")
    try:
        yield driver
    finally:
        driver.quit()  # type: ignore[attr-defined]


@pytest.fixture
def running(tmp_path: Path) -> Iterator[tuple[Path, str, Web]]:
    db = tmp_path / "hostile.db"
    SqliteTaskStore(db).close()
    node = Node(db, "--submit", "loop")
    web = Web(db)
    (task_id,) = node.task_ids
    try:
        wait_until(lambda: stored_status(db, task_id) is TaskStatus.RUNNING, what="running")
        yield db, task_id, web
    finally:
        web.close()
        node.finish()


def test_a_page_under_another_name_gets_nothing(
    running: tuple[Path, str, Web], browser: object
) -> None:
    from selenium.webdriver.remote.webdriver import WebDriver

    db, task_id, web = running
    driver = browser
    assert isinstance(driver, WebDriver)
    driver.get(f"http://{EVIL}:{web.port}/tasks/{task_id}")
    wait_until(lambda: "does not answer to the host" in driver.page_source, 15, "the refusal")
    assert "Timeline" not in driver.page_source
    # The page's own script, same-origin under the rebound name, is refused too.
    said = driver.execute_async_script(
        "const done = arguments[0];"
        f"fetch('/tasks/{task_id}/cancel', {{method: 'POST', body: 'csrf=x'}})"
        ".then(r => done(r.status), e => done(String(e)));"
    )
    assert said == 400
    assert stored_status(db, task_id) is TaskStatus.RUNNING


def test_another_page_can_neither_frame_a_task_nor_post_a_control(
    running: tuple[Path, str, Web], browser: object
) -> None:
    from selenium.webdriver.common.by import By
    from selenium.webdriver.remote.webdriver import WebDriver

    db, task_id, web = running
    driver = browser
    assert isinstance(driver, WebDriver)
    target = f"http://127.0.0.1:{web.port}"
    framing, port = serve(
        f'<iframe id="victim" src="{target}/tasks/{task_id}" width="900" height="600"></iframe>'
    )
    try:
        driver.get(f"http://127.0.0.1:{port}/")
        frame = driver.find_element(By.ID, "victim")
        driver.switch_to.frame(frame)
        wait_until(lambda: driver.page_source != "", 10, "the frame")
        assert "Timeline" not in driver.page_source  # the browser refused to draw it
        assert not driver.find_elements(By.XPATH, "//button[normalize-space()='pause']")
        driver.switch_to.default_content()
    finally:
        framing.shutdown()
        framing.server_close()
    # Same host, another port: the same site, so the page can plant the CSRF cookie
    # (cookies ignore ports) and post a matching form. The origin gives it away.
    posting, port = serve(
        "<script>document.cookie = 'cm_csrf=planted; path=/';</script>"
        f'<form id="f" method="post" action="{target}/tasks/{task_id}/cancel">'
        '<input name="csrf" value="planted"></form>'
        "<script>document.getElementById('f').submit();</script>"
    )
    try:
        driver.get(f"http://127.0.0.1:{port}/")
        wait_until(lambda: "own pages" in driver.page_source, 15, "the refusal")
    finally:
        posting.shutdown()
        posting.server_close()
    assert stored_status(db, task_id) is TaskStatus.RUNNING


def test_the_filter_form_works_as_a_person_submits_it(
    running: tuple[Path, str, Web], browser: object
) -> None:
    from selenium.webdriver.common.by import By
    from selenium.webdriver.remote.webdriver import WebDriver

    _db, task_id, web = running
    driver = browser
    assert isinstance(driver, WebDriver)
    driver.get(f"{web.base}/tasks")
    wait_until(lambda: task_id[:12] in driver.page_source, 15, "the list")
    driver.find_element(By.NAME, "name").send_keys("loop")
    driver.find_element(By.XPATH, "//button[normalize-space()='filter']").click()
    wait_until(lambda: "name=loop" in driver.current_url, 15, "the filtered page")
    assert "status=" in driver.current_url  # the form sent its default status, empty
    wait_until(lambda: task_id[:12] in driver.page_source, 15, "the task listed")
    assert "unknown status" not in driver.page_source
    driver.find_element(By.NAME, "name").clear()
    driver.find_element(By.NAME, "name").send_keys("nothing-by-this-name")
    driver.find_element(By.XPATH, "//button[normalize-space()='filter']").click()
    wait_until(lambda: "no task matches" in driver.page_source, 15, "the empty list")
