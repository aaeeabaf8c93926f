"""The tenant's Batch API batches, and its files for download with the member's session (the API's
`/v1/files/{id}/content` needs an API key, which a member reading the dashboard may not hold)."""

from __future__ import annotations

from django.contrib.auth.decorators import login_required
from django.http import Http404
from django.shortcuts import render

from batches.downloads import file_download_response
from batches.services.files import file_open
from dashboard.selectors.batches import batch_queues, batches_page, file_get
from dashboard.views.access import membership_or_404


@login_required
def batches(request, slug: str):
    membership = membership_or_404(request, slug)
    page, rows = batches_page(tenant=membership.tenant, number=request.GET.get("page"))
    queue_limit, queues = batch_queues(tenant=membership.tenant)
    return render(request, "dashboard/batches.html", {
        "membership": membership, "tenant": membership.tenant, "page": "batches", "batches_page": page,
        "rows": rows, "queue_limit": queue_limit, "queues": queues,
    })


@login_required
def file_download(request, slug: str, file_id: str):
    """The file's bytes, for a member of its tenant only; another tenant's file and a deleted one are a 404."""
    membership = membership_or_404(request, slug)
    file = file_get(tenant=membership.tenant, file_id=file_id)
    if file is None:
        raise Http404("No such file")
    try:
        handle = file_open(file=file)
    except OSError:  # deleted meanwhile: its bytes go once the deletion is committed
        raise Http404("No such file") from None
    return file_download_response(file, handle)
