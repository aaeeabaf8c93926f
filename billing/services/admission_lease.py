"""The pre-enqueue lease: a reservation between admission and the queue (the web side).

Between admission (billing.services.admission_reserve) and the queue a reservation is held on a lease of
ADMISSION_LEASE_S seconds, renewed by the web process (`AdmissionLease`) until the job is queued
(`aadmission_confirm`), then up to ADMISSION_HOLD_S as before: a web process killed in between stops
renewing, its request's concurrency slots are free within ADMISSION_LEASE_S, and the stale sweep
(billing.services.admission_settle.reservations_release_stale) gives back the rest (billing.counters.base).
"""

from __future__ import annotations

import asyncio
import logging

from django.conf import settings

from billing.counters import AdmissionUnavailable, get_admission_backend
from billing.services.admission_reserve import Admission, counters_outage

logger = logging.getLogger(__name__)


class AdmissionLease:
    """The web side of the pre-enqueue lease: renews it every third of ADMISSION_LEASE_S while the request is
    in this process's hands before it is queued (`async with AdmissionLease(admission):` around the enqueue).

    The renewal is a background task that sleeps first: an enqueue takes milliseconds, so normally it never
    renews at all and costs one task. If this process dies, nothing renews: the request's concurrency slots
    are free once the lease runs out, and the stale sweep gives back its quota and budget.
    """

    def __init__(self, admission: Admission | None) -> None:
        self.admission = admission
        self._task = None

    async def __aenter__(self) -> "AdmissionLease":
        if self.admission is not None and self.admission.leased:
            self._task = asyncio.create_task(self._renew(self.admission.request_id))
        return self

    async def __aexit__(self, *exc_info) -> None:
        if self._task is not None:
            self._task.cancel()
            try:
                await self._task
            except asyncio.CancelledError:
                pass

    @staticmethod
    async def _renew(request_id: str) -> None:
        lease_s = float(settings.ADMISSION_LEASE_S)
        backend = get_admission_backend()
        while True:
            await asyncio.sleep(lease_s / 3)
            try:
                if not await backend.aextend([request_id], lease_s):
                    logger.warning("the admission lease of %s ran out before its job was queued", request_id)
                    return
            except AdmissionUnavailable as exc:
                counters_outage.failed(exc)


_confirmations: set = set()  # the confirmations in flight (the event loop keeps only weak references to tasks)


async def aadmission_confirm(*, admission: Admission | None, wait: bool = False) -> None:
    """The request's job is on the queue: end its pre-enqueue lease, hold its reservation up to ADMISSION_HOLD_S
    (the worker or the reaper settles it). Sent to Redis in the background unless `wait`: nothing the client
    waits for depends on it, and it has the lease's seconds to land."""
    if admission is None or not admission.leased:
        return
    admission.leased = False
    if wait or get_admission_backend().in_process:
        await _confirm(admission.request_id)
        return
    task = asyncio.create_task(_confirm(admission.request_id))
    _confirmations.add(task)
    task.add_done_callback(_confirmations.discard)


async def _confirm(request_id: str) -> None:
    backend = get_admission_backend()
    for attempt in range(3):
        try:
            if not await backend.aconfirm(request_id):  # settled already (a request that ended at once), or
                # its lease ran out before the enqueue and the sweep released it: the worker's settlement of
                # it finds nothing, and its usage counts from the next rebuild of the counters
                logger.info("no reservation of %s left to confirm", request_id)
            return
        except AdmissionUnavailable as exc:
            counters_outage.failed(exc)
            await asyncio.sleep(0.2 * (attempt + 1))
