"""Fixtures of the API tests that drive the ASGI application in-process (tests/inference/conftest.py offers
them to that folder; other folders import them)."""

from __future__ import annotations

import httpx
import pytest
from asgiref.sync import sync_to_async


@pytest.fixture
async def asgi_client():
    """An httpx client on the project's ASGI application (no socket)."""
    from django.db import connections

    from platform_site.asgi import application

    async with httpx.AsyncClient(transport=httpx.ASGITransport(app=application), base_url="http://testserver") as client:
        yield client
    # ORM calls made off the event loop (sync_to_async) keep a connection in asgiref's
    # worker thread; close it there, or PostgreSQL refuses to drop the test database.
    await sync_to_async(connections.close_all)()


@pytest.fixture
def key(api_key_factory, tenant_factory, tier_factory, served_model):
    """The plaintext key of a new tenant whose tier allows every model, 256 output tokens, 2048 of context."""
    from inference.api.model_access import model_cache_clear

    model_cache_clear()
    tier = tier_factory(allowed_models=["*"], max_output_tokens=256, max_context=2048)
    return api_key_factory(tenant=tenant_factory(tier=tier)).key
