"""What a scrape reads at that moment: queues, admission, workers, and this process's resources.

Shared state (one answer for the whole deployment, read by the web process
that answers the scrape; `LiveCollector`):
- `llmp:queue_depth{model_name,tier}`: jobs queued, not yet leased;
- `llmp:live_workers{model_name}`: workers whose heartbeat is current;
- `llmp:queue_oldest_age_seconds{model_name,tier}`: how long the oldest queued job has waited (0: none);
- `llmp:requests_waiting_for_worker{model_name}`: requests waiting (at most MODEL_WAIT_S) for a worker of
  a model none serves: with queue_depth, what a KEDA ScaledObject scales a model from zero on
  (deploy/k8s, deploy/docs/kubernetes.md). Each is the same on every web replica: aggregate with max();
- `llmp:admission_reservations_held`, `llmp:admission_slots_held`: open
  admission reservations and concurrency slots (billing.counters); both are
  0 once every admitted request has ended;
- `llmp:db_server_connections`: the database's connections to this
  database (PostgreSQL's pg_stat_activity), every process included.

Per process (`ResourceCollector`, read when scraped; in multiprocess mode
`process_figures_update` writes them as series labelled with the pid, web
processes on scrapes and every few seconds while serving):
- `llmp:process_open_fds`, `llmp:process_resident_memory_bytes`;
- `llmp:db_pool_connections{state=open|in_use}`: this process's PostgreSQL
  pool (settings.DB_POOL); `in_use` counts connections held by threads.

None of them must grow under a steady load: benchmarks/soak.py and
tests/e2e/test_load_leaks.py read them before and after.
"""

from __future__ import annotations

import logging
import os
import time

from prometheus_client import Gauge
from prometheus_client.core import GaugeMetricFamily
from prometheus_client.registry import Collector

from common.cache import TtlCache

from . import PREFIX

logger = logging.getLogger(__name__)

# what the queue-depth series are labelled with: enabled models and tiers (two small tables)
_catalogue: TtlCache[str, tuple[list[str], list[str]]] = TtlCache("metrics catalogue", ttl=30.0, max_entries=4)


def _open_fds() -> int:
    return len(os.listdir("/proc/self/fd"))


def _resident_bytes() -> int:
    with open("/proc/self/statm") as statm:
        return int(statm.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


def db_pool_stats() -> dict[str, int] | None:
    """(open, in_use) connections of this process's pool of the default database, None without a pool.
    Reads the pool Django made, never makes one."""
    from django.db import connections

    wrapper = connections["default"]
    pools = getattr(type(wrapper), "_connection_pools", None)
    pool = pools.get(wrapper.alias) if pools else None
    if pool is None:
        return None
    stats = pool.get_stats()
    size = int(stats.get("pool_size", 0))
    return {"open": size, "in_use": max(0, size - int(stats.get("pool_available", 0)))}


def process_figures() -> dict[str, float]:
    """This process's open files, resident memory and database pool (Linux /proc); what cannot be read
    is left out."""
    figures: dict[str, float] = {}
    try:
        figures["open_fds"] = _open_fds()
        figures["resident_memory_bytes"] = _resident_bytes()
    except OSError:
        pass
    try:
        stats = db_pool_stats()
    except Exception:  # noqa: BLE001
        logger.debug("database pool figures unavailable", exc_info=True)
        stats = None
    for state, value in (stats or {}).items():
        figures[f"db_{state}"] = value
    return figures


_HELP = {
    "open_fds": (f"{PREFIX}process_open_fds", "Open file descriptors of the process."),
    "resident_memory_bytes": (f"{PREFIX}process_resident_memory_bytes", "Resident memory of the process."),
}
_DB_HELP = (f"{PREFIX}db_pool_connections", "Connections of this process's database pool: open, and in use by a thread.")


class ResourceCollector(Collector):
    """This process's figures, read when scraped (single-process registries)."""

    def collect(self):
        figures = process_figures()
        for key, (name, doc) in _HELP.items():
            if key in figures:
                yield GaugeMetricFamily(name, doc, value=float(figures[key]))
        if "db_open" in figures:
            pool = GaugeMetricFamily(*_DB_HELP, labels=["state"])
            for state in ("open", "in_use"):
                pool.add_metric([state], float(figures[f"db_{state}"]))
            yield pool


_gauges: dict[str, Gauge] = {}


def process_figures_update() -> None:
    """Multiprocess mode: write this process's figures to its own series (label `pid`) of the shared
    directory. Web processes call it on scrapes and every few seconds while serving, workers at each
    heartbeat. Without a multiprocess directory it does nothing (ResourceCollector reads them when
    scraped). Never raises."""
    from django.conf import settings

    if not settings.METRICS_MULTIPROC_DIR:
        return
    try:
        if not _gauges:  # registry=None: the values go to the directory, which MultiProcessCollector reads
            for key, (name, doc) in _HELP.items():
                _gauges[key] = Gauge(name, doc, multiprocess_mode="liveall", registry=None)
            _gauges["db"] = Gauge(*_DB_HELP, ["state"], multiprocess_mode="liveall", registry=None)
        figures = process_figures()
        for key in _HELP:
            if key in figures:
                _gauges[key].set(figures[key])
        if "db_open" in figures:
            for state in ("open", "in_use"):
                _gauges["db"].labels(state).set(figures[f"db_{state}"])
    except Exception:  # noqa: BLE001
        logger.exception("process metrics update failed")


def _catalogue_load() -> tuple[list[str], list[str]]:
    from inference.models import ServedModel
    from tenants.models import Tier

    models = list(ServedModel.objects.filter(enabled=True).values_list("name", flat=True))
    tiers = list(Tier.objects.values_list("name", flat=True))
    return models, tiers


def _db_server_connections() -> int | None:
    from django.db import connection

    if connection.vendor != "postgresql":
        return None
    with connection.cursor() as cursor:
        cursor.execute("SELECT count(*) FROM pg_stat_activity WHERE datname = current_database()")
        return int(cursor.fetchone()[0])


class LiveCollector(Collector):
    """The shared figures, read at scrape time (see the module docstring). A figure whose source fails
    is left out of that scrape, and the error logged."""

    def collect(self):
        yield from self._guarded(self._queues)
        yield from self._guarded(self._admission)
        yield from self._guarded(self._database)

    def _guarded(self, read):
        try:
            yield from read()
        except Exception:  # noqa: BLE001 - a scrape still answers with the rest
            logger.exception("metrics: %s failed", read.__name__)

    def _queues(self):
        from inference.queue import get_job_queue

        queue = get_job_queue()
        models, tiers = _catalogue.get_or_load("all", _catalogue_load)
        depth = GaugeMetricFamily(f"{PREFIX}queue_depth", "Jobs queued (not yet leased) per model and tier.",
                                  labels=["model_name", "tier"])
        workers = GaugeMetricFamily(f"{PREFIX}live_workers", "Workers with a current heartbeat, per model.",
                                    labels=["model_name"])
        oldest = GaugeMetricFamily(f"{PREFIX}queue_oldest_age_seconds",
                                   "Seconds the oldest queued job has waited, per model and tier (0: none queued).",
                                   labels=["model_name", "tier"])
        demand = GaugeMetricFamily(f"{PREFIX}requests_waiting_for_worker",
                                   "Requests waiting for a worker of a model that has none (scale from zero).",
                                   labels=["model_name"])
        now = time.time()
        for model in models:
            depths, ages = queue.depths(model), queue.oldest_queued(model)
            for tier in sorted(set(tiers) | set(depths)):
                depth.add_metric([model, tier], float(depths.get(tier, 0)))
                oldest.add_metric([model, tier], max(0.0, now - ages[tier]) if tier in ages else 0.0)
            workers.add_metric([model], float(len(queue.live_workers(model))))
            demand.add_metric([model], float(queue.demand(model)))
        yield depth
        yield workers
        yield oldest
        yield demand

    def _admission(self):
        from billing.counters import get_admission_backend

        reservations, slots = get_admission_backend().held()
        yield GaugeMetricFamily(f"{PREFIX}admission_reservations_held",
                                "Admission reservations not yet settled or released.", value=float(reservations))
        yield GaugeMetricFamily(f"{PREFIX}admission_slots_held", "Concurrency slots held by admitted requests.",
                                value=float(slots))

    def _database(self):
        count = _db_server_connections()
        if count is not None:
            yield GaugeMetricFamily(f"{PREFIX}db_server_connections",
                                    "Connections the database server has open to this database (all processes).",
                                    value=float(count))
