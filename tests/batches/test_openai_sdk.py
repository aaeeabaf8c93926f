"""The official openai SDK, unchanged, against the project's ASGI application served by uvicorn on a real socket
(in a thread of this process, on the test database): files.create/list/retrieve/content/delete and
batches.create/retrieve/list/cancel. The ASGI edge's body limit is the real one here (batches.uploads):
a file over DATA_UPLOAD_MAX_MEMORY_SIZE is taken, one over FILES_MAX_BYTES is refused before it is read."""

from __future__ import annotations

import io
import json
import threading
import time

import openai
import pytest

from tests.batches.conftest import chat_line, jsonl
from tests.e2e.processes import free_port

pytestmark = pytest.mark.django_db(transaction=True)  # the server's threads read what the test wrote


@pytest.fixture
def live_url():
    import uvicorn

    from platform_site.asgi import application

    port = free_port()
    server = uvicorn.Server(uvicorn.Config(application, host="127.0.0.1", port=port, lifespan="off",
                                           log_level="warning"))
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    deadline = time.monotonic() + 20
    while not server.started:
        assert time.monotonic() < deadline and thread.is_alive(), "uvicorn did not start"
        time.sleep(0.02)
    yield f"http://127.0.0.1:{port}/v1"
    server.should_exit = True
    thread.join(10)


@pytest.fixture
def client(live_url, api_key, served_model):
    return openai.OpenAI(api_key=api_key.key, base_url=live_url, max_retries=0, timeout=30)


def test_the_sdk_uploads_lists_and_downloads_files(client, tmp_path):
    content = jsonl([chat_line(f"r{n}") for n in range(3)])
    path = tmp_path / "requests.jsonl"
    path.write_bytes(content)
    with path.open("rb") as handle:
        created = client.files.create(file=handle, purpose="batch")
    assert created.id.startswith("file-") and created.filename == "requests.jsonl"
    assert created.bytes == len(content) and created.purpose == "batch" and created.object == "file"
    assert client.files.retrieve(created.id) == created
    assert client.files.content(created.id).content == content
    second = client.files.create(file=("more.jsonl", io.BytesIO(content)), purpose="batch")
    listed = client.files.list(purpose="batch", limit=1)
    assert [f.id for f in listed.data] == [second.id] and listed.has_more
    assert [f.id for f in listed.iter_pages().__next__().data] == [second.id]
    assert [f.id for f in client.files.list(purpose="batch", limit=1)] == [second.id, created.id]  # auto-paging
    assert client.files.delete(created.id).deleted is True
    with pytest.raises(openai.NotFoundError):
        client.files.retrieve(created.id)


def test_the_sdk_creates_lists_and_cancels_batches(client):
    file = client.files.create(file=("in.jsonl", io.BytesIO(jsonl([chat_line("a"), chat_line("b")]))),
                               purpose="batch")
    batch = client.batches.create(input_file_id=file.id, endpoint="/v1/chat/completions",
                                  completion_window="24h", metadata={"run": "sdk"})
    assert batch.id.startswith("batch_") and batch.metadata == {"run": "sdk"}
    assert batch.status == "in_progress"  # validated as it was made: tasks run eagerly here
    assert batch.request_counts.total == 2 and batch.input_file_id == file.id
    other = client.batches.create(input_file_id=file.id, endpoint="/v1/chat/completions", completion_window="24h")
    assert [b.id for b in client.batches.list(limit=1)] == [other.id, batch.id]  # the cursor, page by page
    cancelled = client.batches.cancel(batch.id)
    assert cancelled.status == "cancelled" and cancelled.cancelled_at is not None
    assert client.batches.retrieve(batch.id).status == "cancelled"
    with pytest.raises(openai.BadRequestError) as refused:
        client.batches.create(input_file_id=file.id, endpoint="/v1/embeddings", completion_window="24h")
    assert refused.value.body["param"] == "endpoint"


def test_the_sdk_sees_a_bad_file_fail_with_its_lines(client):
    lines = jsonl([chat_line("a"), b"{oops", chat_line("a")])
    file = client.files.create(file=("bad.jsonl", io.BytesIO(lines)), purpose="batch")
    batch = client.batches.create(input_file_id=file.id, endpoint="/v1/chat/completions", completion_window="24h")
    assert batch.status == "failed"
    assert [(e.code, e.line) for e in batch.errors.data] == [("invalid_json_line", 2), ("duplicate_custom_id", 3)]


def test_uploads_past_the_api_body_limit(client, settings):
    settings.DATA_UPLOAD_MAX_MEMORY_SIZE = 4096  # what other /v1 bodies may carry
    settings.FILES_MAX_BYTES = 64 * 1024
    line = json.dumps(chat_line("x", content="y" * 900)).encode()
    big = b"\n".join(line.replace(b'"x"', f'"{n}"'.encode()) for n in range(40)) + b"\n"
    assert 4096 < len(big) < 64 * 1024
    assert client.files.create(file=("big.jsonl", io.BytesIO(big)), purpose="batch").bytes == len(big)
    with pytest.raises(openai.APIStatusError) as refused:
        client.files.create(file=("huge.jsonl", io.BytesIO(big * 3)), purpose="batch")
    assert refused.value.status_code == 413
