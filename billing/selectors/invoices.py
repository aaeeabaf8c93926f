"""Invoice reads: the invoices a tenant, a user or a key may see."""

from __future__ import annotations

from django.db.models import QuerySet

from billing.models import Invoice
from tenants.models import Membership, Tenant


def invoices_of(*, tenant: Tenant) -> QuerySet[Invoice]:
    return Invoice.objects.filter(tenant=tenant).order_by("-period_start", "kind", "number")


def invoice_for_user(*, user, public_id: str) -> Invoice | None:
    """The invoice (by its public id) if `user` is staff or a member of its tenant, else None (never says which)."""
    invoice = Invoice.objects.select_related("tenant").filter(public_id=public_id).first()
    if invoice is None or not user.is_authenticated:
        return None
    if user.is_staff or Membership.objects.filter(user=user, tenant=invoice.tenant_id).exists():
        return invoice
    return None
