"""The pull policy: which (model, tier) queue a worker with room takes from next.

Across tiers: smooth weighted round-robin (the "SWRR" of nginx's upstream
balancer) over the tiers that have queued work, weighted by Tier.queue_weight.
Each pick adds every eligible tier's weight to its running credit, takes the
tier with the most credit and charges it the sum of the eligible weights. A tier
of weight w therefore gets w / sum(weights) of the pulls while it has work, and
the picks are spread out: weights 8:1 give e e e e f e e e e, never a run of
eight before the free tier moves. With a fresh state the heaviest tier goes
first, so a saturated worker that frees one slot serves an enterprise job
queued after free ones before them.

Why not strict priority: under sustained enterprise load a strict order never
serves the lower tiers at all. With weights they slow down in proportion
instead of stopping, and the engine still runs higher tiers first among what
it holds, because every job carries its tier's engine priority.

Inside a tier: round-robin across tenants. Each (model, tier) keeps a ring of
the tenants that have queued jobs and a FIFO sub-queue per tenant. Taking a job
pops the tenant at the head of the ring, takes that tenant's oldest job and puts
the tenant back at the tail if it has more, so a tenant that floods its tier
with a thousand jobs gets one turn per round like everybody else. `TenantRing`
below is that structure for the in-process backend; the Redis backend keeps
the same ring in Redis lists, changed only inside its Lua scripts
(redis_scripts.py), so both backends serve jobs in the same order.
"""

from __future__ import annotations

import logging
import threading
import time
from collections import deque
from collections.abc import Callable, Mapping

from common.cache import TtlCache
from tenants.models import Tier

logger = logging.getLogger(__name__)

DEFAULT_WEIGHT = 1
WeightSource = Mapping[str, int] | Callable[[], Mapping[str, int]] | None


class TierSelector:
    """Smooth weighted round-robin over tiers; one per queue client, thread-safe."""

    def __init__(self, weights: WeightSource = None) -> None:
        self._source = weights
        self._credit: dict[str, int] = {}
        self._lock = threading.Lock()

    def weights(self) -> Mapping[str, int]:
        source = self._source
        if source is None:
            return {}
        return source() if callable(source) else source

    def plan(self, depths: Mapping[str, int], n: int) -> list[str]:
        """The tiers to take the next `n` jobs from (fewer if less is queued).

        `depths` maps tier -> queued jobs for one model. A tier may appear
        several times in the plan, never more often than it has jobs.
        """
        remaining = {tier: int(depth) for tier, depth in depths.items() if int(depth) > 0}
        if n <= 0 or not remaining:
            return []
        weights = self.weights()
        weight = {tier: max(DEFAULT_WEIGHT, int(weights.get(tier, DEFAULT_WEIGHT) or 0)) for tier in remaining}
        plan: list[str] = []
        with self._lock:
            # A tier that has nothing queued keeps no credit: coming back after
            # a quiet spell must not give it a burst of pulls.
            for tier in list(self._credit):
                if tier not in remaining:
                    del self._credit[tier]
            while remaining and len(plan) < n:
                total = sum(weight[tier] for tier in remaining)
                for tier in remaining:
                    self._credit[tier] = self._credit.get(tier, 0) + weight[tier]
                # Most credit wins; ties go to the heavier tier, then by name.
                pick = max(remaining, key=lambda tier: (self._credit[tier], weight[tier], tier))
                self._credit[pick] -= total
                plan.append(pick)
                remaining[pick] -= 1
                if remaining[pick] == 0:
                    del remaining[pick]
                    self._credit.pop(pick, None)
        return plan


class TenantRing:
    """FIFO sub-queues per tenant, served round-robin (not thread-safe: the caller locks).

    Invariant: a tenant is in the ring exactly when its sub-queue is non-empty.
    """

    def __init__(self) -> None:
        self.ring: deque[str] = deque()
        self.queues: dict[str, deque[str]] = {}
        self.size = 0

    def push(self, tenant: str, item: str, *, front: bool = False) -> None:
        queue = self.queues.get(tenant)
        if queue is None:
            queue = self.queues[tenant] = deque()
        if front:
            queue.appendleft(item)
            # A requeued job goes first, and so does its tenant.
            if tenant in self.ring:
                self.ring.remove(tenant)
            self.ring.appendleft(tenant)
        else:
            queue.append(item)
            if len(queue) == 1:
                self.ring.append(tenant)
        self.size += 1

    def pop(self) -> str | None:
        if not self.ring:
            return None
        return self.pop_from(self.ring[0])

    def pop_from(self, tenant: str) -> str:
        """The oldest item of `tenant` (in the ring); the tenant goes to the tail if it has more
        (queue.routing takes a tenant further down the ring this way)."""
        self.ring.remove(tenant)
        queue = self.queues[tenant]
        item = queue.popleft()
        if queue:
            self.ring.append(tenant)
        else:
            del self.queues[tenant]
        self.size -= 1
        return item

    def heads(self, n: int) -> list[tuple[str, str]]:
        """(tenant, its oldest item) of the first `n` tenants of the ring."""
        return [(tenant, self.queues[tenant][0]) for tenant in list(self.ring)[:n]]

    def remove(self, tenant: str, item: str) -> bool:
        queue = self.queues.get(tenant)
        if not queue or item not in queue:
            return False
        queue.remove(item)
        if not queue:
            del self.queues[tenant]
            self.ring.remove(tenant)
        self.size -= 1
        return True


class DbTierWeights:
    """Tier.queue_weight by tier name, read from the database at most every `ttl` seconds.

    Any failure (no database in this thread, table missing) keeps the last
    known weights until the next read; unknown tiers weigh DEFAULT_WEIGHT.
    Called from a worker's threads: one of them reads, the others wait for it.
    """

    def __init__(self, ttl: float = 10.0, *, clock: Callable[[], float] = time.monotonic) -> None:
        self.ttl = ttl
        self._weights: Mapping[str, int] = {}  # the last known
        self._cache: TtlCache[str, Mapping[str, int]] = TtlCache("tier weights", ttl=ttl, max_entries=1, clock=clock)

    def __call__(self) -> Mapping[str, int]:
        return self._cache.get_or_load("weights", self._read)

    def _read(self) -> Mapping[str, int]:
        try:
            self._weights = dict(Tier.objects.values_list("name", "queue_weight"))
        except Exception as exc:  # noqa: BLE001 - weights are advisory; never stop a worker
            logger.debug("tier weights unavailable, keeping the last known: %s", exc)
        return self._weights
