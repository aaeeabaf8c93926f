"""Engine figures, as vLLM names them, gathered by a worker from `Engine.stats()`.

The worker loop calls `EngineMetrics.update(stats, active=...)` at each
heartbeat (about once a second, on the loop's own thread: the stats it
reports anyway), so the engine step pays nothing for them. The engine's
token, preemption and prefix-cache figures are cumulative: each update adds
what they grew by since the last one.

Gauges are summed over live processes in multiprocess mode (several
embedded engines, one per process); the KV-cache fraction takes the largest.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping

from prometheus_client import Counter, Gauge

from . import PREFIX

logger = logging.getLogger(__name__)

LABELS = ["model_name"]

NUM_REQUESTS_RUNNING = Gauge(f"{PREFIX}num_requests_running", "Number of requests in model execution batches.",
                             LABELS, multiprocess_mode="livesum")
NUM_REQUESTS_WAITING = Gauge(f"{PREFIX}num_requests_waiting", "Number of requests waiting to be processed.",
                             LABELS, multiprocess_mode="livesum")
KV_CACHE_USAGE = Gauge(f"{PREFIX}kv_cache_usage_perc", "KV-cache usage. 1 means 100 percent usage.", LABELS,
                       multiprocess_mode="livemax")
KV_CACHE_BLOCKS_USED = Gauge(f"{PREFIX}kv_cache_blocks_used",
                             "KV-cache blocks held by requests (cached blocks nobody holds are free).", LABELS,
                             multiprocess_mode="livesum")
KV_CACHE_BLOCKS = Gauge(f"{PREFIX}kv_cache_blocks", "KV-cache blocks of the engine.", LABELS,
                        multiprocess_mode="livesum")
KV_CACHE_SIZE = Gauge(f"{PREFIX}kv_cache_size_bytes",
                      "Bytes of the engine's KV cache (chosen at start: inference.engine.kv_sizing).", LABELS,
                      multiprocess_mode="livesum")
KV_CACHE_TOKENS = Gauge(f"{PREFIX}kv_cache_capacity_tokens", "Tokens the engine's KV cache holds.", LABELS,
                        multiprocess_mode="livesum")
WORKER_REQUESTS_ACTIVE = Gauge(f"{PREFIX}worker_requests_active",
                               "Requests a worker holds (leased, in its engine or being finished).", LABELS,
                               multiprocess_mode="livesum")
PREFIX_CACHE_QUERIES = Counter(f"{PREFIX}prefix_cache_queries",
                               "Prefix cache queries, in terms of number of queried tokens.", LABELS)
PREFIX_CACHE_HITS = Counter(f"{PREFIX}prefix_cache_hits", "Prefix cache hits, in terms of number of cached tokens.",
                            LABELS)
NUM_PREEMPTIONS = Counter(f"{PREFIX}num_preemptions", "Cumulative number of preemption from the engine.", LABELS)
PROMPT_TOKENS = Counter(f"{PREFIX}prompt_tokens", "Number of prefill tokens processed.", LABELS)
GENERATION_TOKENS = Counter(f"{PREFIX}generation_tokens", "Number of generation tokens processed.", LABELS)
# speculative decoding (vLLM's spec_decode counters): acceptance rate = accepted / draft tokens; accepted
# tokens per drafting step = 1 + accepted / drafts
SPEC_DRAFTS = Counter(f"{PREFIX}spec_decode_num_drafts", "Number of spec decoding drafts.", LABELS)
SPEC_DRAFT_TOKENS = Counter(f"{PREFIX}spec_decode_num_draft_tokens", "Number of draft tokens.", LABELS)
SPEC_ACCEPTED_TOKENS = Counter(f"{PREFIX}spec_decode_num_accepted_tokens", "Number of accepted tokens.", LABELS)

# engine stats key -> the counter that follows it
_CUMULATIVE = {
    "prefix_cache_queries": PREFIX_CACHE_QUERIES,
    "prefix_cache_hits": PREFIX_CACHE_HITS,
    "preemptions": NUM_PREEMPTIONS,
    "prompt_tokens": PROMPT_TOKENS,
    "generated_tokens": GENERATION_TOKENS,
    "spec_decode_num_drafts": SPEC_DRAFTS,
    "spec_decode_num_draft_tokens": SPEC_DRAFT_TOKENS,
    "spec_decode_num_accepted_tokens": SPEC_ACCEPTED_TOKENS,
}


class EngineMetrics:
    """One worker's engine figures (labelled with its model)."""

    def __init__(self, *, model: str) -> None:
        self.model = model
        self._last: dict[str, float] = {}
        self._gauges = {gauge: gauge.labels(model) for gauge in (
            NUM_REQUESTS_RUNNING, NUM_REQUESTS_WAITING, KV_CACHE_USAGE, KV_CACHE_BLOCKS_USED, KV_CACHE_BLOCKS,
            KV_CACHE_SIZE, KV_CACHE_TOKENS, WORKER_REQUESTS_ACTIVE)}
        self._counters = {key: counter.labels(model) for key, counter in _CUMULATIVE.items()}

    def update(self, stats: Mapping[str, object] | None, *, active: int) -> None:
        """Set the gauges and advance the counters from one `Engine.stats()`; never raises."""
        try:
            self._gauges[WORKER_REQUESTS_ACTIVE].set(active)
            if not stats:
                return
            gauges = self._gauges
            gauges[NUM_REQUESTS_RUNNING].set(float(stats.get("running", 0)))
            gauges[NUM_REQUESTS_WAITING].set(float(stats.get("waiting", 0)))
            gauges[KV_CACHE_USAGE].set(float(stats.get("kv_usage", 0.0)))
            num_blocks = stats.get("num_blocks")
            if num_blocks is not None:
                gauges[KV_CACHE_BLOCKS].set(float(num_blocks))
                gauges[KV_CACHE_BLOCKS_USED].set(float(num_blocks) - float(stats.get("free_blocks", num_blocks)))
            for gauge, key in ((KV_CACHE_SIZE, "kv_cache_bytes"), (KV_CACHE_TOKENS, "kv_cache_tokens")):
                if stats.get(key) is not None:
                    gauges[gauge].set(float(stats[key]))
            for key, counter in self._counters.items():
                value = stats.get(key)
                if value is None:
                    continue
                value = float(value)
                grown = value - self._last.get(key, 0.0)
                if grown < 0:  # a new engine (the worker restarted it): its figures start again
                    grown = value
                if grown:
                    counter.inc(grown)
                self._last[key] = value
        except Exception:  # noqa: BLE001 - metrics must never cost the worker a request
            logger.exception("engine metrics update failed")
