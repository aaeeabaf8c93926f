"""What Django's middleware stack would cost the completion paths: the API handler and Django's own, A/B.

    DATABASE_URL=sqlite:////tmp/bench/db.sqlite3 SECRET_KEY=... DEBUG=0 \\
        python benchmarks/asgi_stack.py --key sk-... --requests 2000

The same `POST /v1/chat/completions` goes, in turns, through
`platform_site.asgi.application` (its `api_http_router` sends the completion
paths to `inference.api.asgi.ApiASGIHandler`: no middleware, no
`request_started`) and through Django's standard `ASGIHandler` with
settings.MIDDLEWARE, in one process and one event loop, as uvicorn would call
them. The body asks for `n: 2`, which the view refuses after the key check
(cached after the first request) and the parsing, so everything up to the
first byte runs but no engine: the time measured, scope in to the first
`http.response.body` message, is the gateway's share of a first token before
the job is queued, with and without the stack. The figure that decides
whether the bypass pays is the difference of the medians.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
os.environ.setdefault("DJANGO_SETTINGS_MODULE", "platform_site.settings")


def _scope(body: bytes, key: str) -> dict:
    return {
        "type": "http", "asgi": {"version": "3.0"}, "http_version": "1.1", "method": "POST", "scheme": "http",
        "path": "/v1/chat/completions", "raw_path": b"/v1/chat/completions", "query_string": b"", "root_path": "",
        "headers": [
            (b"host", b"127.0.0.1"), (b"content-type", b"application/json"),
            (b"content-length", str(len(body)).encode()), (b"authorization", f"Bearer {key}".encode()),
        ],
        "client": ("127.0.0.1", 50000), "server": ("127.0.0.1", 8000),
    }


async def _one(app, body: bytes, key: str) -> tuple[float, int]:
    """Seconds from the call to the first body message, and the status."""
    first_body = asyncio.get_running_loop().create_future()
    status = 0
    delivered = False

    async def receive():
        nonlocal delivered
        if not delivered:
            delivered = True
            return {"type": "http.request", "body": body, "more_body": False}
        await asyncio.Event().wait()  # no disconnect: the handler cancels this when the response is done

    async def send(message):
        nonlocal status
        if message["type"] == "http.response.start":
            status = message["status"]
        elif message["type"] == "http.response.body" and not first_body.done():
            first_body.set_result(time.perf_counter())

    started = time.perf_counter()
    await app(_scope(body, key), receive, send)
    return first_body.result() - started, status


def _ms(values: list[float], q: float) -> float:
    return sorted(values)[min(len(values) - 1, int(q * len(values)))] * 1000


async def _main(args) -> dict:
    import django

    django.setup()
    from django.core.handlers.asgi import ASGIHandler

    from platform_site.asgi import application

    apps = {"api_handler": application, "django_stack": ASGIHandler()}
    body = json.dumps({"model": args.model, "messages": [{"role": "user", "content": "Hi"}], "n": 2}).encode()
    times: dict[str, list[float]] = {name: [] for name in apps}
    for name, app in apps.items():  # warm up: the key's row cached, the URLconf and the views imported
        for _ in range(args.warmup):
            _, status = await _one(app, body, args.key)
            assert status == 400, f"{name}: expected the 400 of n=2, got {status} (is the key valid?)"
    for i in range(args.requests):
        order = list(apps) if i % 2 == 0 else list(reversed(apps))  # interleaved, each first half the time
        for name in order:
            elapsed, status = await _one(apps[name], body, args.key)
            assert status == 400, status
            times[name].append(elapsed)
    result = {
        name: {"p50_ms": round(statistics.median(v) * 1000, 4), "p90_ms": round(_ms(v, 0.9), 4),
               "p99_ms": round(_ms(v, 0.99), 4)}
        for name, v in times.items()
    }
    result["stack_cost_p50_ms"] = round(result["django_stack"]["p50_ms"] - result["api_handler"]["p50_ms"], 4)
    paired = [d - a for d, a in zip(times["django_stack"], times["api_handler"])]
    result["stack_cost_paired_p50_ms"] = round(statistics.median(paired) * 1000, 4)
    result["requests"] = args.requests
    return result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--key", default=os.environ.get("OPENAI_API_KEY"), required="OPENAI_API_KEY" not in os.environ)
    parser.add_argument("--model", default="smollm2-135m-instruct")
    parser.add_argument("--requests", type=int, default=2000, help="per handler")
    parser.add_argument("--warmup", type=int, default=50)
    args = parser.parse_args()
    result = asyncio.run(_main(args))
    for name in ("api_handler", "django_stack"):
        print(f"{name:13} " + "  ".join(f"{k}={v}" for k, v in result[name].items()))
    print(f"stack cost    p50 difference {result['stack_cost_p50_ms']} ms, "
          f"paired p50 {result['stack_cost_paired_p50_ms']} ms")
    print(json.dumps(result))


if __name__ == "__main__":
    main()
