"""Fixtures of the Batch API's tests: files stored in a temporary folder, tasks run eagerly, JSONL lines."""

from __future__ import annotations

import json
import threading

import pytest
from django.db import connection, connections

from tests.conftest import bearer

MODEL = "smollm2-135m-instruct"


@pytest.fixture(autouse=True)
def _files_in_tmp(settings, tmp_path):
    """Each test's files in a folder of its own (the `files` storage is rebuilt when STORAGES changes)."""
    settings.STORAGES = {**settings.STORAGES, "files": {
        "BACKEND": "django.core.files.storage.FileSystemStorage", "OPTIONS": {"location": str(tmp_path / "files")}}}


@pytest.fixture(autouse=True)
def _no_embedded_runner(settings):
    """The batch runner stays off here (batches in progress stay so); tests/e2e/test_batches_e2e.py runs it."""
    settings.BATCH_RUNNER_EMBEDDED = False


@pytest.fixture(autouse=True)
def _tasks_eager(settings):
    """Celery tasks run in this process, as in the embedded mode (under REDIS_URL too: no broker needed)."""
    from platform_site.celery import app

    settings.CELERY_TASK_ALWAYS_EAGER = True
    previous = app.conf.task_always_eager, app.conf.task_eager_propagates
    app.conf.task_always_eager = app.conf.task_eager_propagates = True
    yield
    app.conf.task_always_eager, app.conf.task_eager_propagates = previous


def chat_line(custom_id: str, *, model: str = MODEL, content: str = "hi", **body) -> dict:
    return {"custom_id": custom_id, "method": "POST", "url": "/v1/chat/completions",
            "body": {"model": model, "messages": [{"role": "user", "content": content}], "max_tokens": 2, **body}}


def jsonl(lines: list) -> bytes:
    """One line per item: dicts as JSON, bytes and str as they are."""
    out = []
    for line in lines:
        if isinstance(line, bytes):
            out.append(line)
        elif isinstance(line, str):
            out.append(line.encode())
        else:
            out.append(json.dumps(line).encode())
    return b"\n".join(out) + b"\n"


def multipart(content: bytes, *, filename: str = "input.jsonl", purpose: str = "batch") -> tuple[bytes, str]:
    """The body and Content-Type the openai SDK sends for files.create (httpx's multipart encoder, which the
    SDK uses): a `purpose` field and a `file` part with its filename."""
    import httpx

    request = httpx.Request("POST", "http://testserver/v1/files", data={"purpose": purpose},
                            files={"file": (filename, content, "application/octet-stream")})
    return request.read(), request.headers["content-type"]


@pytest.fixture
def upload(api_client):
    """upload(key, content, filename=..., purpose=...) -> the response of POST /v1/files."""

    def send(key: str, content: bytes, **fields):
        body, content_type = multipart(content, **fields)
        return api_client.generic("POST", "/v1/files", body, content_type=content_type, **bearer(key))

    return send


@pytest.fixture
def input_file(upload, api_key, served_model):
    """upload a JSONL file of `lines` as `api_key`'s tenant -> the file's id."""

    def make(lines: list, key: str | None = None) -> str:
        response = upload(key or api_key.key, jsonl(lines))
        assert response.status_code == 200, response.content
        return response.json()["id"]

    return make


@pytest.fixture
def create_batch(api_client, api_key, django_capture_on_commit_callbacks):
    """create_batch(file_id, key=None, **fields) -> the response of POST /v1/batches (its validation run)."""

    def create(file_id: str, key: str | None = None, **fields):
        body = {"input_file_id": file_id, "endpoint": "/v1/chat/completions", "completion_window": "24h", **fields}
        with django_capture_on_commit_callbacks(execute=True):
            return api_client.post("/v1/batches", body, format="json", **bearer(key or api_key.key))

    return create


def race(count: int, work) -> list:
    """Run `work(i)` in `count` threads released together; their results (a thread's exception as its result)."""
    barrier, results = threading.Barrier(count), [None] * count

    def run(index: int) -> None:
        try:
            barrier.wait(10)
            results[index] = work(index)
        except Exception as exc:  # noqa: BLE001 - reported by the test
            results[index] = exc
        finally:
            connections.close_all()

    threads = [threading.Thread(target=run, args=(i,)) for i in range(count)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(30)
    return results


@pytest.fixture
def batch(input_file, create_batch):
    """An in_progress batch of five chat lines, c0 to c4."""
    from batches.models import Batch

    created = create_batch(input_file([chat_line(f"c{n}") for n in range(5)])).json()
    return Batch.objects.get(public_id=created["id"])


# threads writing at once need PostgreSQL: the in-memory SQLite test database refuses a second writer at once
postgres_only = pytest.mark.skipif(connection.vendor != "postgresql", reason=(
    "threads writing at once need PostgreSQL: the in-memory SQLite test database refuses a second writer at once"))
