"""The Batch API in production's shape, through a worker's SIGKILL: a web process (uvicorn, no engine), a
`run_worker` process, the `run_batches` runner and a Celery worker (the validation task) on Redis +
PostgreSQL, driven by the openai SDK.

A 24-line batch starts; once some lines are done, the worker holding the others is SIGKILLed and a second one
starts. The reaper requeues the jobs it had not started and fails those it had (a 500 to the runner, which runs
those lines again); the batch still ends `completed` with 24 answers, and each line has exactly one usage
record (a killed try's record, if one was written, is the line's only one), priced as a batch line.
"""

from __future__ import annotations

import io
import json
import os
import signal
import time
import uuid

import openai
import psycopg
import pytest

from tests.e2e.processes import (
    MODEL, Proc, api_key_new, database_prepare, postgres_database_reset, process_env, servers_required, wait_until,
    web_start, worker_start,
)

pytestmark = [pytest.mark.e2e, pytest.mark.slow]

REDIS_URL = os.environ.get("QUEUE_TEST_REDIS_URL", "redis://127.0.0.1:6379/2")
DATABASE_URL = os.environ.get("BATCH_E2E_DATABASE_URL", "postgres://postgres@127.0.0.1:5432/llm_batches_e2e")
# a Redis database of its own for the Celery broker: no other test's tasks wait there
CELERY_BROKER_URL = os.environ.get("BATCH_E2E_BROKER_URL", "redis://127.0.0.1:6379/11")
LINES = 24


@pytest.fixture(scope="module")
def stack(tmp_path_factory):
    servers_required(database_url=DATABASE_URL, redis_url=REDIS_URL)
    import sys

    tmp = tmp_path_factory.mktemp("batches_kill")
    prefix = f"e2e-{uuid.uuid4().hex[:8]}"
    postgres_database_reset(DATABASE_URL)
    env = process_env(DATABASE_URL=DATABASE_URL, REDIS_URL=REDIS_URL, QUEUE_KEY_PREFIX=prefix,
                      ADMISSION_KEY_PREFIX=f"{prefix}-lim",
                      WORKER_HEARTBEAT_TIMEOUT_S="3", OMP_NUM_THREADS="1", BATCH_MAX_IN_FLIGHT="4",
                      BATCH_POLL_S="0.2", CELERY_BROKER_URL=CELERY_BROKER_URL, FILE_STORAGE_DIR=str(tmp / "files"), WORKER_SPOOL_DIR=str(tmp / "spool"))
    database_prepare(env)
    key = api_key_new(env, tenant="batcher", tier="pro")
    procs: list[Proc] = []
    web, url = web_start(env, tmp)
    procs.append(web)
    runner = Proc("runner", [sys.executable, "manage.py", "run_batches"], env, tmp / "runner.log")
    procs.append(runner)
    # the validation task, as deploy/Procfile's celery line runs it
    procs.append(Proc("celery", [sys.executable, "-m", "celery", "-A", "platform_site", "worker", "--pool", "solo",
                                 "--loglevel", "WARNING"], env, tmp / "celery.log"))
    yield {"env": env, "tmp": tmp, "url": url, "key": key, "procs": procs, "runner": runner}
    for proc in reversed(procs):
        proc.stop(timeout=20)


def start_worker(stack, name: str) -> Proc:
    proc = worker_start(stack["env"], stack["tmp"], name=name,
                        extra=("--worker-id", name, "--max-num-seqs", "4", "--kv-cache-mb", "64"))
    stack["procs"].append(proc)
    return proc


def records(batch_id: str) -> list[tuple[str, int, str]]:
    with psycopg.connect(DATABASE_URL) as conn:
        return conn.execute("SELECT request_id, completion_tokens, batch_id FROM tenants_usagerecord "
                            "WHERE request_id LIKE %s ORDER BY request_id", (f"{batch_id}-%",)).fetchall()


def test_a_batch_completes_through_a_worker_sigkill_and_bills_each_line_once(stack):
    first = start_worker(stack, "worker-a")
    client = openai.OpenAI(base_url=f"{stack['url']}/v1", api_key=stack["key"], max_retries=2, timeout=60)
    lines = [{"custom_id": f"k-{n}", "method": "POST", "url": "/v1/chat/completions",
              "body": {"model": MODEL, "messages": [{"role": "user", "content": f"Count from {n} to {n + 40}."}],
                       "max_tokens": 48, "temperature": 0}} for n in range(LINES)]
    content = "\n".join(json.dumps(line) for line in lines).encode() + b"\n"
    file = client.files.create(file=("kill.jsonl", io.BytesIO(content)), purpose="batch")
    batch = client.batches.create(input_file_id=file.id, endpoint="/v1/chat/completions", completion_window="24h")

    def some_done():
        assert stack["runner"].alive, stack["runner"].log_tail()
        current = client.batches.retrieve(batch.id)
        return current if current.request_counts.completed >= 3 else None

    before = wait_until(some_done, timeout=300, interval=0.3, what="three lines done")
    assert before.request_counts.completed < LINES, "the batch ended before the kill"
    first.signal(signal.SIGKILL)
    first.popen.wait(10)
    start_worker(stack, "worker-b")

    def finished():
        current = client.batches.retrieve(batch.id)
        return current if current.status in ("completed", "failed", "expired", "cancelled") else None

    done = wait_until(finished, timeout=400, interval=0.5, what="the batch to end")
    assert done.status == "completed", (done, stack["runner"].log_tail())
    assert (done.request_counts.completed, done.request_counts.failed) == (LINES, 0), done.request_counts
    output = [json.loads(line) for line in client.files.content(done.output_file_id).text.splitlines()]
    assert sorted(line["custom_id"] for line in output) == sorted(f"k-{n}" for n in range(LINES))
    assert all(line["response"]["status_code"] == 200 for line in output)
    billed = wait_until(lambda: (rows := records(batch.id)) and len(rows) >= LINES and rows, timeout=30,
                        what="every line's usage record")
    assert [row[0] for row in billed] == sorted(f"{batch.id}-{n}" for n in range(1, LINES + 1))  # one each
    assert {row[2] for row in billed} == {batch.id}
