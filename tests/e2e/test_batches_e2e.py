"""The Batch API end to end, as the official openai SDK (unchanged) sees it: a real embedded server (uvicorn
process, the engine inside, the batch runner on its event loop) with the real model.

- A 50-line file runs to `completed`: 50 output lines, one per custom_id, each body's answer equal to the same
  request sent live at temperature 0; each line billed once, at half the live request's cost (the default
  batch discount), its usage record under the line's request id.
- A batch cancelled halfway ends `cancelled`: the lines that ran are in the output file and billed, the others
  in the error file (`batch_cancelled`) and billed nothing.
- A line the live endpoint would refuse (max_tokens above the tier's cap) is in the error file with the live
  400 body; the other lines complete.

The runner holds one line at a time here (BATCH_MAX_IN_FLIGHT=1), so that a line runs alone in the engine as
the live request it is compared with does (greedy tokens are equal then; beside other rows they may differ
in the last bits of a logit, as for any live request).
"""

from __future__ import annotations

import time

import openai
import pytest

from tests.e2e.batch_client import TERMINAL, create, file_lines, records, wait
from tests.e2e.processes import MODEL, EmbeddedServer

pytestmark = [pytest.mark.slow, pytest.mark.e2e]

PROMPTS = ["Name a colour.", "Say hello.", "What is 2+2?", "Name a fruit.", "Name an animal."]


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    server = EmbeddedServer(tmp_path_factory.mktemp("batches_e2e"), env={"BATCH_MAX_IN_FLIGHT": "1",
                                                                         "BATCH_POLL_S": "0.2"})
    yield server
    server.stop()


@pytest.fixture(scope="module")
def client(server):
    return openai.OpenAI(base_url=f"{server.url}/v1", api_key=server.keys["pro"], max_retries=0, timeout=120)


def body(prompt: str, **fields) -> dict:
    return {"model": MODEL, "messages": [{"role": "user", "content": prompt}], "max_tokens": 6, "temperature": 0,
            **fields}


def per_token(record: dict) -> tuple[int, int]:
    """(uncached input, output) femto-dollars per token of a record."""
    uncached = record["prompt_tokens"] - record["cached_tokens"]
    output = int(record["output_cost_femtos"]) // record["completion_tokens"]
    return int(record["input_cost_femtos"]) // uncached, output


def test_a_batch_runs_to_completed_and_answers_as_live_requests(server, client):
    live, live_records = {}, {}
    for prompt in PROMPTS:
        raw = client.chat.completions.with_raw_response.create(**body(prompt))
        live[prompt] = raw.parse().choices[0].message.content
        request_id = raw.headers["x-request-id"]
        deadline = time.monotonic() + 30
        while request_id not in live_records:
            live_records.update(records(server, request_id))
            assert time.monotonic() < deadline, "no usage record for the live request"
            time.sleep(0.1)
        live_records[prompt] = live_records.pop(request_id)
    lines = [{"custom_id": f"req-{n}", "method": "POST", "url": "/v1/chat/completions",
              "body": body(PROMPTS[n % len(PROMPTS)])} for n in range(50)]
    batch = create(client, lines)
    done = wait(client, batch.id, lambda b: b.status in TERMINAL)
    assert done.status == "completed", done
    assert (done.request_counts.total, done.request_counts.completed, done.request_counts.failed) == (50, 50, 0)
    assert done.error_file_id is None and done.completed_at and done.in_progress_at
    output = file_lines(client, done.output_file_id)
    assert sorted(output) == sorted(f"req-{n}" for n in range(50))
    for n in range(50):
        line = output[f"req-{n}"]
        assert line["error"] is None and line["response"]["status_code"] == 200
        reply = line["response"]["body"]
        assert reply["object"] == "chat.completion" and reply["model"] == MODEL
        assert reply["choices"][0]["message"]["content"] == live[PROMPTS[n % len(PROMPTS)]], (n, reply)
    billed = records(server, f"{batch.id}-")
    assert len(billed) == 50  # one record per line
    for n in range(50):
        record = billed[output[f"req-{n}"]["response"]["request_id"]]
        same_live = live_records[PROMPTS[n % len(PROMPTS)]]
        assert record["completion_tokens"] == same_live["completion_tokens"] and record["batch_id"] == batch.id
        live_input, live_output = per_token(same_live)
        assert per_token(record) == (live_input // 2, live_output // 2), record  # half price (default discount)


def test_a_batch_cancelled_halfway_bills_only_the_lines_that_ran(server, client):
    lines = [{"custom_id": f"c-{n}", "method": "POST", "url": "/v1/chat/completions",
              "body": body(f"Count from {n} to {n + 20}.", max_tokens=24)} for n in range(20)]
    batch = create(client, lines)
    wait(client, batch.id, lambda b: b.request_counts.completed >= 2)
    assert client.batches.cancel(batch.id).status in ("cancelling", "cancelled")
    done = wait(client, batch.id, lambda b: b.status in TERMINAL, timeout=120)
    assert done.status == "cancelled" and done.cancelled_at
    ran = done.request_counts.completed
    assert 2 <= ran < 20 and done.request_counts.failed == 0
    output, errors = file_lines(client, done.output_file_id), file_lines(client, done.error_file_id)
    assert len(output) == ran and len(errors) == 20 - ran
    assert {line["error"]["code"] for line in errors.values()} == {"batch_cancelled"}
    billed = records(server, f"{batch.id}-")
    assert sorted(billed) == sorted(line["response"]["request_id"] for line in output.values())


def test_a_line_the_live_endpoint_refuses_is_in_the_error_file(server, client):
    lines = [{"custom_id": "ok", "method": "POST", "url": "/v1/chat/completions", "body": body("Say hi.")},
             {"custom_id": "too-long", "method": "POST", "url": "/v1/chat/completions",
              "body": body("Say hi.", max_tokens=10_000_000)}]
    batch = create(client, lines)
    done = wait(client, batch.id, lambda b: b.status in TERMINAL)
    assert done.status == "completed", done
    assert (done.request_counts.completed, done.request_counts.failed) == (1, 1)
    assert list(file_lines(client, done.output_file_id)) == ["ok"]
    refused = file_lines(client, done.error_file_id)["too-long"]
    assert refused["response"]["status_code"] == 400
    assert refused["response"]["body"]["error"]["param"] == "max_tokens", refused
    assert list(records(server, f"{batch.id}-")) == [f"{batch.id}-1"]  # the refused line costs nothing
