"""Tenant isolation, generated from the URL configuration: every pattern has a case, and every case holds.

`test_every_url_pattern_has_an_isolation_case` walks the URL resolver (and
the WebSocket routes) and fails naming each pattern that has neither a case
in tests/security/isolation_cases.py (CASES) nor a reason in PUBLIC: a new
endpoint or page cannot ship without saying how one tenant is kept from
another's data. See that module's docstring for how to add a case.
`test_isolation_case` runs each case: tenant A's key or session on tenant B's
objects gets 404 (or 403), and B's objects stay as they were. The WebSocket's
frames have their own table: `test_every_frame_type_has_its_cases` compares
the consumer's dispatch table with FRAME_CASES (each frame type times each
attack: B's ids, a revoked key, a key without the scope), and
`test_websocket_frame_case` runs them. /admin/ is
staff-only: `test_admin_requires_staff` requests every admin pattern as a
logged-in tenant member (not staff) and expects the admin login page.
"""

from __future__ import annotations

import re
from datetime import datetime, timedelta, timezone

import pytest
from django.urls import URLPattern, URLResolver, get_resolver

from tests.security.isolation_cases import CASES, FRAME_ATTACKS, FRAME_CASES, PUBLIC, Side, World

ADMIN_PREFIX = "admin/"
ADMIN_UNGUARDED = {"admin/login/", "admin/logout/"}  # the way in and out


def _routes(patterns, prefix: str = ""):
    for entry in patterns:
        if isinstance(entry, URLResolver):
            yield from _routes(entry.url_patterns, prefix + str(entry.pattern))
        elif isinstance(entry, URLPattern):
            yield prefix + str(entry.pattern)


def url_routes() -> set[str]:
    """Every HTTP pattern (joined from the root) and every WebSocket route (as `ws:<route>`)."""
    from inference.routing import websocket_urlpatterns

    return set(_routes(get_resolver().url_patterns)) | {f"ws:{route}" for route in _routes(websocket_urlpatterns)}


def test_every_url_pattern_has_an_isolation_case():
    routes = {route for route in url_routes() if not route.startswith(ADMIN_PREFIX)}
    uncovered = sorted(routes - set(CASES) - set(PUBLIC))
    assert not uncovered, (
        "URL patterns without a tenant-isolation case (add one to tests/security/isolation_cases.py, "
        f"see its docstring): {uncovered}")
    stale = sorted(set(CASES) - routes)
    assert not stale, f"isolation cases for patterns that no longer exist: {stale}"


def _side(name: str, tier, django_user_model, *, period: str, start: datetime):
    from billing.models import Invoice, UsageRecord
    from tenants.models import Membership, Tenant
    from tenants.services.api_keys import api_key_create

    tenant = Tenant.objects.create(name=name, slug=f"iso-{name}", tier=tier)
    new = api_key_create(tenant=tenant, name=f"{name}-key")
    user = django_user_model.objects.create_user(username=f"iso-{name}-owner", password="x-unused-Passw0rd")
    Membership.objects.create(user=user, tenant=tenant, role=Membership.Role.OWNER)
    invoice = Invoice.objects.create(tenant=tenant, number=f"INV-ISO-{name}", period=period, timezone="UTC",
                                     period_start=start, period_end=start + timedelta(days=30))
    usage = None
    if name == "b":
        usage = UsageRecord.objects.create(
            request_id=f"iso-{name}-request", tenant=tenant, api_key=new.api_key, model="smollm2-135m-instruct",
            tier=tier.name, prompt_tokens=10, completion_tokens=5, finish_reason="stop",
            created_at=start + timedelta(days=2, hours=3), input_cost_femtos=10**9, output_cost_femtos=10**9,
            cost_femtos=2 * 10**9)
    return Side(tenant=tenant, key=new.key, api_key=new.api_key, user=user, invoice=invoice, usage=usage)


@pytest.fixture
def world(db, tier_factory, served_model, django_user_model, client, settings):
    from inference.models import ServedModel
    from rest_framework.test import APIClient

    settings.PASSWORD_HASHERS = ["django.contrib.auth.hashers.MD5PasswordHasher"]  # the members never log in

    b_model = "b-only-model"
    ServedModel.objects.create(name=b_model, source=served_model.source, context_length=512)
    start = datetime(2026, 9, 1, tzinfo=timezone.utc)
    a = _side("a", tier_factory(allowed_models=[served_model.name]), django_user_model, period="2026-09", start=start)
    b = _side("b", tier_factory(allowed_models=["*"]), django_user_model, period="2026-09", start=start)
    client.force_login(a.user)
    return World(a=a, b=b, b_model=b_model, api=APIClient(), browser_a=client)


@pytest.mark.parametrize("route", sorted(r for r in CASES if not r.startswith("ws:")))
def test_isolation_case(route, world):
    CASES[route](world)


@pytest.mark.django_db(transaction=True)  # the consumer reads the database from other threads
@pytest.mark.parametrize("route", sorted(r for r in CASES if r.startswith("ws:")))
def test_websocket_isolation_case(route, world):
    CASES[route](world)


def test_every_frame_type_has_its_cases():
    from inference.consumers import RealtimeConsumer

    frame_types = set(RealtimeConsumer.FRAME_HANDLERS)
    missing = sorted({(t, attack) for t in frame_types for attack in FRAME_ATTACKS} - set(FRAME_CASES))
    assert not missing, ("WebSocket frame types without their isolation cases (add them to "
                         f"tests/security/isolation_cases.py with @frame_case, see its docstring): {missing}")
    stale = sorted({t for t, _attack in FRAME_CASES} - frame_types)
    assert not stale, f"frame cases for frame types the consumer no longer has: {stale}"


@pytest.mark.django_db(transaction=True)  # the consumer reads the database from other threads
@pytest.mark.parametrize("frame_type,attack", sorted(FRAME_CASES))
def test_websocket_frame_case(frame_type, attack, world):
    FRAME_CASES[(frame_type, attack)](world)


def sample_path(route: str) -> str:
    """A concrete path matching an admin pattern (route converters and the admin's few regexes)."""
    path = re.sub(r"<(?:\w+:)?\w+>", "1", route)
    path = re.sub(r"\(\?P<\w+>([^|)]*)[^)]*\)", r"\1", path)  # a named group: its first alternative
    path = path.replace(r"\d+", "1").replace(".+", "1").replace("^", "").replace("$", "")
    return "/" + path


@pytest.mark.django_db
def test_admin_requires_staff(client, django_user_model, tenant, settings):
    from tenants.models import Membership

    settings.PASSWORD_HASHERS = ["django.contrib.auth.hashers.MD5PasswordHasher"]

    member = django_user_model.objects.create_user(username="not-staff", password="x-unused-Passw0rd")
    Membership.objects.create(user=member, tenant=tenant, role=Membership.Role.OWNER)
    client.force_login(member)
    admin_routes = sorted(r for r in url_routes() if r.startswith(ADMIN_PREFIX) and r not in ADMIN_UNGUARDED)
    assert len(admin_routes) > 20
    refused = []
    for route in admin_routes:
        path = sample_path(route)
        response = client.get(path)
        if not (response.status_code == 302 and response["Location"].startswith("/admin/login/")):
            refused.append((route, path, response.status_code))
    assert refused == [], "admin pages a non-staff session could open"
