"""/metrics of `uvicorn --workers 2` in prometheus_client's multiprocess mode: every process's counts, summed.

Each request goes on a new connection, so the kernel hands them to both
worker processes; requests go on until both have written their metric files.
Then every scrape, whichever process answers it, reports every request once,
and the per-process gauges carry one series per live process (its pid).
"""

from __future__ import annotations

import sys

import httpx
import pytest

from tests.e2e.processes import Proc, database_prepare, free_port, http_wait, process_env
from tests.inference.metrics_helpers import Scrape

pytestmark = [pytest.mark.e2e, pytest.mark.slow]


@pytest.fixture(scope="module")
def web(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("metrics_mp")
    metrics_dir = tmp / "prometheus"
    metrics_dir.mkdir()
    env = process_env(DATABASE_URL=f"sqlite:///{tmp / 'db.sqlite3'}", PROMETHEUS_MULTIPROC_DIR=str(metrics_dir))
    database_prepare(env)
    port = free_port()
    proc = Proc("web", [sys.executable, "-m", "uvicorn", "platform_site.asgi:application", "--host", "127.0.0.1",
                        "--port", str(port), "--workers", "2", "--lifespan", "off", "--no-access-log"],
                env, tmp / "web.log")
    url = f"http://127.0.0.1:{port}"
    try:
        http_wait(f"{url}/healthz", proc)
        yield url, metrics_dir
    finally:
        proc.stop()


def writers(metrics_dir) -> set[str]:
    """Pids that wrote counter files (counter_<pid>.db)."""
    return {path.stem.split("_", 1)[1] for path in metrics_dir.glob("counter_*.db")}


def test_every_scrape_sums_the_requests_both_processes_served(web):
    url, metrics_dir = web
    sent = 0
    while len(writers(metrics_dir)) < 2 and sent < 400:
        with httpx.Client() as client:  # a new connection each time
            assert client.get(f"{url}/v1/models").status_code == 401
        sent += 1
    assert len(writers(metrics_dir)) == 2, "one process served every request"
    for _ in range(8):
        with httpx.Client() as client:
            response = client.get(f"{url}/metrics")
        scrape = Scrape(response.text)
        assert scrape.total("llmp:http_requests_total", handler="models", status="401") == sent
        pids = {labels["pid"] for labels in scrape.series("llmp:process_open_fds")}
        assert len(pids) == 2 and pids == writers(metrics_dir)
        assert scrape.total("llmp:queue_depth") == 0  # the shared figures, once per scrape
        assert {labels["tier"] for labels in scrape.series("llmp:queue_depth")} >= {"free", "pro", "enterprise"}
