"""Prefix-aware routing: a worker prefers the queued jobs whose prompt prefix its KV cache holds.

Why: with several workers of one model on a shared pull queue, a prompt whose prefix (a tenant's system
prompt, a few-shot preamble, a conversation so far) is cached on worker A is as likely to be pulled by
worker B and prefilled again. vLLM's production-stack router (`prefixaware`) and SGLang's router keep an
approximate map of which replica served which prefix and send a request where its longest prefix went;
this is the same idea on a pull queue.

How, in three parts:

- Keys (web side, `prefix_keys`): a job carries the routing keys of its prompt's first blocks: a chain
  hash over ROUTING_BLOCK_TOKENS-token blocks seeded with the tenant's cache salt (the same salt that
  partitions the engine's prefix cache), taken at 1, 2, 4, 8, ... full blocks (at most MAX_KEYS of them).
  Different tenants never share a key, so no tenant's traffic gives another an affinity signal, and a
  key is a truncated SHA-256: it tells nothing of the tokens.
- Affinity (queue side): per model, key -> the worker that took the first job with that key while no
  live worker held it. A worker owns at most `keys_per_worker` keys (its oldest dropped first), roughly
  what its prefix cache holds. This is the advertisement: approximate (the engine may have evicted the
  blocks since), like the routers above, and kept inside the queue's own atomic operations.
- Preference (lease): a worker pulling from a tier looks at the head job of each of the first `scan`
  tenants of the tier's round-robin ring (so a tenant's jobs still run in order and tenants still take
  turns). It takes the first one that (a) has no live preferred worker, (b) prefers it, (c) prefers a
  worker that reported no room at its last intake, (d) prefers a worker holding `balance` or more jobs
  than this one (SGLang's router balances the same way past an imbalance threshold: an idle worker does
  not wait while another has work), or (e) has waited `steal_after_s` or longer (work stealing: no job
  waits on its preferred worker past the bound). The preferred worker is the live
  owner of the job's deepest key with one. A worker that skips a job for another wakes that worker.
- Step-aware wait: at each intake a busy worker reports, beside its room, how long it takes between intakes
  (the worker loop's moving average of a pass: one engine step and its hand-overs). A job then waits on its
  busy preferred worker only while that worker is expected back in time: it is taken by another at once
  when the owner's next intake is expected after the job's bound, or when the owner is late (its last
  intake plus LATE_FACTOR intervals plus LATE_SLACK_S has passed: it is in a long step, such as a big
  prefill). An idle preferred worker is woken and comes at once, so it reports no interval.

A worker that dies is no longer live once its heartbeat expires: its keys stop attracting work at once
and the next worker to take such a job claims them. A job skipped for another worker never leaves the
queue, so nothing is lost when that worker dies. With one worker per model every job has no other live
preferred worker and the order is exactly the plain tier/tenant order.

Settings (platform_site.settings): QUEUE_ROUTING (`prefix`, the default, or `off`),
QUEUE_ROUTING_STEAL_S (0.25), QUEUE_ROUTING_SCAN (32 tenants per tier), QUEUE_ROUTING_KEYS_PER_WORKER
(4096), QUEUE_ROUTING_BALANCE (2), ROUTING_BLOCK_TOKENS (16, the engine's default block size). deploy/docs/scaling.md explains
when to change them.
"""

from __future__ import annotations

import hashlib
import struct
from collections import OrderedDict
from collections.abc import Callable, Sequence
from dataclasses import dataclass

MAX_KEYS = 10  # 1, 2, 4, ... 512 blocks: prompts up to 8k tokens at 16-token blocks
ROUTING_BLOCK_TOKENS = 16
LATE_FACTOR = 2  # a busy worker is late when LATE_FACTOR of its intake intervals (plus the slack) have passed
LATE_SLACK_S = 0.01
ROOM_TTL_S = 5.0  # a worker's reported room counts this long (it reports at every intake, at least every ~1 s)


@dataclass(frozen=True, slots=True)
class RoutingPolicy:
    enabled: bool = True
    steal_after_s: float = 0.25  # a job waits at most this long on a preferred worker that has room
    scan: int = 32  # tenants looked at per tier and pull
    keys_per_worker: int = 4096
    balance: int = 2  # a job is taken at once by a worker holding this many fewer jobs than its preferred one

    @classmethod
    def off(cls) -> "RoutingPolicy":
        return cls(enabled=False)

    @classmethod
    def from_settings(cls) -> "RoutingPolicy":
        from django.conf import settings

        if str(getattr(settings, "QUEUE_ROUTING", "prefix")).lower() in ("off", "0", "none", "false"):
            return cls.off()
        return cls(steal_after_s=float(settings.QUEUE_ROUTING_STEAL_S), scan=max(1, int(settings.QUEUE_ROUTING_SCAN)),
                   keys_per_worker=max(1, int(settings.QUEUE_ROUTING_KEYS_PER_WORKER)),
                   balance=max(1, int(settings.QUEUE_ROUTING_BALANCE)))


def prefix_keys(token_ids: Sequence[int], salt: str, *, block_tokens: int = ROUTING_BLOCK_TOKENS,
                max_keys: int = MAX_KEYS) -> list[str]:
    """The routing keys of a prompt, shallowest first: the chain hash of its first 1, 2, 4, ... full blocks.

    A prompt shorter than one block has none (nothing worth routing for)."""
    full = len(token_ids) // block_tokens
    keys: list[str] = []
    digest = hashlib.sha256(b"llmp-route\0" + salt.encode()).digest()
    checkpoint = 1
    for block in range(1, full + 1):
        chunk = token_ids[(block - 1) * block_tokens:block * block_tokens]
        digest = hashlib.sha256(digest + struct.pack(f"<{block_tokens}q", *chunk)).digest()
        if block == checkpoint:
            keys.append(digest[:8].hex())
            if len(keys) >= max_keys:
                break
            checkpoint *= 2
    return keys


class AffinityTable:
    """The in-process backend's affinity state (the Redis backend keeps the same in Lua: redis_scripts.LEASE).
    Not thread-safe: the queue's lock is held."""

    def __init__(self) -> None:
        self.owner: dict[tuple[str, str], str] = {}  # (model, key) -> worker
        self.owned: dict[str, OrderedDict[tuple[str, str], None]] = {}  # worker -> its keys, oldest first
        self.room: dict[str, tuple[int, float, float]] = {}  # worker -> (room, reported at (monotonic), interval)

    def preferred(self, model: str, keys: Sequence[str], live: Callable[[str], bool]) -> str | None:
        for key in reversed(keys):
            worker = self.owner.get((model, key))
            if worker is not None and live(worker):
                return worker
        return None

    def has_room(self, worker: str, now: float) -> bool:
        room, at, _ = self.room.get(worker, (0, 0.0, 0.0))
        return room > 0 and now - at < ROOM_TTL_S

    def report(self, worker: str, room: int, now: float, every: float, busy: bool) -> None:
        """A worker's intake: the jobs it could take and, while busy, the seconds between its intakes."""
        self.room[worker] = (room, now, every if busy else 0.0)

    def owner_wait(self, worker: str, now: float, left: float) -> float:
        """How long of `left` (the job's time to its bound) a job may wait on its busy preferred `worker`:
        0 when that worker is not expected back in time or is late (module docstring), else `left` or less."""
        _, at, every = self.room.get(worker, (0, 0.0, 0.0))
        if every <= 0:
            return left
        late = at + LATE_FACTOR * every + LATE_SLACK_S - now
        if at + every - now >= left or late <= 0:
            return 0.0
        return min(left, late)

    def claim(self, model: str, keys: Sequence[str], worker: str, live: Callable[[str], bool], cap: int) -> None:
        """After `worker` took a job: the keys nobody live holds become its own, its own are refreshed."""
        mine = self.owned.setdefault(worker, OrderedDict())
        for key in keys:
            holder = self.owner.get((model, key))
            if holder is None or holder == worker or not live(holder):
                self.owner[(model, key)] = worker
                mine[(model, key)] = None
                mine.move_to_end((model, key))
        while len(mine) > cap:
            old, _ = mine.popitem(last=False)
            if self.owner.get(old) == worker:
                del self.owner[old]

    def forget(self, worker: str) -> None:
        for key in self.owned.pop(worker, {}):
            if self.owner.get(key) == worker:
                del self.owner[key]
        self.room.pop(worker, None)
