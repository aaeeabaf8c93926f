"""What an oversize or malformed completion body costs the server, and whether it counts against the key's RPM.

    python benchmarks/oversize_body.py --url http://127.0.0.1:8000 --key sk-... --pid PID [--n 20]

Sends `--n` POSTs to /v1/chat/completions for each kind of body (a JSON body
of 3 MiB and of 12 MiB, over the 2.5 MiB limit; 3 MiB sent chunked, with no
Content-Length; a 2 KB body that is not JSON), one at a time on one
keep-alive connection, and reports per request the client's wall time, the
server process's CPU time (utime + stime of --pid from /proc, the web process
of `make run` or uvicorn), the statuses, and whether each refusal counted
against the key's requests per minute: the `x-ratelimit-remaining-requests`
the refusals carry (none when they were not counted).

`make run`-like server: `ENV_FILE=... uvicorn platform_site.asgi:application`
with the embedded engine; the figures are the web process's own, so the
engine thread is idle throughout (no body here reaches the queue).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import time

import httpx

KINDS = {
    "3 MiB JSON": lambda: _json_body(3 * 1024 * 1024),
    "12 MiB JSON": lambda: _json_body(12 * 1024 * 1024),
    "3 MiB JSON, chunked": lambda: _json_body(3 * 1024 * 1024),
    "2 KB malformed": lambda: b'{"model": "smollm2-135m-instruct", "messages": [' + b"x" * 2000,
}


def _json_body(size: int) -> bytes:
    head = b'{"model": "smollm2-135m-instruct", "messages": [{"role": "user", "content": "'
    tail = b'"}], "max_tokens": 1}'
    return head + b"a" * (size - len(head) - len(tail)) + tail


def _cpu_s(pid: int) -> float:
    with open(f"/proc/{pid}/stat") as stat:
        fields = stat.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def _chunks(body: bytes, size: int = 65536):
    for start in range(0, len(body), size):
        yield body[start:start + size]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--url", default="http://127.0.0.1:8000")
    parser.add_argument("--key", required=True)
    parser.add_argument("--pid", type=int, required=True, help="the web process (its CPU time is measured)")
    parser.add_argument("--n", type=int, default=20)
    args = parser.parse_args()
    headers = {"Authorization": f"Bearer {args.key}", "Content-Type": "application/json"}
    results = {}
    with httpx.Client(base_url=args.url, headers=headers, timeout=120) as client:
        for make in KINDS.values():  # warm-up: the key's row, the admission counters, the connection
            for _ in range(3):
                client.post("/v1/chat/completions", content=make())
        time.sleep(1)
        for kind, make in KINDS.items():
            body = make()
            walls, statuses, remaining = [], {}, []
            cpu_before = _cpu_s(args.pid)
            for _ in range(args.n):
                started = time.perf_counter()
                try:
                    content = _chunks(body) if "chunked" in kind else body
                    response = client.post("/v1/chat/completions", content=content)
                    status = response.status_code
                    remaining.append(response.headers.get("x-ratelimit-remaining-requests"))
                except httpx.HTTPError as exc:
                    status = type(exc).__name__
                walls.append(time.perf_counter() - started)
                statuses[status] = statuses.get(status, 0) + 1
            cpu = (_cpu_s(args.pid) - cpu_before) / args.n
            counted = [value for value in remaining if value is not None]
            results[kind] = {
                "statuses": statuses, "wall_ms_median": round(statistics.median(walls) * 1000, 1),
                "server_cpu_ms_per_request": round(cpu * 1000, 1),
                "counted_against_rpm": f"{len(counted)}/{args.n}",
                "rpm_remaining_first_last": [counted[0], counted[-1]] if counted else None,
            }
            row = results[kind]
            print(f"{kind:22} statuses {statuses}  wall median {row['wall_ms_median']} ms  server CPU "
                  f"{row['server_cpu_ms_per_request']} ms/request  counted against RPM {row['counted_against_rpm']} "
                  f"(remaining {row['rpm_remaining_first_last']})", flush=True)
            time.sleep(1)
    print(json.dumps(results))


if __name__ == "__main__":
    main()
