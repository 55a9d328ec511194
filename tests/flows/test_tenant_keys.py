"""Tenant namespaces without a server: the default tenant's keys are today's byte for byte, a tenant's
keys follow the original layout in the execution's slot, a hostile tenant id is a bad task, a step
cannot stage writes to any tenant's execution keys."""

from __future__ import annotations

from typing import Any

import pytest

from plaita.errors import BadTaskError
from plaita.flows.model.context import StepContext
from plaita.store.executions.fanout import done_key
from plaita.store.keyspace import DEFAULT, TENANTS_KEY, Keyspace, hash_tag, tenant_prefix
from plaita.tasks import CancelFlag, Task, validate_body


def test_the_default_tenants_keys_are_todays_byte_for_byte() -> None:
    for ks in (DEFAULT, DEFAULT.for_tenant(None), DEFAULT.for_tenant(""), DEFAULT.for_tenant("default")):
        assert ks == DEFAULT and ks.tenant == ""
        assert ks.lease_key("e1") == "plaita:execution:lease:e1"
        assert ks.fence_key("e1") == "plaita:execution:fence:e1"
        assert ks.execution_key("e1") == "plaita:execution:e1"
        assert ks.cancel_key("e1") == "plaita:execution:cancel:e1"
        assert ks.dedup_key(0, "k") == "plaita:start-dedup:k"
        assert ks.status_key(0, "running") == "plaita:executions:status:running"
        assert ks.deadlines_key(0) == "plaita:executions:deadlines"
        assert ks.index_keeps_key(0) == "plaita:executions:index-keeps"
        assert ks.lease_prefix(0) == "plaita:execution:lease:"
        assert done_key(ks, "e1", "e1:fan:0") == "plaita:execution:children:e1:fan:0"
        assert ks.named("plaita:execution:keeper-retry:") == "plaita:execution:keeper-retry:"
    tagged = Keyspace("q", 4, True)
    t = tagged.tags[tagged.partition_of("e1")]
    assert tagged.for_tenant("default") == tagged
    assert tagged.lease_key("e1") == f"plaita:execution:lease:{t}:e1"
    assert tagged.execution_key("e1") == f"plaita:execution:{t}:e1"
    assert tagged.deadlines_key(0) == f"plaita:executions:deadlines:{tagged.tags[0]}"
    assert tagged.index_keeps_key(0) == f"plaita:executions:index-keeps:{tagged.tags[0]}"


def test_a_tenants_keys_follow_the_original_layout_in_the_same_slot() -> None:
    ks = DEFAULT.for_tenant("t1")
    assert ks.tenant == "t1" and ks.ns == "plaita:t1" and ks is DEFAULT.for_tenant("t1")  # cached
    assert ks.execution_key("ID") == "plaita:t1:execution:ID"
    assert ks.lease_key("ID") == "plaita:t1:execution:lease:ID"
    assert ks.fence_key("ID") == "plaita:t1:execution:fence:ID"
    assert ks.cancel_key("ID") == "plaita:t1:execution:cancel:ID"
    assert ks.dedup_key(0, "k") == "plaita:t1:start-dedup:k"
    assert ks.status_key(0, "error") == "plaita:t1:executions:status:error"
    assert ks.deadlines_key(0) == "plaita:t1:executions:deadlines"
    assert ks.index_keeps_key(0) == "plaita:t1:executions:index-keeps"
    assert done_key(ks, "ID", "ID:s:0") == "plaita:t1:execution:children:ID:s:0"
    # The platform's keys are not the tenant's.
    assert ks.stream(0) == DEFAULT.stream(0) and ks.dlq(0) == DEFAULT.dlq(0)
    tagged = Keyspace("q", 4, True).for_tenant("t1")
    t = tagged.tags[tagged.partition_of("ID")]
    assert tagged.execution_key("ID") == f"plaita:t1:execution:{t}:ID"
    assert tagged.lease_key("ID") == f"plaita:t1:execution:lease:{t}:ID"
    # Every key of a tenant's execution is in the execution's partition slot, as the default's.
    assert {hash_tag(tagged.lease_key("ID")), hash_tag(tagged.status_key(tagged.partition_of("ID"), "x"))} == {t}
    # The reclaim's lease prefix of an entry, from its body's raw tenant_id.
    prefix = f"plaita:execution:lease:{t}:"
    assert tenant_prefix(prefix, b"t1") == tagged.lease_prefix(tagged.partition_of("ID")).encode()
    for default in (b"", b"default", b"a:b", b"{p0}", b"\xff"):
        assert tenant_prefix(prefix, default) == prefix.encode()


@pytest.mark.parametrize(
    "tenant", ["a:b", "{p0}", "x{y}", " t", "t\n", "-lead", "x" * 65, "é", 7, ["t"], {"t": 1}, True]
)
def test_a_hostile_tenant_id_is_a_bad_task(tenant: Any) -> None:
    with pytest.raises(BadTaskError, match="tenant_id"):
        validate_body({"type": "start", "flow_id": "f", "execution_id": "e", "tenant_id": tenant})
    with pytest.raises(ValueError):
        DEFAULT.for_tenant(tenant)


@pytest.mark.parametrize("tenant", [None, "", "default", "t1", "Acme.prod-2_x", "x" * 64])
def test_a_valid_tenant_id_is_accepted(tenant: Any) -> None:
    body = validate_body({"type": "resume", "execution_id": "e", "tenant_id": tenant})
    task = Task("1-0", body, 1)
    assert task.tenant_id == ("" if tenant in (None, "", "default") else tenant)


def test_a_step_cannot_stage_writes_to_any_tenants_execution_keys() -> None:
    ctx = StepContext(
        execution_id="e", flow_id="f", step="s", params={}, state={}, results={}, resume=None, attempt=1,
        cancel=CancelFlag(),
    )  # fmt: skip
    for key in ("plaita:t2:execution:e", "plaita:t2:executions:status:running", "plaita:t2:start-dedup:k"):
        with pytest.raises(ValueError, match="belong to the checkpoint"):
            ctx.stage(key, "x")
    with pytest.raises(ValueError, match="belong to the checkpoint"):
        ctx.stage(TENANTS_KEY, "x")
    ctx.stage("plaita:t2:mine", "x")  # a tenant's own data keys are not execution keys
