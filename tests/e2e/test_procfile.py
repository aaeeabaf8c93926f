"""The production layout, run for real: honcho starts deploy/Procfile (2 web processes under one uvicorn,
2 engine workers, a Celery worker and beat) on a private PostgreSQL and a private Redis (appendonly, as
deployed), and the tests drive it with the openai SDK, then take parts of it down.

What each fault test states (deploy/docs/operations.md says the same for operators):
- serving: a streamed and a non-streamed completion; each request has exactly one usage record, with its
  cost, equal to the usage the client was told; /readyz and `manage.py worker_ready` say ready.
- Redis restarted under load: requests in flight end either whole (every token the record bills reached
  the client: counted from the logprobs) or with an error event, none hangs; new requests meanwhile get
  503 with a code and Retry-After; service resumes by itself; no queued job is lost (each request has
  one record); the logs say it about once per component, not a traceback per poll.
- PostgreSQL restarted under load: streams end normally (their records wait in each worker's spool),
  and every record is written exactly once after the database is back; the first request after it
  answers 200 (pooled connections are checked).
- a web process killed mid-stream (SIGKILL): the workers notice that nobody reads its reply channel and
  abort its jobs within seconds, billed for what they generated (finish_reason abort, fewer tokens than
  asked); uvicorn starts a new web process.
"""

from __future__ import annotations

import asyncio
import inspect
import re
import os
import shutil
import signal
import subprocess
import sys
import time
from collections import Counter
from pathlib import Path

import httpx
import openai
import pytest

from tests.e2e.processes import (
    MODEL, ROOT, Proc, api_key_new, database_prepare, process_env, usage_records, wait_until,
)
from tests.e2e.servers import PrivatePostgres, PrivateRedis, port_pick

pytestmark = [pytest.mark.e2e, pytest.mark.slow]

MESSAGES = [{"role": "user", "content": "Count from one to twenty."}]


def _venv_path() -> str:
    return f"{Path(sys.executable).parent}{os.pathsep}{os.environ.get('PATH', '')}"


@pytest.fixture(scope="module")
def layout(tmp_path_factory):
    missing = [name for name in ("redis-server", "initdb", "pg_ctl") if shutil.which(name) is None]
    if missing:  # the machine's PostgreSQL and Redis packages provide them
        if os.environ.get("CI", "").lower() == "true":
            pytest.fail(f"this test needs {missing} under CI")
        pytest.skip(f"needs {missing}")
    tmp = tmp_path_factory.mktemp("procfile")
    postgres = PrivatePostgres()
    redis_server = PrivateRedis(tmp / "redis")
    honcho: Proc | None = None
    try:
        postgres.start()
        postgres.create_database()
        redis_server.start()
        web_port = port_pick()
        deploy = {  # what deploy/env holds in production (deploy/env.example), for this private stack
            "DEBUG": "0", "SECRET_KEY": "e2e-procfile-" + "s" * 50, "API_KEY_PEPPER": "e2e-pepper-" + "p" * 40,
            "ALLOWED_HOSTS": "127.0.0.1,localhost", "DATABASE_URL": postgres.url, "REDIS_URL": redis_server.url,
            "EMBEDDED_WORKER": "0", "WEB_CONCURRENCY": "2", "CELERY_CONCURRENCY": "1", "LOG_LEVEL": "WARNING",
            "ENGINE_KV_CACHE_MB": "64", "ENGINE_MAX_NUM_SEQS": "1", "WORKER_HEARTBEAT_TIMEOUT_S": "5",
            "WORKER_SPOOL_DIR": str(tmp / "spool"), "BEAT_SCHEDULE_FILE": str(tmp / "beat-schedule"),
            "DB_POOL_TIMEOUT_S": "3", "OMP_NUM_THREADS": "1", "HF_HUB_OFFLINE": "1",
        }
        env_file = tmp / "env"
        env_file.write_text("".join(f"{k}={v}\n" for k, v in deploy.items()))
        env = process_env(**deploy, PATH=_venv_path())
        env["DEBUG"] = "0"
        database_prepare(env)
        keys = {name: api_key_new(env, tenant=name, tier="pro") for name in ("acme", "globex")}
        honcho = Proc("honcho", [sys.executable, "-m", "honcho", "-f", str(ROOT / "deploy" / "Procfile"), "-d",
                                 str(ROOT), "-e", str(env_file), "start", "-p", str(web_port)], env, tmp / "honcho.log")
        url = f"http://127.0.0.1:{web_port}"

        def ready():
            assert honcho.alive, honcho.log_tail()
            try:
                return httpx.get(f"{url}/readyz", timeout=3).status_code == 200
            except httpx.HTTPError:
                return False

        wait_until(ready, timeout=300, interval=0.5, what="the Procfile's layout to be ready")
        yield {"url": url, "keys": keys, "env": env, "postgres": postgres, "redis": redis_server, "honcho": honcho,
               "tmp": tmp}
    finally:
        if honcho is not None:
            honcho.stop(timeout=40)
        redis_server.stop()
        postgres.destroy()


def _client(layout, cls=openai.OpenAI, key: str = "acme"):
    return cls(base_url=f"{layout['url']}/v1", api_key=layout["keys"][key], max_retries=0, timeout=120)


def _records(layout, request_id: str) -> list[dict]:
    return usage_records(layout["postgres"].url, request_id)


def _one_record(layout, request_id: str, timeout: float = 30) -> dict:
    rows = wait_until(lambda: _records(layout, request_id), timeout=timeout, what=f"the record of {request_id}")
    assert len(rows) == 1, rows
    return rows[0]


def _seen_new() -> dict:
    return {"tokens": 0, "text": "", "usage": None, "finish": None, "error": None, "request_id": None}


async def _stream(client, *, max_tokens: int, seen: dict | None = None) -> dict:
    """One streamed completion with logprobs (so every delivered token is counted): what the client saw
    (`seen`, updated as the stream goes)."""
    seen = _seen_new() if seen is None else seen
    try:
        raw = await client.chat.completions.with_raw_response.create(
            model=MODEL, messages=MESSAGES, max_tokens=max_tokens, temperature=0, logprobs=True, stream=True,
            stream_options={"include_usage": True}, extra_body={"ignore_eos": True})
        seen["request_id"] = raw.headers.get("x-request-id")
        seen["status"] = raw.http_response.status_code
        stream = raw.parse()
        if inspect.isawaitable(stream):
            stream = await stream
        async for chunk in stream:
            if chunk.usage is not None:
                seen["usage"] = chunk.usage
            for choice in chunk.choices:
                if choice.logprobs is not None and choice.logprobs.content:
                    seen["tokens"] += len(choice.logprobs.content)
                seen["text"] += choice.delta.content or ""
                seen["finish"] = choice.finish_reason or seen["finish"]
    except openai.APIStatusError as exc:
        seen["error"], seen["status"] = exc, exc.status_code
        seen["request_id"] = seen["request_id"] or exc.response.headers.get("x-request-id")
    except openai.APIError as exc:  # an error event inside the stream
        seen["error"] = exc
    return seen


async def _until(predicate, timeout: float = 60) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        assert time.monotonic() < deadline, "timed out"
        await asyncio.sleep(0.05)


def _check_billed_equals_delivered(layout, seen: dict) -> dict | None:
    if isinstance(seen["error"], openai.APIStatusError):  # refused before it was queued: nothing billed
        assert seen["status"] == 503 and seen["error"].response.headers.get("Retry-After"), seen
        time.sleep(1.0)
        assert _records(layout, seen["request_id"]) == []
        return None
    record = _one_record(layout, seen["request_id"])
    if seen["error"] is None:  # ended with [DONE]: every billed token reached the client
        assert seen["usage"].completion_tokens == record["completion_tokens"] == seen["tokens"], (seen, record)
        assert record["cost_femtos"] > 0
    else:  # an error event: the message states what was billed when text went missing
        assert seen["tokens"] <= record["completion_tokens"], (seen, record)
        if "interrupted" in str(seen["error"]):
            assert f"{record['completion_tokens']} completion tokens" in str(seen["error"])
    return record


# ---------------------------------------------------------------- the layout serves and bills
def test_the_procfile_layout_serves_and_bills_each_request_once(layout):
    client = _client(layout)
    raw = client.chat.completions.with_raw_response.create(model=MODEL, messages=MESSAGES, max_tokens=8,
                                                           temperature=0)
    completion = raw.parse()
    record = _one_record(layout, raw.headers["x-request-id"])
    assert completion.choices[0].message.content
    assert record["completion_tokens"] == completion.usage.completion_tokens == 8
    assert record["prompt_tokens"] == completion.usage.prompt_tokens and record["finish_reason"] == "length"
    cost = completion.usage.model_extra["cost"]
    assert int(round(float(cost["total"]) * 10**15)) == record["cost_femtos"] > 0

    seen = asyncio.run(_stream(_client(layout, openai.AsyncOpenAI), max_tokens=8))
    assert seen["error"] is None and seen["finish"] == "length"
    streamed = _check_billed_equals_delivered(layout, seen)
    assert streamed["finish_reason"] == "length" and streamed["completion_tokens"] == 8

    ready = httpx.get(f"{layout['url']}/readyz", timeout=5).json()
    assert ready == {"status": "ok", "database": "ok", "redis": "ok", "workers": "ok"}
    assert httpx.get(f"{layout['url']}/livez", timeout=5).status_code == 200
    check = subprocess.run([sys.executable, "manage.py", "worker_ready"], cwd=ROOT, env=layout["env"],
                           capture_output=True, text=True, timeout=60)
    assert check.returncode == 0, check.stderr


# ---------------------------------------------------------------- Redis restarted under load
def _log_lines(layout, since: int) -> list[str]:
    return layout["honcho"].log_path.read_text(errors="replace")[since:].splitlines()


def test_redis_restarted_under_load(layout):
    redis_server, log_at = layout["redis"], layout["honcho"].log_path.stat().st_size

    async def scenario():
        client = _client(layout, openai.AsyncOpenAI)
        # 2 workers x (1 running + 2 prefetched): 8 requests leave two on the queue
        seen = [_seen_new() for _ in range(8)]
        streams = [asyncio.create_task(_stream(client, max_tokens=24, seen=one)) for one in seen]
        await _until(lambda: all(one["request_id"] for one in seen))  # all 8 queued (headers come after)
        redis_server.stop()
        down = []
        for _ in range(3):  # new requests while Redis is down: 503 with a code and Retry-After, at once
            started = time.monotonic()
            response = await asyncio.to_thread(
                httpx.post, f"{layout['url']}/v1/chat/completions", timeout=30,
                headers={"Authorization": f"Bearer {layout['keys']['globex']}"},
                json={"model": MODEL, "messages": MESSAGES, "max_tokens": 4})
            down.append((response, time.monotonic() - started))
            await asyncio.sleep(0.5)
        await asyncio.sleep(1.0)
        redis_server.start()
        return down, await asyncio.wait_for(asyncio.gather(*streams), timeout=180)

    down, streams = asyncio.run(scenario())
    for response, _seconds in down:
        assert response.status_code == 503, response.text
        assert response.json()["error"]["code"] in {"queue_unavailable", "limits_unavailable", "no_worker", "model_unavailable"}
        assert int(response.headers["Retry-After"]) >= 1
    for seen in streams:  # none hung, none lost (two were still queued); each billed once, as delivered or as stated
        assert not isinstance(seen["error"], openai.APIStatusError), seen
        _check_billed_equals_delivered(layout, seen)
    # service resumes by itself
    client = _client(layout)
    resumed = wait_until(lambda: _try_completion(client), timeout=30, interval=0.5, what="service to resume")
    assert resumed.choices[0].message.content
    # the web and worker processes say it once per component (no traceback per poll); Celery's consumer
    # reports its lost broker connection once, with its own chained traceback
    lines = [line for line in _log_lines(layout, log_at) if re.match(r"\S+ (web|worker)", line)]
    tracebacks = [line for line in lines if "Traceback" in line]
    assert len(tracebacks) <= 2, "\n".join(lines[-200:])
    unavailable = [line for line in lines if "unavailable" in line and "still" not in line]
    # per component and log prefix (web.1 is both web processes): at most twice per process, where a
    # line per poll would be dozens; the total grows with the components, so it is not what is checked
    said = Counter(re.sub(r"^\S+ (\S+)\s*\| (.*?) unavailable.*$", r"\1 \2", line) for line in unavailable)
    assert said and max(said.values()) <= 4, "\n".join(unavailable)


def _try_completion(client):
    try:
        return client.chat.completions.create(model=MODEL, messages=MESSAGES, max_tokens=2, temperature=0)
    except openai.APIStatusError as exc:
        assert exc.status_code == 503, exc  # while it comes back: 503s, never a 500
        return None


# ---------------------------------------------------------------- PostgreSQL restarted under load
def test_postgres_restarted_under_load_loses_no_usage_record(layout):
    postgres = layout["postgres"]

    async def scenario():
        client = _client(layout, openai.AsyncOpenAI)
        seen = [_seen_new() for _ in range(4)]
        streams = [asyncio.create_task(_stream(client, max_tokens=16, seen=one)) for one in seen]
        await _until(lambda: all(one["tokens"] or one["error"] for one in seen))  # all generating
        await asyncio.to_thread(postgres.stop)
        results = await asyncio.wait_for(asyncio.gather(*streams), timeout=180)  # they end while it is down
        await asyncio.sleep(1.0)
        return results

    streams = asyncio.run(scenario())
    spooled = list((layout["tmp"] / "spool").glob("spool-*.sqlite3"))
    assert spooled, "the workers keep their records on disk while the database is away"
    postgres.start()
    for seen in streams:
        assert seen["error"] is None, seen["error"]
        assert seen["finish"] == "length" and seen["tokens"] == 16
    for seen in streams:  # each written exactly once, with what the client was told
        record = _one_record(layout, seen["request_id"], timeout=60)
        assert record["completion_tokens"] == seen["usage"].completion_tokens == 16
    # the first request after the restart is served (no stale pooled connection answers 500)
    completion = _client(layout).chat.completions.create(model=MODEL, messages=MESSAGES, max_tokens=2)
    assert completion.usage.completion_tokens == 2


# ---------------------------------------------------------------- a web process killed mid-stream
def _web_children_with_connections(layout, port: int) -> list[int]:
    """The uvicorn web processes holding an established connection on `port`."""
    inodes = set()
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        for line in Path(table).read_text().splitlines()[1:]:
            fields = line.split()
            local_port = int(fields[1].rsplit(":", 1)[1], 16)
            if local_port == port and fields[3] == "01":  # ESTABLISHED, server side
                inodes.add(fields[9])
    pids = []
    for pid_dir in Path("/proc").iterdir():
        if not pid_dir.name.isdigit():
            continue
        try:
            cmdline = (pid_dir / "cmdline").read_bytes()
            if b"uvicorn" not in cmdline and b"multiprocessing" not in cmdline:
                continue
            links = {os.readlink(fd) for fd in (pid_dir / "fd").iterdir()}
        except OSError:
            continue
        if any(f"socket:[{inode}]" in links for inode in inodes):
            pids.append(int(pid_dir.name))
    return pids


def test_a_web_process_killed_mid_stream_has_its_jobs_aborted(layout):
    port = int(layout["url"].rsplit(":", 1)[1])
    # far more than a stream produces before the kill: a worker of this layout runs one sequence and holds two more
    # (prefetch), so the second stream may wait behind the first, and with 300 the first once ended before the kill
    asked = 1500

    async def scenario():
        client = _client(layout, openai.AsyncOpenAI, key="globex")
        seen = [_seen_new() for _ in range(2)]
        streams = [asyncio.create_task(_stream(client, max_tokens=asked, seen=one)) for one in seen]
        # both queued (their headers come after the enqueue), one streaming: the other may wait in the same worker
        await _until(lambda: all(one["request_id"] for one in seen) and any(one["tokens"] for one in seen))
        assert not any(one.get("finish") for one in seen), seen  # neither ended before the kill
        pids = _web_children_with_connections(layout, port)
        assert pids, "no web process holds the streams"
        for pid in pids:
            os.kill(pid, signal.SIGKILL)
        return pids, await asyncio.wait_for(asyncio.gather(*streams), timeout=60)

    _pids, streams = asyncio.run(scenario())
    for seen in streams:
        assert seen["error"] is not None and seen["request_id"], seen  # the client saw its connection drop
        record = _one_record(layout, seen["request_id"], timeout=45)
        assert record["finish_reason"] == "abort", record
        assert seen["tokens"] <= record["completion_tokens"] < asked
    # uvicorn replaced the killed process: the layout still serves
    wait_until(lambda: httpx.get(f"{layout['url']}/readyz", timeout=5).status_code == 200, timeout=30,
               what="the web processes to be back")
