from django.urls import path

import common.converters  # noqa: F401 - registers <public_id:> and <row_id:>
from tenants import apis

urlpatterns = [
    path("v1/keys", apis.ApiKeyListCreateApi.as_view(), name="api-keys"),
    path("v1/keys/<public_id:key_id>", apis.ApiKeyDetailApi.as_view(), name="api-key-detail"),
    path("v1/keys/<public_id:key_id>/revoke", apis.ApiKeyRevokeApi.as_view(), name="api-key-revoke"),
]
