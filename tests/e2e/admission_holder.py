"""A web process stopped between admission and the queue, for tests/e2e/test_admission_lease.py.

    python -m tests.e2e.admission_holder TENANT_SLUG

Does what `inference.api.services.ajob_submit` does up to the enqueue, with the
real services on the real stores (settings from the environment: DATABASE_URL,
REDIS_URL, ADMISSION_LEASE_S): loads the tenant, admits one request
(`aadmission_reserve`) and holds it under `AdmissionLease`, as the web process
does while it enqueues; then prints `held <request id>` and stays there until
the test kills it.
"""

from __future__ import annotations

import asyncio
import os
import sys
import uuid


async def _hold(slug: str) -> None:
    from asgiref.sync import sync_to_async

    from billing.services.admission_lease import AdmissionLease
    from billing.services.admission_reserve import aadmission_reserve
    from tenants.models import Tenant
    from tenants.services.api_keys import AuthContext

    tenant = await sync_to_async(Tenant.objects.select_related("tier").get)(slug=slug)
    auth = AuthContext(tenant=tenant, tier=tenant.tier, api_key=None)
    admission = await aadmission_reserve(auth=auth, request_id=uuid.uuid4().hex, model="smollm2-135m-instruct",
                                         prompt_tokens=10, max_tokens=10)
    async with AdmissionLease(admission):
        print(f"held {admission.request_id}", flush=True)
        await asyncio.Event().wait()


def main() -> None:
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "platform_site.settings")
    import django

    django.setup()
    asyncio.run(_hold(sys.argv[1]))


if __name__ == "__main__":
    main()
