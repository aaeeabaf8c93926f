"""Batch on spare capacity: tier traffic at a steady rate with and without a large batch running beside it.

    python benchmarks/batch_spare_capacity.py --rate 2 --duration 60 --max-tokens 32 \\
        --batch-lines 400 --batch-max-tokens 64 [--batch-in-flight 8] [--json]

Starts a real embedded server (one uvicorn process, the engine and the batch runner inside, on its own SQLite
database), as the end-to-end tests do (tests/e2e/processes.py), then:

- phase A (baseline): open-loop Poisson arrivals of streaming chat requests at --rate for --duration (the
  official `openai.AsyncOpenAI` client, a "pro" key, ignore_eos so every request generates exactly
  --max-tokens). Per request: TTFT (send -> first content chunk). The engine's generated tokens/s over the
  phase come from the server's /metrics (`llmp:generation_tokens_total`), else from the client's count.
- a batch of --batch-lines lines (an "enterprise" key of another tenant; ignore_eos, --batch-max-tokens) is
  uploaded and created (`files.create`, `batches.create`); once it is in_progress and lines complete,
- phase B: the same live load (same arrival times, same prompts) with the batch running beside it: live TTFT
  again, and the batch's output tokens in the window (the engine's generated tokens minus the live requests'
  own; and, as a cross-check, completed lines x --batch-max-tokens from `batches.retrieve`'s request_counts);
- phase C: the batch alone (no live traffic) for --alone-duration: the batch's tokens/s at full use of the
  worker, its capacity when idle.

Figures: TTFT p95 ratio B/A (the issue's bar: <= 1.10) and the share of the worker's idle capacity the batch
used in B = batch tokens/s in B / batch tokens/s in C. The batch is cancelled at the end (its output file's
usage then gives tokens per line, a check that ignore_eos held) and the server stopped.

/metrics counters reach the web process with the worker's heartbeat (about a second late): phase A and B's
windows end --settle-s after the last live request finished, so every live token is inside the counter's
window; in B the batch runs alone in those last seconds (a small bias up, ~settle/duration).

Everything runs on one machine (client, web, engine): a busy machine's figures are noisy.
"""

from __future__ import annotations

import argparse
import asyncio
import io
import json
import os
import platform
import random
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from benchmarks.serving import pct  # noqa: E402
from tests.e2e.processes import MODEL, EmbeddedServer  # noqa: E402

WORDS = ("river stone lantern orchard copper meadow harbor violet thunder candle ember quartz willow falcon "
         "saddle glacier pepper marble compass hollow cedar drift signal amber tide prairie cobalt fern").split()
TERMINAL = {"completed", "failed", "expired", "cancelled"}


# ---------------------------------------------------------------- small helpers
def ms(value: float | None) -> float | None:
    return None if value is None else round(value * 1000, 1)


def ratio(a: float | None, b: float | None) -> float | None:
    return None if a is None or not b else round(a / b, 3)


def prompt(tag: str, i: int, words: int, rng: random.Random) -> list[dict]:
    """A distinct prompt (a numbered opening), so no request reuses another's cached prefix."""
    text = f"{tag} {i}-{rng.randrange(10**9)}: " + " ".join(rng.choice(WORDS) for _ in range(words))
    return [{"role": "user", "content": f"{text}\nWrite a story using these words."}]


def machine() -> dict:
    import torch

    try:
        load = os.getloadavg()
    except OSError:
        load = None
    return {"platform": platform.platform(), "cpus": os.cpu_count(), "python": platform.python_version(),
            "torch": torch.__version__, "loadavg_at_start": load}


async def generated_tokens(http, url: str) -> float | None:
    """The engine's generated tokens so far (`llmp:generation_tokens_total` on /metrics); None if unreadable."""
    from prometheus_client.parser import text_string_to_metric_families

    try:
        response = await http.get(f"{url}/metrics", timeout=10)
        response.raise_for_status()
    except Exception:  # noqa: BLE001 - the figure falls back to the client's count
        return None
    return sum(sample.value for family in text_string_to_metric_families(response.text)
               for sample in family.samples if sample.name == "llmp:generation_tokens_total")


# ---------------------------------------------------------------- live load
@dataclass
class Live:
    ttft_s: float | None = None
    tokens: int = 0
    error: str | None = None


async def live_one(client, messages, max_tokens: int) -> Live:
    out = Live()
    sent = time.perf_counter()
    try:
        stream = await client.chat.completions.create(
            model=MODEL, messages=messages, max_tokens=max_tokens, temperature=0.8, stream=True,
            stream_options={"include_usage": True}, extra_body={"ignore_eos": True})
        async for chunk in stream:
            if out.ttft_s is None and chunk.choices and chunk.choices[0].delta.content:
                out.ttft_s = time.perf_counter() - sent
            if chunk.usage is not None:
                out.tokens = chunk.usage.completion_tokens
    except Exception as exc:  # noqa: BLE001 - counted, not fatal
        out.error = f"{type(exc).__name__}: {exc}"[:200]
    return out


def arrivals(args) -> list[float]:
    """Offsets (s) of the live requests: Poisson at --rate over --duration (seeded: the same in A and B)."""
    rng = random.Random(args.seed)
    times, t = [], 0.0
    while True:
        t += rng.expovariate(args.rate) if args.arrivals == "poisson" else 1.0 / args.rate
        if t >= args.duration:
            return times
        times.append(t)


async def live_phase(args, client, tag: str) -> tuple[list[Live], float]:
    """Open loop: each request sent at its arrival time, whatever the others are doing. Returns (results, wall
    from the first send to the last finish)."""
    rng = random.Random(args.seed + 7)
    offsets = arrivals(args)
    started = time.perf_counter()

    async def at(offset: float, i: int) -> Live:
        await asyncio.sleep(max(0.0, started + offset - time.perf_counter()))
        return await live_one(client, prompt(tag, i, args.prompt_words, rng), args.max_tokens)

    results = await asyncio.gather(*(at(offset, i) for i, offset in enumerate(offsets)))
    return list(results), time.perf_counter() - started


def live_summary(results: list[Live], wall: float, engine_tokens: float | None) -> dict:
    ttft = [r.ttft_s for r in results if r.ttft_s is not None]
    tokens = sum(r.tokens for r in results)
    errors = [r.error for r in results if r.error]
    return {
        "requests": len(results), "errors": len(errors), "first_error": errors[0] if errors else None,
        "ttft_p50_ms": ms(pct(ttft, 50)), "ttft_p95_ms": ms(pct(ttft, 95)), "ttft_max_ms": ms(max(ttft, default=None)),
        "live_output_tokens": tokens, "wall_s": round(wall, 2),
        "live_tok_s": round(tokens / wall, 1) if wall else None,
        "engine_tok_s": round(engine_tokens / wall, 1) if engine_tokens is not None and wall else None,
    }


# ---------------------------------------------------------------- the batch
def batch_file(args) -> bytes:
    rng = random.Random(args.seed + 13)
    lines = [{"custom_id": f"line-{n}", "method": "POST", "url": "/v1/chat/completions",
              "body": {"model": MODEL, "messages": prompt("Batch line", n, args.prompt_words, rng),
                       "max_tokens": args.batch_max_tokens, "temperature": 0.8, "ignore_eos": True}}
             for n in range(args.batch_lines)]
    return "\n".join(json.dumps(line) for line in lines).encode() + b"\n"


async def batch_counts(client, batch_id: str):
    batch = await client.batches.retrieve(batch_id)
    return batch.status, batch.request_counts.completed, batch.request_counts.failed


async def batch_window(args, batch_client, http, url: str, batch_id: str, run_live) -> dict:
    """Counters around `run_live()` (a live phase, or a sleep): the engine's generated tokens and the batch's
    completed lines at the start and --settle-s after its end."""
    tokens0 = await generated_tokens(http, url)
    status0, done0, failed0 = await batch_counts(batch_client, batch_id)
    t0 = time.perf_counter()
    live = await run_live()
    live_end = time.perf_counter()
    await asyncio.sleep(args.settle_s)
    tokens1 = await generated_tokens(http, url)
    status1, done1, failed1 = await batch_counts(batch_client, batch_id)
    return {"t0": t0, "live_end": live_end, "window_s": time.perf_counter() - t0, "live": live,
            "engine_tokens": None if tokens0 is None or tokens1 is None else tokens1 - tokens0,
            "lines_done": done1 - done0, "lines_failed": failed1 - failed0, "status_end": status1,
            "batch_ran_out": status1 != "in_progress" or done1 + failed1 >= args.batch_lines}


def batch_rates(args, window: dict, live_tokens: int) -> dict:
    seconds = window["window_s"]
    from_lines = window["lines_done"] * args.batch_max_tokens
    from_engine = None if window["engine_tokens"] is None else max(0.0, window["engine_tokens"] - live_tokens)
    return {"window_s": round(seconds, 2), "lines_completed": window["lines_done"],
            "lines_failed": window["lines_failed"],
            "batch_tok_s": round((from_engine if from_engine is not None else from_lines) / seconds, 1),
            "batch_tok_s_source": "engine counter - live tokens" if from_engine is not None else "lines x max_tokens",
            "batch_tok_s_from_lines": round(from_lines / seconds, 1),
            "engine_tok_s_total": None if window["engine_tokens"] is None
            else round(window["engine_tokens"] / seconds, 1),
            "batch_ran_out": window["batch_ran_out"]}


async def batch_output_tokens(client, batch_id: str, timeout: float) -> dict:
    """Cancel the batch, wait for it to end, and read its output file's usage (tokens per completed line)."""
    try:
        await client.batches.cancel(batch_id)
    except Exception:  # noqa: BLE001 - already completed
        pass
    deadline = time.monotonic() + timeout
    batch = await client.batches.retrieve(batch_id)
    while batch.status not in TERMINAL and time.monotonic() < deadline:
        await asyncio.sleep(0.5)
        batch = await client.batches.retrieve(batch_id)
    out = {"final_status": batch.status, "completed": batch.request_counts.completed,
           "failed": batch.request_counts.failed, "total": batch.request_counts.total}
    if batch.output_file_id:
        text = (await client.files.content(batch.output_file_id)).text
        usage = [json.loads(line)["response"]["body"]["usage"]["completion_tokens"] for line in text.splitlines()
                 if line.strip() and json.loads(line).get("response")]
        out.update(output_lines=len(usage), output_tokens=sum(usage),
                   tokens_per_line_min=min(usage, default=None), tokens_per_line_max=max(usage, default=None))
    return out


# ---------------------------------------------------------------- the run
async def bench(args, server: EmbeddedServer) -> dict:
    import httpx
    import openai

    live_client = openai.AsyncOpenAI(base_url=f"{server.url}/v1", api_key=server.keys["pro"], max_retries=0,
                                     timeout=600)
    batch_client = openai.AsyncOpenAI(base_url=f"{server.url}/v1", api_key=server.keys["enterprise"],
                                      max_retries=2, timeout=120)
    http = httpx.AsyncClient()
    batch_id = None
    try:
        for i in range(args.warmup):  # the engine's first steps (allocation, kernels) out of the figures
            await live_one(live_client, prompt("Warmup", i, args.prompt_words, random.Random(i)), 4)

        # ---- A: live alone
        tokens0 = await generated_tokens(http, server.url)
        live_a, wall_a = await live_phase(args, live_client, "Request A")
        await asyncio.sleep(args.settle_s)
        tokens1 = await generated_tokens(http, server.url)
        a = live_summary(live_a, wall_a, None if tokens0 is None or tokens1 is None else tokens1 - tokens0)

        # ---- the batch, until its lines run
        file = await batch_client.files.create(file=("batch.jsonl", io.BytesIO(batch_file(args))), purpose="batch")
        batch = await batch_client.batches.create(input_file_id=file.id, endpoint="/v1/chat/completions",
                                                  completion_window="24h")
        batch_id = batch.id
        deadline = time.monotonic() + args.start_timeout
        while True:
            status, done, failed = await batch_counts(batch_client, batch_id)
            if status == "in_progress" and done + failed > 0:
                break
            if status in TERMINAL or status == "failed" or time.monotonic() > deadline:
                raise RuntimeError(f"batch {batch_id} did not start running lines: {status} {done}/{failed}")
            await asyncio.sleep(0.3)
        if failed:
            print(f"warning: {failed} batch lines failed (see the error file)", file=sys.stderr)

        # ---- B: live beside the batch
        window_b = await batch_window(args, batch_client, http, server.url, batch_id,
                                      lambda: live_phase(args, live_client, "Request B"))
        live_b, wall_b = window_b["live"]
        b = live_summary(live_b, wall_b, None)
        b.pop("engine_tok_s")
        b_batch = batch_rates(args, window_b, b["live_output_tokens"])

        # ---- C: the batch alone
        window_c = await batch_window(args, batch_client, http, server.url, batch_id,
                                      lambda: asyncio.sleep(max(0.0, args.alone_duration - args.settle_s)))
        c_batch = batch_rates(args, window_c, 0)

        final = await batch_output_tokens(batch_client, batch_id, timeout=120)
        batch_id = None
    finally:
        if batch_id is not None:
            try:
                await batch_client.batches.cancel(batch_id)
            except Exception:  # noqa: BLE001
                pass
        await http.aclose()
        await live_client.close()
        await batch_client.close()

    warnings = []
    if b_batch["batch_ran_out"] or c_batch["batch_ran_out"]:
        warnings.append("the batch ran out of lines during a phase: raise --batch-lines (its tok/s is low)")
    if a["wall_s"] > 1.5 * args.duration + 5:
        warnings.append("phase A's live load alone outran the worker (requests queued long after the last arrival): "
                        "no spare capacity at this --rate on this machine, the TTFT figures measure a backlog")
    if a["errors"] or b["errors"]:
        warnings.append("some live requests failed (see first_error)")
    ttft_ratio = ratio(b["ttft_p95_ms"], a["ttft_p95_ms"])
    return {
        "config": {k: getattr(args, k) for k in ("rate", "duration", "max_tokens", "prompt_words", "arrivals",
                                                 "batch_lines", "batch_max_tokens", "batch_in_flight",
                                                 "alone_duration", "settle_s", "seed")},
        "machine": machine_info,
        "A_live_alone": a, "B_live_with_batch": b, "B_batch": b_batch, "C_batch_alone": c_batch,
        "batch_final": final,
        "ttft_p50_ratio_b_over_a": ratio(b["ttft_p50_ms"], a["ttft_p50_ms"]),
        "ttft_p95_ratio_b_over_a": ttft_ratio,
        "ttft_p95_within_10pct": None if ttft_ratio is None else ttft_ratio <= 1.10,
        "idle_capacity_share_used": ratio(b_batch["batch_tok_s"], c_batch["batch_tok_s"]),
        "warnings": warnings,
    }


def table(report: dict) -> str:
    a, b, bb, cb = (report[k] for k in ("A_live_alone", "B_live_with_batch", "B_batch", "C_batch_alone"))
    rows = [
        ("", "A live alone", "B live + batch", "C batch alone"),
        ("live requests (errors)", f"{a['requests']} ({a['errors']})", f"{b['requests']} ({b['errors']})", "-"),
        ("live TTFT p50 ms", a["ttft_p50_ms"], b["ttft_p50_ms"], "-"),
        ("live TTFT p95 ms", a["ttft_p95_ms"], b["ttft_p95_ms"], "-"),
        ("live tok/s", a["live_tok_s"], b["live_tok_s"], "-"),
        ("engine tok/s (all)", a["engine_tok_s"], bb["engine_tok_s_total"], cb["engine_tok_s_total"]),
        ("batch lines completed", "-", bb["lines_completed"], cb["lines_completed"]),
        ("batch tok/s", "-", bb["batch_tok_s"], cb["batch_tok_s"]),
        ("batch tok/s (lines x max)", "-", bb["batch_tok_s_from_lines"], cb["batch_tok_s_from_lines"]),
        ("window s", a["wall_s"], bb["window_s"], cb["window_s"]),
    ]
    lines = ["  ".join(f"{str(v if v is not None else 'n/a'):>{26 if i == 0 else 16}}" for i, v in enumerate(row))
             for row in rows]
    lines.append(f"TTFT p95 B/A = {report['ttft_p95_ratio_b_over_a']} (bar <= 1.10: "
                 f"{report['ttft_p95_within_10pct']}); idle capacity share used by the batch = "
                 f"{report['idle_capacity_share_used']} (B batch tok/s / C batch tok/s)")
    final = report["batch_final"]
    lines.append("batch at the end: " + "  ".join(f"{k}={v}" for k, v in final.items()))
    lines += [f"warning: {w}" for w in report["warnings"]]
    return "\n".join(lines)


machine_info: dict = {}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rate", type=float, default=2.0, help="live requests per second")
    parser.add_argument("--duration", type=float, default=60.0, help="seconds of live arrivals per phase")
    parser.add_argument("--max-tokens", type=int, default=32, help="live output tokens (ignore_eos)")
    parser.add_argument("--prompt-words", type=int, default=32, help="~1.3 tokens per word, plus the chat template")
    parser.add_argument("--arrivals", choices=("poisson", "fixed"), default="poisson")
    parser.add_argument("--batch-lines", type=int, default=400)
    parser.add_argument("--batch-max-tokens", type=int, default=64, help="output tokens per batch line (ignore_eos)")
    parser.add_argument("--batch-in-flight", type=int, default=None,
                        help="BATCH_MAX_IN_FLIGHT for the server (default: the server's, 4)")
    parser.add_argument("--alone-duration", type=float, default=20.0, help="phase C: seconds of the batch alone")
    parser.add_argument("--settle-s", type=float, default=2.0,
                        help="wait after a phase before reading /metrics (the heartbeat's delay)")
    parser.add_argument("--warmup", type=int, default=3, help="short live requests before phase A")
    parser.add_argument("--start-timeout", type=float, default=300.0, help="seconds for the batch's lines to start")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--keep-dir", action="store_true", help="keep the server's folder (database, web.log)")
    parser.add_argument("--json", action="store_true", help="last line: one JSON object with every figure")
    args = parser.parse_args()

    machine_info.update(machine())
    env = {"BATCH_POLL_S": "0.2"}
    if args.batch_in_flight is not None:
        env["BATCH_MAX_IN_FLIGHT"] = str(args.batch_in_flight)
    tmp = Path(tempfile.mkdtemp(prefix="batch_spare_"))
    started = time.perf_counter()
    server = EmbeddedServer(tmp, env=env)
    machine_info["server_start_s"] = round(time.perf_counter() - started, 1)
    try:
        report = asyncio.run(bench(args, server))
    except BaseException:
        print(f"server log ({tmp / 'web.log'}):\n{server.proc.log_tail()}", file=sys.stderr)
        raise
    finally:
        server.stop()
        if not args.keep_dir:
            import shutil

            shutil.rmtree(tmp, ignore_errors=True)
    print(table(report))
    if args.json:
        print(json.dumps(report))


if __name__ == "__main__":
    main()
