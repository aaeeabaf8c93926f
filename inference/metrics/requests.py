"""Per-request metrics, from each request's `Ending` (billing.services.settlement): latency histograms,
endings, tokens and spend by tier.

`requests_observe(endings)` runs where a request's ending is recorded
(`inference.worker.finish.endings_record`: the worker's finisher thread,
a failure, the reaper), so every ending is counted once, off the engine's
thread. Times are the client's: from the moment the web process queued the
job (`Job.enqueued_at`), as in the `Done` event's timing.

`billed_observe(endings)` counts tokens and spend when their records are
written (`inference.worker.finish.EndingsSink.write`, at once or later from
the spool after a database outage), from what billing wrote (each ending's
own `Priced`: nothing is priced here). A record the spool writes again after
a crash is counted again (the insert ignores it). Spend is an integer counter
of nano-dollars (1e-9 USD), each record's cost rounded up to a whole
nano-dollar as the admission's budget counters count it
(`billing.counters.units.cost_femtos_to_nanos`): a float64 counter is
exact to 2**53 of them, about 9 million dollars per process.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable
from typing import TYPE_CHECKING

from prometheus_client import Counter, Histogram

from . import PREFIX

if TYPE_CHECKING:
    from billing.services.settlement import Ending

logger = logging.getLogger(__name__)

LABELS = ["model_name", "tier"]

# vLLM's buckets (vllm/v1/metrics/loggers.py)
TTFT_BUCKETS = (0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0, 20.0,
                40.0, 80.0, 160.0, 640.0, 2560.0)
TPOT_BUCKETS = (0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.4, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0, 20.0, 40.0,
                80.0)
REQUEST_LATENCY_BUCKETS = (0.3, 0.5, 0.8, 1.0, 1.5, 2.0, 2.5, 5.0, 10.0, 15.0, 20.0, 30.0, 40.0, 50.0, 60.0, 120.0,
                           240.0, 480.0, 960.0, 1920.0, 7680.0)
TOKEN_BUCKETS = (1, 2, 5, 10, 20, 50, 100, 200, 500, 1000, 2000, 5000, 10000, 20000, 50000, 100000)

TIME_TO_FIRST_TOKEN = Histogram(f"{PREFIX}time_to_first_token_seconds",
                                "Histogram of time to first token in seconds.", LABELS, buckets=TTFT_BUCKETS)
TIME_PER_OUTPUT_TOKEN = Histogram(f"{PREFIX}time_per_output_token_seconds",
                                  "Histogram of time per output token in seconds (a request's mean inter-token "
                                  "latency after its first token).", LABELS, buckets=TPOT_BUCKETS)
E2E_REQUEST_LATENCY = Histogram(f"{PREFIX}e2e_request_latency_seconds",
                                "Histogram of e2e request latency in seconds.", LABELS,
                                buckets=REQUEST_LATENCY_BUCKETS)
REQUEST_QUEUE_TIME = Histogram(f"{PREFIX}request_queue_time_seconds",
                               "Histogram of time spent in WAITING phase for request.", LABELS,
                               buckets=REQUEST_LATENCY_BUCKETS)
REQUEST_PROMPT_TOKENS = Histogram(f"{PREFIX}request_prompt_tokens", "Number of prefill tokens processed.", LABELS,
                                  buckets=TOKEN_BUCKETS)
REQUEST_GENERATION_TOKENS = Histogram(f"{PREFIX}request_generation_tokens", "Number of generation tokens processed.",
                                      LABELS, buckets=TOKEN_BUCKETS)
REQUEST_SUCCESS = Counter(f"{PREFIX}request_success", "Count of processed requests by how they finished.",
                          LABELS + ["finished_reason"])
BILLED_TOKENS = Counter(f"{PREFIX}billed_tokens",
                        "Tokens of written usage records by kind (input: uncached prompt, cached_input, output).",
                        LABELS + ["kind"])
SPEND_NANODOLLARS = Counter(f"{PREFIX}spend_nanodollars",
                            "Cost of written usage records, in nano-dollars (each record rounded up).", LABELS)


def requests_observe(endings: Iterable[Ending]) -> None:
    """Count the endings and observe the latencies of finished requests. Never raises."""
    try:
        for ending in endings:
            _observe(ending)
    except Exception:  # noqa: BLE001 - metrics must never cost a request its record or its event
        logger.exception("request metrics failed")


def billed_observe(endings: Iterable[Ending]) -> None:
    """Count the tokens and spend of endings whose records were just written (what the ledger holds), each
    with the cost it was written at. Never raises."""
    try:
        from billing.money import cached_clamp
        from billing.counters.units import cost_femtos_to_nanos
        from billing.services.costs import is_charged

        for ending in endings:
            if not is_charged(finish_reason=ending.finish_reason, completion_tokens=ending.completion_tokens):
                continue  # an error before the first token
            labels = _labels(ending)
            prompt = max(0, ending.prompt_tokens)
            cached = cached_clamp(prompt_tokens=prompt, cached_tokens=ending.cached_tokens)
            for kind, count in (("input", prompt - cached), ("cached_input", cached),
                                ("output", max(0, ending.completion_tokens))):
                if count:
                    BILLED_TOKENS.labels(*labels, kind).inc(count)
            spend = cost_femtos_to_nanos(ending.cost.total) if ending.cost is not None else 0
            if spend:
                SPEND_NANODOLLARS.labels(*labels).inc(spend)
    except Exception:  # noqa: BLE001
        logger.exception("billed-token metrics failed")


def _labels(ending: Ending) -> tuple[str, str]:
    return str(ending.model or ""), str(ending.tier or "")


def _observe(ending: Ending) -> None:
    labels = _labels(ending)
    completion = max(0, int(ending.completion_tokens or 0))
    e2e = float(ending.duration_s or 0.0)
    ttft = ending.ttft_s
    REQUEST_SUCCESS.labels(*labels, str(ending.finish_reason or "")).inc()
    E2E_REQUEST_LATENCY.labels(*labels).observe(e2e)
    REQUEST_QUEUE_TIME.labels(*labels).observe(float(ending.queued_s or 0.0))
    REQUEST_PROMPT_TOKENS.labels(*labels).observe(int(ending.prompt_tokens or 0))
    REQUEST_GENERATION_TOKENS.labels(*labels).observe(completion)
    if ttft is not None:
        TIME_TO_FIRST_TOKEN.labels(*labels).observe(float(ttft))
        if completion > 1:
            TIME_PER_OUTPUT_TOKEN.labels(*labels).observe(max(0.0, e2e - float(ttft)) / (completion - 1))
