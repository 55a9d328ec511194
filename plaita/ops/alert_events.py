"""The events a worker and a keeper alert about, built from what they observe.

``WorkerAlerts`` turns a worker's notifications into events of ``plaita.ops.alerts``:
``dead_letter`` (a task moved to the DLQ, after the write), ``execution_error`` (a checkpoint
ended an execution in ``error``), ``zombie_reaped`` (a keeper marked an execution orphaned;
the original's name) and ``backoff_stuck`` / ``backoff_recovered`` (an outage longer than
``alert_backoff_s``: BACKOFF with its retries, once per outage). A task's body and an
execution's params, state and traceback are never sent: only ids, names and the reason.
Every method only queues (``AlertSender.emit``): none ever blocks the caller.
"""

from __future__ import annotations

import logging
import socket
import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from plaita.ops.alerts import AlertSender, CountHook
from plaita.runtime.outage import Outage
from plaita.store.streams.entries import DeadLetter

if TYPE_CHECKING:
    from plaita.runtime.worker import Worker

logger = logging.getLogger(__name__)

#: Every event name (schema version 1).
EVENTS = ("dead_letter", "execution_error", "zombie_reaped", "backoff_stuck", "backoff_recovered")

#: (execution id, reason, last update as epoch seconds) -> None: the keeper's orphan hook.
OrphanHook = Callable[[str, str, float], None]


def _body_fields(body: Any) -> dict[str, Any]:
    """The ids of a task body (never the body: params may hold anything, secrets included)."""
    if not isinstance(body, dict):
        return {}
    keys = ("type", "execution_id", "flow_id", "resume_type", "tenant_id")
    return {("task_type" if k == "type" else k): str(body[k]) for k in keys if isinstance(body.get(k), str | int)}


def orphan_alert(sender: AlertSender) -> OrphanHook:
    """The keeper's ``on_orphaned`` hook: one ``zombie_reaped`` event per execution marked."""

    def on_orphaned(execution_id: str, reason: str, updated_at_s: float) -> None:
        # "source" is the keeper's also when it runs inside a worker (``plaita worker --keeper``).
        fields = {
            "source": "keeper",
            "execution_id": execution_id,
            "reason": reason,
            "last_update": round(updated_at_s, 3),
        }
        sender.emit("zombie_reaped", fields, text=f"plaita keeper: execution {execution_id} marked error ({reason})")

    return on_orphaned


class WorkerAlerts:
    """A worker's alerts (attached by ``Operations``); ``check_backoff`` runs on its monitor tick."""

    def __init__(self, sender: AlertSender, outage: Outage, *, backoff_after_s: float, name: str) -> None:
        self.sender = sender
        self._outage = outage
        self.backoff_after_s = backoff_after_s
        self._name = name
        #: ``Outage.since_s`` of the outage a ``backoff_stuck`` went out for (None: none).
        self._alerted_since: float | None = None

    @classmethod
    def of(cls, worker: Worker, on_count: CountHook | None = None) -> WorkerAlerts | None:
        """The alerts of ``worker`` per its settings (None without ``alert_webhook``)."""
        s = worker.settings
        if not s.alert_webhook:
            return None
        identity = {
            "source": "worker",
            "instance_id": worker.instance_id,
            "consumer": s.consumer_name,
            "group": s.consumer_group,
            "queue": s.queue_name,
            "host": socket.gethostname(),
        }
        sender = AlertSender(s.alert_webhook, secret=s.alert_webhook_secret, identity=identity, on_count=on_count)
        return cls(sender, worker.outage, backoff_after_s=s.alert_backoff_s, name=s.consumer_name)

    def start(self) -> None:
        self.sender.start()

    def begin_close(self) -> None:
        self.sender.begin_close()

    def close(self) -> None:
        self.sender.close()

    # -- events --------------------------------------------------------------------------
    def dead_lettered(self, letters: list[DeadLetter]) -> None:
        for d in letters:
            fields = {
                "message_id": d.message_id,
                "reason": d.reason,
                "delivery_count": d.delivery_count,
                **_body_fields(d.payload),
            }
            about = f" (execution {fields['execution_id']})" if "execution_id" in fields else ""
            text = f"plaita: task {d.message_id}{about} moved to the DLQ on {self._name}: {d.reason}"
            self.sender.emit("dead_letter", fields, text=text)

    def execution_failed(self, flow_id: str, execution_id: str, error: dict[str, Any] | None) -> None:
        error = error or {}
        reason = str(error.get("message") or "")
        fields = {
            "execution_id": execution_id,
            "flow_id": flow_id,
            "step": error.get("step"),
            "error_type": error.get("type"),
            "attempts": error.get("attempts"),
            "reason": reason,
        }
        text = f"plaita: execution {execution_id} of flow {flow_id} ended in error: {reason}"
        self.sender.emit("execution_error", fields, text=text)

    def check_backoff(self, now_s: float | None = None) -> None:
        """Alert once when the current outage passes the threshold, and once when it ends."""
        now_s = time.monotonic() if now_s is None else now_s
        since_s = self._outage.since_s
        alerted = self._alerted_since
        if alerted is not None and since_s != alerted:  # the outage alerted about is over
            self._alerted_since = None
            lasted_s = round(now_s - alerted, 1)
            text = f"plaita: worker {self._name} consuming again after about {lasted_s:.0f} s of Redis outage"
            self.sender.emit("backoff_recovered", {"duration_s": lasted_s}, text=text)
        if since_s is None or self._alerted_since is not None or now_s - since_s < self.backoff_after_s:
            return
        self._alerted_since = since_s
        lasted_s = round(now_s - since_s, 1)
        reason = self._outage.reason()
        fields = {
            "state": "BACKOFF",
            "duration_s": lasted_s,
            "since": round(time.time() - lasted_s, 3),
            "retries": self._outage.retries,
            "threshold_s": self.backoff_after_s,
            "reason": reason,
        }
        text = f"plaita: worker {self._name} in BACKOFF for {lasted_s:.0f} s: {reason}"
        self.sender.emit("backoff_stuck", fields, text=text)


def keeper_sender(
    url: str, secret: str | None, *, holder: str, queue: str, on_count: CountHook | None = None
) -> AlertSender:
    """The sender of a keeper running on its own (``plaita keeper --alert-webhook``)."""
    identity = {"source": "keeper", "instance_id": holder, "queue": queue, "host": socket.gethostname()}
    return AlertSender(url, secret=secret, identity=identity, on_count=on_count)
