"""`GET /health`, the probe vLLM and TGI answer and load generators (guidellm) call before a run: 200 with
an empty body when this process can serve a completion now, 503 with an empty body when it cannot (the
checks of /readyz), beside /healthz, /livez and /readyz. The server backed case (a real web process and a
real worker) is in tests/e2e/test_worker_kv_sizing.py."""

from __future__ import annotations

import pytest

from inference.queue import get_job_queue, reset_job_queue


@pytest.fixture
def in_process_queue(settings):
    """Separate workers (no engine thread here) on the in-process queue."""
    settings.REDIS_URL = ""
    settings.EMBEDDED_WORKER = False
    reset_job_queue()
    yield get_job_queue()
    reset_job_queue()


def test_503_until_a_worker_serves_the_default_model(client, db, settings, in_process_queue):
    response = client.get("/health")
    assert (response.status_code, response.content) == (503, b"")
    assert client.get("/healthz").status_code == 200  # the process and its database are fine: no worker yet
    in_process_queue.heartbeat("w-health", settings.DEFAULT_MODEL, {"status": "loading"})
    assert client.get("/health").status_code == 503  # loading its model: not serving yet
    in_process_queue.heartbeat("w-health", settings.DEFAULT_MODEL, {"status": "serving"})
    response = client.get("/health")
    assert (response.status_code, response.content) == (200, b"")
    assert client.head("/health").status_code == 200
    assert client.get("/readyz").status_code == 200  # the same checks


def test_the_embedded_mode_serves_once_its_database_answers(client, db, settings, monkeypatch):
    from django.db import DatabaseError, connection

    settings.EMBEDDED_WORKER = True
    response = client.get("/health")
    assert (response.status_code, response.content) == (200, b"")

    def broken(*args, **kwargs):
        raise DatabaseError("down")

    with monkeypatch.context() as patch:
        patch.setattr(connection, "cursor", broken)
        response = client.get("/health")
    assert (response.status_code, response.content) == (503, b"")


@pytest.mark.parametrize("method", ["post", "put", "delete"])
def test_other_methods_are_not_allowed(client, db, method):
    assert getattr(client, method)("/health").status_code == 405
