"""The batch state machine: only the table's moves, each by one conditional UPDATE, so that of two processes
moving one batch exactly one does (two cancels; a cancel racing the validation; two runners claiming)."""

from __future__ import annotations

import pytest

from batches.models import Batch, BatchLine
from batches.services.transitions import S, TERMINAL, TRANSITIONS, batch_transition, sources_of
from tests.batches.conftest import chat_line, postgres_only, race

STATES = list(Batch.Status.values)


@pytest.fixture
def make_batch(input_file, api_key):
    from batches.services.batches import batch_create

    def make(lines: int = 0, status: str = S.VALIDATING) -> Batch:
        batch = batch_create(tenant=api_key.api_key.tenant, api_key=api_key.api_key, input_file_id=input_file(
            [chat_line("a")]), endpoint="/v1/chat/completions", completion_window="24h")
        BatchLine.objects.filter(batch=batch).delete()  # validated already where on_commit runs (transaction=True)
        BatchLine.objects.bulk_create([BatchLine(batch=batch, line_no=n + 1, custom_id=f"c{n}", body="{}")
                                       for n in range(lines)])
        Batch.objects.filter(pk=batch.pk).update(status=status, total=lines)
        batch.refresh_from_db()
        return batch

    return make


@pytest.mark.django_db
@pytest.mark.parametrize("source", STATES)
@pytest.mark.parametrize("target", [s for s in STATES if s != S.VALIDATING])
def test_only_the_tables_moves_happen(make_batch, source, target):
    batch = make_batch(status=source)
    allowed = target in TRANSITIONS.get(source, ())
    assert batch_transition(batch=batch, to=target) is allowed
    batch.refresh_from_db()
    assert batch.status == (target if allowed else source)
    stamp = {"in_progress": "in_progress_at", "cancelling": "cancelling_at"}.get(target, f"{target}_at")
    assert (getattr(batch, stamp) is not None) is allowed


def test_the_table_ends_in_terminal_states():
    assert not TERMINAL & set(TRANSITIONS)
    assert sources_of(S.CANCELLING) == [S.IN_PROGRESS, S.VALIDATING]
    with pytest.raises(ValueError):
        batch_transition(batch=Batch(), to=S.VALIDATING)


@pytest.mark.django_db
def test_a_stale_copy_cannot_move_the_batch_again(make_batch):
    """Two processes read the batch validating; the first cancels it, the second's move matches nothing."""
    first = make_batch()
    second = Batch.objects.get(pk=first.pk)
    assert batch_transition(batch=first, to=S.CANCELLING)
    assert not batch_transition(batch=second, to=S.CANCELLING)
    assert not batch_transition(batch=second, to=S.IN_PROGRESS)  # the validation, finishing late
    assert Batch.objects.get(pk=first.pk).status == S.CANCELLING


@postgres_only
@pytest.mark.django_db(transaction=True)
def test_two_cancels_at_once_move_the_batch_once(make_batch):
    from batches.services.batches import batch_cancel

    batch = make_batch(lines=3, status=S.IN_PROGRESS)
    BatchLine.objects.filter(custom_id="c1").update(status=BatchLine.Status.RUNNING)
    moved = race(8, lambda _: batch_transition(batch=Batch.objects.get(pk=batch.pk), to=S.CANCELLING))
    assert sorted(moved) == [False] * 7 + [True]
    answers = race(4, lambda _: batch_cancel(batch=Batch.objects.get(pk=batch.pk)).status)
    assert answers == [S.CANCELLING] * 4


@postgres_only
@pytest.mark.django_db(transaction=True)
def test_two_runners_never_claim_one_line(make_batch):
    from batches.services.runs import batch_lines_claim

    batch = make_batch(lines=40, status=S.IN_PROGRESS)
    claims = race(4, lambda i: [line.pk for line in batch_lines_claim(batch=batch, runner=f"r{i}", limit=15)])
    taken = [pk for claim in claims for pk in claim]
    assert len(taken) == len(set(taken)) == 40


@postgres_only
@pytest.mark.django_db(transaction=True)
@pytest.mark.parametrize("attempt", range(3))
def test_a_cancel_racing_the_validation_ends_cancelled(input_file, api_key, attempt):
    """Whichever commits first, the batch ends cancelled and no line is left to run."""
    from batches.services.batches import batch_cancel
    from batches.services.validation import batch_validate

    batch = Batch.objects.create(tenant=api_key.api_key.tenant, api_key=api_key.api_key,
                                 endpoint="/v1/chat/completions",
                                 input_file_id=_file_pk(input_file([chat_line(f"c{n}") for n in range(500)])),
                                 expires_at=_in_a_day())

    def work(index: int):
        if index == 0:
            return batch_validate(batch_id=batch.pk).status
        return batch_cancel(batch=Batch.objects.get(pk=batch.pk)).status

    results = race(2, work)
    assert not [r for r in results if isinstance(r, Exception)], results
    batch.refresh_from_db()
    assert batch.status == S.CANCELLED
    assert not BatchLine.objects.filter(batch=batch).exclude(status=BatchLine.Status.CANCELLED).exists()


def _file_pk(file_id: str) -> int:
    from batches.models import StoredFile

    return StoredFile.objects.get(public_id=file_id).pk


def _in_a_day():
    from datetime import timedelta

    from django.utils import timezone

    return timezone.now() + timedelta(days=1)
