"""What a scrape reads at that moment: queues, admission, workers, and this process's resources.

Shared state (one answer for the whole deployment, read by the web process
that answers the scrape; `LiveCollector`):
- `llmp:queue_depth{model_name,tier}`: jobs queued, not yet leased;
- `llmp:live_workers{model_name}`: workers whose heartbeat is current;
- `llmp:admission_reservations_held`, `llmp:admission_slots_held`: open
  admission reservations and concurrency slots (billing.admission); both are
  0 once every admitted request has ended;
- `llmp:db_server_connections`: the database's connections to this
  database (PostgreSQL's pg_stat_activity), every process included.

Per process (`process_figures_update`: gauges labelled with the pid in
multiprocess mode; web processes refresh them on scrapes and every few
seconds while serving, workers at each heartbeat):
- `llmp:process_open_fds`, `llmp:process_resident_memory_bytes`;
- `llmp:db_pool_connections{state=open|in_use}`: this process's PostgreSQL
  pool (settings.DB_POOL); `in_use` counts connections held by threads.

None of them must grow under a steady load: benchmarks/soak.py and
tests/e2e/test_load_leaks.py read them before and after.
"""

from __future__ import annotations

import logging
import os

from prometheus_client import Gauge
from prometheus_client.core import GaugeMetricFamily
from prometheus_client.registry import Collector

from common.cache import TtlCache

from . import PREFIX

logger = logging.getLogger(__name__)

PROCESS_OPEN_FDS = Gauge(f"{PREFIX}process_open_fds", "Open file descriptors of the process.",
                         multiprocess_mode="liveall")
PROCESS_RESIDENT_MEMORY = Gauge(f"{PREFIX}process_resident_memory_bytes", "Resident memory of the process.",
                                multiprocess_mode="liveall")
DB_POOL_CONNECTIONS = Gauge(f"{PREFIX}db_pool_connections",
                            "Connections of this process's database pool: open, and in use by a thread.", ["state"],
                            multiprocess_mode="liveall")

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


def process_figures_update() -> None:
    """Set this process's gauges (Linux /proc); never raises."""
    try:
        PROCESS_OPEN_FDS.set(_open_fds())
        PROCESS_RESIDENT_MEMORY.set(_resident_bytes())
    except OSError:
        pass
    try:
        stats = db_pool_stats()
    except Exception:  # noqa: BLE001
        logger.debug("database pool figures unavailable", exc_info=True)
        stats = None
    if stats is not None:
        for state, value in stats.items():
            DB_POOL_CONNECTIONS.labels(state).set(value)


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
        process_figures_update()
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
        for model in models:
            depths = queue.depths(model)
            for tier in sorted(set(tiers) | set(depths)):
                depth.add_metric([model, tier], float(depths.get(tier, 0)))
            workers.add_metric([model], float(len(queue.live_workers(model))))
        yield depth
        yield workers

    def _admission(self):
        from billing.admission import get_admission_backend

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
