"""The site's front door: `/` for newcomers (its links and the quick start's base URL), where signed-in users
land, the favicon, and the error pages people see (JSON under /v1 as before)."""

from __future__ import annotations

import re
import xml.etree.ElementTree as ElementTree

import pytest
from django.contrib.auth import get_user_model
from django.test import Client, RequestFactory, override_settings

from common.errors import handler404, handler500

pytestmark = pytest.mark.django_db


def links(html: str, container: str) -> list[str]:
    block = re.search(rf'id="{container}"(.*?)</ul>', html, re.S)
    assert block, f"no #{container}"
    return re.findall(r'href="([^"]+)"', block.group(1))


def test_landing_page_says_what_this_is_and_where_to_go(served_model, settings):
    settings.ALLOWED_HOSTS = ["llm.example.test"]
    response = Client().get("/", HTTP_HOST="llm.example.test")
    assert response.status_code == 200
    html = response.content.decode()
    assert "OpenAI-compatible" in html and served_model.name in html
    assert links(html, "landing-links") == ["/dashboard/", "/admin/", "/v1/openapi.json", "/v1/models"]
    # the quick start names this server, as the request reached it
    assert re.search(r'id="base-url">http://llm\.example\.test/v1<', html)
    assert 'base_url="http://llm.example.test/v1"' in html
    assert "curl http://llm.example.test/v1/chat/completions" in html and f'"model": "{served_model.name}"' in html


def test_the_landing_page_names_only_the_models_every_tier_may_use(served_model, tier_factory):
    from inference.models import ServedModel

    private = ServedModel.objects.create(name="acme-private-ft", source=served_model.source, enabled=True)
    tier_factory("public", allowed_models=[served_model.name])
    tier_factory("acme-only", allowed_models=["*"])
    html = Client().get("/").content.decode()
    assert served_model.name in html and private.name not in html


def test_every_landing_link_resolves(served_model):
    client = Client()
    for href in links(client.get("/").content.decode(), "landing-links"):
        response = client.get(href, follow=True)
        if href == "/v1/models":  # the API's own answer without a key
            assert response.status_code == 401 and response.json()["error"]["code"] == "invalid_api_key"
        else:
            assert response.status_code == 200, href


def test_signed_in_users_go_to_their_dashboard(tenant, member_factory):
    member = Client()
    member.force_login(member_factory(tenant, "viewer"))
    response = member.get("/")
    assert response.status_code == 302 and response.url == "/dashboard/"
    staff = Client()
    staff.force_login(get_user_model().objects.create_user("ops-front", password="x-long-password-1", is_staff=True))
    response = staff.get("/")
    assert response.status_code == 302 and response.url == "/admin/"


def test_favicon_is_an_svg():
    response = Client().get("/favicon.ico")
    assert response.status_code == 200 and response["Content-Type"] == "image/svg+xml"
    assert "max-age=86400" in response["Cache-Control"]
    root = ElementTree.fromstring(response.content)
    assert root.tag == "{http://www.w3.org/2000/svg}svg"


def test_pages_name_the_favicon(served_model):
    assert '<link rel="icon" href="/favicon.ico"' in Client().get("/").content.decode()


@override_settings(DEBUG=False)
def test_unknown_page_is_a_styled_404_for_people_and_json_under_v1():
    client = Client()
    page = client.get("/no/such/page/")
    assert page.status_code == 404 and page["Content-Type"].startswith("text/html")
    html = page.content.decode()
    assert 'id="error-404"' in html and "/no/such/page/" in html and '<a href="/">Start page</a>' in html
    assert '<link rel="icon" href="/favicon.ico"' in html
    api = client.get("/v1/no-such-endpoint")
    assert api.status_code == 404 and api.json()["error"]["code"] == "unknown_url"
    wants_json = client.get("/no/such/page/", HTTP_ACCEPT="application/json")
    assert wants_json.status_code == 404 and wants_json.json()["error"]["type"] == "invalid_request_error"


def test_handlers_render_the_styled_pages_and_json_under_v1():
    factory = RequestFactory()
    request = factory.get("/dashboard/nothing/")
    from django.contrib.auth.models import AnonymousUser

    request.user = AnonymousUser()
    not_found = handler404(request, Exception("nothing"))
    assert not_found.status_code == 404 and b'id="error-404"' in not_found.content
    failed = handler500(factory.get("/dashboard/"))
    assert failed.status_code == 500 and b'id="error-500"' in failed.content and b"/favicon.ico" in failed.content
    api = handler500(factory.get("/v1/chat/completions"))
    assert api.status_code == 500 and b'"code": "internal_error"' in api.content


def test_forbidden_is_a_styled_403(tenant, member_factory):
    viewer = Client()
    viewer.force_login(member_factory(tenant, "viewer"))
    response = viewer.post(f"/dashboard/{tenant.slug}/keys/", {"name": "nope"})
    assert response.status_code == 403 and b'id="error-403"' in response.content
