"""`manage.py check --deploy` with production settings reports no warnings."""

import json
import os
import secrets
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


def env_example() -> dict:
    lines = (ROOT / "deploy" / "env.example").read_text().splitlines()
    return dict(line.split("=", 1) for line in lines if line.strip() and not line.startswith("#"))


def production_env(tmp_path, **overrides) -> dict:
    """deploy/env.example with its placeholders filled in (no server is contacted by `check`)."""
    env = {k: v for k, v in os.environ.items() if k not in {"PYTEST_VERSION", "DATABASE_URL", "REDIS_URL"}}
    env.update(env_example())
    env.update(
        SECRET_KEY=secrets.token_urlsafe(64),
        API_KEY_PEPPER=secrets.token_urlsafe(48),
        DATABASE_URL=f"sqlite:///{tmp_path / 'deploy.sqlite3'}",
        ENV_FILE=str(tmp_path / "absent.env"),  # a developer's .env (from `make run`) must not count here
    )
    env.update(overrides)
    return {k: v for k, v in env.items() if v is not None}


def check_deploy(env) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "manage.py", "check", "--deploy", "--fail-level", "WARNING"],
        cwd=ROOT, env=env, capture_output=True, text=True, timeout=120,
    )


@pytest.mark.slow
def test_check_deploy_is_clean(tmp_path):
    result = check_deploy(production_env(tmp_path))
    assert result.returncode == 0, result.stdout + result.stderr
    assert "no issues" in result.stdout


@pytest.mark.slow
def test_check_deploy_flags_missing_pepper_and_redirect(tmp_path):
    result = check_deploy(production_env(tmp_path, API_KEY_PEPPER=None, SECURE_SSL_REDIRECT=None))
    assert result.returncode != 0
    assert "tenants.W001" in result.stderr and "security.W008" in result.stderr


@pytest.mark.slow
def test_production_refuses_to_start_without_secret_key(tmp_path):
    env = production_env(tmp_path, SECRET_KEY=None)
    result = subprocess.run([sys.executable, "manage.py", "check"], cwd=ROOT, env=env, capture_output=True, text=True,
                            timeout=120)
    assert result.returncode != 0 and "SECRET_KEY must be set" in result.stderr


def test_env_example_is_production_and_complete():
    env = env_example()
    assert env["DEBUG"] == "0" and env["SECURE_SSL_REDIRECT"] == "1"
    for name in ("SECRET_KEY", "API_KEY_PEPPER", "DATABASE_URL", "REDIS_URL", "ALLOWED_HOSTS"):
        assert env.get(name), name
    used = "".join((ROOT / path).read_text() for path in ("platform_site/settings.py", "deploy/Procfile"))
    assert [name for name in env if name not in used and name != "HF_HUB_OFFLINE"] == []


def test_procfile_processes():
    procs = dict(line.split(":", 1) for line in (ROOT / "deploy" / "Procfile").read_text().splitlines()
                 if line.strip() and not line.startswith("#"))
    # 2 engine workers (issue 28), the Batch API's runner (issue 39)
    assert set(procs) == {"web", "worker1", "worker2", "celery", "beat", "batches"}
    assert "uvicorn platform_site.asgi:application" in procs["web"] and "--workers ${WEB_CONCURRENCY:-2}" in procs["web"]
    assert "manage.py run_worker" in procs["worker1"] and "manage.py run_worker" in procs["worker2"]
    assert "celery -A platform_site worker" in procs["celery"] and "celery -A platform_site beat" in procs["beat"]
    assert "manage.py run_batches" in procs["batches"]


@pytest.mark.slow
def test_deploy_settings_secure_cookies_transport_and_logins(tmp_path):
    """Under deploy/env.example: secure, HTTP-only cookies, HSTS, the SSL redirect, login throttling on,
    and the WebSocket Origin allow-list taken from its hosts."""
    names = ["SESSION_COOKIE_SECURE", "CSRF_COOKIE_SECURE", "SESSION_COOKIE_HTTPONLY", "SECURE_HSTS_SECONDS",
             "SECURE_SSL_REDIRECT", "SECURE_CONTENT_TYPE_NOSNIFF", "X_FRAME_OPTIONS", "AXES_ENABLED", "DEBUG",
             "WEBSOCKET_ALLOWED_ORIGINS", "REQUEST_BODY_TIMEOUT_S"]
    code = f"import json; from django.conf import settings as s; print(json.dumps({{n: getattr(s, n) for n in {names!r}}}))"
    result = subprocess.run([sys.executable, "manage.py", "shell", "-c", code], cwd=ROOT, env=production_env(tmp_path),
                            capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr
    values = json.loads(result.stdout.strip().splitlines()[-1])
    assert values["DEBUG"] is False and values["AXES_ENABLED"] is True
    assert values["SESSION_COOKIE_SECURE"] and values["CSRF_COOKIE_SECURE"] and values["SESSION_COOKIE_HTTPONLY"]
    assert values["SECURE_HSTS_SECONDS"] >= 31536000 and values["SECURE_SSL_REDIRECT"]
    assert values["SECURE_CONTENT_TYPE_NOSNIFF"] and values["X_FRAME_OPTIONS"] == "DENY"
    assert values["WEBSOCKET_ALLOWED_ORIGINS"] == [f"https://{host}" for host in env_example()["ALLOWED_HOSTS"].split(",")]
    assert values["REQUEST_BODY_TIMEOUT_S"] > 0
