"""Operators see tenants' files, batches and lines in the admin, read-only."""

from __future__ import annotations

import pytest

from batches.models import Batch, BatchLine, StoredFile
from tests.batches.conftest import chat_line

pytestmark = pytest.mark.django_db


@pytest.fixture
def staff_client(client, django_user_model):
    client.force_login(django_user_model.objects.create_superuser("ops", "ops@example.com", "x-unused-Passw0rd"))
    return client


def test_operators_read_files_batches_and_lines(staff_client, input_file, create_batch):
    create_batch(input_file([chat_line("a"), chat_line("b")]))
    rows = {"storedfile": StoredFile.objects.get(), "batch": Batch.objects.get(), "batchline": BatchLine.objects.first()}
    for name, row in rows.items():
        listing = staff_client.get(f"/admin/batches/{name}/")
        assert listing.status_code == 200, name
        page = staff_client.get(f"/admin/batches/{name}/{row.pk}/change/")
        assert page.status_code == 200 and b'name="_save"' not in page.content, name  # read-only
        assert staff_client.get(f"/admin/batches/{name}/add/").status_code == 403
        assert staff_client.post(f"/admin/batches/{name}/{row.pk}/delete/").status_code == 403
    assert Batch.objects.get().public_id.encode() in staff_client.get("/admin/batches/batch/").content
