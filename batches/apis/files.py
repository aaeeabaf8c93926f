"""`/v1/files`: upload (multipart, as the openai SDK sends it), list, retrieve, content, delete."""

from __future__ import annotations

from drf_spectacular.utils import OpenApiResponse, extend_schema
from rest_framework import serializers
from rest_framework.negotiation import BaseContentNegotiation
from rest_framework.parsers import FormParser, MultiPartParser
from rest_framework.response import Response

from batches.apis.scoped import InferenceScoped
from batches.downloads import file_download_response
from batches.models import StoredFile
from batches.payloads import file_deleted_payload, file_payload, list_payload
from batches.selectors import file_get, files_of, page_after
from batches.services.files import file_create, file_delete, file_open
from common.errors import NotFound
from tenants.openapi import ref

MAX_LIST_LIMIT = 10_000


def file_or_404(request, file_id: str) -> StoredFile:
    file = file_get(tenant=request.auth.tenant, file_id=file_id)
    if file is None:
        raise NotFound(f"No such File object: {file_id}.", param="id", code="file_not_found")
    return file


class FileListCreateApi(InferenceScoped):
    parser_classes = [MultiPartParser, FormParser]

    class ListInput(serializers.Serializer):
        purpose = serializers.ChoiceField(choices=StoredFile.Purpose.values, required=False)
        limit = serializers.IntegerField(min_value=1, max_value=MAX_LIST_LIMIT, default=MAX_LIST_LIMIT)
        after = serializers.CharField(max_length=64, required=False)
        order = serializers.ChoiceField(choices=["asc", "desc"], default="desc")

    @extend_schema(operation_id="files_list", summary="The tenant's files, newest first",
                   parameters=[ListInput], responses={200: OpenApiResponse(response=ref("FileList"))})
    def get(self, request):
        query = self.ListInput(data=request.query_params)
        query.is_valid(raise_exception=True)
        data = query.validated_data
        tenant = request.auth.tenant
        page = page_after(files_of(tenant=tenant, purpose=data.get("purpose")), tenant=tenant,
                          after=data.get("after"), limit=data["limit"], newest_first=data["order"] == "desc")
        return Response(list_payload([file_payload(f) for f in page.items], has_more=page.has_more))

    @extend_schema(operation_id="files_create", summary="Upload a file (a batch's input: JSONL)",
                   request={"multipart/form-data": ref("FileUpload")},
                   responses={200: OpenApiResponse(response=ref("File"))})
    def post(self, request):
        file = file_create(tenant=request.auth.tenant, purpose=request.data.get("purpose"),
                           upload=request.FILES.get("file"))
        return Response(file_payload(file))


class FileDetailApi(InferenceScoped):
    @extend_schema(operation_id="files_retrieve", summary="One file",
                   responses={200: OpenApiResponse(response=ref("File"))})
    def get(self, request, file_id: str):
        return Response(file_payload(file_or_404(request, file_id)))

    @extend_schema(operation_id="files_delete", summary="Delete a file",
                   responses={200: OpenApiResponse(response=ref("FileDeleted"))})
    def delete(self, request, file_id: str):
        file = file_or_404(request, file_id)
        if not file_delete(file=file):  # deleted by another request meanwhile
            raise NotFound(f"No such File object: {file_id}.", param="id", code="file_not_found")
        return Response(file_deleted_payload(file))


class _AnyAccept(BaseContentNegotiation):
    """The bytes go as they are whatever the client accepts (the openai SDK asks for `application/binary`);
    an error is JSON, as everywhere under /v1."""

    def select_parser(self, request, parsers):
        return parsers[0] if parsers else None

    def select_renderer(self, request, renderers, format_suffix=None):
        return renderers[0], renderers[0].media_type


class FileContentApi(InferenceScoped):
    content_negotiation_class = _AnyAccept

    @extend_schema(operation_id="files_content", summary="A file's bytes",
                   responses={(200, "application/octet-stream"): OpenApiResponse(
                       response={"type": "string", "format": "binary"})})
    def get(self, request, file_id: str):
        file = file_or_404(request, file_id)
        try:
            content = file_open(file=file)
        except OSError:  # deleted meanwhile: its bytes go once the deletion is committed
            raise NotFound(f"No such File object: {file_id}.", param="id", code="file_not_found") from None
        return file_download_response(file, content)
