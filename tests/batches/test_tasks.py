"""The batches app's Celery tasks: registered under the names services and beat send, each calling its service."""

from __future__ import annotations

import pytest

from tests.batches.conftest import chat_line

pytestmark = pytest.mark.django_db


def test_beat_and_services_name_registered_tasks(settings):
    from platform_site.celery import app

    names = {"batches.tasks.validate_batch", "batches.tasks.validate_pending", "batches.tasks.expire_batches"}
    assert names <= set(app.tasks)
    scheduled = {entry["task"] for entry in settings.CELERY_BEAT_SCHEDULE.values()}
    assert {"batches.tasks.validate_pending", "batches.tasks.expire_batches"} <= scheduled


def test_the_tasks_run_their_services(input_file, api_key):
    from datetime import timedelta

    from batches.models import Batch
    from batches.services.batches import batch_create
    from batches.tasks import expire_batches, validate_batch

    batch = batch_create(tenant=api_key.api_key.tenant, api_key=api_key.api_key, input_file_id=input_file(
        [chat_line("a")]), endpoint="/v1/chat/completions", completion_window="24h")
    assert validate_batch.delay(batch_id=batch.pk).get() == "in_progress"
    Batch.objects.filter(pk=batch.pk).update(expires_at=batch.created_at - timedelta(seconds=1))
    assert expire_batches.delay().get() == 1
    assert Batch.objects.get(pk=batch.pk).status == "expired"
