"""`/v1/batches`: create, list, retrieve, cancel."""

from __future__ import annotations

from drf_spectacular.utils import OpenApiResponse, extend_schema
from rest_framework import serializers
from rest_framework.response import Response

from batches.apis.scoped import InferenceScoped
from batches.models import Batch
from batches.payloads import batch_payload, list_payload
from batches.selectors import batch_get, batches_of, page_after
from batches.services.batches import batch_cancel, batch_create
from common.errors import NotFound
from tenants.openapi import ref

MAX_LIST_LIMIT = 100


def batch_or_404(request, batch_id: str) -> Batch:
    batch = batch_get(tenant=request.auth.tenant, batch_id=batch_id)
    if batch is None:
        raise NotFound(f"No such Batch object: {batch_id}.", param="id", code="batch_not_found")
    return batch


class BatchListCreateApi(InferenceScoped):
    class CreateInput(serializers.Serializer):
        input_file_id = serializers.CharField(max_length=64)
        endpoint = serializers.CharField(max_length=64)
        completion_window = serializers.CharField(max_length=16)
        metadata = serializers.JSONField(required=False, allow_null=True)

    class ListInput(serializers.Serializer):
        limit = serializers.IntegerField(min_value=1, max_value=MAX_LIST_LIMIT, default=20)
        after = serializers.CharField(max_length=64, required=False)

    @extend_schema(operation_id="batches_list", summary="The tenant's batches, newest first",
                   parameters=[ListInput], responses={200: OpenApiResponse(response=ref("BatchList"))})
    def get(self, request):
        query = self.ListInput(data=request.query_params)
        query.is_valid(raise_exception=True)
        tenant = request.auth.tenant
        page = page_after(batches_of(tenant=tenant), tenant=tenant, after=query.validated_data.get("after"),
                          limit=query.validated_data["limit"])
        return Response(list_payload([batch_payload(b) for b in page.items], has_more=page.has_more))

    @extend_schema(operation_id="batches_create", summary="Create a batch from an uploaded JSONL file",
                   request={"application/json": ref("BatchCreateRequest")},
                   responses={200: OpenApiResponse(response=ref("Batch"))})
    def post(self, request):
        body = self.CreateInput(data=request.data)
        body.is_valid(raise_exception=True)
        batch = batch_create(tenant=request.auth.tenant, api_key=request.auth.api_key, **body.validated_data)
        batch.refresh_from_db()  # validated already where tasks run eagerly (the embedded mode)
        return Response(batch_payload(batch))


class BatchDetailApi(InferenceScoped):
    @extend_schema(operation_id="batches_retrieve", summary="One batch",
                   responses={200: OpenApiResponse(response=ref("Batch"))})
    def get(self, request, batch_id: str):
        return Response(batch_payload(batch_or_404(request, batch_id)))


class BatchCancelApi(InferenceScoped):
    @extend_schema(operation_id="batches_cancel", summary="Cancel a batch", request=None,
                   responses={200: OpenApiResponse(response=ref("Batch"))})
    def post(self, request, batch_id: str):
        return Response(batch_payload(batch_cancel(batch=batch_or_404(request, batch_id))))
