"""`make run` on a fresh SQLite file: migrate, bootstrap, serve; the printed key works with the openai SDK.

Runs the Makefile's own `run` recipe (skipping only the install step, which the
test environment has already done) as a real process tree on a free port.
"""

import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import httpx
import openai
import pytest

ROOT = Path(__file__).resolve().parents[2]
KEY_RE = re.compile(r"Demo API key \(shown once\): (sk-[a-z0-9]{10}-[A-Za-z0-9]{43})")

pytestmark = [pytest.mark.e2e, pytest.mark.slow]


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def server_command(port: int) -> list[str]:
    make = shutil.which("make")
    if make:
        return [make, "-s", "-o", "install", "-o", ".venv/.installed", "run", f"PY={sys.executable}",
                "HOST=127.0.0.1", f"PORT={port}"]
    py = sys.executable  # no make: the same three steps as the Makefile's recipe
    return ["sh", "-c", f"{py} manage.py migrate --noinput && BASE_URL=http://127.0.0.1:{port} {py} manage.py bootstrap"
            f" && exec {py} -m uvicorn "
            f"platform_site.asgi:application --host 127.0.0.1 --port {port} --lifespan off"]


@pytest.fixture(scope="module")
def served(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("make_run")
    port = free_port()
    env = {k: v for k, v in os.environ.items() if k not in {"PYTEST_VERSION", "REDIS_URL", "DJANGO_SETTINGS_MODULE"}}
    # ENV_FILE: `make run` writes its .env there, not into the checkout
    env.update(DEBUG="1", DATABASE_URL=f"sqlite:///{tmp / 'fresh.sqlite3'}", ADMIN_PASSWORD="e2e-admin-password-1",
               ENV_FILE=str(tmp / ".env"),
               PYTHONUNBUFFERED="1", HF_HUB_OFFLINE="1")
    log_path = tmp / "server.log"
    with open(log_path, "w") as log:
        proc = subprocess.Popen(server_command(port), cwd=ROOT, env=env, stdout=log, stderr=subprocess.STDOUT,
                                start_new_session=True)
    base = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 180
        while True:
            assert proc.poll() is None, f"server exited early:\n{log_path.read_text()}"
            assert time.monotonic() < deadline, f"server did not come up:\n{log_path.read_text()}"
            try:
                if httpx.get(f"{base}/healthz", timeout=2).status_code == 200:
                    break
            except httpx.TransportError:
                pass
            time.sleep(0.3)
        match = KEY_RE.search(log_path.read_text())
        assert match, log_path.read_text()
        yield {"base": base, "key": match.group(1), "log": log_path}
    finally:
        os.killpg(proc.pid, signal.SIGTERM)
        try:
            proc.wait(timeout=20)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(timeout=10)


def test_models_list_with_openai_client(served):
    client = openai.OpenAI(base_url=served["base"] + "/v1", api_key=served["key"], max_retries=0, timeout=10)
    models = client.models.list()
    ids = [model.id for model in models]
    assert ids == ["smollm2-135m-instruct"]
    first = models.data[0]
    assert first.object == "model" and first.owned_by and first.created > 0
    assert client.models.retrieve("smollm2-135m-instruct").id == "smollm2-135m-instruct"
    with pytest.raises(openai.NotFoundError):
        client.models.retrieve("no-such-model")


def test_401_without_a_key(served):
    response = httpx.get(served["base"] + "/v1/models", timeout=10)
    assert response.status_code == 401
    assert response.headers["www-authenticate"].startswith("Bearer")
    error = response.json()["error"]
    assert error["code"] == "invalid_api_key" and error["type"] == "invalid_request_error"

    bad = openai.OpenAI(base_url=served["base"] + "/v1", api_key="sk-wrong", max_retries=0, timeout=10)
    with pytest.raises(openai.AuthenticationError) as info:
        bad.models.list()
    assert info.value.status_code == 401 and info.value.code == "invalid_api_key"


def test_make_run_prints_admin_login_and_serves_admin(served):
    log = served["log"].read_text()
    assert f"Admin: {served['base']}/admin/  user admin" in log
    response = httpx.get(served["base"] + "/admin/login/", timeout=10)
    assert response.status_code == 200 and "csrfmiddlewaretoken" in response.text
    css = httpx.get(served["base"] + "/static/admin/css/base.css", timeout=10)
    assert css.status_code == 200 and "text/css" in css.headers["content-type"]


@pytest.mark.parametrize(
    "value",
    [b"Bearer", b"Bearer \x00\x00", b"Bearer \xff\xfe\xfd", b"Bearer " + b"A" * 60_000, b"\xe2\x98\x83",
     b"Bearer  sk-aaaaaaaaaa-" + b"b" * 43, b"Bearer sk-aaaaaaaaaa-" + "é".encode() * 43],
)
def test_raw_header_bytes_never_500(served, value):
    """Bytes straight onto the socket, past any client library's header validation."""
    port = int(served["base"].rsplit(":", 1)[1])
    request = b"GET /v1/models HTTP/1.1\r\nHost: 127.0.0.1\r\nAuthorization: " + value + b"\r\nConnection: close\r\n\r\n"
    with socket.create_connection(("127.0.0.1", port), timeout=10) as sock:
        sock.sendall(request)
        status_line = sock.makefile("rb").readline()
    status = int(status_line.split()[1])
    assert 400 <= status < 500, status_line
