"""The batches page (issue 39): a tenant's batches with their progress and links to their files, and the
files' download with the member's session; another tenant's batches and files are a 404."""

from __future__ import annotations

from datetime import timedelta

import pytest
from django.test import Client
from django.urls import reverse
from django.utils import timezone

from batches.models import Batch
from batches.services.files import file_content_create, file_delete
from dashboard.selectors.batches import PAGE_SIZE

INPUT = b'{"custom_id": "a", "method": "POST", "url": "/v1/chat/completions", "body": {}}\n'
OUTPUT = b'{"id": "batch_req_1", "custom_id": "a"}\n\x00\xff not text either\n'


@pytest.fixture(autouse=True)
def _files_in_tmp(settings, tmp_path):
    settings.STORAGES = {**settings.STORAGES, "files": {
        "BACKEND": "django.core.files.storage.FileSystemStorage", "OPTIONS": {"location": str(tmp_path / "files")}}}


def login(user) -> Client:
    client = Client()
    client.force_login(user)
    return client


def streamed(response) -> bytes:
    """A streamed response's bytes (an async iterator: the ASGI handler's way), read as that handler does."""
    from asgiref.sync import async_to_sync

    async def read():
        return b"".join([chunk async for chunk in response.streaming_content])

    return async_to_sync(read)()


def batch_make(tenant, *, created_at=None, output: bytes | None = None, **fields) -> Batch:
    made = file_content_create(tenant=tenant, purpose="batch", filename="input.jsonl", content=INPUT)
    if output is not None:
        fields["output_file"] = file_content_create(tenant=tenant, purpose="batch_output",
                                                    filename="batch_output.jsonl", content=output)
    when = created_at or timezone.now()
    return Batch.objects.create(tenant=tenant, endpoint="/v1/chat/completions", input_file=made, created_at=when,
                                expires_at=when + timedelta(hours=24), **fields)


@pytest.fixture
def tenant_a(tenant_factory):
    return tenant_factory(slug="tenant-a")


def test_a_member_sees_batches_with_progress_and_file_links(tenant_a, member_factory):
    done = batch_make(tenant_a, created_at=timezone.now() - timedelta(hours=2), output=OUTPUT, model="m-batch",
                      status=Batch.Status.COMPLETED, total=4, completed=3, failed=1, completed_at=timezone.now())
    running = batch_make(tenant_a, status=Batch.Status.IN_PROGRESS, total=8, completed=2, failed=0)
    page = login(member_factory(tenant_a, "viewer")).get(reverse("dashboard:batches", args=[tenant_a.slug]))
    assert page.status_code == 200
    html = page.content.decode()
    assert html.index(running.public_id) < html.index(done.public_id)  # newest first
    assert '<progress max="4" value="4">100%</progress> <span class="progress">4 of 4</span> (1 failed)' in html
    assert '<progress max="8" value="2">25%</progress> <span class="progress">2 of 8</span>' in html
    assert "m-batch" in html and "In progress" in html and 'aria-current="page">Batches<' in html
    for file in (done.input_file, done.output_file, running.input_file):
        assert reverse("dashboard:file", args=[tenant_a.slug, file.public_id]) in html


def test_no_batches_says_so(tenant_a, member_factory):
    page = login(member_factory(tenant_a)).get(reverse("dashboard:batches", args=[tenant_a.slug]))
    assert page.status_code == 200 and b"No batches yet" in page.content


def test_pages_of_batches(tenant_a, member_factory):
    start = timezone.now() - timedelta(days=1)
    made = [batch_make(tenant_a, created_at=start + timedelta(minutes=n)) for n in range(PAGE_SIZE + 1)]
    client = login(member_factory(tenant_a))
    first = client.get(reverse("dashboard:batches", args=[tenant_a.slug])).content.decode()
    second = client.get(reverse("dashboard:batches", args=[tenant_a.slug]), {"page": "2"}).content.decode()
    assert made[-1].public_id in first and made[0].public_id not in first and 'rel="next"' in first
    assert made[0].public_id in second and made[1].public_id not in second and 'rel="prev"' in second
    not_a_page = client.get(reverse("dashboard:batches", args=[tenant_a.slug]), {"page": "²"})
    assert not_a_page.status_code == 200 and made[-1].public_id.encode() in not_a_page.content


def test_download_gives_the_exact_bytes_as_an_attachment(tenant_a, member_factory):
    batch = batch_make(tenant_a, output=OUTPUT, status=Batch.Status.COMPLETED)
    response = login(member_factory(tenant_a, "viewer")).get(
        reverse("dashboard:file", args=[tenant_a.slug, batch.output_file.public_id]))
    assert response.status_code == 200 and streamed(response) == OUTPUT
    assert response["Content-Length"] == str(len(OUTPUT)) and response["Content-Type"] == "application/octet-stream"
    assert response["Content-Disposition"] == 'attachment; filename="batch_output.jsonl"'


def test_another_tenants_member_gets_404s(tenant_a, tenant_factory, member_factory):
    batch = batch_make(tenant_a, output=OUTPUT)
    other = tenant_factory(slug="tenant-b")
    client = login(member_factory(other))
    assert client.get(reverse("dashboard:batches", args=[tenant_a.slug])).status_code == 404
    own_page = client.get(reverse("dashboard:batches", args=[other.slug]))
    assert own_page.status_code == 200 and batch.public_id.encode() not in own_page.content
    for slug in (tenant_a.slug, other.slug):  # A's file under A's slug, and under the member's own
        assert client.get(reverse("dashboard:file", args=[slug, batch.output_file.public_id])).status_code == 404
    assert Client().get(reverse("dashboard:file", args=[tenant_a.slug, batch.input_file.public_id])).status_code == 302


def test_a_deleted_file_is_a_404_and_no_link(tenant_a, member_factory, django_capture_on_commit_callbacks):
    batch = batch_make(tenant_a, output=OUTPUT)
    with django_capture_on_commit_callbacks(execute=True):
        assert file_delete(file=batch.output_file)
    client = login(member_factory(tenant_a))
    url = reverse("dashboard:file", args=[tenant_a.slug, batch.output_file.public_id])
    assert client.get(url).status_code == 404
    page = client.get(reverse("dashboard:batches", args=[tenant_a.slug])).content.decode()
    assert url not in page and "output (deleted)" in page
    assert reverse("dashboard:file", args=[tenant_a.slug, batch.input_file.public_id]) in page


def _queue_rows(html: str) -> dict[str, tuple[str, str]]:
    """The batch-queue table's rows: model -> (enqueued tokens, limit)."""
    import re

    table = html[html.index('<table id="batch-queue">'):]
    table = table[:table.index("</table>")]
    rows = re.findall(r'<tr><th scope="row">([^<]+)</th><td>([^<]+)</td><td[^>]*>([^<]+)</td></tr>', table)
    return {model: (held, limit) for model, held, limit in rows}


def test_the_batch_queue_shows_what_unfinished_batches_hold_against_the_limit(tenant_a, tenant_factory,
                                                                               member_factory):
    """OpenAI's enqueued-token limit as batches.services.queue_limit enforces it: the tier's for every model,
    a per-model row's where the tier sets one; held by in_progress, finalizing and cancelling batches only."""
    from tenants.models import TierModelLimit

    tier = tenant_a.tier
    tier.batch_queue_tokens = 2_000_000
    tier.save(update_fields=["batch_queue_tokens"])
    TierModelLimit.objects.create(tier=tier, model_name="m-own", batch_queue_tokens=50_000)
    for status, tokens in ((Batch.Status.IN_PROGRESS, 1200), (Batch.Status.CANCELLING, 300),
                           (Batch.Status.COMPLETED, 9999), (Batch.Status.VALIDATING, 7777)):
        batch_make(tenant_a, model="m-batch", status=status, input_tokens=tokens)
    batch_make(tenant_factory(slug="tenant-b", tier=tier), model="m-own", status=Batch.Status.IN_PROGRESS,
               input_tokens=4000)  # another tenant's queue is its own
    html = login(member_factory(tenant_a, "viewer")).get(reverse("dashboard:batches", args=[tenant_a.slug])).content
    assert _queue_rows(html.decode()) == {"m-batch": ("1500", "2000000"), "m-own": ("0", "50000"),
                                          "every other model": ("0", "2000000")}
