"""Does the time of a 401 tell whether a key's public id exists? Known id + wrong secret against unknown id.

    python benchmarks/key_lookup.py --pairs 300                      # a real server on SQLite
    python benchmarks/key_lookup.py --pairs 300 --database-url postgres://postgres@127.0.0.1:5432/llm_keybench
    python benchmarks/key_lookup.py --pairs 2000 --mode service      # the async service in this process

`--mode server` (default) starts one uvicorn web process (embedded mode: the
engine never starts, every request here is refused at the key) on a fresh
database (SQLite in a temp dir, or the PostgreSQL database given, dropped and
created first), creates a tenant and a key, and sends `POST
/v1/chat/completions` over one keep-alive connection with, in turns, the
key's public id and a wrong secret ("known") and a public id that names no
key ("unknown"), each first in every other pair; every answer must be the
same 401 with the same body. That is the completion endpoints' key check
(`tenants.services.api_keys.aapi_key_verify`), the one issue 35 timed.
`--mode service` calls `aapi_key_verify` itself on the same kind of database,
without HTTP: the lookup's share alone, in microseconds.

Prints each case's median, the ratio unknown/known, and in how many pairs
the unknown id was the slower one (about half when the two cannot be told
apart). Before the negative cache: found rows were answered from memory and
unknown ids went to the database every time (issue 35: 1.6 ms against 3.8 ms
median, 296 of 300 pairs).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import secrets
import statistics
import string
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

SECRET = "A" * 43


def _keys(key: str) -> dict[str, str]:
    prefix = key.rsplit("-", 1)[0]
    unknown_id = "".join(secrets.choice(string.ascii_lowercase + string.digits) for _ in range(10))
    return {"known": f"{prefix}-{SECRET}", "unknown": f"sk-{unknown_id}-{SECRET}"}


def _environment(database_url: str | None, tmp: Path) -> tuple[dict, str]:
    from tests.e2e.processes import api_key_new, database_prepare, postgres_database_reset, process_env

    url = database_url or f"sqlite:///{tmp / 'keys.sqlite3'}"
    if url.startswith("postgres"):
        postgres_database_reset(url)
    env = process_env(DATABASE_URL=url, LOG_LEVEL="ERROR")
    database_prepare(env)
    return env, api_key_new(env, tenant="bench-keys", tier="pro")


def _summary(samples: dict[str, list[float]], unit: str, scale: float) -> dict:
    medians = {name: statistics.median(values) * scale for name, values in samples.items()}
    slower = sum(u > k for k, u in zip(samples["known"], samples["unknown"]))
    return {
        "unit": unit, "pairs": len(samples["known"]),
        "known_wrong_secret_median": round(medians["known"], 4),
        "unknown_id_median": round(medians["unknown"], 4),
        "ratio_unknown_over_known": round(medians["unknown"] / medians["known"], 3),
        "pairs_unknown_slower": slower,
    }


def run_server(args, tmp: Path) -> dict:
    import httpx

    from tests.e2e.processes import web_start

    env, key = _environment(args.database_url, tmp)
    proc, url = web_start(env, tmp, name="key-lookup-web")
    keys = _keys(key)
    body = {"model": "smollm2-135m-instruct", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 1}
    samples: dict[str, list[float]] = {"known": [], "unknown": []}
    try:
        with httpx.Client(base_url=url, timeout=30) as client:
            answers = set()

            def one(name: str) -> float:
                started = time.perf_counter()
                response = client.post("/v1/chat/completions", json=body,
                                       headers={"Authorization": f"Bearer {keys[name]}"})
                elapsed = time.perf_counter() - started
                assert response.status_code == 401, response.text
                answers.add(response.content)
                return elapsed

            for i in range(args.warmup + args.pairs):
                order = ("known", "unknown") if i % 2 == 0 else ("unknown", "known")
                times = {name: one(name) for name in order}
                if i >= args.warmup:
                    for name, value in times.items():
                        samples[name].append(value)
            assert len(answers) == 1, answers  # the same 401 body for both
    finally:
        proc.stop()
    return _summary(samples, "ms", 1000)


def run_service(args, tmp: Path) -> dict:
    env, key = _environment(args.database_url, tmp)
    os.environ.update({k: env[k] for k in ("DATABASE_URL", "DEBUG")})
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "platform_site.settings")
    import django

    django.setup()
    from common.errors import AuthenticationError
    from tenants.services.api_keys import aapi_key_verify

    keys = _keys(key)
    samples: dict[str, list[float]] = {"known": [], "unknown": []}

    async def one(name: str) -> float:
        started = time.perf_counter()
        try:
            await aapi_key_verify(key=keys[name])
        except AuthenticationError as exc:
            assert exc.message == "Incorrect API key provided.", exc.message
        else:
            raise AssertionError("a wrong key was accepted")
        return time.perf_counter() - started

    async def measure() -> None:
        for i in range(args.warmup + args.pairs):
            order = ("known", "unknown") if i % 2 == 0 else ("unknown", "known")
            times = {name: await one(name) for name in order}
            if i >= args.warmup:
                for name, value in times.items():
                    samples[name].append(value)

    asyncio.run(measure())
    return _summary(samples, "us", 1e6)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--mode", choices=("server", "service"), default="server")
    parser.add_argument("--pairs", type=int, default=300)
    parser.add_argument("--warmup", type=int, default=20)
    parser.add_argument("--database-url", help="PostgreSQL database to use (dropped and created); default SQLite")
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="key-lookup-") as tmp:
        result = (run_server if args.mode == "server" else run_service)(args, Path(tmp))
    result["mode"] = args.mode
    result["database"] = "postgresql" if (args.database_url or "").startswith("postgres") else "sqlite"
    unit = result["unit"]
    print(f"known id, wrong secret  median {result['known_wrong_secret_median']:9.3f} {unit}")
    print(f"unknown id              median {result['unknown_id_median']:9.3f} {unit}")
    print(f"ratio unknown/known     {result['ratio_unknown_over_known']:.3f}   "
          f"unknown slower in {result['pairs_unknown_slower']} of {result['pairs']} pairs")
    if args.json:
        print(json.dumps(result))


if __name__ == "__main__":
    main()
