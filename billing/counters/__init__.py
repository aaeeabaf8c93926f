"""The admission counters' backends: rate limits, concurrency, quotas and budgets (base.AdmissionBackend).

    from billing.counters import get_admission_backend
    backend = get_admission_backend()   # Redis when settings.REDIS_URL is set, else in-process

The backends only count. Their keys are built from typed parts in billing.counters.keys, money is in
nano-dollars (billing.counters.units). The policy (which limits apply to a request, the errors) lives in
billing.services.admission_plan and its siblings (admission_reserve, admission_lease, admission_settle).
"""

from __future__ import annotations

import threading

from .base import AdmissionBackend, AdmissionUnavailable

__all__ = ["AdmissionBackend", "AdmissionUnavailable", "get_admission_backend", "reset_admission_backend"]

_backend: AdmissionBackend | None = None
_lock = threading.Lock()


def _build() -> AdmissionBackend:
    from django.conf import settings

    if settings.REDIS_URL:
        from .redis_backend import RedisAdmission

        return RedisAdmission(url=settings.REDIS_URL, prefix=settings.ADMISSION_KEY_PREFIX)
    from .memory import MemoryAdmission

    return MemoryAdmission()


def get_admission_backend() -> AdmissionBackend:
    """The process-wide backend (built on first use, thread-safe)."""
    global _backend
    if _backend is None:
        with _lock:
            if _backend is None:
                _backend = _build()
    return _backend


def reset_admission_backend(backend: AdmissionBackend | None = None) -> None:
    """Forget the singleton (or put `backend` in its place): tests."""
    global _backend
    with _lock:
        _backend = backend
