"""Key management API for tenants: /v1/keys. A key only ever sees its own tenant's keys.

Every method needs the `keys:manage` scope, reading included: a key's list
names every other key of the tenant (names, prefixes, scopes, last use), which
an inference-only key has no business seeing. Keys with no scopes have all.
"""

from __future__ import annotations

from datetime import datetime, timezone as dt_timezone

from drf_spectacular.utils import OpenApiResponse, extend_schema
from rest_framework import serializers, status
from rest_framework.response import Response
from rest_framework.views import APIView

from common.errors import NotFound
from tenants.auth import HasScope
from tenants.models import ApiKey
from tenants.openapi import ref
from tenants.selectors import api_key_get, api_key_list, api_key_status
from tenants.services.api_keys import api_key_create_for, api_key_revoke


def _unix(value: datetime | None) -> int | None:
    return int(value.timestamp()) if value is not None else None


def api_key_payload(api_key: ApiKey) -> dict:
    """The public view of a key: never the secret or its hash."""
    return {
        "id": api_key.public_id,
        "object": "api_key",
        "name": api_key.name,
        "prefix": api_key.prefix,
        "redacted_value": api_key.redacted,
        "scopes": api_key.scopes or list(ApiKey.ALL_SCOPES),
        "status": api_key_status(api_key=api_key),
        "created_at": _unix(api_key.created_at),
        "expires_at": _unix(api_key.expires_at),
        "revoked_at": _unix(api_key.revoked_at),
        "last_used_at": _unix(api_key.last_used_at),
    }


def _key_or_404(request, key_id: str) -> ApiKey:
    api_key = api_key_get(tenant=request.auth.tenant, key_id=key_id)
    if api_key is None:
        raise NotFound(f"No API key with id {key_id!r}.", param="id", code="api_key_not_found")
    return api_key


class ApiKeyListCreateApi(APIView):
    permission_classes = [HasScope]
    required_scope = ApiKey.SCOPE_KEYS

    class InputSerializer(serializers.Serializer):
        name = serializers.CharField(max_length=100)
        scopes = serializers.ListField(
            child=serializers.ChoiceField(choices=ApiKey.ALL_SCOPES), required=False, max_length=10
        )
        expires_at = serializers.IntegerField(required=False, allow_null=True, min_value=0, max_value=2**37)

    @extend_schema(operation_id="keys_list", summary="The tenant's API keys", responses={200: OpenApiResponse(response=ref("ApiKeyList"))})
    def get(self, request):
        keys = api_key_list(tenant=request.auth.tenant)
        return Response({"object": "list", "data": [api_key_payload(key) for key in keys]})

    @extend_schema(summary="Create an API key (its secret is in this response only)",
                   request={"application/json": ref("ApiKeyCreateRequest")}, responses={201: OpenApiResponse(response=ref("ApiKeyCreated"))})
    def post(self, request):
        serializer = self.InputSerializer(data=request.data)
        serializer.is_valid(raise_exception=True)
        data = serializer.validated_data
        expires_at = None
        if data.get("expires_at") is not None:
            expires_at = datetime.fromtimestamp(data["expires_at"], tz=dt_timezone.utc)
        new = api_key_create_for(
            creator=request.auth.api_key, name=data["name"], scopes=data.get("scopes"), expires_at=expires_at
        )
        return Response({**api_key_payload(new.api_key), "key": new.key}, status=status.HTTP_201_CREATED)


class ApiKeyDetailApi(APIView):
    """GET one key; DELETE revokes it (same as POST .../revoke)."""

    permission_classes = [HasScope]
    required_scope = ApiKey.SCOPE_KEYS

    @extend_schema(summary="One API key", responses={200: OpenApiResponse(response=ref("ApiKey"))})
    def get(self, request, key_id: str):
        return Response(api_key_payload(_key_or_404(request, key_id)))

    @extend_schema(summary="Revoke an API key", responses={200: OpenApiResponse(response=ref("ApiKey"))})
    def delete(self, request, key_id: str):
        api_key = api_key_revoke(api_key=_key_or_404(request, key_id))
        return Response(api_key_payload(api_key))


class ApiKeyRevokeApi(APIView):
    permission_classes = [HasScope]
    required_scope = ApiKey.SCOPE_KEYS

    @extend_schema(summary="Revoke an API key", request=None,
                   responses={200: OpenApiResponse(response=ref("ApiKey"))})
    def post(self, request, key_id: str):
        api_key = api_key_revoke(api_key=_key_or_404(request, key_id))
        return Response(api_key_payload(api_key))

