"""OpenAPI pieces of the keys API (drf-spectacular): the bearer scheme and the API key objects.

The views return hand-built dicts (tenants.apis.api_key_payload), so their
responses are described here as JSON Schema; `inference.api.openapi` puts
COMPONENTS into the one document served at /v1/openapi.json.
"""

from __future__ import annotations

from drf_spectacular.extensions import OpenApiAuthenticationExtension

from tenants.models import ApiKey

MAX_EXPIRES_AT = 2**37


def ref(name: str) -> dict:
    return {"$ref": f"#/components/schemas/{name}"}


def _unix_or_null(description: str) -> dict:
    return {"type": ["integer", "null"], "description": description}


COMPONENTS = {
    "ApiKey": {
        "type": "object",
        "description": "An API key as the API shows it: never its secret nor the secret's hash.",
        "required": ["id", "object", "name", "prefix", "redacted_value", "scopes", "status", "created_at",
                     "expires_at", "revoked_at", "last_used_at"],
        "properties": {
            "id": {"type": "string", "pattern": "^key_[A-Za-z0-9]+$", "description": "Public id (random)."},
            "object": {"const": "api_key"},
            "name": {"type": "string"},
            "prefix": {"type": "string"},
            "redacted_value": {"type": "string"},
            "scopes": {"type": "array", "items": {"enum": list(ApiKey.ALL_SCOPES)}},
            "status": {"enum": ["active", "revoked", "expired"]},
            "created_at": {"type": "integer"},
            "expires_at": _unix_or_null("Unix seconds; null: never."),
            "revoked_at": _unix_or_null("Unix seconds; null: not revoked."),
            "last_used_at": _unix_or_null("Unix seconds, to the minute; null: never used."),
        },
    },
    "ApiKeyCreated": {
        "allOf": [ref("ApiKey"), {
            "type": "object", "required": ["key"],
            "properties": {"key": {"type": "string", "description": "The secret key, shown this once."}},
        }],
    },
    "ApiKeyList": {
        "type": "object", "required": ["object", "data"],
        "properties": {"object": {"const": "list"}, "data": {"type": "array", "items": ref("ApiKey")}},
    },
    "ApiKeyCreateRequest": {
        "type": "object",
        "required": ["name"],
        "properties": {
            "name": {"type": "string", "minLength": 1, "maxLength": 100},
            "scopes": {"type": "array", "maxItems": 10, "items": {"enum": list(ApiKey.ALL_SCOPES)},
                       "description": "Empty or absent: the creating key's scopes."},
            "expires_at": {"type": ["integer", "null"], "minimum": 0, "maximum": MAX_EXPIRES_AT,
                           "description": "Unix seconds, in the future; null: never."},
        },
    },
}


class ApiKeyAuthenticationScheme(OpenApiAuthenticationExtension):
    target_class = "tenants.auth.ApiKeyAuthentication"
    name = "ApiKey"

    def get_security_definition(self, auto_schema):
        return {"type": "http", "scheme": "bearer", "description": "Authorization: Bearer sk-..."}
