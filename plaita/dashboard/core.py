"""What every dashboard route shares: configuration, Redis clients, notices and templates.

Three clients, each with its own bounded socket timeout: the sampler's (short, so an outage is
noticed within about a second), the pages' (DLQ reads) and the actions' (long enough for a
control command's reply wait). None retries: a failure is shown, and the next request tries again.
"""

from __future__ import annotations

import contextlib
import secrets
import time
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import jinja2
from starlette.requests import Request
from starlette.responses import Response
from starlette.templating import Jinja2Templates

from plaita.config import DEFAULT_CONSUMER_GROUP, DEFAULT_QUEUE_NAME, Settings, redact_url
from plaita.dashboard.actions import REPLY_TIMEOUT_S
from plaita.dashboard.flow_figures import READ_PER_STATUS
from plaita.dashboard.monitor import SAMPLE_EVERY_S, FleetMonitor
from plaita.dashboard.security import Guard
from plaita.dashboard.svg import lifecycle_svg, throughput_svg
from plaita.flows.producer.client import FlowClient
from plaita.store.client import Client, make_client
from plaita.store.fleet_access import FleetAccess
from plaita.store.queue_access import executions_of
from plaita.store.streams.dlq import DeadLetterQueue
from plaita.store.streams.partitioned import open_queue
from plaita.store.streams.queue import StreamQueue

HERE = Path(__file__).resolve().parent
#: Socket timeout of the sampler's client: an outage shows within about this long.
SAMPLER_TIMEOUT_S = 1.0
#: Socket timeout of the client behind the DLQ pages.
PAGE_TIMEOUT_S = 2.0
#: Milliseconds between the overview's refreshes in the browser.
REFRESH_MS = 1000
#: Notices (the outcome of an action, shown after its redirect) kept at once.
MAX_NOTICES = 200
#: The tabs, in order: (name, path, title).
TABS = [
    ("overview", "/", "Overview"),
    ("workers", "/workers", "Workers"),
    ("dlq", "/dlq", "DLQ"),
    ("executions", "/executions", "Executions"),
    ("schedules", "/schedules", "Schedules"),
]
#: Host headers accepted when bound to loopback (a DNS-rebinding page sends its own name).
LOOPBACK_HOSTS = ("127.0.0.1", "localhost", "::1", "[::1]")


@dataclass(frozen=True)
class DashboardConfig:
    """What ``plaita dashboard`` was started with."""

    redis_url: str
    queue_name: str = DEFAULT_QUEUE_NAME
    consumer_group: str = DEFAULT_CONSUMER_GROUP
    dlq_key: str = ""
    partitions: int = 1
    allow_actions: bool = False
    token: str | None = None
    allowed_hosts: tuple[str, ...] = LOOPBACK_HOSTS
    sample_every_s: float = SAMPLE_EVERY_S
    refresh_ms: int = REFRESH_MS

    def settings(self) -> Settings:
        """Validated queue settings (ConfigError on a bad URL or empty name)."""
        return Settings(
            redis_url=self.redis_url,
            queue_name=self.queue_name,
            consumer_group=self.consumer_group,
            consumer_name="plaita-dashboard",
            dlq_key=self.dlq_key,
            partitions=self.partitions,
        )


class Notices:
    """Outcomes of actions, kept under a random id so the redirect's URL carries no text."""

    def __init__(self) -> None:
        self._items: OrderedDict[str, dict[str, Any]] = OrderedDict()

    def add(self, kind: str, message: str, replies: list[dict[str, Any]] | None = None) -> str:
        notice_id = secrets.token_urlsafe(9)
        self._items[notice_id] = {"kind": kind, "message": message, "replies": replies or []}
        while len(self._items) > MAX_NOTICES:
            self._items.popitem(last=False)
        return notice_id

    def get(self, notice_id: str | None) -> dict[str, Any] | None:
        return self._items.get(notice_id or "")


def scrubber(url: str) -> Callable[[str], str]:
    """A function removing the URL's password from any text (error messages may quote it)."""
    password = urlsplit(url).password

    def scrub(text: str) -> str:
        return text.replace(password, "***") if password else text

    return scrub


def _age(seconds: Any) -> str:
    try:
        s = float(seconds)
    except (TypeError, ValueError):  # whatever an entry held: a page never fails on it
        return "-"
    if s != s:  # NaN
        return "-"
    if s < 120:
        return f"{s:.0f}s"
    if s < 7200:
        return f"{s / 60:.0f}m"
    return f"{s / 3600:.1f}h"


def _clock(epoch_s: Any) -> str:
    try:
        return time.strftime("%H:%M:%S UTC", time.gmtime(float(epoch_s)))
    except (TypeError, ValueError, OverflowError, OSError):  # None, junk, NaN, out of range
        return "-"


def _stamp(epoch_s: Any) -> str:
    """A full UTC time (a sleep or a tick may be days away, where ``clock`` shows only the hour)."""
    try:
        return time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime(float(epoch_s)))
    except (TypeError, ValueError, OverflowError, OSError):
        return "-"


def _took(seconds: Any) -> str:
    """A duration from milliseconds to hours (a p50 may be 40 ms or 3 days)."""
    try:
        s = float(seconds)
    except (TypeError, ValueError):
        return "-"
    if s != s or s < 0:
        return "-"
    if s < 1:
        return f"{s * 1000:.0f} ms"
    return f"{s:.1f} s" if s < 120 else _age(s)


def _templates() -> Jinja2Templates:
    env = jinja2.Environment(
        loader=jinja2.FileSystemLoader(HERE / "templates"),
        autoescape=True,  # every payload, reason and error from Redis is untrusted text
    )
    env.filters.update(age=_age, clock=_clock, stamp=_stamp, took=_took)
    env.globals.update(
        lifecycle_svg=lifecycle_svg, throughput_svg=throughput_svg, tabs=TABS, read_per_status=READ_PER_STATUS
    )
    return Jinja2Templates(env=env)


class Dashboard:
    """Everything the routes share: config, clients, monitor, guard, notices, templates."""

    def __init__(self, config: DashboardConfig, *, sampler_client: Client | None = None) -> None:
        settings = config.settings()
        self.config = config
        self.scrub = scrubber(config.redis_url)
        self.redis_label = redact_url(config.redis_url)

        def queue(timeout_s: float, client: Client | None = None) -> StreamQueue:
            # No client name: CLIENT SETNAME would be one more command the ACL users must allow.
            c = client or make_client(config.redis_url, socket_timeout_s=timeout_s)
            return open_queue(settings, client=c, read_client=c)

        self.page_dlq = DeadLetterQueue(queue(PAGE_TIMEOUT_S))
        self.page_executions = executions_of(self.page_dlq.queue)
        # The per-flow figures read hundreds of states: on the pages' client, so a slow read is
        # never taken for an outage by the sampler's short timeout.
        self.monitor = FleetMonitor(
            queue(SAMPLER_TIMEOUT_S, sampler_client),
            scrub=self.scrub,
            sample_every_s=config.sample_every_s,
            figures_store=self.page_executions,
        )
        self.action_queue = queue(REPLY_TIMEOUT_S + 2.0)
        self.action_dlq = DeadLetterQueue(self.action_queue)
        self.action_fleet = FleetAccess.of(self.action_queue)
        self.action_flows = FlowClient(self.action_queue)
        self.guard = Guard(allow_actions=config.allow_actions, token=config.token)
        self.notices = Notices()
        self.templates = _templates()

    def close(self) -> None:
        self.monitor.stop()
        for queue in (self.monitor.queue, self.page_dlq.queue, self.action_queue):
            with contextlib.suppress(Exception):  # closing a pool of a dead server may fail; nothing to do
                queue.close()

    def render(self, request: Request, name: str, status_code: int = 200, **context: Any) -> Response:
        session = self.guard.session(request)
        base = {
            "active": context.pop("active", ""),
            "actions": self.config.allow_actions,
            "logged_in": session is not None,
            "csrf": session.csrf if session else "",
            "redis_label": self.redis_label,
            "snap": context.pop("snap", None) or self.monitor.snapshot(),
            "notice": self.notices.get(request.query_params.get("notice")),
            "refresh_ms": self.config.refresh_ms,
            "page_error": context.pop("page_error", None),
        }
        return self.templates.TemplateResponse(request, name, {**base, **context}, status_code=status_code)
