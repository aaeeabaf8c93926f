"""The Batch API as the e2e tests drive it through the official openai SDK, and the server's SQLite database
read directly (the usage records the tests reconcile against)."""

from __future__ import annotations

import io
import json
import sqlite3
import time

TERMINAL = {"completed", "failed", "expired", "cancelled"}


def upload(client, lines: list[dict]) -> str:
    """A JSONL input file of `lines` -> its file id."""
    content = "\n".join(json.dumps(line) for line in lines).encode() + b"\n"
    return client.files.create(file=("requests.jsonl", io.BytesIO(content)), purpose="batch").id


def create(client, lines: list[dict]):
    """A chat-completions batch of `lines` (uploaded first)."""
    return client.batches.create(input_file_id=upload(client, lines), endpoint="/v1/chat/completions",
                                 completion_window="24h")


def wait(client, batch_id: str, until=lambda batch: batch.status in TERMINAL, timeout: float = 300):
    """Poll the batch until `until(batch)` (default: a terminal status); fail after `timeout` seconds."""
    deadline = time.monotonic() + timeout
    while True:
        batch = client.batches.retrieve(batch_id)
        if until(batch):
            return batch
        assert time.monotonic() < deadline, f"batch {batch_id} still {batch.status} {batch.request_counts}"
        time.sleep(0.3)


def file_lines(client, file_id: str | None) -> dict[str, dict]:
    """custom_id -> line of an output or error file (empty when the batch has none)."""
    if file_id is None:
        return {}
    text = client.files.content(file_id).text
    return {line["custom_id"]: line for line in map(json.loads, text.splitlines())}


def query(server, sql: str, *args) -> list[dict]:
    """Rows of `sql` on the embedded server's SQLite database, as dicts."""
    with sqlite3.connect(server.database_url[len("sqlite:///"):], timeout=30) as conn:
        conn.row_factory = sqlite3.Row
        return [dict(row) for row in conn.execute(sql, args).fetchall()]


def records(server, prefix: str) -> dict[str, dict]:
    """request id -> the usage record (tokens, costs) of the records whose request id starts with `prefix`."""
    rows = query(server, "SELECT * FROM tenants_usagerecord WHERE request_id LIKE ?", prefix + "%")
    return {row["request_id"]: row for row in rows}
