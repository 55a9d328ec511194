"""``plaita enqueue --delay-s`` and ``plaita executions start --delay-s``: tasks wait in the delayed
set (not on the stream), ``plaita status --json`` counts them, a bad delay exits 2 with a message."""

from __future__ import annotations

import json
import time

import pytest
import redis

from plaita.store.streams.delayed import delayed_key
from tests.support.ops import QUEUE, plaita, plaita_json

pytestmark = pytest.mark.redis


def test_enqueue_with_a_delay_waits_off_the_stream_and_status_counts_it(redis_url: str, bclient: redis.Redis) -> None:
    bodies = "".join(json.dumps({"type": "start", "flow_id": "f", "params": {"n": n}}) + "\n" for n in range(3))
    done = plaita(redis_url, "enqueue", "--delay-s", "3600")
    assert done.returncode == 2 and "no task given" in done.stderr  # stdin is empty here
    one = plaita(redis_url, "enqueue", "--delay-s", "3600", bodies.splitlines()[0])
    assert one.returncode == 0, one.stderr
    assert one.stdout.strip().startswith("d-")
    assert bclient.xlen(QUEUE) == 0 and bclient.zcard(delayed_key(QUEUE)) == 1
    (score,) = [s for _, s in bclient.zrange(delayed_key(QUEUE), 0, -1, withscores=True)]
    assert time.time() * 1000 + 3_500_000 < score <= time.time() * 1000 + 3_600_000  # due in an hour, in ms
    status = plaita_json(redis_url, "status")
    assert status["delayed"] == 1 and status["length"] == 0


@pytest.mark.parametrize("value", ["-1", "nan", "inf", "400000000"])
def test_a_bad_delay_exits_2_and_adds_nothing(redis_url: str, bclient: redis.Redis, value: str) -> None:
    done = plaita(redis_url, "enqueue", "--delay-s", value, '{"type": "start", "flow_id": "f"}')
    assert done.returncode == 2 and "--delay-s" in done.stderr and "Traceback" not in done.stderr
    assert bclient.zcard(delayed_key(QUEUE)) == 0 and bclient.xlen(QUEUE) == 0


def test_delay_with_wait_replicas_is_refused(redis_url: str) -> None:
    done = plaita(redis_url, "enqueue", "--delay-s", "5", "--wait-replicas", "1", '{"type": "start", "flow_id": "f"}')
    assert done.returncode == 2 and "--wait-replicas" in done.stderr


def test_executions_start_with_a_delay_is_queued_and_shown_waiting(redis_url: str, bclient: redis.Redis) -> None:
    done = plaita(redis_url, "executions", "start", "f", "--delay-s", "600", "--json")
    assert done.returncode == 0, done.stderr
    eid = json.loads(done.stdout)["execution_id"]
    shown = plaita_json(redis_url, "executions", "show", eid)
    assert shown["status"] == "queued" and shown["waiting"]["for"] == "due"
    assert bclient.zcard(delayed_key(QUEUE)) == 1 and bclient.xlen(QUEUE) == 0
    text = plaita(redis_url, "executions", "show", eid)
    assert "delayed start: due " in text.stdout and "version" not in text.stdout, text.stdout
    bad = plaita(redis_url, "executions", "start", "f", "--delay-s", "-5")
    assert bad.returncode == 2 and "delay_s" in bad.stderr
