"""Execution ids, dedup keys and tenant ids can never alias another execution's key.

A user-chosen id goes into a key as ``key_id(id)`` (``:`` and ``%`` escaped), so the id part of a
key holds no ``:``; a tenant id holds none either. The property test builds every key of many
(tenant, id) pairs made of the layout's own words and separators and shows no key is shared; the
Redis tests replay each aliasing the issue found (each failed on the layout before).
"""

from __future__ import annotations

import pytest
from hypothesis import example, given, settings
from hypothesis import strategies as st

from plaita.store.executions.fanout import done_key
from plaita.store.executions.keeper_store import KEEPER_LEASE_KEY, KEEPER_RETRY_PREFIX
from plaita.store.keyspace import DEFAULT, TENANTS_KEY, Keyspace, id_of_key, key_id, key_id_bytes
from plaita.tasks import TENANT_ID
from tests.flows.support import Harness, start

#: The layout's own words and separators: what a hostile or unlucky id is made of.
WORDS = [
    "plaita", "execution", "executions", "lease", "fence", "cancel", "events", "children", "status",
    "deadlines", "start-dedup", "keeper-retry", "running", "suspended", "tenants", "default", "abc",
    "%", "%3A", "%25", "3A", "{p0}", "",
]  # fmt: skip
TENANT_WORDS = ["", "default", "execution", "executions", "lease", "cancel", "start-dedup", "plaita", "t1", "abc"]
ALL_STATUSES = ("queued", "running", "suspended", "completed", "error", "cancelled")
SPACES = [DEFAULT, Keyspace("plaita:flow:queue", 1, True), Keyspace("q", 3, True)]


def ids() -> st.SearchStrategy[str]:
    return st.lists(st.sampled_from(WORDS), min_size=1, max_size=4).flatmap(
        lambda words: st.sampled_from([":", "%", "-", ""]).map(lambda sep: sep.join(words))
    ) | st.text(alphabet=":%3Aabc", min_size=1, max_size=8)


def keys_of(ks: Keyspace, eid: str) -> dict[str, str]:
    """Every key the execution ``eid`` of keyspace ``ks`` (its tenant) can own, by kind."""
    p = ks.partition_of(eid)
    return {
        "state": ks.execution_key(eid),
        "lease": ks.lease_key(eid),
        "fence": ks.fence_key(eid),
        "cancel": ks.cancel_key(eid),
        "events": ks.events_key(eid),
        "dedup": ks.dedup_key(p, eid),
        "retry": ks.named(KEEPER_RETRY_PREFIX) + key_id(eid),
        "crashes": ks.crashes_key(eid),
        "version_wait": ks.version_wait_key(eid),
        "children": done_key(ks, eid, f"{eid}:fan:0"),
    }


def index_keys(ks: Keyspace) -> dict[str, str]:
    out = {f"status-{s}-{p}": ks.status_key(p, s) for p in range(ks.partitions) for s in ALL_STATUSES}
    out.update({f"deadlines-{p}": ks.deadlines_key(p) for p in range(ks.partitions)})
    return out


PLATFORM = {TENANTS_KEY, KEEPER_LEASE_KEY, "plaita:flow:queue", "plaita:flow:queue:dlq"}


@settings(max_examples=300, deadline=None)
@given(
    pairs=st.lists(st.tuples(st.sampled_from(TENANT_WORDS), ids()), min_size=2, max_size=12, unique=True),
    space=st.sampled_from(SPACES),
)
@example(pairs=[("execution", "abc"), ("", "execution:abc")], space=DEFAULT)
@example(pairs=[("", "cancel:victim"), ("", "victim")], space=DEFAULT)
@example(pairs=[("", "lease:hold"), ("", "hold")], space=DEFAULT)
@example(pairs=[("", "executions:deadlines"), ("execution", "x")], space=DEFAULT)
@example(pairs=[("", "a:b"), ("", "a%3Ab")], space=DEFAULT)
def test_no_two_tenant_id_pairs_share_any_key(pairs: list[tuple[str, str]], space: Keyspace) -> None:
    owner: dict[str, tuple[str, str, str]] = {k: ("platform", "", k) for k in PLATFORM}
    # "" and "default" are one tenant: the pair is the same execution, not two.
    seen = {(t if t != "default" else "", e) for t, e in pairs}
    for tenant, eid in seen:
        ks = space.for_tenant(tenant)
        for name, key in [*keys_of(ks, eid).items(), *index_keys(ks).items()]:
            kind_owner = (tenant, name, "" if name.startswith(("status-", "deadlines-")) else eid)
            assert owner.setdefault(key, kind_owner) == kind_owner, f"{key!r} is {owner[key]} and {kind_owner}"


@settings(max_examples=200, deadline=None)
@given(tenant=st.sampled_from(TENANT_WORDS), eid=ids(), space=st.sampled_from(SPACES))
def test_own_keys_are_each_keys_own_method(tenant: str, eid: str, space: Keyspace) -> None:
    """``own_keys`` (what every checkpoint and create names, from cached prefixes) is exactly the
    keys each one's method builds."""
    ks = space.for_tenant(tenant)
    keys = keys_of(ks, eid)
    assert ks.own_keys(eid) == (keys["lease"], keys["fence"], keys["state"], keys["cancel"], keys["events"])


@given(st.text(max_size=20))
def test_key_id_is_reversible_holds_no_colon_and_matches_its_bytes_form(eid: str) -> None:
    part = key_id(eid)
    assert ":" not in part and id_of_key(part) == eid
    raw = eid.encode("utf-8", "surrogatepass")
    assert key_id_bytes(raw) == part.encode("utf-8", "surrogatepass")


def test_plain_ids_keep_the_original_bytes_and_colon_ids_are_escaped() -> None:
    assert DEFAULT.execution_key("order-123") == "plaita:execution:order-123"
    assert DEFAULT.lease_key("e1") == "plaita:execution:lease:e1"
    assert DEFAULT.execution_key("order:123") == "plaita:execution:order%3A123"
    assert DEFAULT.cancel_key("cancel:victim") == "plaita:execution:cancel:cancel%3Avictim"
    assert DEFAULT.dedup_key(0, "sched:a:1") == "plaita:start-dedup:sched%3Aa%3A1"
    assert DEFAULT.for_tenant("t1").lease_key("50%") == "plaita:t1:execution:lease:50%25"
    assert all(TENANT_ID.fullmatch(t) for t in TENANT_WORDS if t)  # the words above are valid tenant ids


# -- each aliasing of the issue, on a real server ---------------------------------------------------


@pytest.mark.redis
def test_a_tenant_named_execution_never_reads_the_default_tenants_colon_id(h: Harness) -> None:
    h.run({**start("execution:abc", who="default"), "flow_id": "ledger3"})
    assert h.store.for_tenant("execution").get("abc") is None
    h.run({**start("abc", who="tenant"), "tenant_id": "execution"})
    mine = h.store.for_tenant("execution").get("abc")
    theirs = h.store.get("execution:abc")
    assert mine is not None and theirs is not None
    assert mine["params"] == {"who": "tenant"} and theirs["params"] == {"who": "default"}
    assert mine["status"] == theirs["status"] == "completed"


@pytest.mark.redis
def test_an_execution_named_cancel_victim_never_cancels_victim(h: Harness) -> None:
    done = h.run(start("cancel:victim"))
    assert done is not None and done["status"] == "completed"
    assert h.store.load("victim") == (None, False)  # no cancel flag written for victim
    victim = h.run(start("victim"))
    assert victim is not None and victim["status"] == "completed"
    assert h.store.get("cancel:victim") is not None  # not deleted by victim's create


@pytest.mark.redis
def test_an_execution_named_lease_hold_never_holds_holds_lease(h: Harness) -> None:
    assert h.run(start("lease:hold")) is not None
    hold = h.run(start("hold"))  # Harness.task asserts the lease of hold is ours
    assert hold is not None and hold["status"] == "completed"


@pytest.mark.redis
def test_a_default_id_named_like_a_tenants_index_never_becomes_that_index(h: Harness) -> None:
    assert h.run(start("executions:deadlines")) is not None
    tenant = DEFAULT.for_tenant("execution")
    assert h.client.type(tenant.deadlines_key(0)) in (b"none", "none")
    assert h.client.exists(DEFAULT.execution_key("executions:deadlines")) == 1
