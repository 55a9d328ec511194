"""The order pipeline's plain tasks (``plaita worker --tasks examples.orders.tasks``): named, retried
with backoff, their results kept an hour (``TaskClient.result``)."""

from __future__ import annotations

import logging
import threading
from typing import Any

from plaita import TaskRegistry

logger = logging.getLogger(__name__)

tasks = TaskRegistry()

#: What was "sent", by message id: an example's mailbox (a real app calls its mail service here,
#: with the message id as the provider's idempotency key, so a redelivered task sends nothing twice).
OUTBOX: dict[str, dict[str, str]] = {}
_OUTBOX_LOCK = threading.Lock()


@tasks.task(retries=5, backoff_s=2.0, result_ttl_s=3600)
def send_email(to: str, subject: str, message_id: str) -> dict[str, Any]:
    if "@" not in to:
        raise ValueError(f"not an address: {to!r}")
    with _OUTBOX_LOCK:
        first = message_id not in OUTBOX
        OUTBOX.setdefault(message_id, {"to": to, "subject": subject})
    if first:
        logger.info("email to %s: %s", to, subject)
    return {"sent_to": to, "first": first}
