"""The base of the Batch API's views: every method needs the key's `inference` scope, as completions do."""

from __future__ import annotations

from rest_framework.views import APIView

from tenants.auth import HasScope
from tenants.models import ApiKey


class InferenceScoped(APIView):
    permission_classes = [HasScope]
    required_scope = ApiKey.SCOPE_INFERENCE
