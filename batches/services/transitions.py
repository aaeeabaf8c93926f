"""A batch's lifecycle, OpenAI's: a state machine whose every move is one conditional UPDATE.

    validating ──▶ in_progress ──▶ finalizing ──▶ completed
        │   │          │   │
        │   │          │   └──▶ expired            (the window ended: lines left are not run, nor billed)
        │   └──▶ failed│                            (the input file's lines refused)
        └──────────────┴──▶ cancelling ──▶ cancelled

`batch_transition` moves a batch only from a state that leads to the target (TRANSITIONS), with
`UPDATE ... WHERE id = %s AND status IN (sources)`: of two processes moving one batch (two cancels, a cancel
and the validation), the database lets one UPDATE match and the other match nothing, on PostgreSQL (the
second waits for the first's row lock, then sees the new status) and on SQLite (one writer at a time). The
caller learns which it was from the return value; the state's timestamp is set in the same statement.
"""

from __future__ import annotations

from django.utils import timezone

from batches.models import Batch

S = Batch.Status
TRANSITIONS: dict[str, frozenset[str]] = {
    S.VALIDATING: frozenset({S.IN_PROGRESS, S.FAILED, S.CANCELLING}),
    S.IN_PROGRESS: frozenset({S.FINALIZING, S.EXPIRED, S.CANCELLING}),
    S.FINALIZING: frozenset({S.COMPLETED}),
    S.CANCELLING: frozenset({S.CANCELLED}),
}
TERMINAL = frozenset({S.COMPLETED, S.FAILED, S.EXPIRED, S.CANCELLED})
TIMESTAMPS = {S.IN_PROGRESS: "in_progress_at", S.FINALIZING: "finalizing_at", S.COMPLETED: "completed_at",
              S.FAILED: "failed_at", S.EXPIRED: "expired_at", S.CANCELLING: "cancelling_at",
              S.CANCELLED: "cancelled_at"}


def _now():
    return timezone.now()


def sources_of(target: str) -> list[str]:
    """The states a batch may move to `target` from."""
    return sorted(source for source, targets in TRANSITIONS.items() if target in targets)


def batch_transition(*, batch: Batch, to: str, **fields) -> bool:
    """Move `batch` to `to` if its stored state allows it; True when this call moved it (then `batch` holds
    the new state, timestamp and `fields`), False when another process had moved it first."""
    if to not in TIMESTAMPS:
        raise ValueError(f"no transition leads to {to!r}")
    changes = {"status": to, TIMESTAMPS[to]: _now(), **fields}
    moved = Batch.objects.filter(pk=batch.pk, status__in=sources_of(to)).update(**changes)
    if moved:
        for name, value in changes.items():
            setattr(batch, name, value)
    return bool(moved)
