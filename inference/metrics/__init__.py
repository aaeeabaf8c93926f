"""Prometheus metrics: the engine's, the requests', the gateway's, and the figures a leak would move.

Names and label sets mirror vLLM's (`vllm:time_to_first_token_seconds` is
`llmp:time_to_first_token_seconds` here, same buckets and `model_name`
label), so its dashboards and alerts carry over by replacing the prefix.
Labels are `model_name` and, on request-level and gateway metrics, `tier`:
never a tenant or an API key (one series per tenant would not scale).

- `inference.metrics.engine_stats`: engine figures (running, waiting, KV cache,
  prefix cache, preemptions, tokens), gathered by the worker loop from
  `Engine.stats()` at each heartbeat: the engine itself knows nothing of
  Prometheus.
- `inference.metrics.requests`: per-request histograms and counters, from
  each request's usage record (`inference.worker.finish`), tokens and spend by tier.
- `inference.metrics.gateway`: HTTP responses by status (an ASGI wrapper),
  refusals before the queue by error code.
- `inference.metrics.live`: what is read when scraped: queue depth per model
  and tier, admission reservations and concurrency slots held, live workers,
  and per process open file descriptors, resident memory, database connections.
- `inference.metrics.exposition`: `/metrics` of a web process (every uvicorn
  worker aggregated in multiprocess mode, PROMETHEUS_MULTIPROC_DIR) and
  `run_worker --metrics-port`.
"""

from prometheus_client import disable_created_metrics

PREFIX = "llmp:"

disable_created_metrics()  # no `_created` series beside each counter and histogram (as vLLM serves them)
