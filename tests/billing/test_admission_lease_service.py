"""The web side of the pre-enqueue lease (billing.services.admission_lease), on the in-process backend, real time.

While `AdmissionLease` is open (the web process enqueuing) the reservation is
renewed past its lease; `aadmission_confirm` (the job is queued) holds it up to
ADMISSION_HOLD_S; one left unrenewed and unconfirmed loses its slot after the
lease and is stale for the sweep, which releases it (no usage record).
"""

from __future__ import annotations

import asyncio
import uuid

import pytest

from billing.counters import get_admission_backend, reset_admission_backend
from billing.counters.base import Actual
from billing.counters.memory import MemoryAdmission
from billing.services.admission_lease import AdmissionLease, aadmission_confirm
from billing.services.admission_reserve import aadmission_reserve
from billing.services.admission_settle import reservations_release_stale
from common.errors import RateLimited

LEASE_S = 1.0  # renewed every third of it: on a loaded 2-core CI machine a 0.1 s renewal tick can slip


@pytest.fixture
def auth(settings, tenant_factory, tier_factory):
    from tenants.services.api_keys import AuthContext

    settings.ADMISSION_LEASE_S = LEASE_S
    reset_admission_backend(MemoryAdmission())
    tier = tier_factory(requests_per_minute=0, tokens_per_minute=0, max_concurrent_requests=1, monthly_token_quota=0)
    tenant = tenant_factory(tier=tier)
    yield AuthContext(tenant=tenant, tier=tier, api_key=None)
    reset_admission_backend()


async def _reserve(auth):
    return await aadmission_reserve(auth=auth, request_id=uuid.uuid4().hex, model="m", prompt_tokens=1, max_tokens=1)


async def _slot_taken(auth) -> bool:
    try:
        admission = await _reserve(auth)
    except RateLimited:
        return True
    get_admission_backend().settle(admission.request_id, Actual())
    return False


async def _renew_then_confirm(auth):
    admission = await _reserve(auth)
    assert admission.leased
    async with AdmissionLease(admission):
        await asyncio.sleep(3 * LEASE_S)  # a slow enqueue: three leases long
        assert await _slot_taken(auth)
    await aadmission_confirm(admission=admission, wait=True)
    await asyncio.sleep(2 * LEASE_S)
    assert await _slot_taken(auth)  # queued: held without renewals
    assert get_admission_backend().stale_reservations() == []


async def _unrenewed(auth):
    admission = await _reserve(auth)
    await asyncio.sleep(1.5 * LEASE_S)  # its process died: nobody renews, nobody confirms
    assert not await _slot_taken(auth)
    assert get_admission_backend().stale_reservations() == [admission.request_id]


@pytest.mark.django_db
def test_a_lease_is_renewed_while_enqueuing_and_held_once_confirmed(auth):
    asyncio.run(_renew_then_confirm(auth))


@pytest.mark.django_db
def test_an_unrenewed_lease_frees_the_slot_and_the_sweep_releases_the_rest(auth):
    asyncio.run(_unrenewed(auth))
    assert reservations_release_stale() == 1
    assert get_admission_backend().held() == (0, 0)
