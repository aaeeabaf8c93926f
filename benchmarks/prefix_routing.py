"""Prefix-aware routing on vs off (inference.queue.routing), with N worker processes of one model on Redis.

    python benchmarks/prefix_routing.py --workers 2 --json [--tenants 6 --requests 72 --concurrency 4]

The real platform, three times on the same PostgreSQL database: a web process and `--workers` engine
workers (`manage.py run_worker`, SmolLM2-135M on the CPU, one torch thread each) on a fresh Redis key
prefix, with QUEUE_ROUTING=prefix ("on"), QUEUE_ROUTING=off ("off": the shared queue, first come first
served), and one worker alone ("single_worker": the hit rate a single cache gets, the bound routing aims
for). The workload, the same in every run: `--tenants` tenants, each with its own system prompt of
`--system-words` words sent with every one of its requests, the requests of all tenants shuffled (seeded)
and sent by a closed loop of `--concurrency` streaming clients (httpx, `stream_options.include_usage`).

Per run: prefix_hit_rate (the cached prompt tokens the usage reports over all prompt tokens), TTFT p50/p95
(send to first content chunk), output_tok_s (completion tokens over the wall time), the requests each
worker served (its /metrics), and idle_with_queue: the fraction of samples (every 50 ms, read from the
queue) in which some worker held no job while jobs were queued (idle_with_queue_held: in two samples in a
row, i.e. not a worker about to pull the job it was just woken for). With --rounds N every mode runs N
times, interleaved, and each figure is the median. The last line with --json is
{"on": {...}, "off": {...}, "single_worker": {...}, "machine": {...}}.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import platform
import random
import sys
import threading
import time
import uuid
from pathlib import Path

import httpx

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from tests.e2e.processes import (  # noqa: E402
    api_key_new, database_prepare, free_port, http_wait, postgres_database_reset, process_env, wait_until, web_start,
    worker_start,
)
from tests.e2e.load_stack import percentile  # noqa: E402
from tests.inference.metrics_helpers import Scrape  # noqa: E402

MODEL = "smollm2-135m-instruct"
WORDS = ("river stone lantern orchard copper meadow harbor signal ledger violet canyon ember glacier market "
         "compass thunder velvet quarry saddle pepper island marble falcon summit willow beacon cedar").split()


def workload(args) -> list[tuple[int, list[dict]]]:
    """(tenant index, messages) for every request, shuffled with the seed."""
    rng = random.Random(args.seed)
    systems = [f"You are assistant number {t} of the {rng.choice(WORDS)} company. "
               + " ".join(rng.choice(WORDS) for _ in range(args.system_words)) for t in range(args.tenants)]
    requests = []
    for i in range(args.requests):
        tenant = i % args.tenants
        question = f"Question {i}: name one word about " + " ".join(rng.choice(WORDS) for _ in range(6)) + "."
        requests.append((tenant, [{"role": "system", "content": systems[tenant]},
                                  {"role": "user", "content": question}]))
    rng.shuffle(requests)
    return requests


async def one_request(client: httpx.AsyncClient, url: str, key: str, messages: list[dict], args) -> dict:
    body = {"model": MODEL, "messages": messages, "max_tokens": args.max_tokens, "stream": True,
            "stream_options": {"include_usage": True}, "temperature": 0}
    started = time.perf_counter()
    ttft, usage = None, None
    async with client.stream("POST", f"{url}/v1/chat/completions", json=body,
                             headers={"Authorization": f"Bearer {key}"}) as response:
        if response.status_code != 200:
            raise RuntimeError(f"{response.status_code}: {(await response.aread())[:300]!r}")
        async for line in response.aiter_lines():
            if not line.startswith("data: ") or line == "data: [DONE]":
                continue
            chunk = json.loads(line[6:])
            if ttft is None and any((choice.get("delta") or {}).get("content") for choice in chunk.get("choices", [])):
                ttft = time.perf_counter() - started
            if chunk.get("usage"):
                usage = chunk["usage"]
    details = usage.get("prompt_tokens_details") or {}
    return {"ttft_s": ttft if ttft is not None else time.perf_counter() - started,
            "prompt_tokens": usage["prompt_tokens"], "cached_tokens": int(details.get("cached_tokens") or 0),
            "completion_tokens": usage["completion_tokens"]}


async def closed_loop(url: str, keys: list[str], requests, args) -> tuple[list[dict], float]:
    pending = list(enumerate(requests))
    results: list[dict] = []
    async with httpx.AsyncClient(timeout=300) as client:
        async def user():
            while pending:
                _, (tenant, messages) = pending.pop(0)
                results.append(await one_request(client, url, keys[tenant], messages, args))

        started = time.perf_counter()
        await asyncio.gather(*(user() for _ in range(args.concurrency)))
        return results, time.perf_counter() - started


def sampler(env: dict, workers: list[str], stop: threading.Event, samples: list[tuple[int, list[int]]]) -> None:
    """(queued, leases per worker) every 50 ms, read from the queue's Redis keys (inference.queue.redis_scripts)."""
    import redis

    client = redis.Redis.from_url(env["REDIS_URL"], decode_responses=True)
    prefix = "{" + env["QUEUE_KEY_PREFIX"] + "}"
    while not stop.is_set():
        pipe = client.pipeline(transaction=False)
        pipe.hvals(f"{prefix}:depth:{MODEL}")
        for worker in workers:
            pipe.hlen(f"{prefix}:lease:{worker}")
        depths, *leases = pipe.execute()
        samples.append((sum(int(d) for d in depths), leases))
        stop.wait(0.05)


def run(mode: str, workers: int, keys: list[str], base_env: dict, requests, args, out: Path) -> dict:
    routing = "off" if mode == "off" else "prefix"
    prefix = f"route-{mode}-{uuid.uuid4().hex[:6]}"
    env = dict(base_env, QUEUE_ROUTING=routing, QUEUE_KEY_PREFIX=prefix, ADMISSION_KEY_PREFIX=f"{prefix}-lim")
    procs = []
    try:
        web, url = web_start(env, out, name=f"web-{mode}")
        procs.append(web)
        ports, names = [], []
        for index in range(workers):
            port, name = free_port(), f"{mode}-w{index}"
            proc = worker_start(env, out, name=f"worker-{mode}-{index}", extra=(
                "--worker-id", name, "--metrics-port", str(port), "--max-num-seqs", str(args.max_num_seqs),
                "--kv-cache-mb", str(args.kv_cache_mb)))
            procs.append(proc)
            ports.append(port)
            names.append(name)
            http_wait(f"http://127.0.0.1:{port}/metrics", proc, timeout=180)
        wait_until(lambda: Scrape.get(url).total("llmp:live_workers") == workers, timeout=120, what="heartbeats")
        # warm-up: short prompts (under one routing block: no affinity), several at once so every worker runs one
        warm = [[{"role": "user", "content": f"Hi {i}"}] for i in range(2 * workers)]
        asyncio.run(closed_loop(url, [keys[0]], [(0, m) for m in warm], argparse.Namespace(**{
            **vars(args), "concurrency": 2 * workers, "max_tokens": 2})))
        before = [Scrape.get(f"http://127.0.0.1:{port}").total("llmp:request_success_total") for port in ports]
        stop, samples = threading.Event(), []
        thread = threading.Thread(target=sampler, args=(env, names, stop, samples), daemon=True)
        thread.start()
        results, wall = asyncio.run(closed_loop(url, keys, requests, args))
        stop.set()
        thread.join()
        served = [Scrape.get(f"http://127.0.0.1:{port}").total("llmp:request_success_total") - before[i]
                  for i, port in enumerate(ports)]
    finally:
        for proc in reversed(procs):
            proc.stop()
    ttfts = [r["ttft_s"] for r in results]
    prompt = sum(r["prompt_tokens"] for r in results)
    queued_samples = [leases for queued, leases in samples if queued > 0]
    idle = sum(1 for leases in queued_samples if min(leases) == 0)
    # the same, held for two samples in a row (>= 50 ms): a worker left idle, not one about to pull the job
    idle_held = sum(1 for (q0, l0), (q1, l1) in zip(samples, samples[1:]) if q0 and q1 and min(l0) == 0 and min(l1) == 0)
    return {
        "workers": workers, "routing": routing, "requests": len(results),
        "prefix_hit_rate": round(sum(r["cached_tokens"] for r in results) / prompt, 4) if prompt else None,
        "ttft_p50_s": round(percentile(ttfts, 0.5), 4), "ttft_p95_s": round(percentile(ttfts, 0.95), 4),
        "output_tok_s": round(sum(r["completion_tokens"] for r in results) / wall, 2), "wall_s": round(wall, 2),
        "requests_per_worker": served,
        "idle_with_queue": round(idle / len(queued_samples), 4) if queued_samples else 0.0,
        "idle_with_queue_held": round(idle_held / len(queued_samples), 4) if queued_samples else 0.0,
        "samples_with_queue": len(queued_samples),
    }


def medians(results: list[dict]) -> dict:
    """Each figure's median over the rounds (the per-round values beside it, under `rounds`)."""
    if len(results) == 1:
        return results[0]
    out = dict(results[0])
    for key, value in results[0].items():
        if isinstance(value, (int, float)) and not isinstance(value, bool):
            out[key] = percentile([r[key] for r in results], 0.5)
    out["requests_per_worker"] = [r["requests_per_worker"] for r in results]
    out["rounds"] = {key: [r[key] for r in results] for key in ("prefix_hit_rate", "ttft_p95_s", "output_tok_s")}
    return out


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--tenants", type=int, default=16)
    # 480: each tenant's prompt 30 times; at 160 a run's TTFT p95 (its 8th slowest request) moved 20-40% between
    # rounds on the same code (docs/benchmarks/routing.md)
    parser.add_argument("--requests", type=int, default=480)
    parser.add_argument("--concurrency", type=int, default=4)
    parser.add_argument("--system-words", type=int, default=160)
    parser.add_argument("--max-tokens", type=int, default=8)
    parser.add_argument("--max-num-seqs", type=int, default=8)
    # 64 MiB: ~2,800 tokens of SmolLM2's KV cache, less than the 16 system prompts (~4,000 tokens) together
    parser.add_argument("--kv-cache-mb", type=int, default=64)
    parser.add_argument("--seed", type=int, default=7)
    parser.add_argument("--rounds", type=int, default=1, help="runs of every mode, interleaved; figures are medians")
    parser.add_argument("--modes", default="single_worker,off,on")
    parser.add_argument("--database-url", default=os.environ.get(
        "BENCH_DATABASE_URL", "postgres://postgres@127.0.0.1:5432/llm_bench_routing"))
    parser.add_argument("--redis-url", default=os.environ.get("BENCH_REDIS_URL", "redis://127.0.0.1:6379/5"))
    parser.add_argument("--out", default=None, help="folder for the processes' logs (default: a temporary one)")
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    if args.workers < 2:
        parser.error("--workers must be 2 or more")
    out = Path(args.out or f"/tmp/prefix-routing-{uuid.uuid4().hex[:6]}")
    out.mkdir(parents=True, exist_ok=True)
    postgres_database_reset(args.database_url)
    env = process_env(DATABASE_URL=args.database_url, REDIS_URL=args.redis_url, OMP_NUM_THREADS="1",
                      EMBEDDED_WORKER="0", MODEL_WAIT_S="60", LOG_LEVEL="WARNING")
    database_prepare(env)
    keys = [api_key_new(env, tenant=f"route-t{t}", tier="enterprise") for t in range(args.tenants)]
    requests = workload(args)
    rounds: dict[str, list[dict]] = {}
    for round_index in range(args.rounds):
        modes = args.modes.split(",")
        for mode in modes if round_index % 2 == 0 else modes[::-1]:  # alternating order: drift favours no mode
            result = run(mode, 1 if mode == "single_worker" else args.workers, keys, env, requests, args, out)
            rounds.setdefault(mode, []).append(result)
            print(f"round {round_index + 1} {mode}: {json.dumps(result)}", flush=True)
    report: dict = {mode: medians(results) for mode, results in rounds.items()}
    report["machine"] = {"cpu": platform.processor() or platform.machine(), "cores": os.cpu_count(),
                         "workload": {k: getattr(args, k) for k in ("tenants", "requests", "concurrency",
                                                                     "system_words", "max_tokens", "seed")}}
    if "on" in report and "single_worker" in report and report["single_worker"]["prefix_hit_rate"]:
        report["on_vs_single_hit_rate"] = round(report["on"]["prefix_hit_rate"]
                                                / report["single_worker"]["prefix_hit_rate"], 3)
    if args.json:
        print(json.dumps(report))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
