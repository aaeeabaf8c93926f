"""Small HTTP views: health checks, Prometheus metrics and the model list (OpenAI `GET /v1/models`)."""

from __future__ import annotations

import logging

from django.conf import settings
from django.db import DatabaseError, connection
from django.http import HttpResponse, JsonResponse
from django.utils.crypto import constant_time_compare
from django.views.decorators.csrf import csrf_exempt
from django.views.decorators.http import require_GET, require_safe
from drf_spectacular.utils import OpenApiResponse, extend_schema
from drf_spectacular.views import SpectacularJSONAPIView
from rest_framework.permissions import AllowAny
from rest_framework.response import Response
from rest_framework.views import APIView

from common.errors import NotFound
from inference.models import ServedModel
from inference.selectors import served_model_get_for_tier, served_model_list_for_tier
from tenants.openapi import ref

logger = logging.getLogger(__name__)


def livez(request):
    """Liveness: 200 while the process answers (restart it when this fails); checks nothing else."""
    return JsonResponse({"status": "ok"})


def readyz(request):
    """Readiness: 200 only when this process can serve a completion now: the database and Redis answer
    and a worker with its model loaded (heartbeat status "serving") serves the default model; else 503
    with what is missing (take it out of the load balancer meanwhile)."""
    from inference.serving import readiness

    checks = readiness(model=settings.DEFAULT_MODEL)
    ready = all(value == "ok" for value in checks.values())
    return JsonResponse({"status": "ok" if ready else "unavailable", **checks}, status=200 if ready else 503)


@csrf_exempt  # another method is a 405, not the CSRF check's 403
@require_safe
def health(request):
    """vLLM's and TGI's probe, which load generators (guidellm) call before a run: 200 with an empty body
    when this process can serve a completion now (what /readyz checks), else 503, also empty."""
    from inference.serving import readiness

    ready = all(value == "ok" for value in readiness(model=settings.DEFAULT_MODEL).values())
    return HttpResponse(status=200 if ready else 503)


def healthz(request):
    """For load balancers: 200 when the process is up and the database answers, else 503."""
    try:
        with connection.cursor() as cursor:
            cursor.execute("SELECT 1")
            cursor.fetchone()
    except DatabaseError as exc:
        logger.warning("health check: database unavailable: %s", exc)
        return JsonResponse({"status": "error", "database": "unavailable"}, status=503)
    return JsonResponse({"status": "ok"})


@require_GET
def metrics(request):
    """Prometheus exposition of this web process (all of them in multiprocess mode: inference.metrics)."""
    from inference.metrics.exposition import metrics_text

    token = settings.METRICS_TOKEN
    if token and not constant_time_compare(request.headers.get("Authorization", ""), f"Bearer {token}"):
        return HttpResponse("metrics need the bearer token\n", status=401, content_type="text/plain")
    body, content_type = metrics_text()
    return HttpResponse(body, content_type=content_type)


def model_payload(model: ServedModel) -> dict:
    """OpenAI's model object, with vLLM's `max_model_len` (the context length: prompt and output tokens)."""
    return {"id": model.name, "object": "model", "created": model.created_unix, "owned_by": model.owned_by,
            "max_model_len": model.context_length}


class ModelListApi(APIView):
    """The enabled models the caller's tier may use."""

    @extend_schema(operation_id="models_list", summary="The models this key's tier may use", responses={200: OpenApiResponse(response=ref("ModelList"))})
    def get(self, request):
        models = served_model_list_for_tier(tier=request.auth.tier)
        return Response({"object": "list", "data": [model_payload(model) for model in models]})


class ModelDetailApi(APIView):
    @extend_schema(summary="One model", responses={200: OpenApiResponse(response=ref("Model"))})
    def get(self, request, model_id: str):
        model = served_model_get_for_tier(tier=request.auth.tier, name=model_id)
        if model is None:
            raise NotFound(f"The model {model_id!r} does not exist or you do not have access to it.", param="model")
        return Response(model_payload(model))


class OpenApiDocument(SpectacularJSONAPIView):
    """GET /v1/openapi.json: the OpenAPI 3.1 document of /v1 (public, no key needed)."""

    authentication_classes = []
    permission_classes = [AllowAny]

    @extend_schema(operation_id="openapi_document", summary="This document", auth=[],
                   responses={200: OpenApiResponse(response={"type": "object", "required": ["openapi", "paths"]})})
    def get(self, request, *args, **kwargs):
        return super().get(request, *args, **kwargs)
