"""DRF authentication for `Authorization: Bearer <api key>` (contract section 5).

Every API endpoint needs a key, so a missing header is a 401 too (DRF's usual
"return None and let another authenticator try" would turn into an anonymous
request here). Errors are `common.errors.ApiError`s: the project's DRF
exception handler renders them in the OpenAI shape, with `WWW-Authenticate`.
Async code (SSE views, the WebSocket consumer) calls
`tenants.services.api_keys.aapi_key_authenticate` directly.
"""

from __future__ import annotations

from dataclasses import dataclass

from axes.backends import AxesStandaloneBackend
from rest_framework.authentication import BaseAuthentication
from rest_framework.permissions import BasePermission

from tenants.models import ApiKey, Tenant
from tenants.services.api_keys import AuthContext, api_key_authenticate, api_key_require_scope

__all__ = ["ApiKeyAuthentication", "ApiPrincipal", "AuthContext", "HasTenant", "HasScope", "LoginThrottleBackend"]


@dataclass(frozen=True, eq=False)
class ApiPrincipal:
    """request.user for API requests: the tenant acting through one key (not a Django user)."""

    tenant: Tenant
    api_key: ApiKey

    is_authenticated = True
    is_anonymous = False
    is_active = True
    is_staff = False
    is_superuser = False

    @property
    def pk(self) -> int:
        return self.api_key.pk

    def __str__(self) -> str:
        return f"{self.tenant.slug}:{self.api_key.prefix}"


class ApiKeyAuthentication(BaseAuthentication):
    def authenticate(self, request):
        authorization = request.META.get("HTTP_AUTHORIZATION")
        context = api_key_authenticate(authorization=authorization)
        return ApiPrincipal(tenant=context.tenant, api_key=context.api_key), context

    def authenticate_header(self, request) -> str:
        return 'Bearer realm="api"'


class HasTenant(BasePermission):
    """The request was authenticated by an API key of an active tenant."""

    def has_permission(self, request, view) -> bool:
        return isinstance(request.auth, AuthContext)


class HasScope(BasePermission):
    """Needs `view.required_scope` (per method: `view.required_scopes = {"POST": ...}`)."""

    def has_permission(self, request, view) -> bool:
        if not isinstance(request.auth, AuthContext):
            return False
        scope = getattr(view, "required_scopes", {}).get(request.method, getattr(view, "required_scope", None))
        if scope:
            api_key_require_scope(api_key=request.auth.api_key, scope=scope)  # 403 in the OpenAI shape
        return True


class LoginThrottleBackend(AxesStandaloneBackend):
    """django-axes' check before the model backend, for logins that come with a request.

    Every login form (the admin's, Django's LoginView) passes the request, so
    each is counted and refused once locked out. A call without one (the test
    client's `login`, a shell) has no address to throttle by; axes' own backend
    raises there, which would break `Client.login`, so this one lets it through.
    """

    def authenticate(self, request, username=None, password=None, **kwargs):
        if request is None:
            return None
        return super().authenticate(request, username=username, password=password, **kwargs)
