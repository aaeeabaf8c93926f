"""Every route that takes an id or a slug answers a hostile one with a 4xx, never a 500, generated from the URLconf.

For each pattern with a parameter (a new route is swept as soon as it is
added), each parameter gets each value of HOSTILE (one at a time, the other
parameters set to the caller's own tenant and objects, so the request gets as
far as the id's own handling), as an API key with every scope and as the
tenant's owner logged in. A 404 under /v1 is in the OpenAI error shape.
Before the id converters (common.converters), `/v1/invoices/²` was a 500
("²" passes `isdigit()`, not `int()`), and an integer id past 2**63 one on
the dashboard's invoice page.
"""

from __future__ import annotations

import re
from urllib.parse import quote

import pytest
from django.test import Client
from django.urls import URLPattern, URLResolver, get_resolver

from tests.conftest import bearer

HOSTILE = [
    "²", "١٢٣", "9" * 25, str(2**63), "-1", "0x10", "1.5", " 1", "key_²", "inv_²", "\x00", "a" * 300,
    "..", "%2e%2e", "é", "key_" + "A" * 200,
]
PARAM = re.compile(r"<(?:(?P<converter>[^>:]+):)?(?P<name>[^>]+)>")


def _routes(patterns, prefix: str = ""):
    for entry in patterns:
        if isinstance(entry, URLResolver):
            yield from _routes(entry.url_patterns, prefix + str(entry.pattern))
        elif isinstance(entry, URLPattern):
            yield prefix + str(entry.pattern)


def routes_with_parameters() -> list[str]:
    return sorted(route for route in set(_routes(get_resolver().url_patterns))
                  if PARAM.search(route) and not route.startswith("admin/") and not route.startswith("^"))


@pytest.fixture
def own(db, tenant_factory, api_key_factory, member_factory, served_model):
    """The caller's own tenant, key (every scope) and owner login: the values a parameter has when not attacked."""
    tenant = tenant_factory(slug="own-tenant")
    new = api_key_factory(tenant=tenant)
    owner = Client(raise_request_exception=False)
    owner.force_login(member_factory(tenant, "owner"))
    return {"tenant": tenant, "key": new.key, "key_id": new.api_key.public_id, "owner": owner}


@pytest.fixture
def member_factory(db):
    from tenants.services.tenants import user_create_member

    made = iter(range(1, 10_000))

    def make(tenant, role: str = "member"):
        return user_create_member(tenant=tenant, username=f"hostile-{next(made)}", role=role,
                                  password="pw-dashboard-1-long")

    return make


def _fill(route: str, attacked: str, value: str, own: dict) -> str:
    defaults = {"slug": own["tenant"].slug, "key_id": own["key_id"], "model_id": "smollm2-135m-instruct"}

    def one(match):
        name = match.group("name")
        return quote(value if name == attacked else defaults.get(name, "1"), safe="")

    return "/" + PARAM.sub(one, route)


def test_the_sweep_covers_the_id_routes():
    routes = routes_with_parameters()
    for expected in ("v1/keys/<public_id:key_id>", "dashboard/<slug:slug>/keys/<public_id:key_id>/revoke/"):
        assert expected in routes
    assert any(route.startswith("v1/invoices/<") for route in routes)
    assert any(route.startswith("dashboard/<slug:slug>/invoices/<") for route in routes)


@pytest.mark.parametrize("route", routes_with_parameters())
def test_a_hostile_parameter_is_a_4xx(route, own):
    api = Client(raise_request_exception=False)
    for match in PARAM.finditer(route):
        for value in HOSTILE:
            path = _fill(route, match.group("name"), value, own)
            for client, kwargs in ((api, bearer(own["key"])), (own["owner"], {})):
                response = client.get(path, **kwargs)
                assert response.status_code < 500, (path, response.status_code)
                if path.startswith("/v1/") and response.status_code == 404:
                    error = response.json()["error"]
                    assert set(error) == {"message", "type", "param", "code"}, (path, error)


def test_the_converters_refuse_what_a_column_cannot_hold():
    from common.converters import PublicIdConverter, RowIdConverter

    row, public = re.compile(RowIdConverter.regex), re.compile(PublicIdConverter.regex)
    for refused in ("²", "١٢", "-1", "1.5", " 1", "9" * 20):
        assert not row.fullmatch(refused)
    for text in (str(2**63 - 1), "1", "0"):
        assert RowIdConverter().to_python(text) == int(text)
    for too_big in (str(2**63), "9" * 19):  # digits the pattern takes, a value no 64-bit column holds
        with pytest.raises(ValueError):
            RowIdConverter().to_python(too_big)
    assert public.fullmatch("key_AbC123xyz") and public.fullmatch("inv_" + "a" * 20)
    for refused in ("key_²", "key é", "a" * 65, "", "x/y"):
        assert not public.fullmatch(refused)
