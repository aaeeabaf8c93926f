"""About a minute of saturating load (Locust) on a web process and a worker (PostgreSQL + Redis): nothing leaks.

A 10 s load first sizes the pools (database, Redis, HTTP connections); the
figures are read at the idle moment after it, then again after a 45 s load
of the same shape. Between the two, and at the end:
- no request failed other than by policy (429 rate limit or quota, 503);
- nothing is held: KV blocks, the worker's requests, admission reservations,
  concurrency slots, queued jobs are all 0;
- no database connection is left checked out of a pool, and the server has no
  connection outside the pools;
- file descriptors of the web process and the worker did not grow past
  what the connection pools may still add (FD_SLACK).
The ten-minute version, with memory and TTFT drift, is benchmarks/soak.py.
"""

from __future__ import annotations

import os

import pytest

from tests.e2e.load_stack import LoadStack, leak_figures, load_errors, load_log
from tests.e2e.processes import servers_required
from tests.inference.metrics_helpers import grafana_metric_names

pytestmark = [pytest.mark.e2e, pytest.mark.slow]

DATABASE_URL = os.environ.get("LOAD_E2E_DATABASE_URL", "postgres://postgres@127.0.0.1:5432/llm_load_e2e")
REDIS_URL = os.environ.get("LOAD_E2E_REDIS_URL", "redis://127.0.0.1:6379/2")
USERS = 12  # more than the worker's batch of 8: the engine never idles, a queue always waits
# Connection pools grow to the peak concurrency they have seen and keep those connections (redis-py's pool of
# the queue client: one per thread using it at once; measured 11 to Redis after the warm-up, 9 more once after
# the main load on a noisy machine, none in another run): a leak is growth past that, e.g. one per request.
FD_SLACK = 12


@pytest.fixture(scope="module")
def stack(tmp_path_factory):
    servers_required(database_url=DATABASE_URL, redis_url=REDIS_URL)
    stack = LoadStack(tmp_path_factory.mktemp("load_leaks"), database_url=DATABASE_URL, redis_url=REDIS_URL)
    yield stack
    stack.stop()


def test_a_minute_of_saturating_load_leaks_nothing(stack):
    warm_log, main_log = stack.tmp / "warm.jsonl", stack.tmp / "main.jsonl"
    warm = stack.load(users=USERS, seconds=10, log_path=warm_log)
    before = leak_figures(*stack.idle())
    main = stack.load(users=USERS, seconds=45, log_path=main_log)
    web, worker = stack.idle()
    after = leak_figures(web, worker)

    entries = load_log(warm_log) + load_log(main_log)
    assert not load_errors(entries), load_errors(entries)[:5]
    assert warm.returncode == 0 and main.returncode == 0  # Locust saw no failure either
    served = [entry for entry in load_log(main_log) if entry["status"] == 200 and entry["kind"] == "stream"]
    assert served, "no stream was served in 45 s"
    for name in ("kv_blocks_used", "worker_requests_active", "reservations_held", "slots_held", "queue_depth"):
        assert after[name] == before[name] == 0, (name, before[name], after[name])
    # a thread's connection stays checked out for its next query (the worker's finisher thread): never more
    assert after["web_db_in_use"] <= before["web_db_in_use"] and after["worker_db_in_use"] <= before["worker_db_in_use"]
    assert after["db_server_connections"] <= after["db_pools_open"] + 1, after  # + the scrape's own, if unpooled
    assert after["web_open_fds"] <= before["web_open_fds"] + FD_SLACK, (before, after)
    assert after["worker_open_fds"] <= before["worker_open_fds"] + FD_SLACK, (before, after)
    # the Grafana dashboard's every metric is on the web's or the worker's page (PostgreSQL, Redis, a worker)
    missing = grafana_metric_names() - web.names - worker.names
    assert not missing, missing
