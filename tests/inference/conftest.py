"""The inference tests' shared fixtures."""

from tests.inference.api_fixtures import asgi_client, key  # noqa: F401
