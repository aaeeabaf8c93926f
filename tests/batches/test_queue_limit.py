"""OpenAI's batch queue limit: prompt tokens a tenant may have enqueued per model across its unfinished batches
(batches.services.queue_limit), counted at validation as the live path counts them."""

from __future__ import annotations

from datetime import timedelta

import pytest
from django.utils import timezone

from batches.models import Batch, BatchLine
from batches.services.transitions import S
from tests.batches.conftest import MODEL, chat_line, postgres_only, race
from tests.conftest import bearer

pytestmark = pytest.mark.django_db

PROMPTS = ["What is the capital of France?", "Write a haiku about tea.", "hi"]


def _lines(tag: str) -> list[dict]:
    return [chat_line(f"{tag}-{n}", content=text) for n, text in enumerate(PROMPTS)]


def _live_tokens() -> int:
    """The three prompts' tokens as a live request's preparation counts them: the model's tokenizer and chat
    template, through the function arequest_prepare calls."""
    from inference.api.model_access import amodel_info_get
    from inference.api.schemas import CHAT, api_request_parse
    from inference.api.services import atokenizer_get, chat_template_get, prompt_tokenize
    from asgiref.sync import async_to_sync

    info = async_to_sync(amodel_info_get)(name=MODEL)
    tokenizer = async_to_sync(atokenizer_get)(model=info)
    template = chat_template_get(model=info, tokenizer=tokenizer)
    return sum(len(prompt_tokenize(request=api_request_parse(endpoint=CHAT, body=line["body"]), tokenizer=tokenizer,
                                   chat_template=template)) for line in _lines("x"))


def _validated(create_batch, api_client, api_key, file_id: str) -> dict:
    created = create_batch(file_id)
    assert created.status_code == 200, created.content
    return api_client.get(f"/v1/batches/{created.json()['id']}", **bearer(api_key.key)).json()


def _limit(tier, value: int, *, model_value: int | None = None) -> None:
    from tenants.models import TierModelLimit

    tier.batch_queue_tokens = value
    tier.save(update_fields=["batch_queue_tokens"])
    if model_value is not None:
        TierModelLimit.objects.create(tier=tier, model_name=MODEL, batch_queue_tokens=model_value)


def test_a_batch_counts_its_prompt_tokens_as_the_live_path_does(input_file, create_batch, api_client, api_key):
    batch = _validated(create_batch, api_client, api_key, input_file(_lines("a")))
    assert batch["status"] == "in_progress"
    tokens = _live_tokens()
    assert tokens > 3 * 5  # the chat template's tokens are counted, not only the words
    assert Batch.objects.get(public_id=batch["id"]).input_tokens == tokens


def test_a_batch_that_does_not_fit_the_queue_fails_with_token_limit_exceeded(input_file, create_batch, api_client,
                                                                             api_key, tier):
    one = _live_tokens()
    _limit(tier, one * 3 // 2)  # room for one batch, not two
    first = _validated(create_batch, api_client, api_key, input_file(_lines("a")))
    second = _validated(create_batch, api_client, api_key, input_file(_lines("b")))
    assert first["status"] == "in_progress"
    assert second["status"] == "failed" and second["failed_at"] is not None and second["in_progress_at"] is None
    [error] = second["errors"]["data"]
    assert error["code"] == "token_limit_exceeded" and error["line"] is None
    assert f"Limit: {one * 3 // 2:,} enqueued tokens" in error["message"] and MODEL in error["message"]
    assert "try again once some in_progress batches have been completed" in error["message"]
    assert not BatchLine.objects.filter(batch__public_id=second["id"]).exists()  # nothing of it runs

    # the first one done (any end: completed here), its tokens leave the queue and a new batch fits
    Batch.objects.filter(public_id=first["id"]).update(status=S.COMPLETED)
    third = _validated(create_batch, api_client, api_key, input_file(_lines("c")))
    assert third["status"] == "in_progress"


@pytest.mark.parametrize("ended", [S.COMPLETED, S.FAILED, S.EXPIRED, S.CANCELLED])
def test_ended_batches_hold_no_tokens_and_unfinished_ones_do(input_file, create_batch, api_client, api_key, tier,
                                                             ended):
    _limit(tier, _live_tokens() * 3 // 2)
    first = _validated(create_batch, api_client, api_key, input_file(_lines("a")))
    Batch.objects.filter(public_id=first["id"]).update(status=S.CANCELLING)  # lines still running: held
    assert _validated(create_batch, api_client, api_key, input_file(_lines("b")))["status"] == "failed"
    Batch.objects.filter(public_id=first["id"]).update(status=ended)
    assert _validated(create_batch, api_client, api_key, input_file(_lines("c")))["status"] == "in_progress"


def test_a_batch_alone_over_the_limit_is_told_to_split(input_file, create_batch, api_client, api_key, tier):
    _limit(tier, 5)
    batch = _validated(create_batch, api_client, api_key, input_file(_lines("a")))
    [error] = batch["errors"]["data"]
    assert batch["status"] == "failed" and error["code"] == "token_limit_exceeded"
    assert "split it into smaller batches" in error["message"]


def test_the_tier_per_model_row_replaces_the_tier_limit(input_file, create_batch, api_client, api_key, tier):
    _limit(tier, 0, model_value=5)  # the tier unlimited, the model's row tight
    assert _validated(create_batch, api_client, api_key, input_file(_lines("a")))["status"] == "failed"
    tier.model_limits.update(batch_queue_tokens=10**9)
    _limit(tier, 5)  # the tier tight, the model's row generous
    assert _validated(create_batch, api_client, api_key, input_file(_lines("b")))["status"] == "in_progress"
    tier.model_limits.update(batch_queue_tokens=None)  # an empty row: the tier's limit again
    assert _validated(create_batch, api_client, api_key, input_file(_lines("c")))["status"] == "failed"


def test_another_tenant_queue_is_its_own(input_file, create_batch, api_client, api_key, tier, api_key_factory,
                                         tenant_factory):
    _limit(tier, _live_tokens() * 3 // 2)
    assert _validated(create_batch, api_client, api_key, input_file(_lines("a")))["status"] == "in_progress"
    other = api_key_factory(tenant=tenant_factory(tier=tier))
    created = create_batch(input_file(_lines("b"), key=other.key), key=other.key)
    assert Batch.objects.get(public_id=created.json()["id"]).status == S.IN_PROGRESS


@postgres_only
@pytest.mark.django_db(transaction=True)
def test_batches_validated_at_once_never_overfill_the_queue(input_file, api_key, tier):
    """Eight batches validated by eight threads at once, room for three: exactly three start."""
    from batches.services.validation import batch_validate

    _limit(tier, _live_tokens() * 3 + 1)
    expires = timezone.now() + timedelta(hours=24)
    batches = [Batch.objects.create(tenant=api_key.api_key.tenant, api_key=api_key.api_key,
                                    endpoint="/v1/chat/completions", expires_at=expires,
                                    input_file=_stored(input_file(_lines(f"r{n}")))) for n in range(8)]
    results = race(8, lambda i: batch_validate(batch_id=batches[i].pk).status)
    assert not [r for r in results if isinstance(r, Exception)], results
    assert sorted(results).count(S.IN_PROGRESS) == 3 and results.count(S.FAILED) == 5, results


def _stored(file_id: str):
    from batches.models import StoredFile

    return StoredFile.objects.get(public_id=file_id)
