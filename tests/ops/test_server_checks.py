"""The doctor's checks as pure functions: what a server says about itself → findings.

The real servers configured each way are in test_doctor.py; these pin the cases a private
server cannot be made to show cheaply (an old version, a failed snapshot, a machine nearly out
of memory) and the judgement of each value.
"""

from __future__ import annotations

from typing import Any

import pytest

from plaita.ops.doctor import as_json, describe, exit_code
from plaita.ops.server_checks import (
    Finding,
    Severity,
    check_cluster,
    check_disk,
    check_eviction,
    check_fsync,
    check_memory,
    check_persistence,
    check_role,
    check_version,
    node_findings,
)
from plaita.store.server_facts import ServerFacts

MIB = 2**20


def facts(info: dict[str, Any] | None = None, config: dict[str, str] | None = None, **refused: str) -> ServerFacts:
    base: dict[str, Any] = {"redis_version": "7.0.15", "role": "master", "used_memory": 10 * MIB, "aof_enabled": 1}
    return ServerFacts(
        "", {**base, **(info or {})}, dict(config or {}), {k.replace("_", "-"): v for k, v in refused.items()}
    )


def only(findings: list[Finding]) -> Finding:
    assert len(findings) == 1, findings
    return findings[0]


@pytest.mark.parametrize(
    ("info", "severity", "words"),
    [
        ({"redis_version": "6.2.14"}, Severity.ERROR, "older than plaita supports"),
        ({"redis_version": "7.0.15"}, Severity.INFO, "no XNACK"),
        ({"redis_version": "8.8.0"}, Severity.OK, "XNACK included"),
        ({"redis_version": "10.0.1"}, Severity.OK, "XNACK included"),
        ({"redis_version": "7.2.4", "server_name": "valkey", "valkey_version": "9.0.0"}, Severity.INFO, "Valkey 9.0.0"),
    ],
)
def test_version(info: dict[str, Any], severity: Severity, words: str) -> None:
    f = only(check_version(facts(info)))
    assert f.severity is severity and words in f.message, f


@pytest.mark.parametrize(
    ("policy", "maxmemory", "severity", "words"),
    [
        ("noeviction", 0, Severity.OK, "refuses writes"),
        ("allkeys-lru", 100 * MIB, Severity.ERROR, "evicts any key"),
        ("volatile-ttl", 100 * MIB, Severity.ERROR, "execution leases"),
        ("allkeys-random", 0, Severity.WARN, "once a limit is set"),
    ],
)
def test_eviction(policy: str, maxmemory: int, severity: Severity, words: str) -> None:
    f = only(check_eviction(facts(config={"maxmemory-policy": policy, "maxmemory": str(maxmemory)})))
    assert f.severity is severity and words in f.message, f


def test_eviction_falls_back_to_info_when_config_is_refused() -> None:
    refused = facts({"maxmemory_policy": "allkeys-lfu", "maxmemory": 5 * MIB}, maxmemory_policy="ACL: no")
    assert only(check_eviction(refused)).severity is Severity.ERROR
    unknown = ServerFacts("", {}, {}, {"INFO": "ACL: no info", "maxmemory-policy": "ACL: no config"})
    f = only(check_eviction(unknown))
    assert f.severity is Severity.INFO and "could not read maxmemory-policy (ACL: no config)" in f.message


@pytest.mark.parametrize(
    ("config", "severity", "words"),
    [
        ({"appendonly": "no", "save": ""}, Severity.ERROR, "a restart of Redis loses the whole queue"),
        ({"appendonly": "no", "save": "3600 1 300 100 60 10000"}, Severity.WARN, "up to 3600 s"),
        ({"appendonly": "yes", "save": "", "appendfsync": "always"}, Severity.OK, "AOF on"),
    ],
)
def test_persistence(config: dict[str, str], severity: Severity, words: str) -> None:
    f = check_persistence(facts(config=config))[0]
    assert f.severity is severity and words in f.message, f


def test_persistence_without_config_says_what_it_could_not_read() -> None:
    """AOF off and ``save`` unreadable: at best RDB snapshots, so at least a warning."""
    f = only(check_persistence(facts({"aof_enabled": 0}, save="ACL: this user has no permissions")))
    assert f.severity is Severity.WARN
    assert "save is unknown (ACL: this user has no permissions)" in f.message, f


@pytest.mark.parametrize(
    ("fsync", "severity", "words"),
    [("always", Severity.OK, "on disk"), ("everysec", Severity.INFO, "about 1 s"), ("no", Severity.WARN, "30 s")],
)
def test_fsync_says_how_much_a_crash_loses(fsync: str, severity: Severity, words: str) -> None:
    f = only(check_fsync(facts(config={"appendfsync": fsync})))
    assert f.severity is severity and words in f.message, f


def test_failed_snapshot_and_replica_are_errors() -> None:
    assert check_disk(facts({"rdb_last_bgsave_status": "ok", "aof_last_write_status": "ok"})) == []
    f = only(check_disk(facts({"rdb_last_bgsave_status": "err"})))
    assert f.severity is Severity.ERROR and "refuses writes" in f.message
    f = only(check_role(facts({"role": "slave", "master_host": "10.0.0.5", "master_port": 6379})))
    assert f.severity is Severity.ERROR and "replica of 10.0.0.5:6379" in f.message
    assert check_role(facts()) == []


@pytest.mark.parametrize(
    ("used_mib", "maxmemory_mib", "total_mib", "severity"),
    [
        (10, 100, 0, Severity.OK),
        (85, 100, 0, Severity.WARN),
        (97, 100, 0, Severity.ERROR),
        (900, 0, 1000, Severity.WARN),  # no maxmemory: against the machine's memory
        (10, 0, 0, Severity.OK),
    ],
)
def test_memory(used_mib: int, maxmemory_mib: int, total_mib: int, severity: Severity) -> None:
    info = {"used_memory": used_mib * MIB, "total_system_memory": total_mib * MIB}
    assert only(check_memory(facts(info, {"maxmemory": str(maxmemory_mib * MIB)}))).severity is severity


def test_memory_leaves_out_what_eviction_does_not_count() -> None:
    info = {"used_memory": 97 * MIB, "mem_not_counted_for_evict": 20 * MIB}
    assert only(check_memory(facts(info, {"maxmemory": str(100 * MIB)}))).severity is Severity.OK


def test_cluster_mode_against_the_url() -> None:
    node = facts({"cluster_enabled": 1})
    f = only(check_cluster([node], url="redis://h:1/0", partitions=1))
    assert f.severity is Severity.ERROR and "use redis+cluster://" in f.message
    assert check_cluster([facts({"cluster_enabled": 0})], url="redis://h:1/0", partitions=1) == []
    three = [node, node, node]
    assert only(check_cluster(three, url="redis+cluster://h:1", partitions=1)).severity is Severity.INFO
    assert only(check_cluster(three, url="redis+cluster://h:1", partitions=6)).severity is Severity.OK


def test_a_well_set_server_is_all_ok_and_exits_0() -> None:
    good = facts(config={"maxmemory-policy": "noeviction", "maxmemory": "0", "appendonly": "yes",
                         "appendfsync": "always", "save": ""}, info={"redis_version": "8.8.0"})  # fmt: skip
    found = node_findings(good)
    assert {f.severity for f in found} == {Severity.OK}, found
    assert exit_code(found) == 0 and describe(found) == "all ok (exit 0)"


def test_exit_codes_and_json() -> None:
    info, warn, err = (Finding(s, "x", "m") for s in (Severity.INFO, Severity.WARN, Severity.ERROR))
    assert (
        exit_code([]) == 0 and exit_code([info]) == 0 and exit_code([info, warn]) == 1 and exit_code([warn, err]) == 3
    )
    assert describe([err, err, warn, info]) == "2 errors, 1 warning, 1 info (exit 3)"
    doc = as_json([warn], url="redis://u:secret@h:1/0")
    assert doc == {
        "redis_url": "redis://u:***@h:1/0",
        "worst": "warn",
        "exit_code": 1,
        "findings": [{"severity": "warn", "check": "x", "node": "", "message": "m"}],
    }
