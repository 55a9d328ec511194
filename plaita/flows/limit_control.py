"""A flow's fleet-wide limits changed at run time, without restarting a worker (``plaita limits``).

    control = LimitControl(FlowClient.from_url(url))
    control.set("charge", max_concurrent=2)        # every worker obeys it at its next acquire
    control.set("charge", max_concurrent_per_key=3)
    control.show("charge")                          # [{"flow_id": "charge", "max_concurrent": 2, ...}]
    control.clear("charge")                         # the limits the flow declares hold again

The record overrides limits the flow declares (``max_concurrent``, ``max_starts_per_s``,
``max_concurrent_per_key``); it does not add one to a flow that declares none (such a flow is
never checked: no round trip per task for it). Lowering a limit stops new starts from taking
the freed slots; running executions finish. Raising one gives the new free slots to the parked
starts at once. See ``plaita.store.executions.limit_overrides``.
"""

from __future__ import annotations

from typing import Any

from plaita.config import DEFAULT_LEASE_TTL_S
from plaita.flows.producer.client import FlowClient
from plaita.store.executions.limit_overrides import LimitOverrides, checked


class LimitControl:
    """Set, clear and show the run-time limits of the flows of ``flows``' queue. ``ttl_s``: the
    workers' lease ttl (a slot reserved here for a parked start lives that long if its start is
    never read)."""

    def __init__(self, flows: FlowClient, *, ttl_s: float = DEFAULT_LEASE_TTL_S) -> None:
        self._overrides = LimitOverrides.sharing(flows.store, ttl_s=ttl_s)

    def set(
        self,
        flow_id: str,
        *,
        max_concurrent: int | None = None,
        max_starts_per_s: float | None = None,
        max_concurrent_per_key: int | None = None,
    ) -> None:
        """Override the given limits of ``flow_id`` (the others are kept); ConfigError for a bad
        value or none given."""
        self._overrides.set(flow_id, checked(max_concurrent, max_starts_per_s, max_concurrent_per_key))

    def clear(self, flow_id: str) -> bool:
        """Drop ``flow_id``'s overrides; False if it had none."""
        return self._overrides.clear(flow_id)

    def show(self, flow_id: str | None = None) -> list[dict[str, Any]]:
        """``flow_id``'s overrides (None: not overridden) and its running and parked counts; or
        those of every flow with overrides or parked starts."""
        return [row.as_dict() for row in self._overrides.show(flow_id)]
