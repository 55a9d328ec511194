"""The dashboard in a real headless browser (Debian's chromium driven by Playwright).

One scenario on a private Redis with a real worker and a real ``plaita dashboard`` process:
the overview updates itself; freezing Redis shows the outage banner and the worker in BACKOFF
(from its own health endpoint), thawing recovers without a reload; a click requeues a dead
letter and the DLQ count drops; a ``<script>`` payload (or flow id) renders as text and never runs;
a click cancels a suspended execution.

A second scenario runs real flows on a flow worker (``tests.dashboard.browser_flows``): the
overview leads with each flow's figures, the Workers tab draws the lifecycle, the list groups
children under their parent, and a child's timeline names the message it consumed. With
``PLAITA_SCREENSHOTS=docs/img`` its pages are saved there (dashboard.png, workers.png,
executions.png, execution.png: the pictures in the README and docs/operations.md).
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import redis

from plaita.flows.producer.client import FlowClient
from plaita.store.keyspace import DEFAULT
from tests.dashboard.conftest import TOKEN, dead_letter, plant
from tests.support.ops import QUEUE, clean_env, enqueue, ops_worker, task, wait_until
from tests.support.redis_server import RedisServer

pytestmark = [pytest.mark.redis, pytest.mark.chaos]

ROOT = Path(__file__).resolve().parents[2]
#: The committed screenshots are refreshed only on request (PLAITA_SCREENSHOTS=docs/img), so a
#: test run leaves the checkout clean; otherwise the pictures go to a temp directory, still taken.
SCREENSHOTS = ROOT / os.environ["PLAITA_SCREENSHOTS"] if os.environ.get("PLAITA_SCREENSHOTS") else None
CHROMIUM_ARGS = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
]
XSS = "<script>window.__pwned = 1; alert('xss')</script>"
#: Tasks run during the scenario (about 80 a second here), so the screenshot shows a chart.
BURST = 600
#: Milliseconds Playwright waits for a change the dashboard shows within a few refreshes.
SHOWS_MS = 15_000
#: Milliseconds for what needs a worker process started first (seconds on a loaded machine).
STARTS_MS = 60_000


def _chromium() -> str:
    for candidate in ("/usr/bin/chromium", shutil.which("chromium"), shutil.which("chromium-browser")):
        if candidate and Path(candidate).exists():
            return candidate
    pytest.skip("chromium is not installed (./scripts/bootstrap.sh installs it with apt-get); browser test skipped")


@pytest.fixture
def browser_page() -> Iterator[Any]:
    executable = _chromium()
    sync_api = pytest.importorskip("playwright.sync_api", reason="playwright is not installed (the dev extra)")
    with sync_api.sync_playwright() as pw:
        browser = pw.chromium.launch(executable_path=executable, args=CHROMIUM_ARGS)
        try:
            page = browser.new_page(viewport={"width": 1280, "height": 900})
            page.set_default_timeout(SHOWS_MS)
            yield page
        finally:
            browser.close()


@pytest.fixture
def dashboard_url(private_redis: RedisServer) -> Iterator[str]:
    """A ``plaita dashboard`` process with actions enabled, on a free port."""
    argv = [sys.executable, "-m", "plaita", "dashboard", "--redis-url", private_redis.url, "--queue-name", QUEUE]
    proc = subprocess.Popen(
        [*argv, "--port", "0", "--allow-actions", "--token", TOKEN],
        cwd=str(ROOT),
        env=clean_env(),
        stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    try:
        assert proc.stdout is not None
        first = proc.stdout.readline()
        assert "serving http://" in first, first
        yield first.split("serving ")[1].split()[0].rstrip("/")
        assert proc.poll() is None, "the dashboard never exits on a Redis fault"
    finally:
        proc.kill()
        proc.wait(5)
        if proc.stdout is not None:
            proc.stdout.close()


def _state_cell(page: Any, instance_id: str) -> Any:
    return page.locator(f'tr[data-instance="{instance_id}"] [data-role="state"]')


def test_overview_outage_recovery_requeue_and_escaping_in_a_real_browser(
    browser_page: Any, dashboard_url: str, private_redis: RedisServer, tmp_path: Path
) -> None:
    from playwright.sync_api import expect

    page = browser_page
    dialogs: list[str] = []
    page.on("dialog", lambda d: (dialogs.append(d.message), d.dismiss()))
    client = redis.Redis.from_url(private_redis.url, socket_timeout=5)
    with ops_worker(private_redis.url, tmp_path) as w:
        enqueue(client, XSS)  # not JSON: the worker dead-letters it with its raw text as payload
        for n in range(BURST):
            enqueue(client, task(n, sleep_s=0.01))
        wait_until(lambda: client.xlen(f"{QUEUE}:dlq") == 1, 10, "the script payload dead-lettered")
        fixed_id = dead_letter(client, reason="RuntimeError: billing was down", payload=task(9001))

        # Overview: the worker, on its state, updating without a reload.
        page.goto(dashboard_url + "/")
        expect(_state_cell(page, w.instance_id)).to_have_text("READING")
        expect(page.locator("#dlq-length")).to_have_text("2")
        wait_until(lambda: page.locator("svg.throughput polyline").count() > 0, 15, "a throughput line", 0.2)
        # The screenshot mid-burst: the queue draining, a few seconds of throughput drawn.
        wait_until(lambda: len(w.done_ids()) >= BURST * 2 // 3, 30, "two thirds of the burst done")
        page.wait_for_function("document.getElementById('live').dataset.updated > 0")
        page.screenshot(path=str(Path(tempfile.gettempdir()) / "plaita-dashboard-burst.png"), full_page=True)

        # Outage: banner and BACKOFF (the worker's own word), then recovery, all without a reload.
        private_redis.freeze()
        try:
            expect(page.locator("#outage")).to_contain_text("Redis unavailable since")
            expect(_state_cell(page, w.instance_id)).to_have_text("BACKOFF", timeout=25_000)
        finally:
            private_redis.thaw()
        expect(page.locator("#outage")).to_have_count(0)
        expect(_state_cell(page, w.instance_id)).to_have_text("READING")

        # DLQ: log in, the script shows as text, a click requeues one entry.
        page.goto(dashboard_url + "/login")
        page.fill("#token", TOKEN)
        page.click("#login")
        page.goto(dashboard_url + "/dlq")
        expect(page.locator("#dlq-count")).to_have_text("2")
        expect(page.locator("td.payload").filter(has_text="<script>")).to_have_count(1)
        page.locator(f'tr[data-dlq-id="{fixed_id}"] button[data-action="requeue"]').click()
        expect(page.locator("#notice")).to_contain_text("requeued 1 dead letter(s)")
        expect(page.locator("#dlq-count")).to_have_text("1")
        wait_until(lambda: any(n == "9001" for ev, _m, n, _d in w.executions() if ev == "done"), 10, "requeued ran")
        page.goto(dashboard_url + "/")
        expect(page.locator("#dlq-length")).to_have_text("1")

        # Executions: a hostile flow id shows as text; a click cancels the suspended execution.
        plant(client, "ex-b1", "suspended", time.time(), flow_id=XSS)
        page.goto(dashboard_url + "/executions?status=suspended")
        expect(page.locator('tr[data-execution="ex-b1"]')).to_contain_text("<script>")
        page.locator('tr[data-execution="ex-b1"] a').first.click()
        expect(page.locator("#execution-status")).to_have_text("suspended")
        page.click("#cancel")
        expect(page.locator("#notice")).to_contain_text("cancel requested for execution 'ex-b1'")
        assert client.exists(DEFAULT.cancel_key("ex-b1")) == 1

        assert dialogs == [], "no script from Redis data ran"
        assert page.evaluate("window.__pwned === undefined")
    client.close()


def _shot(page: Any, name: str, tmp_path: Path) -> None:
    page.screenshot(path=str((SCREENSHOTS or tmp_path) / name), full_page=True)


def _completed(page: Any, url: str) -> None:
    """Load ``url`` until its execution shows ``completed`` (the page is not live: reloads)."""

    def shows() -> bool:
        page.goto(url)
        return bool(page.locator("#execution-status").text_content() == "completed")

    wait_until(shows, 30, f"{url} completed", 0.5)


def _figure(page: Any, flow_id: str, figure: str) -> Any:
    return page.locator(f'#flow-figures tr[data-flow="{flow_id}"] td[data-figure="{figure}"]')


@pytest.mark.timeout(240)  # a flow worker process, 23 executions and a browser on a loaded machine
def test_the_flow_overview_workers_tab_children_and_timeline_in_a_real_browser(
    browser_page: Any, dashboard_url: str, private_redis: RedisServer, tmp_path: Path
) -> None:
    from playwright.sync_api import expect

    page = browser_page
    flags = ("--flows", "tests.dashboard.browser_flows", "--concurrency", "8")
    with (
        ops_worker(private_redis.url, tmp_path, *flags, name="fw") as w,
        FlowClient.from_url(private_redis.url, queue_name=QUEUE) as flows,
    ):
        for n in range(12):
            flows.start("checkout", {"hold_s": 0.05 * (n % 4 + 1)})
        for _ in range(2):
            flows.start("checkout", {"declined": True})
        approvals = [flows.start("approval", {}) for _ in range(2)]
        flows.start("reminder", {})
        parent = flows.start("fanout", {"n": 3})
        for _ in range(3):
            flows.start("export", {"hold_s": 20})

        # The overview leads with the flows: what each does now and did in the last minute.
        page.goto(dashboard_url + "/")
        expect(_figure(page, "checkout", "completed")).to_have_text("12", timeout=STARTS_MS)  # a worker starts first
        expect(_figure(page, "checkout", "failed")).to_have_text("2", timeout=SHOWS_MS)
        expect(_figure(page, "approval", "waiting-resume")).to_have_text("2", timeout=SHOWS_MS)
        expect(_figure(page, "reminder", "waiting-sleep")).to_have_text("1", timeout=SHOWS_MS)
        expect(_figure(page, "fanout", "waiting-children")).to_have_text("1", timeout=SHOWS_MS)
        expect(_figure(page, "leaf", "waiting-resume")).to_have_text("3", timeout=SHOWS_MS)
        expect(_figure(page, "export", "running")).to_have_text("1", timeout=SHOWS_MS)
        expect(_figure(page, "export", "waiting-slot")).to_have_text("2", timeout=SHOWS_MS)
        expect(_figure(page, "checkout", "p95")).to_contain_text(" ms", timeout=SHOWS_MS)
        expect(_state_cell(page, w.instance_id)).to_have_text("READING", timeout=SHOWS_MS)
        assert page.locator("svg.lifecycle").count() == 0, "the lifecycle diagram is on the Workers tab"
        _shot(page, "dashboard.png", tmp_path)

        # The Workers tab: the worker on the lifecycle diagram.
        page.click('header nav a[href="/workers"]')
        expect(page.locator('g[data-state="READING"]')).to_have_attribute("data-count", "1", timeout=SHOWS_MS)
        _shot(page, "workers.png", tmp_path)

        # The list: the three children under their parent, not rows of their own.
        page.goto(dashboard_url + "/executions")
        group = page.locator(f'tr[data-children-of="{parent}"]')
        expect(group).to_contain_text("3 child execution(s)", timeout=SHOWS_MS)
        expect(page.locator(f'tr[data-execution^="{parent}"]')).to_have_count(1, timeout=SHOWS_MS)
        group.locator("summary").click()
        child = group.locator("a[data-child]").first.get_attribute("data-child")
        assert child and child.startswith(parent)
        _shot(page, "executions.png", tmp_path)

        # A message to a child and a resume of an approval: each step's run names what it consumed.
        flows.send(child, "go", {"ok": True}, idempotency_key="k1")
        flows.resume(approvals[0], "event", {"by": "ann"}, resume_id="approve-ann", wait_for="approve")
        _completed(page, dashboard_url + "/executions/" + approvals[0])
        expect(page.locator('#timeline [data-consumed="approve-ann"]')).to_contain_text("for approve", timeout=SHOWS_MS)
        _shot(page, "execution.png", tmp_path)
        _completed(page, dashboard_url + "/executions/" + child)
        expect(page.locator('#timeline [data-consumed="msg:go:k1"]')).to_contain_text("for go", timeout=SHOWS_MS)
