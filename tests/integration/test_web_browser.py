"""The dashboard in a real headless Chromium (Debian's ``chromium`` and ``chromedriver``,
driven by Selenium; nothing is downloaded): every page renders, a pause clicked on a
task's page pauses the task in another process and the open page shows it without a
reload. A screenshot of each page is saved in the test's own directory, or where
``CHONGMING_SCREENSHOTS`` says, for a person to look at."""

from __future__ import annotations

import os
import shutil
from collections.abc import Iterator
from pathlib import Path

import pytest

from chongming_task import CancellationToken, Controller, Pipeline, SqliteTaskStore, TaskStatus
from tests.conftest import stored_status, wait_until
from tests.integration.test_cross_process import Node
from tests.integration.test_web import Web

CHROMIUM, DRIVER = shutil.which("chromium"), shutil.which("chromedriver")


def _browser(*flags: str) -> object:
    if not (CHROMIUM and DRIVER):
        reason = "headless tests need Debian's chromium and chromium-driver (apt-get install)"
        if os.environ.get("CI"):
            pytest.fail(reason)
        pytest.skip(reason)
    pytest.importorskip("selenium", reason="selenium is not installed (dev group)")
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service

    os.environ["SE_OFFLINE"] = "true"  # Selenium Manager must never fetch a browser
    options = webdriver.ChromeOptions()
    options.binary_location = CHROMIUM
    for flag in ("--headless=new", "--no-sandbox", "--disable-dev-shm-usage"):
        options.add_argument(flag)
    options.add_argument("--window-size=1280,1000")
    for flag in flags:
        options.add_argument(flag)
    return webdriver.Chrome(service=Service(executable_path=DRIVER), options=options)


@pytest.fixture
def browser() -> Iterator[object]:
    driver = _browser()
    try:
        yield driver
    finally:
        driver.quit()  # type: ignore[attr-defined]


def _step(token: CancellationToken) -> str:
    return "done"


def test_the_pages_render_and_a_clicked_pause_reaches_another_process(
    tmp_path: Path, browser: object
) -> None:
    from selenium.common.exceptions import NoSuchElementException, StaleElementReferenceException
    from selenium.webdriver.common.by import By
    from selenium.webdriver.remote.webdriver import WebDriver

    driver = browser
    assert isinstance(driver, WebDriver)
    db = tmp_path / "browser.db"
    SqliteTaskStore(db).close()
    node = Node(db, "--submit", "loop", "--submit", "loop")
    web = Web(db)
    shots = Path(os.environ.get("CHONGMING_SCREENSHOTS") or tmp_path / "screenshots")
    shots.mkdir(parents=True, exist_ok=True)
    try:
        first = node.task_ids[0]
        wait_until(lambda: stored_status(db, first) is TaskStatus.RUNNING, what="running")

        def text(by: str, what: str) -> str:
            """An element's text; the live part is re-rendered every second, so an
            element found a moment ago may be gone: look again."""
            for _ in range(20):
                try:
                    return str(driver.find_element(by, what).text)
                except (StaleElementReferenceException, NoSuchElementException):
                    continue
            raise AssertionError(f"{what} kept changing under the test")

        def click(by: str, what: str) -> None:
            for _ in range(20):
                try:
                    driver.find_element(by, what).click()
                    return
                except StaleElementReferenceException:
                    continue
            raise AssertionError(f"{what} kept changing under the test")

        def visit(path: str, needle: str, shot: str) -> None:
            driver.get(web.base + path)
            wait_until(lambda: needle in driver.page_source, 15, f"{needle!r} on {path}")
            driver.save_screenshot(str(shots / f"{shot}.png"))

        visit("/", "Buckets", "overview")
        cells = driver.find_elements(By.CSS_SELECTOR, ".buckets .cell")
        assert len(cells) == 64
        visit("/tasks", first[:12], "tasks")
        with Controller(SqliteTaskStore(db), owner="node-p") as submitter:
            etl = Pipeline("etl")
            etl.add("extract", _step)
            etl.add("transform", _step, depends_on=["extract"])
            etl.add("load", _step, depends_on=["transform"])
            pipeline = submitter.submit_pipeline(etl)
            pipeline.wait(20)
        visit("/pipelines", "etl", "pipelines")
        visit(f"/pipelines/{pipeline.pipeline_run_id}", 'data-key="load"', "pipeline")
        boxes = driver.find_elements(By.CSS_SELECTOR, "svg.graph rect.node")
        assert len(boxes) == 3
        visit("/schedules", "Schedules", "schedules")
        visit("/nodes", "live", "nodes")
        visit(f"/tasks/{first}", "Timeline", "task")
        assert text(By.CSS_SELECTOR, ".status").startswith("running")

        click(By.XPATH, "//button[normalize-space()='pause']")
        wait_until(
            lambda: "request accepted" in text(By.ID, "answer"),
            15,
            "the answer under the buttons",
        )
        wait_until(lambda: stored_status(db, first) is TaskStatus.PAUSED, 15, "paused by its node")
        # The open page follows without a reload: its live part re-renders.
        # Pushed: the event stream says "change" and the live part is fetched again. Its
        # fallback poll is every 5 s, so a page showing it within 3 s got the push.
        wait_until(
            lambda: text(By.CSS_SELECTOR, ".status").startswith("paused"),
            3,
            "the page to show paused",
        )
        assert "running → pausing" in text(By.CSS_SELECTOR, ".timeline")
        driver.save_screenshot(str(shots / "task-paused.png"))
        assert stored_status(db, node.task_ids[1]) is TaskStatus.RUNNING  # only the one clicked
    finally:
        web.close()
        node.finish()
    pages = ("overview", "tasks", "pipelines", "pipeline", "schedules", "nodes", "task")
    for name in (*pages, "task-paused"):
        assert (shots / f"{name}.png").stat().st_size > 5_000
