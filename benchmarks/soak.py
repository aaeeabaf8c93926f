"""Soak: a saturating Locust load for ten minutes on a web process and an engine worker (PostgreSQL + Redis).

    .venv/bin/python benchmarks/soak.py --minutes 10 --database-url postgres://postgres@127.0.0.1:5432/llm_soak \\
        --redis-url redis://127.0.0.1:6379/2 --out benchmarks/results/<machine>-<date>-soak

Starts the stack of tests/e2e/load_stack.py (its database dropped and made
anew), runs benchmarks/locustfile.py headless on loopback with more users
than the worker's batch (the saturation rate) for the warm-up plus the
soak, scrapes both /metrics pages every 10 s, then waits for the platform
to be idle. It reports, and exits 1 when one fails:
- requests that failed other than by policy (429, 503): must be none;
- resident memory of the web process and of the worker at the end of the
  load against just after the warm-up: within 5%;
- the clients' TTFT p99 (streams, time to the first content chunk) in the
  soak's last minute against its first minute (after the warm-up): within 20%;
- at the idle end: KV blocks, the worker's requests, admission reservations,
  concurrency slots and queued jobs 0; no more database connections in use
  than after the warm-up and none outside the pools; file descriptors of
  both processes no more than after the warm-up (+2).
TTFT windows count the streams whose first token came in that minute.
Raw data in --out: load.jsonl (one line per request), samples.jsonl (the
scrapes), run.json (start, end, the idle figures), summary.json, the
processes' logs; `--analyze-only --out DIR` recomputes summary.json from them.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import sys
import threading
import time
from datetime import datetime, timezone
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
os.environ.setdefault("DJANGO_SETTINGS_MODULE", "platform_site.settings")

from tests.e2e.load_stack import LoadStack, leak_figures, load_errors, load_log, percentile  # noqa: E402

FD_SLACK = 2


def sampler(stack: LoadStack, path: Path, stop: threading.Event, every_s: float) -> None:
    with open(path, "a", buffering=1) as out:
        while not stop.wait(every_s):
            try:
                figures = leak_figures(stack.web_scrape(), stack.worker_scrape())
            except Exception as exc:  # noqa: BLE001 - a missed sample is noted, the soak goes on
                out.write(json.dumps({"t": time.time(), "error": str(exc)}) + "\n")
                continue
            out.write(json.dumps({"t": time.time(), **figures}) + "\n")


def window_p99(entries: list[dict], start: float, end: float) -> tuple[float, int]:
    """p99 of the streams' TTFT whose first token came in [start, end), and how many."""
    ttfts = [e["ttft_s"] for e in entries
             if e["kind"] == "stream" and e["ttft_s"] is not None and start <= e["t"] + e["ttft_s"] < end]
    return percentile(ttfts, 0.99), len(ttfts)


def run(args) -> dict:
    """Start the stack, load it, sample it; what the analysis needs besides the logs (run.json)."""
    soak_s = int(args.minutes * 60)
    stack = LoadStack(args.out, database_url=args.database_url, redis_url=args.redis_url,
                      max_num_seqs=args.max_num_seqs)
    stop = threading.Event()
    thread = threading.Thread(target=sampler, args=(stack, args.out / "samples.jsonl", stop, 10.0), daemon=True)
    try:
        started = time.time()
        thread.start()
        locust = stack.load(users=args.users, seconds=args.warmup_s + soak_s, log_path=args.out / "load.jsonl")
        load_end = time.time()
        stop.set()
        thread.join()
        idle = leak_figures(*stack.idle(timeout=120))
    finally:
        stop.set()
        stack.stop()
    facts = {"started": started, "load_end": load_end, "warmup_s": args.warmup_s, "idle_end": idle,
             "locust_returncode": locust.returncode, "date": datetime.now(timezone.utc).isoformat(timespec="seconds"),
             "machine": platform.node(), "cpus": os.cpu_count(), "load_average_at_end": os.getloadavg(),
             "args": {k: str(v) for k, v in vars(args).items()}}
    (args.out / "run.json").write_text(json.dumps(facts, indent=2) + "\n")
    return facts


def analyze(out: Path, facts: dict) -> dict:
    entries = load_log(out / "load.jsonl")
    samples = [s for s in load_log(out / "samples.jsonl") if "error" not in s]
    soak_start, load_end, idle = facts["started"] + facts["warmup_s"], facts["load_end"], facts["idle_end"]
    after_warmup = next(s for s in samples if s["t"] >= soak_start)
    at_end = [s for s in samples if s["t"] <= load_end][-1]
    first_p99, first_n = window_p99(entries, soak_start, soak_start + 60)
    last_p99, last_n = window_p99(entries, load_end - 60, load_end)
    errors = load_errors(entries)
    statuses: dict[str, int] = {}
    for entry in entries:
        statuses[str(entry["status"])] = statuses.get(str(entry["status"]), 0) + 1
    rss = {who: at_end[f"{who}_rss_bytes"] / after_warmup[f"{who}_rss_bytes"] for who in ("web", "worker")}
    checks = {
        "no errors but 429/503": not errors,
        "web RSS within 5%": abs(rss["web"] - 1) <= 0.05,
        "worker RSS within 5%": abs(rss["worker"] - 1) <= 0.05,
        "TTFT p99 last minute within 20% of the first": abs(last_p99 / first_p99 - 1) <= 0.20,
        "nothing held when idle": all(idle[k] == 0 for k in ("kv_blocks_used", "worker_requests_active",
                                                               "reservations_held", "slots_held", "queue_depth")),
        "no connection left in use": (idle["web_db_in_use"] <= after_warmup["web_db_in_use"]
                                      and idle["worker_db_in_use"] <= after_warmup["worker_db_in_use"]),
        "no connection outside the pools": idle["db_server_connections"] <= idle["db_pools_open"] + 1,
        "no file descriptor leaked": (idle["web_open_fds"] <= after_warmup["web_open_fds"] + FD_SLACK
                                      and idle["worker_open_fds"] <= after_warmup["worker_open_fds"] + FD_SLACK),
    }
    return {
        **{k: facts[k] for k in ("date", "machine", "cpus", "load_average_at_end", "args", "locust_returncode")},
        "requests": len(entries), "statuses": statuses,
        "streams_served": sum(1 for e in entries if e["kind"] == "stream" and e["status"] == 200),
        "errors": errors[:20], "ttft_p99_first_minute_s": first_p99, "ttft_first_minute_n": first_n,
        "ttft_p99_last_minute_s": last_p99, "ttft_last_minute_n": last_n, "ttft_p99_ratio": last_p99 / first_p99,
        "rss_after_warmup": {w: after_warmup[f"{w}_rss_bytes"] for w in ("web", "worker")},
        "rss_at_end": {w: at_end[f"{w}_rss_bytes"] for w in ("web", "worker")}, "rss_ratio": rss,
        "after_warmup": after_warmup, "idle_end": idle, "checks": checks,
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--minutes", type=float, default=10.0)
    parser.add_argument("--warmup-s", type=int, default=60)
    parser.add_argument("--users", type=int, default=12)
    parser.add_argument("--max-num-seqs", type=int, default=8)
    parser.add_argument("--database-url", default="postgres://postgres@127.0.0.1:5432/llm_soak")
    parser.add_argument("--redis-url", default="redis://127.0.0.1:6379/2")
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--analyze-only", action="store_true", help="recompute summary.json from the logs in --out")
    args = parser.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    facts = json.loads((args.out / "run.json").read_text()) if args.analyze_only else run(args)
    summary = analyze(args.out, facts)
    (args.out / "summary.json").write_text(json.dumps(summary, indent=2) + "\n")
    print(json.dumps({k: summary[k] for k in ("requests", "statuses", "streams_served", "ttft_p99_first_minute_s",
                                              "ttft_first_minute_n", "ttft_p99_last_minute_s", "ttft_last_minute_n",
                                              "ttft_p99_ratio", "rss_ratio", "checks")}, indent=2))
    return 0 if all(checks_pass for checks_pass in summary["checks"].values()) else 1


if __name__ == "__main__":
    sys.exit(main())
