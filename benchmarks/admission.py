"""Admission: zero overshoot across web processes, and what one admission costs (limits on vs off).

1. Overshoot. --processes processes (each its own Django, database connection
   and Redis client, as web processes are) start --requests concurrent
   `aadmission_reserve` calls together, through the service (effective
   limits, worst-case price, the Lua script, counter rebuilds from
   PostgreSQL): once with a limit of 10 requests per minute, once with a
   monthly budget that holds exactly 10 worst-case requests. Admitted must be
   exactly 10 in both, and the budget's counter never above its limit.
2. Cost. One process admits requests one after another, limits on (requests
   and tokens per minute, concurrency, the token quota and the budget: every
   kind) against limits off (`ADMISSION_ENABLED=False`, the same call returns
   at once), interleaved rounds, p50 and p99 per request, on the in-process
   backend and on Redis.
3. Settle. What settling adds to the worker's usage-record insert, on the
   worker's record path (`inference.worker.spool.Spool`: the records of a
   step as `job_ending` makes them, spooled, inserted in one statement,
   their reservations settled): per step of --batch records (a pipelined
   step) and of 1, on the in-process backend and on Redis, the path with
   settling off, on (as deployed: the settlement sent before the insert and
   read after it) and sequential (insert, then settle), and the insert
   alone, interleaved; (on - off) as a share of the insert, from medians
   and paired per step, and the thread's own CPU time (no waits for
   PostgreSQL or Redis: what a shared, noisy machine distorts least).

    DATABASE_URL=postgres://postgres@127.0.0.1:5432/llm_admission REDIS_URL=redis://127.0.0.1:6379/7 \\
        python benchmarks/admission.py [--processes 4 --requests 50 --rounds 5 --calls 400 --json]
    python benchmarks/admission.py --part settle --steps 200 --batch 16 --json

It makes its own tier and tenants ("bench-admission-<random>"), deletes them after, and uses
its own Redis key prefix.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import multiprocessing
import os
import shutil
import statistics
import sys
import tempfile
import time
import uuid
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
os.environ.setdefault("DJANGO_SETTINGS_MODULE", "platform_site.settings")
os.environ.setdefault("SECRET_KEY", "benchmark-only-secret-key-not-for-serving")
MODEL = "bench-admission-model"


def _setup(prefix: str):
    import django

    os.environ["ADMISSION_KEY_PREFIX"] = prefix
    django.setup()


def _auth(tenant_id: int):
    from tenants.models import Tenant
    from tenants.services.api_keys import AuthContext

    tenant = Tenant.objects.select_related("tier", "budget").get(pk=tenant_id)  # as the verified-key rows
    return AuthContext(tenant=tenant, tier=tenant.tier, api_key=None)


def _overshoot_worker(prefix: str, tenant_id: int, count: int, barrier, results) -> None:
    _setup(prefix)
    from billing.services.admission_reserve import aadmission_reserve
    from common.errors import ApiError

    auth = _auth(tenant_id)

    async def one() -> bool:
        try:
            await aadmission_reserve(auth=auth, request_id=uuid.uuid4().hex, model=MODEL, prompt_tokens=100,
                                     max_tokens=100)
            return True
        except ApiError as exc:
            if exc.status_code != 429:
                raise
            return False

    async def all_at_once() -> int:
        return sum(await asyncio.gather(*(one() for _ in range(count))))

    barrier.wait()
    results.put(asyncio.run(all_at_once()))


def overshoot(*, prefix: str, tenant_id: int, processes: int, requests: int) -> int:
    context = multiprocessing.get_context("spawn")
    barrier, results = context.Barrier(processes), context.Queue()
    shares = [requests // processes + (i < requests % processes) for i in range(processes)]
    workers = [context.Process(target=_overshoot_worker, args=(prefix, tenant_id, share, barrier, results))
               for share in shares]
    for worker in workers:
        worker.start()
    admitted = sum(results.get(timeout=120) for _ in workers)
    for worker in workers:
        worker.join(30)
    return admitted


def cost(*, tenant_id: int, calls: int, rounds: int, backend_name: str) -> dict:
    """p50/p99 microseconds of reserve + settle per request, limits on and off, interleaved."""
    from django.conf import settings

    from billing.counters import reset_admission_backend
    from billing.counters.memory import MemoryAdmission
    from billing.services.admission_reserve import aadmission_reserve

    reset_admission_backend(MemoryAdmission() if backend_name == "memory" else None)
    auth = _auth(tenant_id)
    samples: dict[str, list[float]] = {"on": [], "off": []}
    admitted: list[str] = []

    async def run(enabled: bool) -> None:
        settings.ADMISSION_ENABLED = enabled
        for _ in range(calls):
            request_id = uuid.uuid4().hex
            started = time.perf_counter()
            await aadmission_reserve(auth=auth, request_id=request_id, model=MODEL, prompt_tokens=100, max_tokens=50)
            samples["on" if enabled else "off"].append(time.perf_counter() - started)
            if enabled:
                admitted.append(request_id)

    async def rounds_() -> None:
        await run(True)  # warm: counters rebuilt, price snapshot loaded
        samples["on"].clear()
        for _ in range(rounds):
            await run(False)
            await run(True)

    asyncio.run(rounds_())
    settings.ADMISSION_ENABLED = True
    _settle_all(auth, admitted)

    def pct(values: list[float], q: float) -> float:
        return round(sorted(values)[min(len(values) - 1, int(q * len(values)))] * 1e6, 1)

    return {
        "backend": backend_name,
        "reserve_on_p50_us": pct(samples["on"], 0.5), "reserve_on_p99_us": pct(samples["on"], 0.99),
        "reserve_off_p50_us": pct(samples["off"], 0.5), "reserve_off_p99_us": pct(samples["off"], 0.99),
        "added_p50_us": round(pct(samples["on"], 0.5) - pct(samples["off"], 0.5), 1),
    }


def _records(auth, request_ids: list[str]) -> list:
    """Finished requests' endings (`Ending`s, the spool's items), as the worker's ending thread makes them
    (priced)."""
    from inference.queue import Job
    from inference.worker.finish import job_ending

    records = []
    for request_id in request_ids:
        job = Job(request_id=request_id, tenant_id=auth.tenant.pk, api_key_id=None, tier=auth.tier.name, priority=0,
                  model=MODEL, prompt_token_ids=[1] * 100, sampling={"max_tokens": 50}, reply_channel="bench")
        records.append(job_ending(job=job, worker_id="bench", finish_reason="stop", prompt_tokens=100,
                                  completion_tokens=20)[0])
    return records


def _sink(way: str):
    """The worker's spool sink (inference.worker.finish.EndingsSink) with its settlement "off" (settled after,
    untimed), "on" (as deployed: sent before the insert, read after) or "sequential" (insert, then settle)."""
    from inference.worker.finish import EndingsSink

    class _Sink(EndingsSink):
        def settle_start(self, endings: list):
            if way == "off":
                return lambda: True
            if way == "sequential":  # started when the spool waits for it: after the insert
                return lambda: super(_Sink, self).settle_start(endings)()
            return super().settle_start(endings)

    return _Sink()


def _settle_all(auth, request_ids: list[str]) -> None:
    from inference.worker.finish import EndingsSink

    for start in range(0, len(request_ids), 64):
        EndingsSink().settle_start(_records(auth, request_ids[start:start + 64]))()


def settle_cost(*, tenant_id: int, steps: int, batch: int) -> list[dict]:
    """Per step and case (backend, records per step), four ways, their order rotated from step to step:
    "insert", the insert alone (the denominator); the worker's record path (`Spool.add`, `Spool.process`) with
    settling "off" (the records' reservations settled after, untimed), "on" (as deployed: the settlement sent
    before the insert, read after), and "sequential" (insert, then settle: the order before). Off, on and
    sequential share one spool, so its SQLite commits weigh the same in each."""
    from billing.counters import get_admission_backend, reset_admission_backend
    from billing.counters.memory import MemoryAdmission
    from billing.services.admission_reserve import aadmission_reserve
    from inference.worker.finish import EndingsSink
    from inference.worker.spool import Spool

    auth = _auth(tenant_id)
    reset_admission_backend()
    backends = {"memory": MemoryAdmission(), "redis": get_admission_backend()}  # each with its connections kept
    cases = [(name, size) for name in backends for size in (batch, 1)]
    ways = ("insert", "off", "on", "sequential")
    folder = Path(tempfile.mkdtemp(prefix="bench-spool-"))
    sinks = {way: _sink(way) for way in ("off", "on", "sequential")}
    spool = Spool(folder, sinks["off"])
    wall: dict = {(case, way): [] for case in cases for way in ways}
    cpu: dict = {(case, way): [] for case in cases for way in ways}  # this thread's CPU: no waits for the servers

    async def reserve(request_ids: list[str]) -> None:
        for request_id in request_ids:
            await aadmission_reserve(auth=auth, request_id=request_id, model=MODEL, prompt_tokens=100, max_tokens=50)

    def end(way: str, records: list) -> None:
        if way == "insert":
            EndingsSink().write(records)  # raises if the records were not written
            return
        spool.sink = sinks[way]
        spool.add(records)
        assert spool.process(records) == (True, True), "not written or not settled"

    # One event loop for every reservation, as in a web process: a loop per step would make a new asyncio Redis
    # client per step (they belong to their loop), and the old one's teardown would land in the timed settle.
    loop = asyncio.new_event_loop()
    for step in range(steps + 3):  # the first 3 warm up (counters rebuilt, scripts loaded, snapshot read)
        for name, size in cases:
            reset_admission_backend(backends[name])
            for way in ways[step % 4:] + ways[:step % 4]:
                request_ids = [uuid.uuid4().hex for _ in range(size)]
                loop.run_until_complete(reserve(request_ids))
                records = _records(auth, request_ids)
                started, started_cpu = time.perf_counter(), time.thread_time()
                end(way, records)
                ended, ended_cpu = time.perf_counter(), time.thread_time()
                if way in ("insert", "off"):
                    EndingsSink().settle_start(records)()
                if step >= 3:
                    wall[((name, size), way)].append(ended - started)
                    cpu[((name, size), way)].append(ended_cpu - started_cpu)
    loop.close()
    spool.close()
    shutil.rmtree(folder, ignore_errors=True)
    ping_cpu = _ping_cpu(backends["redis"])
    reset_admission_backend()
    return _settle_rows(cases, ways, wall, cpu, ping_cpu)


def _ping_cpu(backend) -> list[float]:
    """The floor: the CPU of one bare round trip through the same Redis client (a PING: its send and its
    receive), which any settlement in Redis from this process pays, however it is overlapped."""
    ping_cpu = []
    for _ in range(500):
        started_cpu = time.thread_time()
        backend.redis.ping()
        ping_cpu.append(time.thread_time() - started_cpu)
    return ping_cpu


def _settle_rows(cases: list, ways: tuple, wall: dict, cpu: dict, ping_cpu: list[float]) -> list[dict]:
    """`settle_cost`'s figures per case, from its samples (seconds per step, by (case, way))."""
    rows = []
    for case in cases:
        insert, off = wall[(case, "insert")], wall[(case, "off")]
        p50 = {way: statistics.median(wall[(case, way)]) for way in ways}
        row = {"backend": case[0], "records_per_step": case[1], "steps": len(insert)}
        row.update({f"{way}_p50_us": round(p50[way] * 1e6, 1) for way in ways})
        for way in ("on", "sequential"):
            paired = [(w - o) / i for w, o, i in zip(wall[(case, way)], off, insert)]
            row[f"{way}_added_pct"] = round((p50[way] - p50["off"]) / p50["insert"] * 100, 2)
            row[f"{way}_added_paired_pct"] = round(statistics.median(paired) * 100, 2)
        row.update({f"{way}_cpu_p50_us": round(statistics.median(cpu[(case, way)]) * 1e6, 1) for way in ways})
        if case[0] == "redis":
            row["ping_cpu_p50_us"] = round(statistics.median(ping_cpu) * 1e6, 1)
            row["ping_cpu_pct_of_insert"] = round(statistics.median(ping_cpu) / p50["insert"] * 100, 2)
        rows.append(row)
    return rows


def _arguments() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--processes", type=int, default=4)
    parser.add_argument("--requests", type=int, default=50)
    parser.add_argument("--calls", type=int, default=400, help="admissions per round in the cost measurement")
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--steps", type=int, default=200, help="worker steps per case in the settle measurement")
    parser.add_argument("--batch", type=int, default=16, help="records of a pipelined step (settle measurement)")
    parser.add_argument("--part", choices=("all", "overshoot", "cost", "settle"), default="all")
    parser.add_argument("--json", action="store_true")
    return parser.parse_args()


def main() -> None:
    args = _arguments()

    prefix = f"bench-admission:{uuid.uuid4().hex[:8]}"
    _setup(prefix)
    from datetime import datetime, timezone

    from django.conf import settings
    from django.db import connection

    from billing.counters.units import cost_femtos_to_nanos
    from billing.models import Price, TenantBudget
    from tenants.models import Tenant, Tier

    if not settings.REDIS_URL:
        raise SystemExit("REDIS_URL is required: the overshoot runs across processes")
    tag = uuid.uuid4().hex[:8]
    tier = Tier.objects.create(name=f"bench-admission-{tag}", requests_per_minute=0, tokens_per_minute=0,
                               max_concurrent_requests=0, monthly_token_quota=0, allowed_models=["*"])
    price = Price.objects.create(model=MODEL, input_per_million="1", cached_input_per_million="0.5",
                                 output_per_million="2", effective_from=datetime(2000, 1, 1, tzinfo=timezone.utc))
    worst_nanos = cost_femtos_to_nanos((100 * 1 + 100 * 2) * 10**6 * 1000)  # 100 prompt at $1/M + 100 output at $2/M
    made = []

    def tenant(**fields) -> int:
        budget = fields.pop("monthly_spend_limit_micros", 0)
        made.append(Tenant.objects.create(slug=f"bench-admission-{tag}-{len(made)}", name="admission benchmark",
                                          tier=tier, **fields))
        if budget:
            TenantBudget.objects.create(tenant=made[-1], monthly_spend_limit_micros=budget)
        return made[-1].pk

    everything = dict(requests_per_minute=10**6, tokens_per_minute=10**9, max_concurrent_requests=10**4,
                      monthly_token_quota=10**12, monthly_spend_limit_micros=10**9)
    result: dict = {}
    try:
        if args.part in ("all", "overshoot"):
            result.update(_overshoot_part(prefix=prefix, tenant=tenant, args=args, worst_nanos=worst_nanos))
        if args.part in ("all", "cost"):
            result["cost"] = [cost(tenant_id=tenant(**everything), calls=args.calls, rounds=args.rounds,
                                   backend_name=name) for name in ("memory", "redis")]
        if args.part in ("all", "settle"):
            result["settle"] = settle_cost(tenant_id=tenant(**everything), steps=args.steps, batch=args.batch)
            result["database"] = connection.vendor
    finally:
        _cleanup(made=made, price=price, tier=tier)
    if args.json:
        print(json.dumps(result, indent=2))
        return
    _print(result, args)


def _overshoot_part(*, prefix: str, tenant, args: argparse.Namespace, worst_nanos: int) -> dict:
    """Part 1: `--requests` concurrent admissions at 10 requests per minute, then against a budget of 10
    worst cases (`tenant(**limits)` makes a tenant); what was admitted and what the budget's counter holds."""
    from billing.counters import get_admission_backend

    result = {"rpm_10_admitted": overshoot(prefix=prefix, tenant_id=tenant(requests_per_minute=10),
                                           processes=args.processes, requests=args.requests)}
    budget_tenant = tenant(monthly_spend_limit_micros=worst_nanos * 10 // 1000)
    result["budget_10_admitted"] = overshoot(prefix=prefix, tenant_id=budget_tenant, processes=args.processes,
                                             requests=args.requests)
    backend = get_admission_backend()
    spent = [int(v) for k, v in ((k, backend.redis.get(k)) for k in backend.redis.scan_iter(
        match=f"{backend.prefix}:q:t{budget_tenant}:*:spend")) if v is not None]
    result["budget_spent_nanos"], result["budget_limit_nanos"] = sum(spent), worst_nanos * 10
    result["processes"], result["requests"] = args.processes, args.requests
    return result


def _cleanup(*, made: list, price, tier) -> None:
    """Delete what the run made: its tenants (their usage records first), its price, its tier; its counters."""
    from billing.counters import get_admission_backend, reset_admission_backend
    from billing.models import UsageRecord
    from tenants.models import Tenant

    reset_admission_backend()
    get_admission_backend().flush()
    UsageRecord.objects.filter(tenant__in=made).delete()
    Tenant.objects.filter(pk__in=[t.pk for t in made]).delete()
    price.delete()
    tier.delete()


def _print(result: dict, args: argparse.Namespace) -> None:
    if "rpm_10_admitted" in result:
        print(f"{args.requests} concurrent requests from {args.processes} processes:")
        print(f"  10 requests per minute: {result['rpm_10_admitted']} admitted")
        print(f"  budget for 10 worst cases: {result['budget_10_admitted']} admitted, counter "
              f"{result['budget_spent_nanos']} of {result['budget_limit_nanos']} nano-USD")
    for row in result.get("cost", []):
        print(f"  {row['backend']:6}: reserve p50 {row['reserve_on_p50_us']} us on, {row['reserve_off_p50_us']} us off "
              f"(+{row['added_p50_us']} us; p99 {row['reserve_on_p99_us']} vs {row['reserve_off_p99_us']})")
    for row in result.get("settle", []):
        print(f"  settle, {row['backend']:6}, {row['records_per_step']:3d} records per step ({row['steps']} steps): "
              f"insert p50 {row['insert_p50_us']} us; record path p50 {row['off_p50_us']} us settling off, "
              f"{row['on_p50_us']} us on: settling adds {row['on_added_pct']}% of the insert (paired "
              f"{row['on_added_paired_pct']}%; insert then settle, as before: {row['sequential_added_pct']}%, "
              f"paired {row['sequential_added_paired_pct']}%); CPU p50 insert {row['insert_cpu_p50_us']} us, "
              f"path off {row['off_cpu_p50_us']} us, on {row['on_cpu_p50_us']} us, "
              f"sequential {row['sequential_cpu_p50_us']} us"
              + (f"; one bare Redis round trip (PING) costs {row['ping_cpu_p50_us']} us of CPU, "
                 f"{row['ping_cpu_pct_of_insert']}% of the insert" if "ping_cpu_p50_us" in row else ""))


if __name__ == "__main__":
    main()
