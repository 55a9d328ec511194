"""The keeper's claimed deadlines: what happens to a due suspension between its claim and its
wake (``plaita.flows.keeper.keeper``).

The claim (``KeeperTenantIO.due_deadlines``) holds a due deadline for one keeper lease, so a
keeper killed before its enqueue leaves it to the keeper that takes over the lease. Afterwards
each claimed deadline is moved on (``unclaim_deadlines``, which touches only a member still at the
claim's score): one whose wake was not sent is due again at once (``take_back``; remembered and
retried by ``retake`` when Redis refused that too), one whose wake was sent waits the cooldown
(``cool_down``).
"""

from __future__ import annotations

import logging

from plaita.flows.keeper_io import KeeperTenantIO

logger = logging.getLogger("plaita.flows.keeper.keeper")  # the keeper's own log

#: Claims remembered for a later take-back at most; past this they wait the hold out instead.
MAX_UNTAKEN = 10_000


class DeadlineClaims:
    """One keeper's claimed deadlines whose take-back Redis refused, per tenant."""

    def __init__(self, cooldown_s: float) -> None:
        self.cooldown_s = cooldown_s
        #: Per tenant: {execution id: (claim's score, due score)}, retried each pass.
        self._untaken: dict[str, dict[str, tuple[float, float]]] = {}

    def pending(self) -> bool:
        """Whether a take-back is still to be done (the next deadline check runs a pass)."""
        return any(self._untaken.values())

    def cool_down(
        self, store: KeeperTenantIO, eids: list[str], claim_at_s: float, now_s: float, *, quiet: bool
    ) -> None:
        """Re-arm claimed deadlines that were acted on for the cooldown. If Redis fails it, they
        are due again when the hold ends: a wake sent twice, which its suspension's number makes
        harmless. ``quiet``: a pass already failing keeps its own error."""
        if not eids or claim_at_s >= now_s + self.cooldown_s:
            return
        try:
            store.unclaim_deadlines(eids, claim_at_s, now_s + self.cooldown_s)
        except Exception:
            if not quiet:
                raise

    def take_back(self, store: KeeperTenantIO, eids: list[str], claim_at_s: float, due_at_s: float) -> None:
        """Make claimed deadlines whose task was not sent due again (best effort); if Redis
        fails that too, remember them for the next pass."""
        if not eids:
            return
        try:
            store.unclaim_deadlines(eids, claim_at_s, due_at_s)
        except Exception:
            held = self._untaken.setdefault(store.tenant, {})
            if sum(map(len, self._untaken.values())) + len(eids) <= MAX_UNTAKEN:
                held.update(dict.fromkeys(eids, (claim_at_s, due_at_s)))  # past the bound: the hold

    def retake(self, store: KeeperTenantIO) -> None:
        """Take back what ``take_back`` could not (Redis failed then too); failing again, they
        stay remembered and the pass goes on (its own claim fails the same way if Redis is down)."""
        held = self._untaken.get(store.tenant)
        if not held:
            return
        by_claim: dict[tuple[float, float], list[str]] = {}
        for eid, claim in held.items():
            by_claim.setdefault(claim, []).append(eid)
        try:
            for (claim_at_s, due_at_s), eids in by_claim.items():
                store.unclaim_deadlines(eids, claim_at_s, due_at_s)
                for eid in eids:
                    held.pop(eid)
        except Exception as exc:
            logger.debug("keeper: deadlines not taken back yet (%s: %s)", type(exc).__name__, exc)
