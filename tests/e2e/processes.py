"""Real processes for end-to-end tests: uvicorn web servers, `run_worker`, manage commands.

Used by tests/e2e and by the server-backed tests in tests/inference. Every
process gets a clean environment (no pytest markers, so settings behave as in
production apart from DEBUG), logs to a file under the test's tmp dir, and is
stopped by whoever started it (SIGTERM, then SIGKILL).
"""

from __future__ import annotations

import json
import os
import signal
import socket
import sqlite3
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

import httpx

ROOT = Path(__file__).resolve().parents[2]
MODEL = "smollm2-135m-instruct"
_STRIPPED = {"PYTEST_VERSION", "PYTEST_CURRENT_TEST", "DJANGO_SETTINGS_MODULE", "DATABASE_URL", "REDIS_URL", "EMBEDDED_WORKER"}


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def process_env(**overrides: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k not in _STRIPPED}
    env.update(DEBUG="1", HF_HUB_OFFLINE="1", PYTHONUNBUFFERED="1", LOG_LEVEL="WARNING")
    env.update({k: str(v) for k, v in overrides.items()})
    return env


def manage(env: dict[str, str], *args: str, timeout: float = 300) -> str:
    result = subprocess.run(
        [sys.executable, "manage.py", *args], cwd=ROOT, env=env, capture_output=True, text=True, timeout=timeout
    )
    if result.returncode != 0:
        raise RuntimeError(f"manage.py {' '.join(args)} failed ({result.returncode}):\n{result.stdout}\n{result.stderr}")
    return result.stdout


def database_prepare(env: dict[str, str]) -> None:
    """migrate + bootstrap (tiers free/pro/enterprise, the SmolLM2 row, tenant `demo`)."""
    manage(env, "migrate", "--noinput", "-v", "0")
    manage(env, "bootstrap", "--admin-password", "e2e-admin-password-1")


def api_key_new(env: dict[str, str], *, tenant: str, tier: str) -> str:
    """A fresh tenant on `tier` and a key for it (through the management commands)."""
    manage(env, "create_tenant", "--slug", tenant, "--tier", tier)
    return json.loads(manage(env, "create_api_key", "--tenant", tenant, "--name", "e2e", "--json"))["key"]


def postgres_database_reset(url: str) -> None:
    """Drop and create the database named in `url` (postgres://user@host:port/name)."""
    import psycopg

    base, name = url.rsplit("/", 1)
    with psycopg.connect(f"{base}/postgres", autocommit=True, connect_timeout=5) as conn:
        conn.execute(
            "SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE datname = %s AND pid <> pg_backend_pid()", (name,)
        )
        conn.execute(f'DROP DATABASE IF EXISTS "{name}"')
        conn.execute(f'CREATE DATABASE "{name}"')


def usage_records(database_url: str, request_id: str) -> list[dict]:
    """UsageRecord rows of one request, read straight from the server's database."""
    query = (
        "SELECT request_id, model, finish_reason, prompt_tokens, cached_tokens, completion_tokens, tier, endpoint, "
        "error, input_cost_femtos, cached_input_cost_femtos, output_cost_femtos, cost_femtos "
        "FROM tenants_usagerecord WHERE request_id = {}"
    )
    if database_url.startswith("sqlite:///"):
        with sqlite3.connect(database_url[len("sqlite:///"):], timeout=30) as conn:
            conn.row_factory = sqlite3.Row
            return [dict(row) for row in conn.execute(query.format("?"), (request_id,))]
    import psycopg
    from psycopg.rows import dict_row

    with psycopg.connect(database_url, row_factory=dict_row, connect_timeout=5) as conn:
        return list(conn.execute(query.format("%s"), (request_id,)))


def usage_record_wait(database_url: str, request_id: str, timeout: float = 30) -> list[dict]:
    deadline = time.monotonic() + timeout
    while True:
        rows = usage_records(database_url, request_id)
        if rows or time.monotonic() > deadline:
            return rows
        time.sleep(0.1)


class Proc:
    """A child process with its output in a log file."""

    def __init__(self, name: str, command: list[str], env: dict[str, str], log_path: Path) -> None:
        self.name = name
        self.log_path = log_path
        self._log = open(log_path, "wb")
        self.popen = subprocess.Popen(command, cwd=ROOT, env=env, stdout=self._log, stderr=subprocess.STDOUT,
                                      start_new_session=True)

    @property
    def alive(self) -> bool:
        return self.popen.poll() is None

    def log_tail(self, chars: int = 4000) -> str:
        try:
            return self.log_path.read_text(errors="replace")[-chars:]
        except OSError:
            return ""

    def signal(self, sig: int) -> None:
        if self.alive:
            self.popen.send_signal(sig)

    def stop(self, timeout: float = 30) -> int | None:
        if self.alive:
            self.popen.send_signal(signal.SIGTERM)
            try:
                self.popen.wait(timeout)
            except subprocess.TimeoutExpired:
                self.popen.kill()
                self.popen.wait(10)
        self._log.close()
        return self.popen.returncode


def web_start(env: dict[str, str], log_dir: Path, *, name: str = "web") -> tuple[Proc, str]:
    port = free_port()
    command = [sys.executable, "-m", "uvicorn", "platform_site.asgi:application", "--host", "127.0.0.1",
               "--port", str(port), "--lifespan", "off", "--no-access-log"]
    proc = Proc(name, command, env, log_dir / f"{name}.log")
    url = f"http://127.0.0.1:{port}"
    http_wait(f"{url}/healthz", proc)
    return proc, url


def worker_start(env: dict[str, str], log_dir: Path, *, name: str = "worker", model: str = MODEL, extra: tuple = ()) -> Proc:
    command = [sys.executable, "manage.py", "run_worker", "--model", model, "--device", "cpu", *extra]
    return Proc(name, command, env, log_dir / f"{name}.log")


def http_wait(url: str, proc: Proc, timeout: float = 90) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if not proc.alive:
            raise RuntimeError(f"{proc.name} exited early:\n{proc.log_tail()}")
        try:
            if httpx.get(url, timeout=2).status_code == 200:
                return
        except httpx.HTTPError:
            pass
        time.sleep(0.2)
    raise RuntimeError(f"{proc.name} did not answer {url} within {timeout} s:\n{proc.log_tail()}")


def wait_until(predicate, *, timeout: float, interval: float = 0.2, what: str = "condition"):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(interval)
    raise AssertionError(f"timed out after {timeout} s waiting for {what}")


class EmbeddedServer:
    """One uvicorn process in the embedded mode (engine thread inside), on its own database."""

    def __init__(self, tmp: Path, *, database_url: str | None = None, env: dict[str, str] | None = None,
                 before_start: Callable[[dict[str, str]], None] | None = None) -> None:
        """`env`: more variables for every process (e.g. SERVE_MODELS); `before_start(env)` runs once the
        database is prepared and the keys made, before the server starts (e.g. `model_add`, `price_set`)."""
        self.tmp = tmp
        self.database_url = database_url or f"sqlite:///{tmp / 'api.sqlite3'}"
        if self.database_url.startswith("postgres"):
            postgres_database_reset(self.database_url)
        # A short keep-alive so that tests see the idle comments within one prefill.
        self.env = process_env(DATABASE_URL=self.database_url, ENGINE_KV_CACHE_MB="256", SSE_KEEPALIVE_S="0.2",
                               **(env or {}))
        database_prepare(self.env)
        self.keys = {tier: api_key_new(self.env, tenant=f"t-{tier}", tier=tier) for tier in ("free", "pro", "enterprise")}
        if before_start is not None:
            before_start(self.env)
        self.proc, self.url = web_start(self.env, tmp)

    def stop(self) -> None:
        self.proc.stop()


def embedded_server_shared(tmp_path_factory, config) -> EmbeddedServer:
    """One embedded server per test session, shared by the modules that need one.

    Under `make test-postgres` (DATABASE_URL set) it runs on its own PostgreSQL
    database, so that run exercises the engine thread writing usage to PostgreSQL.
    """
    server = getattr(config, "_embedded_api_server", None)
    if server is None:
        url = os.environ.get("DATABASE_URL", "")
        database_url = url.rsplit("/", 1)[0] + "/llm_api_embedded" if url.startswith("postgres") else None
        server = EmbeddedServer(tmp_path_factory.mktemp("embedded_api"), database_url=database_url)
        config._embedded_api_server = server
        config.add_cleanup(server.stop)
    return server


def servers_required(*, database_url: str, redis_url: str) -> None:
    """Skip locally when PostgreSQL or Redis is down; fail under CI=true, where they must be up."""
    import psycopg
    import pytest
    import redis

    problem = None
    try:
        redis.Redis.from_url(redis_url, socket_connect_timeout=2).ping()
    except redis.RedisError as exc:
        problem = f"Redis at {redis_url}: {exc}"
    try:
        psycopg.connect(database_url.rsplit("/", 1)[0] + "/postgres", connect_timeout=3).close()
    except psycopg.Error as exc:
        problem = problem or f"PostgreSQL: {exc}"
    if problem:
        if os.environ.get("CI", "").lower() == "true":
            pytest.fail(f"this test needs PostgreSQL and Redis under CI: {problem}")
        pytest.skip(problem)
