"""``plaita migrate ids`` on a real server: keys written under the old layout (ids as they are) move
to the escaped names, and the executions they belong to carry on as if nothing happened.

The old layout is made by hand from the new one: every key holding an escaped id is renamed to the
id unescaped, exactly what an older worker wrote. After the migration the key set is the one before
that, byte for byte; a second run moves nothing; suspended executions, a waiting parent's done set and
a dedup key keep working.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import pytest

from plaita.cli.main import main
from plaita.store.keyspace import DEFAULT
from tests.flows import fanout_flows, flowdefs
from tests.flows.support import Harness, resume, start
from tests.support.lease_workers import QUEUE

pytestmark = pytest.mark.redis


@pytest.fixture
def h(redis_url: str, monkeypatch: pytest.MonkeyPatch) -> Iterator[Harness]:
    monkeypatch.setenv("PLAITA_TEST_REDIS_URL", redis_url)
    harness = Harness(redis_url, flows=[*flowdefs.FLOWS, *fanout_flows.FLOWS])
    try:
        yield harness
    finally:
        harness.close()


def _keys(h: Harness) -> set[str]:
    names = (k.decode() if isinstance(k, bytes) else str(k) for k in h.client.keys("plaita:*"))
    return {k for k in names if not k.startswith(("plaita:test:", QUEUE))}


def _downgrade(h: Harness) -> int:
    """Rename every escaped key to the name an older worker wrote: the id as it is."""
    moved = 0
    for key in _keys(h):
        if "%3A" in key or "%25" in key:
            h.client.rename(key, key.replace("%3A", ":").replace("%25", "%"))
            moved += 1
    return moved


def _children_bodies(h: Harness, parent: str) -> list[dict[str, Any]]:
    bodies = [json.loads(f[b"payload"]) for _, f in h.client.xrange(DEFAULT.queue)]  # type: ignore[union-attr]
    return [b for b in bodies if b.get("execution_id", "").startswith(parent + ":")]


def _migrate(redis_url: str, capsys: pytest.CaptureFixture[str], *extra: str) -> dict[str, Any]:
    code = main(["migrate", "ids", "--redis-url", redis_url, "--queue-name", QUEUE, "--json", *extra])
    assert code == 0
    return dict(json.loads(capsys.readouterr().out))


def test_old_keys_move_to_their_escaped_names_and_the_executions_carry_on(
    h: Harness, redis_url: str, capsys: pytest.CaptureFixture[str]
) -> None:
    assert h.run(start("order:1", "signup"))["status"] == "suspended"  # type: ignore[index]
    assert h.run({**start("order:2", "signup"), "tenant_id": "t1"})["status"] == "suspended"  # type: ignore[index]
    assert h.run({**start("50%", "signup")})["status"] == "suspended"  # type: ignore[index]
    assert h.run({**start("deduped", "ledger3"), "dedup_key": "shop:7"})["status"] == "completed"  # type: ignore[index]
    assert h.run(start("plain", "signup"))["status"] == "suspended"  # type: ignore[index]
    assert h.run(start("fan:1", "fan", n=2, child={"wait": True}))["status"] == "suspended"  # type: ignore[index]
    kids = _children_bodies(h, "fan:1")
    assert len(kids) == 2
    for body in kids:
        assert h.run(body)["status"] == "suspended"  # type: ignore[index]
    assert h.run(resume(kids[0]["execution_id"]))["status"] == "completed"  # type: ignore[index]
    before = _keys(h)
    assert DEFAULT.execution_key("plain") in before and "plaita:start-dedup:shop%3A7" in before

    assert _downgrade(h) >= 10
    assert _keys(h) != before and "plaita:execution:order:1" in _keys(h)
    dry = _migrate(redis_url, capsys, "--dry-run")
    assert dry["moved"] >= 10 and _keys(h) != before  # a dry run changes nothing
    report = _migrate(redis_url, capsys)
    assert report["moved"] == dry["moved"] and report["conflicts"] == [] and report["foreign"] == []
    assert _keys(h) == before
    assert _migrate(redis_url, capsys)["moved"] == 0  # idempotent

    # Everything carries on from the moved keys.
    assert h.run(resume("order:1", data="a@b"))["status"] == "completed"  # type: ignore[index]
    assert h.run({**resume("order:2", data="x"), "tenant_id": "t1"})["status"] == "completed"  # type: ignore[index]
    assert h.run(resume("50%", data="y"))["status"] == "completed"  # type: ignore[index]
    assert h.store.dedup_target("shop:7") == "deduped"
    h.run(resume(kids[1]["execution_id"]))
    parent = h.store.get("fan:1")
    assert parent is not None and parent["status"] == "suspended"  # its resume is on the stream
    wake = [json.loads(f[b"payload"]) for _, f in h.client.xrange(DEFAULT.queue)][-1]  # type: ignore[union-attr]
    assert wake["execution_id"] == "fan:1"
    assert h.run(wake)["status"] == "completed"  # type: ignore[index]


def test_a_key_already_written_under_its_new_name_is_kept_and_reported(
    h: Harness, redis_url: str, capsys: pytest.CaptureFixture[str]
) -> None:
    h.client.set("plaita:execution:cancel:a:b", "1")
    h.client.set("plaita:execution:cancel:a%3Ab", "1")
    h.client.zadd(DEFAULT.status_key(0, "suspended"), {"a:b": 1.0})
    code = main(["migrate", "ids", "--redis-url", redis_url, "--queue-name", QUEUE])
    out = capsys.readouterr().out
    assert code == 1 and "left plaita:execution:cancel:a:b" in out
    assert h.client.exists("plaita:execution:cancel:a:b", "plaita:execution:cancel:a%3Ab") == 2
