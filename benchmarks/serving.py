"""Serving benchmark: N concurrent streaming clients (the `openai` SDK) against a running server.

    python benchmarks/serving.py --url http://127.0.0.1:8000 --key sk-... \\
        --concurrency 16 --requests 64 --prompt-words 96 --max-tokens 64 [--json]

Phase 1 (API): a closed loop of C clients (`AsyncOpenAI`, streaming, ignore_eos so
every request generates exactly --max-tokens) sends R chat requests. Per request:
TTFT (send -> first content chunk) and inter-token latencies (between content
chunks), plus the worker's own clocks for the same request, which the server
adds to the last chunk when asked (`stream_options.include_timing`).

Phase 2 (engine alone): the same prompts, token for token (same chat template),
through an in-process `Engine` with the server's configuration, driven in the
same closed loop of C requests in flight, after the server has gone idle.

Gateway overhead, two ways, both from this one run:
- paired: per request, client TTFT minus the worker-measured time from the
  enqueue to the first token (`timing.ttft_s`). What is left is the gateway's own
  path: HTTP in, auth, tokenising, enqueue, event delivery over the channel
  layer, SSE out, client parsing. Exact per request, and immune to the two
  phases seeing different CPU contention.
- phases: API TTFT percentiles minus engine-alone TTFT percentiles. This also
  charges the gateway for what it does to the engine: a request that arrives
  over HTTP mid-step waits for the step to end (the engine-alone loop adds
  requests exactly at step boundaries), and on a shared CPU the web process
  competes with the engine for cores.
Throughput: output tok/s of each phase and their ratio.

Client floor (after phase 1, unless --floor-requests 0): the same SDK client,
one request at a time, against a null SSE server in this process that answers
at once. Its TTFT is what the client's own work (building the request, parsing
the chunk) and loopback HTTP cost on this machine: a floor under the paired
overhead of any gateway, ours or another.

Loaded floor (--loaded-floor, after the client floor): phase 1's closed loop
again, same prompts, lengths and concurrency, against benchmarks/null_gateway.py,
a subprocess that streams on a step clock of phase 1's ITL p50 at next to no
cost while a second process keeps one core busy, as the engine does. Its paired
overhead is what the SDK client, loopback HTTP and this machine's scheduling
cost under the same load when the gateway itself costs nothing: the idle floor
above leaves out the client handling the other streams' chunks and the core
the engine takes.

Everything runs on this machine (client, server, engine): the client's own
CPU use is part of the API phase's cost here, as it would not be on separate
machines.

The client is the SDK as a tenant would run it: httpx on asyncio by default;
--http-client aiohttp (`openai.DefaultAioHttpClient`) and --loop uvloop change
it in every phase over HTTP, the floors' included, so a figure and its floor
always come from the same client.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import platform
import random
import statistics
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from _runtime import runtime_configure_from_env  # noqa: E402

MODEL = "smollm2-135m-instruct"
WORDS = ("river stone lantern orchard copper meadow harbor violet thunder candle ember quartz willow falcon "
         "saddle glacier pepper marble compass hollow cedar drift signal amber tide prairie cobalt fern").split()


@dataclass
class RequestStats:
    ttft_s: float | None = None
    itl_s: list[float] = field(default_factory=list)
    tokens: int = 0
    server_ttft_s: float | None = None  # worker clock: enqueue -> first token
    processing_ms: float | None = None  # web process: view start -> response (auth, tokenise, enqueue)
    engine_ttft_s: float | None = None  # engine clock: add_request -> first token


def pct(values: list[float], q: float) -> float | None:
    if not values:
        return None
    ordered = sorted(values)
    index = min(len(ordered) - 1, max(0, round(q / 100 * (len(ordered) - 1))))
    return ordered[index]


def ms(value: float | None) -> float | None:
    return None if value is None else round(value * 1000, 2)


def output_lengths(args) -> list[int]:
    """Per-request output lengths: --max-tokens +- --jitter (seeded, the same in both phases).

    Equal lengths would make a closed loop finish, and resubmit, in lock-step
    bursts that no real traffic has; the jitter spreads the arrivals.
    """
    rng = random.Random(args.seed + 1)
    spread = int(args.max_tokens * args.jitter)
    return [max(1, args.max_tokens + rng.randint(-spread, spread)) for _ in range(args.requests)]


def prompts_build(count: int, words: int, seed: int) -> list[list[dict]]:
    """Distinct prompts (a numbered opening), so no request reuses another's cached prefix."""
    rng = random.Random(seed)
    out = []
    for i in range(count):
        text = f"Request {i}-{rng.randrange(10**9)}: " + " ".join(rng.choice(WORDS) for _ in range(words))
        out.append([{"role": "user", "content": f"{text}\nWrite a story using these words."}])
    return out


# ---------------------------------------------------------------- phase 1: through the API
def sdk_client(args, base_url: str, key: str):
    """The `openai` SDK's async client over --http-client: httpx (its default) or aiohttp
    (`openai.DefaultAioHttpClient`, the SDK's own backend for many concurrent requests; `openai[aiohttp]`)."""
    import openai

    http_client = openai.DefaultAioHttpClient(timeout=600) if args.http_client == "aiohttp" else None
    return openai.AsyncOpenAI(base_url=base_url, api_key=key, max_retries=0, timeout=600, http_client=http_client)


async def api_one(client, messages, max_tokens: int) -> RequestStats:
    stats = RequestStats()
    sent = last = time.perf_counter()
    stream = await client.chat.completions.create(
        model=MODEL, messages=messages, max_tokens=max_tokens, temperature=0.8, stream=True,
        stream_options={"include_usage": True, "include_timing": True}, extra_body={"ignore_eos": True})
    stats.processing_ms = float(stream.response.headers.get("openai-processing-ms", "nan"))
    async for chunk in stream:
        now = time.perf_counter()
        if chunk.choices and chunk.choices[0].delta.content:
            if stats.ttft_s is None:
                stats.ttft_s = now - sent
            else:
                stats.itl_s.append(now - last)
            last = now
        timing = (chunk.model_extra or {}).get("timing")
        if timing:
            stats.server_ttft_s, stats.engine_ttft_s = timing.get("ttft_s"), timing.get("engine_ttft_s")
        if chunk.usage is not None:
            stats.tokens = chunk.usage.completion_tokens
    return stats


async def api_phase(args, prompts) -> tuple[list[RequestStats], float]:
    client = sdk_client(args, args.url.rstrip("/") + "/v1", args.key)
    for messages in prompts[: args.warmup]:
        await api_one(client, messages, 4)
    lengths = output_lengths(args)
    queue = list(enumerate(prompts[args.warmup:]))
    results: list[RequestStats] = [None] * len(queue)  # type: ignore[list-item]

    async def client_loop(delay: float) -> None:
        await asyncio.sleep(delay)
        while queue:
            index, messages = queue.pop(0)
            results[index] = await api_one(client, messages, lengths[index])

    started = time.perf_counter()
    # clients start spread over --ramp-s, so the first requests do not all arrive in one burst
    await asyncio.gather(*(client_loop(i * args.ramp_s / args.concurrency) for i in range(args.concurrency)))
    wall = time.perf_counter() - started
    await client.close()
    return results, wall


# ---------------------------------------------------------------- the client's own floor
async def _null_sse_server(reader, writer) -> None:
    """Answers every chat request at once with a role chunk, one content chunk, [DONE] (HTTP/1.1 keep-alive)."""
    from null_gateway import chunked, read_request  # benchmarks/, this script's folder
    chunk = {"id": "chatcmpl-floor", "object": "chat.completion.chunk", "created": 0, "model": MODEL,
             "choices": [{"index": 0, "delta": {"content": "hi"}, "logprobs": None, "finish_reason": None}]}
    role = {**chunk, "choices": [{"index": 0, "delta": {"role": "assistant", "content": ""}, "logprobs": None,
                                  "finish_reason": None}]}
    events = [f"data: {json.dumps(c)}\n\n".encode() for c in (role, chunk)] + [b"data: [DONE]\n\n"]
    body = b"".join(chunked(e) for e in events) + b"0\r\n\r\n"
    try:
        while True:
            await read_request(reader)
            writer.write(b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\ntransfer-encoding: chunked\r\n\r\n" + body)
            await writer.drain()
    except (asyncio.IncompleteReadError, ConnectionError):
        writer.close()
    except asyncio.CancelledError:  # the phase is over: end quietly (Python 3.11 logs a cancelled handler)
        writer.close()


async def floor_phase(args, prompts) -> dict:
    """TTFT of the same SDK client, one request at a time, against a server that answers at once.

    What is left is the client's own work (the SDK building the request,
    parsing the chunk) plus HTTP over loopback: a floor under any gateway's
    paired overhead on this machine, measured in the same run.
    """
    server = await asyncio.start_server(_null_sse_server, "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    client = sdk_client(args, f"http://127.0.0.1:{port}/v1", "sk-floor")
    ttfts = []
    for index in range(args.warmup + args.floor_requests):
        messages = prompts[index % len(prompts)]
        sent = time.perf_counter()
        stream = await client.chat.completions.create(model=MODEL, messages=messages, max_tokens=args.max_tokens,
                                                      temperature=0.8, stream=True)
        first = None
        async for chunk in stream:
            if first is None and chunk.choices and chunk.choices[0].delta.content:
                first = time.perf_counter() - sent
        if index >= args.warmup:
            ttfts.append(first)
    await client.close()
    server.close()
    await server.wait_closed()
    return {"requests": len(ttfts), "ttft_p50_ms": ms(pct(ttfts, 50)), "ttft_p99_ms": ms(pct(ttfts, 99))}


async def loaded_floor_phase(args, prompts, step_ms: float) -> dict:
    """Phase 1's closed loop, same prompts and lengths, against benchmarks/null_gateway.py (a subprocess
    streaming on a --step-ms clock at next to no cost, one core kept busy as the engine keeps it): the
    paired overhead of a gateway that does nothing, under phase 1's client load, on this machine."""
    proc = await asyncio.create_subprocess_exec(
        sys.executable, str(Path(__file__).with_name("null_gateway.py")), "--step-ms", f"{step_ms:.1f}", "--burn",
        stdout=asyncio.subprocess.PIPE)
    try:
        line = (await asyncio.wait_for(proc.stdout.readline(), 60)).decode()
        if not line.startswith("port "):
            raise RuntimeError(f"null_gateway.py did not start: {line!r}")
        null_args = argparse.Namespace(**{**vars(args), "url": f"http://127.0.0.1:{int(line.split()[1])}",
                                           "key": "sk-null"})
        results, wall = await api_phase(null_args, prompts)
    finally:
        proc.terminate()
        await proc.wait()
    totals = summary(results, wall)
    paired = {k: v for k, v in gateway(results, totals, None).items() if k.startswith("paired_overhead_p")}
    return {"step_ms": round(step_ms, 1), **totals, **paired}


# ---------------------------------------------------------------- phase 2: the engine alone
def engine_phase(args, prompts) -> tuple[list[RequestStats], float]:
    from inference.engine import Engine, EngineConfig, SamplingParams

    engine = Engine(EngineConfig(model=MODEL, device="cpu", dtype=args.dtype, kv_cache_mb=args.kv_cache_mb,
                                 max_num_seqs=args.max_num_seqs, num_threads=args.threads))
    args.engine_kv_cache = engine.kv_plan.describe()
    tokenizer = engine.tokenizer
    warm = SamplingParams(max_tokens=4, temperature=0.8)
    engine.generate([tokenizer.encode_chat(m) for m in prompts[: args.warmup]], warm)
    todo = [tokenizer.encode_chat(m) for m in prompts[args.warmup:]]
    lengths = output_lengths(args)
    results = [RequestStats() for _ in todo]
    added: dict[str, float] = {}
    last: dict[str, float] = {}
    next_index = 0

    def add() -> None:
        nonlocal next_index
        request_id = f"bench-{next_index}"
        added[request_id] = last[request_id] = time.perf_counter()
        sampling = SamplingParams(max_tokens=lengths[next_index], temperature=0.8, ignore_eos=True)
        engine.add_request(request_id, todo[next_index], sampling)
        next_index += 1

    def on_outputs(outputs) -> None:
        now = time.perf_counter()
        for output in outputs:
            stats = results[int(output.request_id.split("-")[1])]
            if output.new_token_ids:
                if stats.ttft_s is None:
                    stats.ttft_s = now - added[output.request_id]
                else:
                    stats.itl_s.append(now - last[output.request_id])
                last[output.request_id] = now
            if output.finished:
                stats.tokens = output.usage.completion_tokens

    wall = closed_loop(engine, len(todo), args, add, on_outputs)
    args.engine_preemptions = engine.scheduler.num_preemptions
    return results, wall


def closed_loop(engine, total: int, args, add, on_outputs, step=None) -> float:
    """Drive the engine alone like the API clients: the first --concurrency of ``total`` requests arrive
    spread over --ramp-s, then each finished request admits the next (``add()``). ``on_outputs`` sees each
    step's outputs; ``step`` replaces ``engine.step`` (to time it). Returns the wall seconds."""
    step = step or engine.step
    admitted = 0

    def admit() -> None:
        nonlocal admitted
        add()
        admitted += 1

    started = time.perf_counter()
    ramp = [started + i * args.ramp_s / args.concurrency for i in range(min(args.concurrency, total))]
    while ramp or engine.has_unfinished():
        while ramp and ramp[0] <= time.perf_counter():
            ramp.pop(0)
            admit()
        if not engine.has_unfinished():
            time.sleep(max(0.0, ramp[0] - time.perf_counter()))
            continue
        outputs = step()
        on_outputs(outputs)
        for output in outputs:
            if output.finished and admitted < total:
                admit()
    return time.perf_counter() - started


# ---------------------------------------------------------------- report
def summary(results: list[RequestStats], wall: float) -> dict:
    ttft = [r.ttft_s for r in results if r.ttft_s is not None]
    itl = [x for r in results for x in r.itl_s]
    tokens = sum(r.tokens for r in results)
    return {
        "requests": len(results), "output_tokens": tokens, "wall_s": round(wall, 2),
        "output_tok_s": round(tokens / wall, 1) if wall else None,
        "ttft_p50_ms": ms(pct(ttft, 50)), "ttft_p99_ms": ms(pct(ttft, 99)),
        "itl_p50_ms": ms(pct(itl, 50)), "itl_p99_ms": ms(pct(itl, 99)),
    }


def gateway(api: list[RequestStats], api_sum: dict, engine_sum: dict | None) -> dict:
    paired = [r.ttft_s - r.server_ttft_s for r in api if r.ttft_s is not None and r.server_ttft_s is not None]
    processing = [r.processing_ms / 1000 for r in api if r.processing_ms is not None]
    hop = [r.server_ttft_s - r.engine_ttft_s for r in api if r.server_ttft_s is not None and r.engine_ttft_s is not None]
    out = {
        "paired_overhead_p50_ms": ms(pct(paired, 50)), "paired_overhead_p99_ms": ms(pct(paired, 99)),
        "paired_overhead_mean_ms": ms(statistics.fmean(paired)) if paired else None,
        "web_processing_p50_ms": ms(pct(processing, 50)), "web_processing_p99_ms": ms(pct(processing, 99)),
        "queue_to_engine_p50_ms": ms(pct(hop, 50)), "queue_to_engine_p99_ms": ms(pct(hop, 99)),
    }
    if engine_sum:
        out["phase_ttft_p50_diff_ms"] = round(api_sum["ttft_p50_ms"] - engine_sum["ttft_p50_ms"], 2)
        out["phase_ttft_p99_diff_ms"] = round(api_sum["ttft_p99_ms"] - engine_sum["ttft_p99_ms"], 2)
        out["throughput_ratio"] = round(api_sum["output_tok_s"] / engine_sum["output_tok_s"], 3)
    return out


def server_preemptions(args) -> float | None:
    """llmp:num_preemptions_total on the server's /metrics (--metrics-url: the web process, which holds the
    engine's figures in the embedded mode, or a worker's --metrics-port); None when it cannot be read."""
    import httpx
    from prometheus_client.parser import text_string_to_metric_families

    headers = {"Authorization": f"Bearer {args.metrics_token}"} if args.metrics_token else {}
    try:
        response = httpx.get((args.metrics_url or args.url).rstrip("/") + "/metrics", headers=headers, timeout=10)
        response.raise_for_status()
    except httpx.HTTPError:
        return None
    return sum(sample.value for family in text_string_to_metric_families(response.text)
               for sample in family.samples if sample.name == "llmp:num_preemptions_total")


def machine() -> dict:
    import torch

    return {"platform": platform.platform(), "cpus": os.cpu_count(), "python": platform.python_version(),
            "torch": torch.__version__, "torch_threads": torch.get_num_threads()}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--url", default="http://127.0.0.1:8000")
    parser.add_argument("--key", default=os.environ.get("OPENAI_API_KEY"), help="API key (default $OPENAI_API_KEY)")
    parser.add_argument("--concurrency", type=int, default=16)
    parser.add_argument("--requests", type=int, default=64)
    parser.add_argument("--prompt-words", type=int, default=96, help="~1.3 tokens per word, plus the chat template")
    parser.add_argument("--max-tokens", type=int, default=64, help="mean output tokens per request (ignore_eos)")
    parser.add_argument("--jitter", type=float, default=0.25, help="output lengths vary by +- this fraction")
    parser.add_argument("--ramp-s", type=float, default=1.0, help="spread the clients' first requests over this")
    parser.add_argument("--threads", type=int, default=None, help="phase 2: torch threads (match the server's)")
    parser.add_argument("--warmup", type=int, default=2)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--no-engine", action="store_true", help="skip phase 2 (the engine alone)")
    parser.add_argument("--dtype", default="bfloat16", help="phase 2: match the server's ENGINE_DTYPE")
    parser.add_argument("--kv-cache-mb", type=int, default=None,
                        help="phase 2: match ENGINE_KV_CACHE_MB (default: sized from free memory, as the server's)")
    parser.add_argument("--metrics-url", default=None,
                        help="where the engine's preemptions are read (/metrics; default --url, the embedded mode)")
    parser.add_argument("--metrics-token", default=os.environ.get("METRICS_TOKEN"),
                        help="/metrics bearer token (default $METRICS_TOKEN)")
    parser.add_argument("--max-num-seqs", type=int, default=64, help="phase 2: match ENGINE_MAX_NUM_SEQS")
    parser.add_argument("--floor-requests", type=int, default=64,
                        help="requests against the in-process null server (the client's floor); 0 skips it")
    parser.add_argument("--loaded-floor", action="store_true",
                        help="after phase 1, the same load against benchmarks/null_gateway.py (the floor under load)")
    parser.add_argument("--floor-step-ms", type=float, default=None,
                        help="--loaded-floor's step clock (default: phase 1's ITL p50)")
    parser.add_argument("--http-client", choices=("httpx", "aiohttp"), default="httpx",
                        help="the SDK's HTTP backend in every phase through HTTP (aiohttp needs openai[aiohttp])")
    parser.add_argument("--loop", choices=("asyncio", "uvloop"), default="asyncio",
                        help="the client's event loop in every phase through HTTP")
    parser.add_argument("--json", action="store_true", help="last line: one JSON object with every figure")
    args = parser.parse_args()
    runtime_configure_from_env()
    if not args.key:
        parser.error("--key (or $OPENAI_API_KEY) is required")
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    prompts = prompts_build(args.warmup + args.requests, args.prompt_words, args.seed)
    if args.loop == "uvloop":
        import uvloop

        asyncio.set_event_loop_policy(uvloop.EventLoopPolicy())

    preempted = server_preemptions(args)
    api_results, api_wall = asyncio.run(api_phase(args, prompts))
    api_sum = summary(api_results, api_wall)
    time.sleep(2.5)  # the engine's counters reach /metrics with the worker's next heartbeat (about a second)
    after = server_preemptions(args)
    api_sum["preemptions"] = None if preempted is None or after is None else int(after - preempted)
    floor = asyncio.run(floor_phase(args, prompts)) if args.floor_requests > 0 else None
    loaded = None
    if args.loaded_floor:
        loaded = asyncio.run(loaded_floor_phase(args, prompts, args.floor_step_ms or api_sum["itl_p50_ms"]))
    engine_sum = None
    if not args.no_engine:
        engine_results, engine_wall = engine_phase(args, prompts)
        engine_sum = summary(engine_results, engine_wall)
        engine_sum.update(preemptions=args.engine_preemptions, kv_cache=args.engine_kv_cache)
    report = {
        "config": {k: getattr(args, k) for k in ("url", "concurrency", "requests", "prompt_words", "max_tokens",
                                                 "jitter", "ramp_s", "dtype", "threads", "http_client", "loop")},
        "machine": machine(), "api": api_sum, "engine_alone": engine_sum, "gateway": gateway(api_results, api_sum, engine_sum),
        "client_floor": floor, "loaded_floor": loaded,
    }
    for section in ("api", "engine_alone", "gateway", "client_floor", "loaded_floor"):
        if report[section]:
            print(f"{section:13s} " + "  ".join(f"{k}={v}" for k, v in report[section].items()))
    if args.json:
        print(json.dumps(report))


if __name__ == "__main__":
    main()
