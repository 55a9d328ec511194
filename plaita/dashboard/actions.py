"""What the dashboard's buttons do: worker control over the control channel, DLQ recovery.

Each function talks to Redis through plaita.store and returns a one-line outcome for the page;
an operator mistake (unknown worker, bad id) raises ActionError with the reason. Redis
failures pass through unchanged: the route turns them into the outage message.
"""

from __future__ import annotations

import re
import time
import uuid
from dataclasses import dataclass
from typing import Any

from plaita.errors import PlaitaError
from plaita.store.fleet import REPLY_PREFIX
from plaita.store.fleet_access import FleetAccess
from plaita.store.streams.dlq import DeadLetterQueue

#: Seconds the dashboard waits for workers' answers to a control command.
REPLY_TIMEOUT_S = 3.0
#: Commands a button may send; ``stop_now`` is ``stop`` without the drain.
COMMANDS = ("pause", "resume", "stop", "stop_now")
#: A stream entry id as Redis prints it (``ms-seq``).
#: A DLQ entry id; ``<partition>/`` first on a partitioned queue.
STREAM_ID = re.compile(r"(\d{1,5}/)?\d{1,20}-\d{1,20}")
#: Instance ids as workers build them (host names, dashes, dots, colons).
INSTANCE_ID = re.compile(r"[A-Za-z0-9._:@-]{1,200}")


class ActionError(PlaitaError):
    """Raised for an operator mistake; the message is shown on the page."""


@dataclass
class Outcome:
    message: str
    replies: list[dict[str, Any]]
    #: The page to go to instead of the one the action came from ("": that one): a fork's new
    #: execution, the list after a delete.
    goto: str = ""


def control(fleet: FleetAccess, target: str, command: str) -> Outcome:
    """Send ``command`` to one instance (or ``all``) and collect the answers that arrive in time."""
    if command not in COMMANDS:
        raise ActionError(f"unknown command {command!r} (one of {', '.join(COMMANDS)})")
    if target != "all" and not INSTANCE_ID.fullmatch(target):
        raise ActionError("not a worker instance id")
    if target != "all" and not fleet.is_registered(target):
        raise ActionError(f"unknown worker instance {target!r} (it may have stopped)")
    reply_to = f"{REPLY_PREFIX}{uuid.uuid4().hex}"
    name = "stop" if command == "stop_now" else command
    now = command == "stop_now"
    received = fleet.send_command(target, name, now=now, reply_to=reply_to, request_id=reply_to)
    if received == 0:
        raise ActionError(f"no worker is listening on the control channel for {target!r}")
    replies: list[dict[str, Any]] = []
    deadline = time.monotonic() + REPLY_TIMEOUT_S
    while len(replies) < received and (left_s := deadline - time.monotonic()) > 0:
        answer = fleet.wait_reply(reply_to, max(0.1, left_s))
        if answer is None:
            break
        replies.append(_reply_row(answer))
    text = f"{command} sent to {target}: {received} worker(s) received it, {len(replies)} answered"
    return Outcome(text, replies)


def _reply_row(answer: dict[str, Any]) -> dict[str, Any]:
    status = answer.get("status") if isinstance(answer.get("status"), dict) else {}
    assert isinstance(status, dict)
    return {
        "instance_id": str(answer.get("instance_id", "")),
        "command": str(answer.get("command", "")),
        "accepted": bool(answer.get("accepted")),
        "state": str(status.get("state", "")),
        "in_flight": status.get("in_flight"),
    }


def check_ids(ids: list[str]) -> None:
    for dlq_id in ids:
        if not STREAM_ID.fullmatch(dlq_id):
            raise ActionError(f"{dlq_id!r} is not a stream entry id (like 1717171717171-0)")


def requeue(dlq: DeadLetterQueue, ids: list[str]) -> Outcome:
    check_ids(ids)
    if not ids:
        raise ActionError("nothing to requeue")
    try:
        moved = dlq.requeue(ids)
    except KeyError as exc:
        raise ActionError(f"no dead letter with id {exc.args[0]!r} (already requeued or purged?)") from None
    return Outcome(f"requeued {len(moved)} dead letter(s) onto {dlq.queue.stream}", [])


def purge(dlq: DeadLetterQueue, expected: int) -> Outcome:
    """Delete every dead letter, but only if the DLQ still holds what the operator confirmed."""
    length = dlq.length()
    if length != expected:
        raise ActionError(f"the DLQ now holds {length} entries, not the {expected} you confirmed: look again")
    return Outcome(f"purged {dlq.purge()} dead letter(s) from {dlq.queue.dlq_key}", [])
