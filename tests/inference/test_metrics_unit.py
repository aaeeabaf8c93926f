"""inference.metrics without a server: engine figures to counters, records to histograms, the ASGI wrapper."""

from __future__ import annotations

import pytest
from prometheus_client import REGISTRY

from inference.metrics.engine_stats import EngineMetrics
from inference.metrics.gateway import handler_name, http_metrics
from inference.metrics.requests import billed_observe, requests_observe


def value(name: str, **labels) -> float:
    return REGISTRY.get_sample_value(name, labels) or 0.0


def stats(**figures) -> dict:
    base = {"running": 0, "waiting": 0, "kv_usage": 0.0, "num_blocks": 100, "free_blocks": 100, "prompt_tokens": 0,
            "generated_tokens": 0, "preemptions": 0, "prefix_cache_queries": 0, "prefix_cache_hits": 0}
    return {**base, **figures}


def test_engine_figures_set_the_gauges_and_advance_the_counters_by_what_they_grew():
    model = "unit-engine"
    metrics = EngineMetrics(model=model)
    before = value("llmp:generation_tokens_total", model_name=model)
    metrics.update(stats(running=3, waiting=2, kv_usage=0.25, free_blocks=75, generated_tokens=10, prompt_tokens=40,
                         prefix_cache_queries=40, prefix_cache_hits=16), active=5)
    metrics.update(stats(running=1, free_blocks=90, generated_tokens=25, prompt_tokens=40, prefix_cache_queries=40,
                         prefix_cache_hits=16), active=1)
    assert value("llmp:generation_tokens_total", model_name=model) - before == 25
    assert value("llmp:prompt_tokens_total", model_name=model) == 40
    assert value("llmp:prefix_cache_hits_total", model_name=model) == 16
    assert value("llmp:num_requests_running", model_name=model) == 1
    assert value("llmp:kv_cache_blocks_used", model_name=model) == 10
    assert value("llmp:worker_requests_active", model_name=model) == 1
    # a new engine (the worker restarted it): its counts start from zero again and are added whole
    metrics.update(stats(generated_tokens=4), active=0)
    assert value("llmp:generation_tokens_total", model_name=model) - before == 29
    metrics.update(None, active=0)  # before the engine loaded: only the loop's own figure
    assert value("llmp:worker_requests_active", model_name=model) == 0


def test_speculative_decoding_counters_follow_the_engine_and_are_absent_without_it():
    model = "unit-spec"
    metrics = EngineMetrics(model=model)
    metrics.update(stats(spec_decode_num_drafts=4, spec_decode_num_draft_tokens=12,
                         spec_decode_num_accepted_tokens=9), active=1)
    metrics.update(stats(spec_decode_num_drafts=6, spec_decode_num_draft_tokens=18,
                         spec_decode_num_accepted_tokens=10), active=1)
    assert value("llmp:spec_decode_num_drafts_total", model_name=model) == 6
    assert value("llmp:spec_decode_num_draft_tokens_total", model_name=model) == 18
    assert value("llmp:spec_decode_num_accepted_tokens_total", model_name=model) == 10
    metrics = EngineMetrics(model="unit-no-spec")
    metrics.update(stats(generated_tokens=3), active=1)
    assert value("llmp:spec_decode_num_drafts_total", model_name="unit-no-spec") == 0


def record(**fields):
    """An unpriced Ending (billing.services.settlement): what the metrics count."""
    from billing.services.settlement import Ending

    base = {"request_id": "r", "tenant_id": 1, "api_key_id": None, "model": "unit-requests", "tier": "pro",
            "finish_reason": "length", "prompt_tokens": 10, "cached_tokens": 4, "completion_tokens": 5,
            "queued_s": 0.5, "ttft_s": 1.0, "duration_s": 3.0, "admitted_at": 1_800_000_000.0,
            "created_at": 1_800_000_003.0}
    return Ending(**{**base, **fields})


def test_each_record_is_one_ending_and_one_latency_of_each_kind_and_no_tokens():
    labels = {"model_name": "unit-requests", "tier": "pro"}
    requests_observe([record(), record(finish_reason="error", completion_tokens=0, prompt_tokens=0, cached_tokens=0,
                                       ttft_s=None)])
    assert value("llmp:request_success_total", finished_reason="length", **labels) == 1
    assert value("llmp:request_success_total", finished_reason="error", **labels) == 1
    assert value("llmp:e2e_request_latency_seconds_count", **labels) == 2
    assert value("llmp:e2e_request_latency_seconds_sum", **labels) == 6.0
    assert value("llmp:time_to_first_token_seconds_count", **labels) == 1  # the error had no first token
    # (3.0 - 1.0) s over the 4 tokens after the first
    assert value("llmp:time_per_output_token_seconds_sum", **labels) == pytest.approx(0.5)
    assert value("llmp:billed_tokens_total", kind="output", **labels) == 0  # counted when written


@pytest.mark.django_db
def test_written_records_count_tokens_by_kind_and_spend_in_nanodollars():
    from datetime import datetime, timezone

    from billing.models import Price
    from billing.services.price_cache import price_cache_clear

    Price.objects.create(model="unit-spend", input_per_million="0.5", cached_input_per_million="0.25",
                         output_per_million="2", effective_from=datetime(2020, 1, 1, tzinfo=timezone.utc))
    price_cache_clear()
    labels = {"model_name": "unit-spend", "tier": "pro"}
    # as written (billing.services.settlement.endings_write): each with its price
    billed_observe([record(model="unit-spend").priced_now(),
                    record(model="unit-spend", finish_reason="error", prompt_tokens=0, cached_tokens=0,
                           completion_tokens=0).priced_now()])
    assert value("llmp:billed_tokens_total", kind="input", **labels) == 6
    assert value("llmp:billed_tokens_total", kind="cached_input", **labels) == 4
    assert value("llmp:billed_tokens_total", kind="output", **labels) == 5
    # 6 x $0.5/M + 4 x $0.25/M + 5 x $2/M = $14/M = 14,000 nano-dollars (tier multiplier 1)
    assert value("llmp:spend_nanodollars_total", **labels) == 14_000


@pytest.mark.parametrize("path, name", [
    ("/v1/chat/completions", "chat_completions"), ("/v1/models/x/y", "models"), ("/v1/nope", "v1_other"),
    ("/admin/tenants/", "admin"), ("/metrics", "metrics"), ("/anything?else", "other"),
])
def test_handler_names_are_a_fixed_set(path, name):
    assert handler_name(path) == name


async def test_the_wrapper_counts_each_response_by_status_and_a_made_up_method_as_other():
    async def app(scope, receive, send):
        if scope["path"] == "/boom":
            raise RuntimeError("boom")
        await send({"type": "http.response.start", "status": 418, "headers": []})
        await send({"type": "http.response.body", "body": b""})

    async def send(message):
        pass

    wrapped = http_metrics(app)
    before = value("llmp:http_requests_total", handler="healthz", method="other", status="418")
    await wrapped({"type": "http", "path": "/healthz", "method": "BREW"}, None, send)
    assert value("llmp:http_requests_total", handler="healthz", method="other", status="418") == before + 1
    failed = value("llmp:http_requests_total", handler="other", method="GET", status="500")
    with pytest.raises(RuntimeError):
        await wrapped({"type": "http", "path": "/boom", "method": "GET"}, None, send)
    assert value("llmp:http_requests_total", handler="other", method="GET", status="500") == failed + 1
