"""The dashboard in a real browser: headless Chromium (Debian's chromium + chromium-driver)
driven by Selenium logs in with an API key, watches a batch that real `radixq worker` processes
run advance on the page, and requeues a dead-lettered job with its button; the job then runs.
A form post without the CSRF token is refused. With RADIXQ_DASHBOARD_SCREENSHOT=PATH the page
is saved there while the batch runs (docs/dashboard.png was made so)."""

from __future__ import annotations

import os
import shutil
import signal
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import TypeVar

import httpx
import msgspec
import pytest

from producer.client import Client
from tests.integration.procs import start_worker
from tests.integration.serve_procs import (
    API_KEY,
    CHAT,
    chat_body,
    least_privilege,
    request_line,
    start_service,
    stop,
)
from tests.waiting import wait_until
from wire.keys import QueueKeys
from wire.schema import Job
from wire.status import Heartbeat, now_ms

pytestmark = pytest.mark.integration
CHROMIUM, DRIVER = "/usr/bin/chromium", "/usr/bin/chromedriver"
KEYS = QueueKeys()
T = TypeVar("T")


@pytest.fixture
def browser() -> Iterator[object]:
    if not (shutil.which(CHROMIUM) and shutil.which(DRIVER)):
        message = "chromium and chromium-driver are not installed (apt-get install chromium chromium-driver)"
        if os.environ.get("CI"):
            pytest.fail(message)
        pytest.skip(message)
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service as ChromeService

    options = webdriver.ChromeOptions()
    options.binary_location = CHROMIUM
    for argument in ("--headless=new", "--no-sandbox", "--disable-dev-shm-usage", "--window-size=1280,1100"):
        options.add_argument(argument)
    driver = webdriver.Chrome(service=ChromeService(DRIVER), options=options)
    try:
        yield driver
    finally:
        driver.quit()


def dead_letter_one(redis_url: str, tmp_path: Path) -> None:
    """Job ``poison`` dead-lettered for real: read by a consumer that then died (its heartbeat
    stale), reclaimed by a worker allowing one attempt, which dead-letters it."""
    client = Client.from_url(redis_url, partitions=0)
    client.enqueue([Job(id="poison", prompt="p")])
    client.redis.xreadgroup(KEYS.group, "ghost", {KEYS.jobs: ">"}, count=1)
    beat = Heartbeat(name="ghost", pid=1, last_seen_ms=now_ms() - 10_000, interval_s=0.1)
    client.redis.hset(KEYS.workers, "ghost", msgspec.msgpack.encode(beat))
    reaper = start_worker(
        redis_url, "reaper", tmp_path / "reaper.log", "--min-idle-s", "0.2", "--max-attempts", "1"
    )
    wait_until(
        lambda: client.redis.xlen(KEYS.dead) == 1, "poison to be dead-lettered", tmp_path / "reaper.log"
    )
    reaper.send_signal(signal.SIGTERM)
    reaper.wait()
    client.redis.hdel(KEYS.workers, "ghost", "reaper")
    client.redis.xgroup_delconsumer(KEYS.jobs, KEYS.group, "ghost")
    client.redis.xgroup_delconsumer(KEYS.jobs, KEYS.group, "reaper")
    client.close()


def test_the_dashboard_in_chromium(redis_url: str, tmp_path: Path, browser: object) -> None:
    from selenium.webdriver.common.by import By

    driver = browser  # a selenium WebDriver
    dead_letter_one(redis_url, tmp_path)
    service = start_service(
        least_privilege(redis_url), tmp_path / "data", tmp_path / "serve.log", "--sample-s", "1"
    )
    client = service.client()
    start_worker(
        redis_url, "gpu-0", tmp_path / "w.log", RADIXQ_FAKE_LATENCY_S="0.1", RADIXQ_FAKE_CAPACITY="2"
    )
    try:
        driver.get(service.url + "/?refresh_ms=300")  # type: ignore[attr-defined]
        assert driver.current_url.endswith("/login")  # type: ignore[attr-defined]
        driver.find_element(By.NAME, "api_key").send_keys(API_KEY)  # type: ignore[attr-defined]
        driver.find_element(By.CSS_SELECTOR, "form button").click()  # type: ignore[attr-defined]
        wait_until(
            lambda: driver.find_elements(By.ID, "dead-" + dead_entry(redis_url)),
            "the dead letter on the page",
        )  # type: ignore[attr-defined]
        driver.get(service.url + "/?refresh_ms=300")  # type: ignore[attr-defined]

        source = tmp_path / "batch.jsonl"
        source.write_text("".join(request_line(f"r{i}", chat_body(f"r{i}")) + "\n" for i in range(160)))
        uploaded = client.files.create(file=source.open("rb"), purpose="batch")
        batch = client.batches.create(input_file_id=uploaded.id, endpoint=CHAT, completion_window="24h")

        def completed() -> int:
            cells = driver.find_elements(By.CSS_SELECTOR, f"#batch-{batch.id} .completed")  # type: ignore[attr-defined]
            return settled(lambda: int(cells[0].text), -1) if cells else -1

        wait_until(lambda: completed() > 0, "the page to show the batch's first rows", service.log)
        first = completed()
        wait_until(lambda: completed() > first, "the page to show the batch advance", service.log)
        # the throughput plot: a line once three samples (a second apart) are in
        wait_until(lambda: driver.find_elements(By.CSS_SELECTOR, "#queue polyline"), "the throughput plot")  # type: ignore[attr-defined]
        shot = os.environ.get("RADIXQ_DASHBOARD_SCREENSHOT")
        if shot:  # a picture for the docs: rates in the heartbeats, a plot with a few points
            wait_until(lambda: completed() >= 80, "the batch half done", service.log)
        driver.save_screenshot(shot or str(tmp_path / "dashboard.png"))  # type: ignore[attr-defined]
        wait_until(lambda: "gpu-0" in settled(lambda: driver.find_element(By.ID, "workers").text, ""),  # type: ignore[attr-defined]
                   "the worker on the page")  # fmt: skip

        # a form post without the page's CSRF token is refused
        cookie = driver.get_cookie("radixq_session")["value"]  # type: ignore[attr-defined]
        forged = httpx.post(f"{service.url}/dashboard/dead/{dead_entry(redis_url)}/discard",
                            cookies={"radixq_session": cookie}, data={"csrf": "forged"})  # fmt: skip
        assert forged.status_code == 403

        wait_until(
            lambda: settled(
                lambda: driver.find_element(By.CSS_SELECTOR, "#dead button.requeue").click() or True, False
            ),  # type: ignore[attr-defined]
            "a click on the dead letter's Requeue button",
        )
        wait_until(
            lambda: "None." in settled(lambda: driver.find_element(By.ID, "dead").text, ""),  # type: ignore[attr-defined]
            "the dead letter to leave the page",
        )
        queue = Client.from_url(redis_url)
        # requeued through the button: the worker runs it, and its result is no error
        wait_until(
            lambda: queue.redis.hget(KEYS.done, "poison") is not None,
            "poison to run again",
            tmp_path / "w.log",
        )
        assert queue.redis.hget(KEYS.failed, "poison") is None and queue.redis.xlen(KEYS.dead) == 0
        wait_until(lambda: client.batches.retrieve(batch.id).status == "completed", "the batch to complete")
    finally:
        stop(service.proc)


def settled(read: Callable[[], T], otherwise: T) -> T:
    """``read()`` of the page, or ``otherwise`` when the live part was replaced under it (the
    page refreshes it every few hundred ms: an element found a moment ago may be gone) or the
    page is loading (after a form's redirect)."""
    from selenium.common.exceptions import NoSuchElementException, StaleElementReferenceException

    try:
        return read()
    except (StaleElementReferenceException, NoSuchElementException):
        return otherwise


def dead_entry(redis_url: str) -> str:
    entries = Client.from_url(redis_url).dead_letters()
    return entries[0].entry_id if entries else "none"
