"""Placeholder; replaced by the API key authentication (issue 2)."""

from rest_framework.permissions import BasePermission


class ApiKeyAuthentication:
    def authenticate(self, request):
        return None


class HasTenant(BasePermission):
    def has_permission(self, request, view):
        return getattr(request, "tenant", None) is not None
