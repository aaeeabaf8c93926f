"""The text a scrape gets: `/metrics` of a web process, and a worker's own port.

Single process (the embedded default, or one uvicorn worker): the default
registry, i.e. this process's metrics (the embedded engine's included), the
client library's process and GC collectors, and `LiveCollector`.

Multiprocess (`PROMETHEUS_MULTIPROC_DIR` set in the environment of every web
process, as prometheus_client requires: uvicorn --workers N): each process
writes its metrics to files in that directory, and whichever process answers
the scrape sums them (`MultiProcessCollector`: counters and histograms
summed, gauges as each declares: live sums, or one series per pid), then
adds the shared figures of `LiveCollector` once. The directory must be
emptied before the processes start (deploy/docs/operations.md); a process
that exits cleanly marks its live gauges dead.

`run_worker --metrics-port N` serves the same text from a thread of the
worker (`worker_metrics_serve`), without the shared figures, which the web
processes answer for.
"""

from __future__ import annotations

import atexit
import logging
import os
import threading

from django.conf import settings
from prometheus_client import REGISTRY, CollectorRegistry, generate_latest, multiprocess
from prometheus_client.exposition import CONTENT_TYPE_PLAIN_0_0_4

from .live import LiveCollector, ResourceCollector, process_figures_update

logger = logging.getLogger(__name__)

_lock = threading.Lock()
_registered: set[str] = set()  # what this process added to the default registry


def multiprocess_mode() -> bool:
    return bool(settings.METRICS_MULTIPROC_DIR)


def mark_dead_at_exit() -> None:
    """Multiprocess mode: when this process exits, its live gauges leave the sums (called as a web
    process builds its ASGI application)."""
    if multiprocess_mode():
        pid = os.getpid()
        atexit.register(lambda: multiprocess.mark_process_dead(pid))


def _registry(*, live: bool) -> CollectorRegistry:
    if multiprocess_mode():
        registry = CollectorRegistry()
        multiprocess.MultiProcessCollector(registry)
        if live:
            registry.register(LiveCollector())
        return registry
    with _lock:
        wanted = {"resources": ResourceCollector, "live": LiveCollector} if live else {"resources": ResourceCollector}
        for name, collector in wanted.items():
            if name not in _registered:
                REGISTRY.register(collector())
                _registered.add(name)
    return REGISTRY


def metrics_text(*, live: bool = True) -> tuple[bytes, str]:
    """(exposition text, content type) of this process, or of every process in multiprocess mode."""
    process_figures_update()  # multiprocess mode: the answering process's own figures, current
    return generate_latest(_registry(live=live)), CONTENT_TYPE_PLAIN_0_0_4  # what every Prometheus reads


def worker_metrics_serve(*, port: int, host: str) -> None:
    """Serve this worker's metrics on host:port from a daemon thread (`run_worker --metrics-port`)."""
    from prometheus_client import start_http_server

    start_http_server(port, addr=host, registry=_registry(live=False))
    logger.info("worker metrics on http://%s:%d/metrics", host, port)
