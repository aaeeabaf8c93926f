"""A tenant's budget runs out in the middle of a batch, as the official openai SDK (unchanged) sees it: a real
embedded server (uvicorn process, the engine inside, the batch runner on its event loop) with the real model.

Each line goes through the live admission path (batches.services.line_run): admission reserves the line's
worst case at the batch price the line is billed at (every prompt token at the uncached input price, every one
of `max_tokens` at the output price, the version's batch discount and the tier multiplier applied:
billing.services.admission_plan.worst_case_nanos) against the tenant's monthly budget, and the worker settles it
to the line's real cost. A line the budget cannot cover is refused
with 429 `insufficient_quota`, final: it is in the error file with that body, billed nothing.

The tenant's budget here covers a little more than two lines' worst case (computed from the model's price, the
tier's multiplier, the prompt's token count and `max_tokens`, not guessed), set before the batch is created. The
batch still ends `completed` (as OpenAI's do when lines failed), and:
- the lines that ran are in the output file, the others in the error file with `insufficient_quota`;
- which lines ran is exactly what admission's rule says, replayed from the usage records (one line at a time:
  BATCH_MAX_IN_FLIGHT=1; a line's reservation is settled before its response comes back): a line runs iff what
  the lines before it cost, plus its worst case, fits in the budget;
- the costs of the usage records never exceed the budget; one record per line that ran, none for the others.
"""

from __future__ import annotations

from decimal import Decimal

import openai
import pytest

from tests.e2e.batch_client import create, file_lines, query, records, wait
from tests.e2e.processes import MODEL, EmbeddedServer, api_key_new, manage

pytestmark = [pytest.mark.slow, pytest.mark.e2e]

TENANT = "t-budget"
PROMPT = "Count from 1 to 200, separated by commas."
MAX_TOKENS = 96
LINES = 12
FEMTOS_PER_NANO, NANOS_PER_MICRO = 10**6, 10**3


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    keys: dict[str, str] = {}

    def tenant_add(env: dict[str, str]) -> None:  # a tenant of its own: no other request counts in its budget
        keys[TENANT] = api_key_new(env, tenant=TENANT, tier="pro")

    server = EmbeddedServer(tmp_path_factory.mktemp("batches_budget_e2e"), before_start=tenant_add,
                            env={"BATCH_MAX_IN_FLIGHT": "1", "BATCH_POLL_S": "0.2"})
    server.keys.update(keys)
    yield server
    server.stop()


def client_of(server, key: str) -> openai.OpenAI:
    return openai.OpenAI(base_url=f"{server.url}/v1", api_key=key, max_retries=0, timeout=120)


def body() -> dict:
    return {"model": MODEL, "messages": [{"role": "user", "content": PROMPT}], "max_tokens": MAX_TOKENS,
            "temperature": 0}


def picos(per_million, discount: int) -> int:
    """USD per 1M tokens (at most 6 places) -> pico-dollars per token at the batch price: `discount` percent
    off, half to even to a whole pico-dollar (billing.money's documented rule)."""
    value = Decimal(str(per_million)).quantize(Decimal("0.000001")) * 10**6
    assert value == value.to_integral_value()
    return int((value * (100 - discount) / 100).to_integral_value(rounding="ROUND_HALF_EVEN"))


def worst_case_nanos(server, *, prompt_tokens: int) -> int:
    """Admission's reservation for one line, from the stored price version (at its batch discount) and the
    tenant's tier multiplier: no cached prompt token, every one of MAX_TOKENS used, rounded up to a nano-dollar."""
    (price,) = query(server, "SELECT CAST(input_per_million AS TEXT) AS input, CAST(output_per_million AS TEXT) "
                             "AS output, batch_discount_percent AS discount FROM billing_price WHERE model = ? AND retired_at IS NULL "
                             "ORDER BY effective_from DESC LIMIT 1", MODEL)
    (tier,) = query(server, "SELECT CAST(t.price_multiplier AS TEXT) AS multiplier FROM tenants_tier t "
                            "JOIN tenants_tenant n ON n.tier_id = t.id WHERE n.slug = ?", TENANT)
    milli = Decimal(tier["multiplier"]) * 1000
    assert milli == milli.to_integral_value()
    discount = int(price["discount"])
    assert discount > 0  # the batch price is below the list price (default 50%)
    femtos = (prompt_tokens * picos(price["input"], discount)
              + MAX_TOKENS * picos(price["output"], discount)) * int(milli)
    return -(-femtos // FEMTOS_PER_NANO)


def budget_set(server, *, worst: int) -> int:
    """A hard monthly budget of a little more than two lines' worst case (whole micro-dollars, rounded down,
    still above two lines' worst case); its nano-dollars."""
    micros = (2 * worst + worst // 4) // NANOS_PER_MICRO
    assert micros * NANOS_PER_MICRO >= 2 * worst + 1, (micros, worst)
    manage(server.env, "limits_set", "--tenant", TENANT, "--monthly-budget-usd", f"{Decimal(micros) / 10**6:f}")
    return micros * NANOS_PER_MICRO


def replay(rows: dict[str, dict], request_ids: list[str], *, worst: int, budget: int) -> list[bool]:
    """Admission's rule, line after line: a line runs iff the settled costs of the lines that ran before it
    (each rounded up to a nano-dollar, as the counters add them) plus its worst case fit in the budget."""
    spent, ran = 0, []
    for request_id in request_ids:
        admitted = spent + worst <= budget
        ran.append(admitted)
        if admitted and request_id in rows:
            spent += -(-int(rows[request_id]["cost_femtos"]) // FEMTOS_PER_NANO)
    return ran


def assert_refused(line: dict) -> None:
    response = line["response"]
    assert line["error"] is None and response["status_code"] == 429, line
    error = response["body"]["error"]
    assert (error["code"], error["type"]) == ("insufficient_quota", "insufficient_quota"), line
    assert "budget" in error["message"], line


def test_a_budget_that_runs_out_mid_batch_fails_the_rest_with_insufficient_quota(server):
    measure, client = client_of(server, server.keys["pro"]), client_of(server, server.keys[TENANT])
    prompt_tokens = measure.chat.completions.create(**body()).usage.prompt_tokens  # another tenant: not counted
    worst = worst_case_nanos(server, prompt_tokens=prompt_tokens)
    budget = budget_set(server, worst=worst)
    lines = [{"custom_id": f"b-{n}", "method": "POST", "url": "/v1/chat/completions", "body": body()}
             for n in range(LINES)]
    batch = create(client, lines)
    done = wait(client, batch.id)
    assert done.status == "completed", done
    ran, refused = done.request_counts.completed, done.request_counts.failed
    assert (done.request_counts.total, ran + refused) == (LINES, LINES), done.request_counts
    assert 2 <= ran < LINES, done.request_counts  # two lines' worst case fit; not every line did
    output, errors = file_lines(client, done.output_file_id), file_lines(client, done.error_file_id)
    assert len(output) == ran and len(errors) == refused and not set(output) & set(errors)
    for line in output.values():
        assert line["error"] is None and line["response"]["status_code"] == 200, line
    for line in errors.values():
        assert_refused(line)
    request_ids = {custom_id: line["response"]["request_id"] for custom_id, line in {**output, **errors}.items()}
    billed = records(server, f"{batch.id}-")
    assert sorted(billed) == sorted(line["response"]["request_id"] for line in output.values())  # once each
    for row in billed.values():
        assert row["batch_id"] == batch.id and row["prompt_tokens"] == prompt_tokens, row
    total_femtos = sum(int(row["cost_femtos"]) for row in billed.values())
    assert total_femtos <= budget * FEMTOS_PER_NANO, (total_femtos, budget)  # never past the budget
    order = [request_ids[f"b-{n}"] for n in range(LINES)]
    expected = replay(billed, order, worst=worst, budget=budget)
    assert [f"b-{n}" in output for n in range(LINES)] == expected, (expected, worst, budget, billed)
