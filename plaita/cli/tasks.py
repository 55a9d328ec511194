"""``plaita tasks enqueue NAME`` and ``plaita tasks result TASK_ID``: named tasks from the shell.

Exit codes: 0 done; 1 Redis failed, or the task failed, has no record or had not finished within
``--timeout-s`` (one line saying which); 2 a bad flag or argument.
"""

from __future__ import annotations

import argparse
import json
import sys
from typing import Any

from plaita.cli.common import json_text, redis_failed
from plaita.cli.options import GroupMaker, add_priority_option, producer_queue_of
from plaita.config import DEFAULT_REDIS_URL
from plaita.errors import ConfigError, PlaitaError


def add_parsers(group: GroupMaker) -> None:
    sub = group(
        "tasks",
        help="enqueue named tasks and read their results",
        description="enqueue NAME [--args JSON] [--kwargs JSON] | result TASK_ID [--timeout-s S] "
        "(named tasks: a worker runs them with --tasks MODULE)",
    ).actions
    en = sub.add_parser("enqueue", help="enqueue a call of the task NAME; prints its task id")
    en.add_argument("name", metavar="NAME")
    en.add_argument("--args", default="[]", help="positional arguments, a JSON array (default [])")
    en.add_argument("--kwargs", default="{}", help="keyword arguments, a JSON object (default {})")
    en.add_argument("--task-id", default=None, help="the task id (default: a new one)")
    en.add_argument("--delay-s", type=float, default=None, help="run it no earlier than this from now")
    add_priority_option(en)
    en.add_argument("--json", action="store_true", help="print JSON")
    rs = sub.add_parser("result", help="a task's result: its value, or its error")
    rs.add_argument("task_id", metavar="TASK_ID")
    rs.add_argument("--timeout-s", type=float, default=0.0, help="wait this long for it to finish (default 0)")
    rs.add_argument("--json", action="store_true", help="print JSON")


def _json_arg(flag: str, text: str, kind: type) -> Any:
    try:
        value = json.loads(text)
    except ValueError as exc:
        raise ConfigError(f"{flag} is not JSON: {exc}") from None
    if not isinstance(value, kind):
        raise ConfigError(f"{flag} must be a JSON {'array' if kind is list else 'object'}")
    return value


def run_tasks(args: argparse.Namespace) -> int:
    from plaita.tasking.client import TaskClient
    from plaita.tasking.errors import TaskFailed, TaskResultTimeout, UnknownTaskResult

    client = TaskClient.from_url(args.redis_url or DEFAULT_REDIS_URL, **producer_queue_of(args))
    try:
        if args.tasks_command == "enqueue":
            call_args = _json_arg("--args", args.args, list)
            kwargs = _json_arg("--kwargs", args.kwargs, dict)
            task_id = client.enqueue(
                args.name, call_args, kwargs, task_id=args.task_id, delay_s=args.delay_s, priority=args.priority
            )
            print(json_text({"task_id": task_id}) if args.json else task_id)
            return 0
        value = client.result(args.task_id, timeout_s=args.timeout_s)
    except (TaskFailed, TaskResultTimeout, UnknownTaskResult) as exc:
        return _not_done(args, exc)
    except PlaitaError:  # ConfigError among them: main() prints it, exit 2
        raise
    except Exception as exc:
        return redis_failed("tasks", args.redis_url, exc)
    finally:
        client.close()
    print(json_text({"task_id": args.task_id, "state": "done", "value": value}) if args.json else json_text(value))
    return 0


def _not_done(args: argparse.Namespace, exc: PlaitaError) -> int:
    """A failed, unknown or unfinished task: one line (or its JSON), exit 1."""
    state = {"TaskFailed": "error", "TaskResultTimeout": "not finished", "UnknownTaskResult": "unknown"}
    if args.json:
        doc: dict[str, Any] = {"task_id": args.task_id, "state": state.get(type(exc).__name__), "error": str(exc)}
        print(json_text(doc))
    else:
        print(f"plaita tasks: {exc}", file=sys.stderr)
    return 1
