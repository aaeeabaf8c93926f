"""The KV cache a worker sizes at start, through the real model: the engine factory reads the settings
(free-memory figure, fraction, explicit size) and exports the chosen size on the worker's metrics; a
real `run_worker` that cannot fit its weights plus one max-length sequence exits at start with the
reason; and `GET /health` of a real web process answers as vLLM's does: 503 with an empty body while
no worker serves, 200 with an empty body once one does."""

from __future__ import annotations

import os
import uuid

import httpx
import pytest
import redis
from prometheus_client import REGISTRY

from inference.engine.kv_sizing import MiB, KvCacheSizeError
from tests.e2e.processes import (
    MODEL, database_prepare, free_port, process_env, wait_until, web_start, worker_start,
)
from tests.inference.metrics_helpers import Scrape

pytestmark = [pytest.mark.slow]

REDIS_URL = os.environ.get("API_E2E_REDIS_URL", "redis://127.0.0.1:6379/3")
TOKEN_BYTES_BF16 = 2 * 30 * 3 * 64 * 2  # SmolLM2-135M: 30 layers, 3 KV heads of 64, bfloat16
MAX_MODEL_LEN = 8192


# ---------------------------------------------------------------- the factory, in this process
@pytest.fixture
def engine_settings(settings):
    settings.ENGINE_KV_CACHE_MB = None
    settings.ENGINE_KV_CACHE_FRACTION = 0.5
    settings.ENGINE_WORKERS_PER_DEVICE = None
    settings.ENGINE_DTYPE = "bfloat16"
    return settings


def test_the_factory_sizes_the_cache_from_the_free_figure_and_exports_it(db, engine_settings):
    from inference.metrics.engine_stats import EngineMetrics
    from inference.worker.engine_factory import engine_build

    engine_settings.ENGINE_FREE_MEMORY_MB = 2400
    engine = engine_build(model=MODEL, device="cpu", max_num_seqs=64)
    plan = engine.kv_plan
    assert plan.source == "free memory"
    assert plan.free_bytes == 2400 * MiB and plan.fraction == 0.5
    assert 100 * MiB < plan.weights_bytes < 1200 * MiB  # the factory loaded them: out of the share
    assert plan.num_blocks == (1200 * MiB - plan.weights_bytes) // plan.block_bytes
    assert plan.block_bytes == 16 * TOKEN_BYTES_BF16 and engine.block_manager.num_blocks == plan.num_blocks

    EngineMetrics(model="kv-sizing-test").update(engine.stats(), active=0)
    labels = {"model_name": "kv-sizing-test"}
    assert REGISTRY.get_sample_value("llmp:kv_cache_size_bytes", labels) == plan.bytes
    assert REGISTRY.get_sample_value("llmp:kv_cache_capacity_tokens", labels) == plan.tokens


def test_the_factory_takes_an_explicit_size_and_the_workers_per_device(db, engine_settings):
    from inference.worker.engine_factory import engine_build

    engine_settings.ENGINE_FREE_MEMORY_MB = 2400
    engine_settings.ENGINE_KV_CACHE_MB = 96
    engine = engine_build(model=MODEL, device="cpu")
    assert engine.kv_plan.source == "kv_cache_mb"
    assert engine.kv_plan.num_blocks == 96 * MiB // engine.kv_plan.block_bytes
    engine_settings.ENGINE_KV_CACHE_MB = None
    engine_settings.ENGINE_WORKERS_PER_DEVICE = 4  # a quarter of 1200 MiB, less the weights: no room left
    with pytest.raises(KvCacheSizeError, match="/ 4 workers"):
        engine_build(model=MODEL, device="cpu")


# ---------------------------------------------------------------- real processes
@pytest.fixture(scope="module")
def stack(tmp_path_factory):
    """A prepared SQLite database and a queue prefix of our own on the test Redis."""
    try:
        redis.Redis.from_url(REDIS_URL, socket_connect_timeout=2).ping()
    except redis.RedisError as exc:
        if os.environ.get("CI", "").lower() == "true":
            pytest.fail(f"this test needs Redis under CI: {exc}")
        pytest.skip(f"Redis at {REDIS_URL}: {exc}")
    from inference.queue.redis_backend import RedisJobQueue

    tmp = tmp_path_factory.mktemp("kv_sizing")
    prefix = f"kv-sizing-{uuid.uuid4().hex[:8]}"
    env = process_env(DATABASE_URL=f"sqlite:///{tmp / 'db.sqlite3'}", REDIS_URL=REDIS_URL, EMBEDDED_WORKER="0",
                      QUEUE_KEY_PREFIX=prefix, OMP_NUM_THREADS="1", WORKER_HEARTBEAT_TIMEOUT_S="4")
    database_prepare(env)
    queue = RedisJobQueue(url=REDIS_URL, prefix=prefix)
    try:
        yield {"env": env, "tmp": tmp, "queue": queue}
    finally:
        queue.flush()


def test_a_worker_that_cannot_fit_its_cache_exits_at_start_with_the_reason(stack):
    env = {**stack["env"], "ENGINE_FREE_MEMORY_MB": "700"}  # a 350 MiB share: weights + 180 MiB do not fit
    worker = worker_start(env, stack["tmp"], name="worker-too-small")
    try:
        worker.popen.wait(240)
    finally:
        code = worker.stop()
    log = worker.log_tail()
    assert code == 1, log
    assert f"could not load '{MODEL}' on cpu: no room for a KV cache of one 8192-token sequence (180 MiB)" in log
    assert "0.5 of the 700 MiB free is 350 MiB" in log
    assert not [w for w in stack["queue"].live_workers(MODEL) if w.get("status") == "serving"]


def test_health_answers_like_vllms_and_the_worker_exports_its_cache(stack):
    env, tmp = stack["env"], stack["tmp"]
    web, url = web_start(env, tmp)
    worker = None
    try:
        down = httpx.get(f"{url}/health", timeout=10)
        assert (down.status_code, down.content) == (503, b"")  # no worker serves the model yet
        assert httpx.get(f"{url}/healthz", timeout=10).status_code == 200  # the process itself is fine
        metrics_port = free_port()
        # one sequence at most: the default cache is capped at one max-length sequence, whatever is free
        worker = worker_start({**env, "LOG_LEVEL": "INFO"}, tmp, name="worker-ok",
                              extra=("--max-num-seqs", "1", "--metrics-port", str(metrics_port)))
        wait_until(lambda: httpx.get(f"{url}/health", timeout=10).status_code == 200 or not worker.alive,
                   timeout=240, what="a serving worker")
        assert worker.alive, worker.log_tail()
        up = httpx.get(f"{url}/health", timeout=10)
        assert (up.status_code, up.content) == (200, b"")
        assert httpx.head(f"{url}/health", timeout=10).status_code == 200
        assert httpx.post(f"{url}/health", timeout=10).status_code == 405

        def exported():
            scrape = Scrape.get(f"http://127.0.0.1:{metrics_port}")
            return scrape if scrape.total("llmp:kv_cache_capacity_tokens", model_name=MODEL) else None

        scrape = wait_until(exported, timeout=30, what="the worker's KV-cache gauges")
        assert scrape.total("llmp:kv_cache_capacity_tokens", model_name=MODEL) == MAX_MODEL_LEN
        assert scrape.total("llmp:kv_cache_size_bytes", model_name=MODEL) == MAX_MODEL_LEN * TOKEN_BYTES_BF16
        assert ("KV cache 180 MiB, 8192 tokens (512 blocks of 16); set by the cap of max_num_seqs x max_model_len"
                in worker.log_tail(200_000))

        worker.stop()
        wait_until(lambda: httpx.get(f"{url}/health", timeout=10).status_code == 503, timeout=60,
                   what="/health to say 503 once the worker is gone")
    finally:
        if worker is not None:
            worker.stop()
        web.stop()


@pytest.mark.parametrize("option", [dict(kv_cache_fraction=0.0), dict(kv_cache_fraction=1.5),
                                    dict(workers_per_device=0)])
def test_the_factory_refuses_a_meaningless_share_before_loading_anything(db, engine_settings, option):
    from inference.worker.engine_factory import engine_build

    with pytest.raises(ValueError, match="kv_cache_fraction|workers_per_device"):
        engine_build(model=MODEL, device="cpu", **option)
