"""/metrics of a real uvicorn process in the embedded mode (the session's shared server, real SmolLM2 engine).

Real requests move the counters: completions (their tokens, spend and latencies),
a bad key (401), a tenant over its requests-per-minute limit (429, one
refusal); afterwards nothing is held (KV blocks, reservations, slots), and every
metric the Grafana dashboard queries is on the page.
"""

from __future__ import annotations

import math
from decimal import Decimal

import httpx
import pytest

from tests.e2e.processes import MODEL, api_key_new, embedded_server_shared, manage, wait_until
from tests.inference.metrics_helpers import Scrape, grafana_metric_names

pytestmark = [pytest.mark.slow]


def chat(url: str, key: str, **body) -> httpx.Response:
    return httpx.post(f"{url}/v1/chat/completions", headers={"Authorization": f"Bearer {key}"}, timeout=300,
                      json={"model": MODEL, "messages": [{"role": "user", "content": "Count to five."}],
                            "max_tokens": 6, "temperature": 0, **body})


@pytest.fixture(scope="module")
def traffic(tmp_path_factory, pytestconfig):
    """(server, scrape before, scrape after, what the clients were told)."""
    server = embedded_server_shared(tmp_path_factory, pytestconfig)
    limited = api_key_new(server.env, tenant="t-metrics-rpm", tier="free")
    manage(server.env, "limits_set", "--tenant", "t-metrics-rpm", "--rpm", "1")
    chat(server.url, server.keys["pro"], max_tokens=1)  # the engine is loaded before the first scrape
    before = Scrape.get(server.url)
    usages = [chat(server.url, server.keys["pro"]).json()["usage"] for _ in range(2)]
    unauthorized = chat(server.url, "sk-not-a-key")
    statuses = [chat(server.url, limited, max_tokens=2).status_code for _ in range(2)]
    told = {"usages": usages, "unauthorized": unauthorized.status_code, "limited": statuses}

    output = sum(usage["completion_tokens"] for usage in usages)

    def settled():
        after = Scrape.get(server.url)
        done = after.total("llmp:request_success_total", tier="pro") - before.total("llmp:request_success_total",
                                                                                     tier="pro")
        idle = (after.total("llmp:kv_cache_blocks_used") == 0 and after.total("llmp:admission_reservations_held") == 0
                and after.total("llmp:worker_requests_active") == 0)
        # the engine's own counters reach the page with the worker's next heartbeat (about a second later)
        beat = grew(before, after, "llmp:generation_tokens_total", model_name=MODEL) >= output
        return after if done >= 2 and idle and beat else None

    after = wait_until(settled, timeout=30, what="the requests' metrics and an idle engine")
    return server, before, after, told


def grew(before: Scrape, after: Scrape, name: str, **labels: str) -> float:
    return after.total(name, **labels) - before.total(name, **labels)


def test_the_page_parses_and_names_the_engine_the_requests_and_the_gateway(traffic):
    _server, _before, after, _told = traffic
    families = {family.name for family in after.families}
    for name in ("llmp:time_to_first_token_seconds", "llmp:time_per_output_token_seconds",
                 "llmp:e2e_request_latency_seconds", "llmp:request_queue_time_seconds", "llmp:num_requests_running",
                 "llmp:num_requests_waiting", "llmp:kv_cache_usage_perc", "llmp:prefix_cache_queries",
                 "llmp:prefix_cache_hits", "llmp:num_preemptions", "llmp:prompt_tokens", "llmp:generation_tokens",
                 "llmp:request_success", "llmp:http_requests", "llmp:admission_refusals", "llmp:queue_depth",
                 "llmp:queue_oldest_age_seconds", "llmp:requests_waiting_for_worker", "llmp:billed_tokens", "llmp:spend_nanodollars"):
        assert name in families, name
    labels = {key for sample in after.samples if sample.name.startswith("llmp:") for key in sample.labels}
    assert not labels & {"tenant", "tenant_id", "api_key", "api_key_id", "key"}  # cardinality: never per tenant


def test_counters_move_with_the_requests_that_were_served(traffic):
    _server, before, after, told = traffic
    assert told["unauthorized"] == 401 and told["limited"] == [200, 429]
    pro = {"model_name": MODEL, "tier": "pro"}
    assert grew(before, after, "llmp:request_success_total", **pro) == 2
    assert grew(before, after, "llmp:request_success_total", model_name=MODEL, tier="free") == 1
    assert grew(before, after, "llmp:time_to_first_token_seconds_count", **pro) == 2
    assert grew(before, after, "llmp:e2e_request_latency_seconds_count", **pro) == 2
    assert grew(before, after, "llmp:http_requests_total", handler="chat_completions", status="200") == 3
    assert grew(before, after, "llmp:http_requests_total", handler="chat_completions", status="401") == 1
    assert grew(before, after, "llmp:http_requests_total", handler="chat_completions", status="429") == 1
    assert grew(before, after, "llmp:admission_refusals_total", model_name=MODEL, tier="free",
                code="rate_limit_exceeded") == 1
    usages = told["usages"]
    output = sum(usage["completion_tokens"] for usage in usages)
    assert grew(before, after, "llmp:billed_tokens_total", kind="output", **pro) == output
    prompt = sum(usage["prompt_tokens"] for usage in usages)
    billed_prompt = (grew(before, after, "llmp:billed_tokens_total", kind="input", **pro)
                     + grew(before, after, "llmp:billed_tokens_total", kind="cached_input", **pro))
    assert billed_prompt == prompt
    # what each client was told it cost, rounded up to whole nano-dollars as the budget counters do
    nanos = sum(math.ceil(Decimal(usage["cost"]["total"]) * 10**9) for usage in usages)
    assert nanos > 0 and grew(before, after, "llmp:spend_nanodollars_total", **pro) == nanos
    assert grew(before, after, "llmp:generation_tokens_total", model_name=MODEL) >= output
    assert grew(before, after, "llmp:prefix_cache_queries_total", model_name=MODEL) >= prompt


def test_after_the_traffic_nothing_is_held_and_the_queues_are_empty(traffic):
    _server, _before, after, _told = traffic
    assert after.total("llmp:admission_slots_held") == 0
    assert after.total("llmp:kv_cache_blocks_used", model_name=MODEL) == 0
    assert after.total("llmp:kv_cache_blocks", model_name=MODEL) > 0
    depths = after.series("llmp:queue_depth")
    assert {"model_name": MODEL, "tier": "pro"} in depths and after.total("llmp:queue_depth") == 0
    assert after.total("llmp:live_workers", model_name=MODEL) == 1
    assert {"model_name": MODEL, "tier": "pro"} in after.series("llmp:queue_oldest_age_seconds")
    assert after.total("llmp:queue_oldest_age_seconds") == 0 and after.total("llmp:requests_waiting_for_worker") == 0
    assert after.total("llmp:process_open_fds") > 0 and after.total("llmp:process_resident_memory_bytes") > 0


# read from PostgreSQL only (its connection pool, pg_stat_activity): on SQLite there is nothing to report
POSTGRES_ONLY = {"llmp:db_pool_connections", "llmp:db_server_connections"}


def test_every_metric_the_grafana_dashboard_queries_is_on_the_page(traffic):
    server, _before, after, _told = traffic
    queried = grafana_metric_names()
    assert len(queried) >= 20
    if server.database_url.startswith("sqlite"):
        assert not POSTGRES_ONLY & after.names
        queried -= POSTGRES_ONLY
    missing = sorted(name for name in queried if name not in after.names)
    assert not missing, f"the dashboard queries metrics /metrics does not have: {missing}"
