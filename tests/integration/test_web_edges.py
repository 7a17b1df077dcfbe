"""The dashboard's rough edges, against a real server process: stop and cancel ask
first (in Chromium), a bad bucket is one clear line, read-only pages draw no
checkboxes, ``/healthz`` tells a caller without the token only whether the store is
healthy, and the pages have an icon."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from chongming_task import SqliteTaskStore, TaskStatus
from tests.conftest import stored_status, wait_until
from tests.integration.test_cross_process import Node
from tests.integration.test_web import Web
from tests.integration.test_web_browser import browser as browser


def asked(driver: object, xpath: str) -> Any:
    """Click the button at ``xpath`` and return the confirmation it raises. The page's
    live part is swapped in as tasks move; a click that lands on a part just replaced
    raises nothing, so the button is found and clicked again (a click that did nothing
    sent nothing) until its question shows, 10 s at most."""
    from selenium.common.exceptions import (
        StaleElementReferenceException,
        TimeoutException,
        UnexpectedAlertPresentException,
    )
    from selenium.webdriver.common.by import By
    from selenium.webdriver.remote.webdriver import WebDriver
    from selenium.webdriver.support.ui import WebDriverWait

    assert isinstance(driver, WebDriver)
    for _ in range(5):
        try:
            driver.find_element(By.XPATH, xpath).click()
        except StaleElementReferenceException:
            continue
        except UnexpectedAlertPresentException:
            return driver.switch_to.alert  # the click before raised it late
        try:
            return WebDriverWait(driver, 2).until(lambda d: d.switch_to.alert)
        except TimeoutException:
            continue
    raise AssertionError(f"no confirmation after clicking {xpath}")


def test_stop_and_cancel_ask_first_and_a_no_sends_nothing(tmp_path: Path, browser: object) -> None:
    from selenium.webdriver.common.by import By
    from selenium.webdriver.remote.webdriver import WebDriver

    driver = browser
    assert isinstance(driver, WebDriver)
    db = tmp_path / "confirm.db"
    SqliteTaskStore(db).close()
    node = Node(db, "--submit", "loop", "--submit", "loop")
    web = Web(db)
    first, second = node.task_ids
    try:
        wait_until(lambda: stored_status(db, second) is TaskStatus.RUNNING, what="running")
        driver.get(f"{web.base}/tasks")
        wait_until(lambda: first[:12] in driver.page_source, 15, "the list")
        driver.find_element(By.CSS_SELECTOR, f"input[value='{first}']").click()
        for accept in (False, True):
            alert = asked(driver, "//button[normalize-space()='stop']")
            assert alert.text == "stop the 1 selected task(s)? It cannot be undone."
            if not accept:
                alert.dismiss()
                assert stored_status(db, first) is TaskStatus.RUNNING  # nothing was sent
            else:
                alert.accept()
        wait_until(lambda: stored_status(db, first) is TaskStatus.STOPPED, 15, "stopped")

        driver.get(f"{web.base}/tasks/{second}")
        wait_until(lambda: "Timeline" in driver.page_source, 15, "the task page")
        alert = asked(driver, "//button[normalize-space()='cancel']")
        assert alert.text.startswith(f"cancel task {second[:12]} (loop)?"), alert.text
        alert.dismiss()
        assert stored_status(db, second) is TaskStatus.RUNNING
    finally:
        web.close()
        node.finish()


def test_bad_bucket_read_only_health_and_icon(tmp_path: Path) -> None:
    db = tmp_path / "edges.db"
    SqliteTaskStore(db).close()
    node = Node(db, "--submit", "loop")
    read_only = Web(db, "--read-only")
    guarded = Web(db, token="s3cret")
    try:
        first = node.task_ids[0]
        wait_until(lambda: stored_status(db, first) is TaskStatus.RUNNING, what="running")
        status, page = read_only.get("/tasks?bucket=abc")
        assert status == 400 and "bucket must be a whole number from 0 to 63" in page
        assert "invalid literal" not in page
        status, page = read_only.get("/tasks")
        assert status == 200 and node.task_ids[0][:12] in page
        assert 'type="checkbox"' not in page  # read-only: nothing to select
        assert 'rel="icon"' in page
        status, icon = read_only.get("/static/favicon.svg")
        assert status == 200 and icon.startswith("<svg")
        status, _ = read_only.get("/favicon.ico")  # redirected to the icon
        assert status == 200

        status, body = read_only.get("/healthz")  # no token set: every page is open
        assert status == 200 and json.loads(body)["store"].endswith("edges.db")
        status, body = guarded.get("/healthz")
        assert status == 200 and json.loads(body) == {"ok": True}  # no token: only that
        status, body = guarded.get("/healthz", Authorization="Bearer s3cret")
        told = json.loads(body)
        assert told["ok"] is True and told["store"].endswith("edges.db") and "tasks" in told
    finally:
        read_only.close()
        guarded.close()
        node.finish()


def test_all_tasks_matching_a_filter_are_controlled_after_a_question_naming_them(
    tmp_path: Path, browser: object
) -> None:
    from selenium.webdriver.remote.webdriver import WebDriver

    driver = browser
    assert isinstance(driver, WebDriver)
    db = tmp_path / "matching.db"
    SqliteTaskStore(db).close()
    node = Node(db, *("--submit", "loop") * 3, "--submit", "aloop")
    web = Web(db)
    loops, aloop = node.task_ids[:3], node.task_ids[3]
    try:
        for task_id in node.task_ids:
            wait_until(lambda t=task_id: stored_status(db, t) is TaskStatus.RUNNING, what="running")
        driver.get(f"{web.base}/tasks?name=loop")
        wait_until(lambda: "All 3 task(s) matching this filter" in driver.page_source, 15, "N")
        pause = "//form[@class='matching']//button[normalize-space()='pause']"
        for accept in (False, True):
            alert = asked(driver, pause)
            assert alert.text.startswith("pause all 3 task(s) matching this filter?")
            if not accept:
                alert.dismiss()
                assert [stored_status(db, t) for t in loops] == [TaskStatus.RUNNING] * 3
            else:
                alert.accept()
        wait_until(lambda: driver.page_source.count("request accepted") == 3, 15, "answers")
        for task_id in loops:
            wait_until(lambda t=task_id: stored_status(db, t) is TaskStatus.PAUSED, 15, "paused")
        assert stored_status(db, aloop) is TaskStatus.RUNNING  # outside the filter
    finally:
        web.close()
        node.finish()


def test_the_tasks_list_follows_a_pause_sent_from_the_cli(tmp_path: Path, browser: object) -> None:
    import subprocess
    import sys

    from selenium.webdriver.common.by import By
    from selenium.webdriver.remote.webdriver import WebDriver

    driver = browser
    assert isinstance(driver, WebDriver)
    db = tmp_path / "follow.db"
    SqliteTaskStore(db).close()
    node = Node(db, "--submit", "loop")
    web = Web(db)
    (task_id,) = node.task_ids
    try:
        wait_until(lambda: stored_status(db, task_id) is TaskStatus.RUNNING, what="running")
        driver.get(f"{web.base}/tasks")
        row = f"//tr[.//code[text()='{task_id[:12]}']]/td[4]"

        def shown() -> str:
            try:
                return str(driver.find_element(By.XPATH, row).text)
            except Exception:  # re-rendered under the test: look again
                return ""

        wait_until(lambda: shown().startswith("running"), 15, "the list")
        paused = subprocess.run(
            [sys.executable, "-m", "chongming_task", "--db", str(db), "pause", task_id],
            capture_output=True,
            text=True,
            timeout=60,
        )
        assert paused.returncode == 0, paused.stderr
        wait_until(lambda: stored_status(db, task_id) is TaskStatus.PAUSED, 15, "paused")
        # No reload: the list's live part is fetched again on the pushed change (its
        # fallback poll is every 5 s; within 3 s it was the push).
        wait_until(lambda: shown().startswith("paused"), 3, "the list to show paused")
        for page in ("/schedules", "/nodes", "/pipelines"):
            driver.get(web.base + page)
            assert driver.find_elements(By.CSS_SELECTOR, "#live[hx-trigger]"), page
    finally:
        web.close()
        node.finish()
