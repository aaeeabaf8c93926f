from django.urls import path

from tenants import apis

urlpatterns = [
    path("v1/keys", apis.ApiKeyListCreateApi.as_view(), name="api-keys"),
    path("v1/keys/<str:key_id>", apis.ApiKeyDetailApi.as_view(), name="api-key-detail"),
    path("v1/keys/<str:key_id>/revoke", apis.ApiKeyRevokeApi.as_view(), name="api-key-revoke"),
]
