"""The transition table: the single source of truth for the worker lifecycle.

The runtime machine, the exhaustive tests, ``diagrams/`` and ``docs/states.md`` are all
built from ``TRANSITIONS``. Keep it to core keys (no ``label``: plain ``Machine`` rejects it).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Final

from plaita.fsm.states import ACTIVE_STATES, State

if TYPE_CHECKING:
    from transitions.core import TransitionConfigDict

S = State

#: Every non-terminal state accepts ``stop_requested``; listed explicitly because
#: ``source="*"`` would also create a STOPPING -> STOPPING self-loop.
_STOPPABLE: Final = [
    S.INIT,
    S.ENSURE_GROUP,
    S.RESUMING_OWN,
    S.RECLAIMING,
    S.ISOLATING,
    S.READING,
    S.BACKOFF,
    S.PAUSED,
]
#: States a remote ``pause`` can interrupt (the owner is between Redis calls in each).
_PAUSABLE: Final = [S.ENSURE_GROUP, S.RESUMING_OWN, S.RECLAIMING, S.ISOLATING, S.READING, S.BACKOFF]

TRANSITIONS: list[TransitionConfigDict] = [
    {"trigger": "start", "source": S.INIT, "dest": S.ENSURE_GROUP},
    # Every (re)start of consuming -- first start, after an outage, after a pause -- re-reads
    # this consumer's own pending entries first: a restarted worker resumes its own work at once,
    # and entries whose read reply an outage swallowed are found. Claiming waits until that scan
    # is done: a claimed entry joins our pending list and the scan would dispatch it twice.
    {"trigger": "group_ready", "source": S.ENSURE_GROUP, "dest": S.RESUMING_OWN},
    {"trigger": "own_pending_done", "source": S.RESUMING_OWN, "dest": S.RECLAIMING},
    {"trigger": "reclaim_done", "source": S.RECLAIMING, "dest": S.READING},
    {"trigger": "reclaim_due", "source": S.READING, "dest": S.RECLAIMING},
    # Tasks a dead predecessor had in flight (our own pending entries found at process start, or
    # entries claimed from a dead consumer) are suspects: they run one at a time, nothing beside
    # them, so the one that kills the process again is the one blamed (plaita.runtime.suspects).
    # Claiming waits for the scan of our own entries, so suspects are found at its end too.
    {"trigger": "suspects_found", "source": [S.RESUMING_OWN, S.RECLAIMING], "dest": S.ISOLATING},
    {"trigger": "suspects_cleared", "source": S.ISOLATING, "dest": S.RECLAIMING},
    {
        "trigger": "redis_failed",
        "source": list(ACTIVE_STATES),
        "dest": S.BACKOFF,
        "before": "schedule_backoff",
    },
    {
        "trigger": "backoff_elapsed",
        "source": S.BACKOFF,
        "dest": S.ENSURE_GROUP,
        "conditions": "backoff_due",
    },
    # Remote pause: stop reading, let in-flight work finish; resume re-checks the group first.
    {"trigger": "pause_requested", "source": _PAUSABLE, "dest": S.PAUSED},
    {"trigger": "pause_requested", "source": S.PAUSED, "dest": None},
    {"trigger": "resume_requested", "source": S.PAUSED, "dest": S.ENSURE_GROUP},
    {"trigger": "stop_requested", "source": _STOPPABLE, "dest": S.STOPPING},
    # Stopping twice is a no-op: an internal transition (dest None) runs no enter/exit callbacks.
    {"trigger": "stop_requested", "source": S.STOPPING, "dest": None},
    {"trigger": "drained", "source": S.STOPPING, "dest": S.STOPPED},
]

#: What each trigger means, for docs/states.md.
TRIGGER_DOCS: Final[dict[str, str]] = {
    "start": "the daemon starts its consume loop",
    "group_ready": "`XGROUP CREATE … MKSTREAM` succeeded or answered BUSYGROUP",
    "own_pending_done": "a page of this consumer's own pending list came back empty: nothing of ours is left to resume",
    "reclaim_done": "the bounded reclaim pass finished (nothing left to claim, or its budget spent)",
    "reclaim_due": "the reclaim interval elapsed while reading",
    "suspects_found": "the scan of this consumer's own pending list at process start, or a reclaim pass, left "
    "suspects: tasks a dead worker process had in flight",
    "suspects_cleared": "every suspect ran alone (or was dead-lettered for its crashes); claiming goes on",
    "redis_failed": "any Redis error (transient or persistent) at a call site of the active states",
    "backoff_elapsed": "the owner polls; it fires only once the backoff delay has passed",
    "pause_requested": "a remote `pause` command (control channel); pausing twice is a no-op",
    "resume_requested": "a remote `resume` command while paused",
    "stop_requested": "SIGTERM/SIGINT or a remote stop; posted by other threads, fired by the owner. A second "
    "signal, or `stop --now`, is not a new transition: it cuts the drain of STOPPING short",
    "drained": "in-flight work finished, the drain timeout passed or a stop-now arrived; unstarted and "
    "unfinished work was handed back",
}

#: What each state means, for docs/states.md.
STATE_DOCS: Final[dict[State, str]] = {
    S.INIT: "constructed; no Redis command issued yet",
    S.ENSURE_GROUP: "creating the consumer group (idempotent); after a Redis restart without data this "
    "recreates it (NOGROUP)",
    S.RESUMING_OWN: "re-reading this consumer's own pending list (`XREADGROUP … 0`, page by page, no BLOCK) and "
    "running what is not already running or awaiting its ack here",
    S.RECLAIMING: "one bounded pass of a Lua script (XPENDING IDLE + lease check + XCLAIM, following a cursor) "
    "claiming entries idle longer than `--claim-min-idle-ms` whose execution lease is absent; then "
    "housekeeping (idle consumers, acked residue) when due",
    S.ISOLATING: "running suspects one at a time with nothing beside them (in-flight work finishes first, no "
    "reads): each records a crash strike (a lone one, the only entry the dead predecessor had pending, is blamed "
    "for it at once) and runs alone; one that killed its worker `--max-crashes` times goes to the "
    "DLQ and its execution ends `error`",
    S.READING: "XREADGROUP `>` with a bounded BLOCK for as many tasks as there are free handler slots",
    S.BACKOFF: "waiting `min(cap, base·2^attempt)` with jitter on the monotonic clock; stop interrupts it",
    S.PAUSED: "remote pause: no reads or claims; in-flight tasks finish and are acked; heartbeat and control stay up",
    S.STOPPING: "no more reads; unstarted tasks are handed back at once, running ones drain up to "
    "`--drain-timeout-s` (a second signal or `stop --now` ends the drain), the rest are handed back",
    S.STOPPED: "terminal: the process exits 0",
}


#: The isolation rule, for docs/states.md: a failure caused by one entry or one key stays with that
#: entry or key; only a failure of Redis itself (or of a key every task needs) means BACKOFF.
ISOLATION_RULES: Final[list[tuple[str, str]]] = [
    (
        "an entry that is not a task: no or undecodable payload, invalid or too deeply nested JSON, lone "
        "surrogates, a non-UTF-8 or duplicated field name, unknown type, newer schema_version, over the size limit",
        "DLQ at once with the reason; the envelope keeps every original field exactly (base64 where not UTF-8, "
        "values over 64 KiB truncated with size and sha256); counter `bad_input`",
    ),
    (
        "a handler raising `BadTaskError`",
        "DLQ at once with the handler's reason",
    ),
    (
        "a handler raising anything else: every `BaseException`, sync or async (`SystemExit`, `KeyboardInterrupt`, "
        "`GeneratorExit`, `CancelledError` included)",
        "left pending for redelivery (logged with the task id, counter `failed`); at `--max-deliveries` it goes to "
        "the DLQ; its slot is free for the next task at once. A `SystemExit` or `KeyboardInterrupt` from a handler "
        "never stops the worker (only a signal to the process does)",
    ),
    (
        "a handler or step that kills its own process (`os._exit`, a signal such as SIGKILL, a segfault), "
        "default `--pool thread`",
        "the worker that finds the tasks in flight at that death (the restarted one, or one that claims them) runs "
        "them one at a time in ISOLATING; none is charged a delivery; the one that kills the process while alone "
        'gets a crash strike, and after `--max-crashes` (3) goes to the DLQ ("killed its worker process N '
        "times\"), its execution ends `error`. A task that was the only one pending under the dead worker's name "
        "(found by the restarted worker's first scan) is the only candidate: that crash is a strike against it at "
        "once, so a poison step that runs alone ends `error` after exactly `--max-crashes` worker exits (1 with "
        "`--max-crashes 1`). When several were in flight the crash blames none of them (the first strike is "
        "shared and counts once): each runs alone, and an innocent's record is deleted once it lives. Entries "
        "claimed from a dead consumer under another name are never lone (other workers may hold the rest)",
    ),
    (
        "the same with `--pool process` (steps and handlers run in child processes)",
        "only its child dies: that one attempt fails with `ChildProcessDied` naming the exit code or signal (a "
        "step: its retry policy, then `error`; a handler: a failed delivery, at `--max-deliveries` the DLQ); the "
        "child is replaced at once; the worker, its leases and the tasks beside it go on; no lifecycle state "
        "changes and ISOLATING is never entered",
    ),
    (
        "a step past its time limit (`@flow.step(time_limit_s=…)`, `--step-time-limit-s`)",
        "`--pool process`: its child is killed at the limit and the attempt fails with `StepTimeLimit` (retry "
        "policy, then `error`); threads: the limit is soft, `ctx.cancelled` is set at the limit (a cooperative "
        "step can stop), the step runs to its end holding its slot, then its result is discarded and the attempt "
        "fails with `StepTimeLimit`",
    ),
    (
        "a lease or fence key that is not what plaita writes (another type, a fence that is no integer, a lease "
        "value without TTL)",
        "that task stays pending, one error line per execution naming the key to fix, counter `bad_keys`; every "
        "other task goes on",
    ),
    (
        "a DLQ key of another type",
        "the dead letter stays pending (logged); the acks of the same batch land and consumption goes on",
    ),
    (
        "anything else Redis refuses or fails at: timeouts, resets, LOADING, READONLY, NOGROUP (transient); auth, "
        "NOPERM, OOM, WRONGTYPE of the stream itself (persistent)",
        "`redis_failed` → BACKOFF (transient: quick exponential retries; persistent: every 5 s, one error line each "
        "attempt with the cause in words); the process never exits",
    ),
]


def triggers() -> list[str]:
    """Every trigger name in the table, in first-appearance order."""
    seen: dict[str, None] = {}
    for t in TRANSITIONS:
        seen.setdefault(t["trigger"], None)
    return list(seen)


def edges() -> list[tuple[State, str, State | None, str | None]]:
    """(source, trigger, dest, condition) for every edge; dest None is an internal no-op."""
    out: list[tuple[State, str, State | None, str | None]] = []
    for t in TRANSITIONS:
        sources = t["source"]
        src_list = sources if isinstance(sources, list) else [sources]
        cond = t.get("conditions")
        cond_name = cond if isinstance(cond, str) else None
        for src in src_list:
            assert isinstance(src, State)
            dest = t["dest"]
            assert dest is None or isinstance(dest, State)
            out.append((src, t["trigger"], dest, cond_name))
    return out


#: The same rule for flow executions, for docs/states.md: one execution key that holds no
#: execution stays with that key in the keeper and in ``plaita executions``.
EXECUTION_ISOLATION_RULES: Final[list[tuple[str, str]]] = [
    (
        "an execution key in the deadlines or running index that is not JSON, JSON but not an object, or not a "
        "string key",
        "the keeper skips it and leaves it as it is (no timeout or retry for it, the index entry kept); one warning "
        "per key per keeper process, counted (`Keeper.corrupt_skips`, `KeeperPass.corrupt`); the rest of the pass "
        "goes on; never called a Redis failure",
    ),
    (
        "the same key met by `plaita executions list`",
        "one line on stderr naming it; the others are listed; exit 0",
    ),
    (
        "the same key asked for by `plaita executions show`, `cancel` or `resume`",
        "one line on stderr naming it and what it holds; exit 1; nothing written",
    ),
    (
        "`plaita keeper --once` while another keeper holds `plaita:keeper:lease`, or a pass that failed",
        "one error line, exit 1; its own lease is handed back on every exit",
    ),
]
