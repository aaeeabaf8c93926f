"""A web process and an engine worker on PostgreSQL + Redis under a Locust load, and the leak figures.

Used by tests/e2e/test_load_leaks.py (about a minute of load, in CI) and by
benchmarks/soak.py (ten minutes). The figures come from the processes'
own /metrics pages (inference.metrics): what the operator's Prometheus sees.
"""

from __future__ import annotations

import json
import subprocess
import sys
import time
import uuid
from pathlib import Path

import httpx

from tests.e2e.processes import (
    ROOT, Proc, api_key_new, database_prepare, free_port, http_wait, manage, postgres_database_reset, process_env,
    wait_until,
    web_start, worker_start,
)
from tests.inference.metrics_helpers import Scrape

LOCUSTFILE = ROOT / "benchmarks" / "locustfile.py"
POLICY = {429, 503}


class LoadStack:
    def __init__(self, tmp: Path, *, database_url: str, redis_url: str, max_num_seqs: int = 8,
                 kv_cache_mb: int = 64) -> None:
        self.tmp = tmp
        prefix = f"load-{uuid.uuid4().hex[:8]}"
        postgres_database_reset(database_url)
        self.env = process_env(DATABASE_URL=database_url, REDIS_URL=redis_url, QUEUE_KEY_PREFIX=prefix,
                               ADMISSION_KEY_PREFIX=f"{prefix}-lim", LOG_LEVEL="WARNING")
        database_prepare(self.env)
        self.keys = {tier: api_key_new(self.env, tenant=f"load-{tier}", tier=tier)
                     for tier in ("free", "pro", "enterprise")}
        # the free tenant's users meet its limit now and then: refusals by policy (429) are part of the load
        manage(self.env, "limits_set", "--tenant", "load-free", "--rpm", "6")
        self.procs: list[Proc] = []
        self.worker_port = free_port()
        try:
            self.web, self.url = web_start(self.env, tmp)
            self.procs.append(self.web)
            self.worker = worker_start(self.env, tmp, extra=(
                "--metrics-port", str(self.worker_port), "--max-num-seqs", str(max_num_seqs),
                "--kv-cache-mb", str(kv_cache_mb)))
            self.procs.append(self.worker)
            self.worker_url = f"http://127.0.0.1:{self.worker_port}"
            http_wait(f"{self.worker_url}/metrics", self.worker, timeout=120)
            wait_until(lambda: self.web_scrape().total("llmp:live_workers") == 1, timeout=120,
                       what="the worker's heartbeat")
            self._first_request()
        except BaseException:
            self.stop()
            raise

    def _first_request(self) -> None:
        """One completion before any load: the engine's first step (kernels built, caches filled) is not
        the load's."""
        response = httpx.post(f"{self.url}/v1/chat/completions", timeout=300,
                              headers={"Authorization": f"Bearer {self.keys['pro']}"},
                              json={"model": "smollm2-135m-instruct", "max_tokens": 4,
                                    "messages": [{"role": "user", "content": "Hello"}]})
        response.raise_for_status()

    def web_scrape(self) -> Scrape:
        return Scrape.get(self.url)

    def worker_scrape(self) -> Scrape:
        return Scrape.get(self.worker_url)

    def load(self, *, users: int, seconds: int, log_path: Path, stop_timeout: int = 15) -> subprocess.CompletedProcess:
        """Locust, headless, on loopback; at the end users get `stop_timeout` seconds to finish the request in
        flight, then are stopped (their streams closed: the server aborts them)."""
        env = dict(self.env, LOAD_KEYS=json.dumps(self.keys), LOAD_LOG=str(log_path))
        command = [sys.executable, "-m", "locust", "-f", str(LOCUSTFILE), "--headless", "-u", str(users),
                   "-r", str(users), "-t", f"{seconds}s", "--stop-timeout", str(stop_timeout), "--host", self.url,
                   "--only-summary", "--loglevel", "WARNING"]
        with open(log_path.with_suffix(".locust.log"), "wb") as out:
            return subprocess.run(command, cwd=ROOT, env=env, stdout=out, stderr=subprocess.STDOUT,
                                  timeout=seconds + stop_timeout + 60)

    def idle(self, timeout: float = 60) -> tuple[Scrape, Scrape]:
        """(web, worker) scrapes once every admitted request has ended and the queues are empty."""
        def quiet():
            web, worker = self.web_scrape(), self.worker_scrape()
            held = (web.total("llmp:queue_depth") + web.total("llmp:admission_reservations_held")
                    + web.total("llmp:admission_slots_held") + worker.total("llmp:worker_requests_active")
                    + worker.total("llmp:kv_cache_blocks_used"))
            return (web, worker) if held == 0 else None

        time.sleep(1.5)  # one worker heartbeat after the last request: its gauges are current
        return wait_until(quiet, timeout=timeout, interval=0.5, what="an idle platform")

    def stop(self) -> None:
        for proc in reversed(self.procs):
            proc.stop()


def leak_figures(web: Scrape, worker: Scrape) -> dict[str, float]:
    """What must not grow (or must be 0) between two idle moments."""
    return {
        "web_open_fds": web.total("llmp:process_open_fds"),
        "worker_open_fds": worker.total("llmp:process_open_fds"),
        "web_rss_bytes": web.total("llmp:process_resident_memory_bytes"),
        "worker_rss_bytes": worker.total("llmp:process_resident_memory_bytes"),
        "web_db_in_use": web.total("llmp:db_pool_connections", state="in_use"),
        "worker_db_in_use": worker.total("llmp:db_pool_connections", state="in_use"),
        "db_pools_open": (web.total("llmp:db_pool_connections", state="open")
                          + worker.total("llmp:db_pool_connections", state="open")),
        "db_server_connections": web.total("llmp:db_server_connections"),
        "reservations_held": web.total("llmp:admission_reservations_held"),
        "slots_held": web.total("llmp:admission_slots_held"),
        "kv_blocks_used": worker.total("llmp:kv_cache_blocks_used"),
        "worker_requests_active": worker.total("llmp:worker_requests_active"),
        "queue_depth": web.total("llmp:queue_depth"),
    }


def load_log(path: Path) -> list[dict]:
    if not path.exists():
        return []
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def load_errors(entries: list[dict]) -> list[dict]:
    """Requests that ended in anything but success or a refusal by policy (429, 503)."""
    return [entry for entry in entries if entry["error"] is not None]


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    if not ordered:
        return float("nan")
    index = min(len(ordered) - 1, max(0, int(round(q * (len(ordered) - 1)))))
    return ordered[index]
