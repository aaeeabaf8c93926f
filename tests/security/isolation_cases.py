"""Tenant-isolation cases, one per URL pattern (tests/security/test_tenant_isolation.py holds every pattern to one).

Each case gets `w` (a `World`: tenants A and B, each with an API key, a
member user, an invoice, a usage record; B also has a model only B's tier may
use) and acts as tenant A on B's objects, asserting A gets 404 (or 403 where
that is the documented answer) and that B's objects are untouched.

How to add a case for a new URL pattern (the test names the uncovered ones):
write a function taking `w`, decorate it with `@case("<route>")` where
<route> is the pattern as the test prints it (the URL configuration's
`str(pattern)` joined from the root, e.g. "v1/keys/<str:key_id>",
"dashboard/keys/<str:key_id>/", or "ws:v1/realtime" for a WebSocket route),
and in it request B's object with A's key (`w.api`, `bearer(w.a.key)`) or A's
session (`w.browser_a`, logged in as A's member). A pattern with no tenant
data at all goes in PUBLIC with the reason instead. /admin/ is staff-only
and checked separately (test_admin_requires_staff).

The WebSocket's frames have a table of their own (FRAME_CASES): every frame
type the consumer dispatches (`RealtimeConsumer.FRAME_HANDLERS`) times every
attack in FRAME_ATTACKS (another tenant's ids, a revoked key, a key without
the `inference` scope). A new frame type fails
test_every_frame_type_has_its_cases until its cases are written here, with
`@frame_case("<type>", "<attack>")`.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass

from billing.models import TenantBudget
from tests.conftest import bearer

PUBLIC: dict[str, str] = {
    "health": "vLLM's health probe (empty body): no tenant data",
    "healthz": "load balancer health check: no tenant data",
    "metrics": "Prometheus metrics: labelled by model and tier, never by tenant or key (METRICS_TOKEN can close it)",
    "livez": "liveness probe: no tenant data",
    "readyz": "readiness probe (database, Redis, a serving worker): no tenant data",
    "v1/openapi.json": "the API's OpenAPI document: no tenant data",
    "accounts/login/": "the dashboard's login form: no tenant data",
    "accounts/logout/": "ends the caller's own session",
    "accounts/password_change/": "changes the caller's own password",
    "accounts/password_change/done/": "a confirmation page: no tenant data",
    "dashboard/assets/plotly.min.js": "the charting library's code, read from the installed package: no tenant data",
    "": "the landing page: the server's name, links and the quick start; a signed-in user is only redirected to "
        "the dashboard, whose own pages have their cases",
    "favicon.ico": "the site's icon: no tenant data",
}
CASES: dict[str, Callable] = {}


def case(route: str):
    def register(func: Callable) -> Callable:
        assert route not in CASES, f"two isolation cases for {route}"
        CASES[route] = func
        return func

    return register


@dataclass
class Side:
    tenant: object
    key: str  # plaintext, all scopes
    api_key: object  # its row
    user: object  # a member of the tenant (Membership.Role.OWNER)
    invoice: object
    usage: object  # B: one UsageRecord (A has none)


@dataclass
class World:
    a: Side
    b: Side
    b_model: str  # a served model only B's tier may use
    api: object  # rest_framework.test.APIClient, no credentials
    browser_a: object  # django.test.Client logged in as A's member


def _error_code(response) -> str | None:
    return json.loads(response.content)["error"]["code"]


def _not_found(response) -> None:
    assert response.status_code == 404, (response.status_code, response.content[:300])


# ---------------------------------------------------------------- models and completions
@case("v1/models")
def models_list(w: World) -> None:
    response = w.api.get("/v1/models", **bearer(w.a.key))
    assert response.status_code == 200
    assert w.b_model not in [model["id"] for model in response.json()["data"]]


@case("v1/models/<path:model_id>")
def model_detail(w: World) -> None:
    _not_found(w.api.get(f"/v1/models/{w.b_model}", **bearer(w.a.key)))


@case("v1/chat/completions")
def chat_with_b_model(w: World) -> None:
    body = {"model": w.b_model, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 1}
    response = w.api.post("/v1/chat/completions", body, format="json", **bearer(w.a.key))
    _not_found(response)
    assert _error_code(response) == "model_not_found"


@case("v1/completions")
def completion_with_b_model(w: World) -> None:
    body = {"model": w.b_model, "prompt": "hi", "max_tokens": 1}
    response = w.api.post("/v1/completions", body, format="json", **bearer(w.a.key))
    _not_found(response)
    assert _error_code(response) == "model_not_found"


# ---------------------------------------------------------------- keys
@case("v1/keys")
def keys_list_and_create(w: World) -> None:
    listed = w.api.get("/v1/keys", **bearer(w.a.key)).json()["data"]
    assert w.b.api_key.public_id not in [key["id"] for key in listed] and listed
    created = w.api.post("/v1/keys", {"name": "made-by-a"}, format="json", **bearer(w.a.key)).json()
    from tenants.models import ApiKey

    assert ApiKey.objects.get(public_id=created["id"]).tenant_id == w.a.tenant.pk


@case("v1/keys/<public_id:key_id>")
def key_detail_and_delete(w: World) -> None:
    for method in ("get", "delete"):
        response = getattr(w.api, method)(f"/v1/keys/{w.b.api_key.public_id}", **bearer(w.a.key))
        _not_found(response)
        assert _error_code(response) == "api_key_not_found"
    w.b.api_key.refresh_from_db()
    assert w.b.api_key.revoked_at is None


@case("v1/keys/<public_id:key_id>/revoke")
def key_revoke(w: World) -> None:
    _not_found(w.api.post(f"/v1/keys/{w.b.api_key.public_id}/revoke", **bearer(w.a.key)))
    w.b.api_key.refresh_from_db()
    assert w.b.api_key.revoked_at is None


# ---------------------------------------------------------------- files and batches (the Batch API)
def _b_file(w: World):
    """A file row of B's (its bytes are never read: A's requests stop at the 404)."""
    from batches.models import StoredFile

    return StoredFile.objects.create(tenant=w.b.tenant, purpose="batch", filename="b.jsonl", bytes=10,
                                     storage_name=f"tenant-{w.b.tenant.pk}/never-written.jsonl")


def _b_batch(w: World):
    from datetime import timedelta

    from django.utils import timezone

    from batches.models import Batch

    return Batch.objects.create(tenant=w.b.tenant, api_key=w.b.api_key, endpoint="/v1/chat/completions",
                                input_file=_b_file(w), status=Batch.Status.IN_PROGRESS,
                                expires_at=timezone.now() + timedelta(hours=24))


@case("v1/files")
def files_list_and_upload(w: World) -> None:
    import tempfile

    from django.conf import settings
    from django.core.files.uploadedfile import SimpleUploadedFile
    from django.test import override_settings

    from batches.models import StoredFile
    from batches.services.files import files_storage

    b_file = _b_file(w)
    listed = w.api.get("/v1/files", **bearer(w.a.key)).json()["data"]
    assert b_file.public_id not in [file["id"] for file in listed]
    assert w.api.get("/v1/files", {"after": b_file.public_id}, **bearer(w.a.key)).status_code == 400
    upload = SimpleUploadedFile("a.jsonl", b"{}\n")
    with tempfile.TemporaryDirectory() as folder, override_settings(STORAGES={**settings.STORAGES, "files": {
            "BACKEND": "django.core.files.storage.FileSystemStorage", "OPTIONS": {"location": folder}}}):
        created = w.api.post("/v1/files", {"purpose": "batch", "file": upload}, **bearer(w.a.key)).json()
        stored = StoredFile.objects.get(public_id=created["id"])
        assert files_storage().exists(stored.storage_name) and stored.tenant_id == w.a.tenant.pk


@case("v1/files/<public_id:file_id>")
def file_detail_and_delete(w: World) -> None:
    b_file = _b_file(w)
    for method in ("get", "delete"):
        response = getattr(w.api, method)(f"/v1/files/{b_file.public_id}", **bearer(w.a.key))
        _not_found(response)
        assert _error_code(response) == "file_not_found"
    b_file.refresh_from_db()
    assert b_file.deleted_at is None


@case("v1/files/<public_id:file_id>/content")
def file_content(w: World) -> None:
    response = w.api.get(f"/v1/files/{_b_file(w).public_id}/content", **bearer(w.a.key))
    _not_found(response)
    assert _error_code(response) == "file_not_found"


@case("v1/batches")
def batches_list_and_create(w: World) -> None:
    from batches.models import Batch

    b_batch = _b_batch(w)
    listed = w.api.get("/v1/batches", **bearer(w.a.key)).json()["data"]
    assert b_batch.public_id not in [batch["id"] for batch in listed]
    assert w.api.get("/v1/batches", {"after": b_batch.public_id}, **bearer(w.a.key)).status_code == 400
    body = {"input_file_id": b_batch.input_file.public_id, "endpoint": "/v1/chat/completions",
            "completion_window": "24h"}
    response = w.api.post("/v1/batches", body, format="json", **bearer(w.a.key))  # B's file as A's input
    _not_found(response)
    assert _error_code(response) == "file_not_found"
    assert Batch.objects.filter(tenant=w.a.tenant).count() == 0


@case("v1/batches/<public_id:batch_id>")
def batch_detail(w: World) -> None:
    response = w.api.get(f"/v1/batches/{_b_batch(w).public_id}", **bearer(w.a.key))
    _not_found(response)
    assert _error_code(response) == "batch_not_found"


@case("v1/batches/<public_id:batch_id>/cancel")
def batch_cancel(w: World) -> None:
    b_batch = _b_batch(w)
    response = w.api.post(f"/v1/batches/{b_batch.public_id}/cancel", **bearer(w.a.key))
    _not_found(response)
    assert _error_code(response) == "batch_not_found"
    b_batch.refresh_from_db()
    assert b_batch.status == "in_progress" and b_batch.cancelling_at is None


# ---------------------------------------------------------------- usage, costs, invoices (API)
def _window(w: World) -> dict:
    start = int(w.b.usage.created_at.timestamp()) // 86400 * 86400
    return {"start_time": start, "end_time": start + 86400}


@case("v1/organization/usage/completions")
def usage_of_b_key(w: World) -> None:
    params = {**_window(w), "api_key_ids": w.b.api_key.public_id, "group_by": "api_key_id"}
    page = w.api.get("/v1/organization/usage/completions", params, **bearer(w.a.key)).json()
    assert [r for bucket in page["data"] for r in bucket["results"]] == []
    everything = w.api.get("/v1/organization/usage/completions", {**_window(w), "group_by": "api_key_id"},
                           **bearer(w.a.key)).json()
    seen = {r["api_key_id"] for bucket in everything["data"] for r in bucket["results"]}
    assert w.b.api_key.public_id not in seen and seen <= {w.a.api_key.public_id}


@case("v1/organization/costs")
def costs_of_a_only(w: World) -> None:
    page = w.api.get("/v1/organization/costs", _window(w), **bearer(w.a.key)).json()
    total = sum(int(r["amount"]["value_decimal"].replace(".", "")) for b in page["data"] for r in b["results"])
    assert total == 0  # A spent nothing; B's usage costs money


@case("v1/invoices")
def invoices_list(w: World) -> None:
    ids = [invoice["id"] for invoice in w.api.get("/v1/invoices", **bearer(w.a.key)).json()["data"]]
    assert ids == [w.a.invoice.public_id]


@case("v1/invoices/<public_id:invoice_id>")
def invoice_detail(w: World) -> None:
    response = w.api.get(f"/v1/invoices/{w.b.invoice.public_id}", **bearer(w.a.key))
    _not_found(response)
    assert _error_code(response) == "invoice_not_found"


# ---------------------------------------------------------------- invoice pages (session)
@case("billing/invoices/<public_id:invoice_id>/")
def invoice_page(w: World) -> None:
    _not_found(w.browser_a.get(f"/billing/invoices/{w.b.invoice.public_id}/"))
    assert w.browser_a.get(f"/billing/invoices/{w.a.invoice.public_id}/").status_code == 200


@case("billing/invoices/<public_id:invoice_id>.csv")
def invoice_csv(w: World) -> None:
    _not_found(w.browser_a.get(f"/billing/invoices/{w.b.invoice.public_id}.csv"))
    assert w.browser_a.get(f"/billing/invoices/{w.a.invoice.public_id}.csv").status_code == 200


# ---------------------------------------------------------------- the tenant dashboard (A's member, B's pages)
def _b_page(w: World, suffix: str) -> None:
    """B's page answers 404 to A's member; A's own page answers 200 (the 404 is isolation, not a broken page)."""
    _not_found(w.browser_a.get(f"/dashboard/{w.b.tenant.slug}/{suffix}"))
    assert w.browser_a.get(f"/dashboard/{w.a.tenant.slug}/{suffix}").status_code == 200


@case("dashboard/")
def dashboard_home(w: World) -> None:
    response = w.browser_a.get("/dashboard/")
    assert response.status_code == 302 and response["Location"] == f"/dashboard/{w.a.tenant.slug}/"


@case("dashboard/<slug:slug>/")
def dashboard_overview(w: World) -> None:
    _b_page(w, "")


@case("dashboard/<slug:slug>/usage/")
def dashboard_usage(w: World) -> None:
    _b_page(w, "usage/")
    # A's usage page filtered by B's key: not one of A's keys, so a form error, never B's figures
    page = w.browser_a.get(f"/dashboard/{w.a.tenant.slug}/usage/", {"key": w.b.api_key.public_id,
                                                                    "start": "2026-09-01", "end": "2026-09-30"})
    assert page.status_code == 200 and b'id="usage-data"' not in page.content


@case("dashboard/<slug:slug>/usage.csv")
def dashboard_usage_csv(w: World) -> None:
    _b_page(w, "usage.csv")


@case("dashboard/<slug:slug>/usage-by-model.csv")
def dashboard_usage_by_model_csv(w: World) -> None:
    _b_page(w, "usage-by-model.csv")
    # A's by-model CSV filtered by B's key: a 400, never B's figures
    response = w.browser_a.get(f"/dashboard/{w.a.tenant.slug}/usage-by-model.csv",
                               {"key": w.b.api_key.public_id, "start": "2026-09-01", "end": "2026-09-30"})
    assert response.status_code == 400 and w.b.usage.model.encode() not in response.content


@case("dashboard/<slug:slug>/keys/")
def dashboard_keys(w: World) -> None:
    from tenants.models import ApiKey

    _b_page(w, "keys/")
    _not_found(w.browser_a.post(f"/dashboard/{w.b.tenant.slug}/keys/", {"name": "planted"}))
    assert not ApiKey.objects.filter(name="planted").exists()


@case("dashboard/<slug:slug>/keys/<public_id:key_id>/revoke/")
def dashboard_key_revoke(w: World) -> None:
    for slug in (w.b.tenant.slug, w.a.tenant.slug):
        _not_found(w.browser_a.post(f"/dashboard/{slug}/keys/{w.b.api_key.public_id}/revoke/"))
    w.b.api_key.refresh_from_db()
    assert w.b.api_key.revoked_at is None


@case("dashboard/<slug:slug>/settings/")
def dashboard_settings(w: World) -> None:
    _b_page(w, "settings/")
    _not_found(w.browser_a.post(f"/dashboard/{w.b.tenant.slug}/settings/", {"monthly_budget_usd": "1"}))
    assert not TenantBudget.objects.filter(tenant=w.b.tenant).exists()  # no budget was set


@case("dashboard/<slug:slug>/settings/alerts/")
def dashboard_budget_alerts(w: World) -> None:
    _not_found(w.browser_a.post(f"/dashboard/{w.b.tenant.slug}/settings/alerts/", {"alert_percents": "1"}))
    assert not TenantBudget.objects.filter(tenant=w.b.tenant).exists()  # no thresholds were set


@case("dashboard/<slug:slug>/invoices/")
def dashboard_invoices(w: World) -> None:
    _b_page(w, "invoices/")
    assert w.b.invoice.number.encode() not in w.browser_a.get(f"/dashboard/{w.a.tenant.slug}/invoices/").content


@case("dashboard/<slug:slug>/invoices/<public_id:invoice_id>/")
def dashboard_invoice(w: World) -> None:
    for slug in (w.b.tenant.slug, w.a.tenant.slug):
        _not_found(w.browser_a.get(f"/dashboard/{slug}/invoices/{w.b.invoice.public_id}/"))
    assert w.browser_a.get(f"/dashboard/{w.a.tenant.slug}/invoices/{w.a.invoice.public_id}/").status_code == 200


@case("dashboard/<slug:slug>/batches/")
def dashboard_batches(w: World) -> None:
    b_batch = _b_batch(w)
    _b_page(w, "batches/")
    assert b_batch.public_id.encode() not in w.browser_a.get(f"/dashboard/{w.a.tenant.slug}/batches/").content


@case("dashboard/<slug:slug>/files/<public_id:file_id>/")
def dashboard_file(w: World) -> None:
    import tempfile

    from django.conf import settings
    from django.test import override_settings

    from batches.services.files import file_content_create

    # B's file has its bytes, so a 404 here is the tenant check, not a missing file
    with tempfile.TemporaryDirectory() as folder, override_settings(STORAGES={**settings.STORAGES, "files": {
            "BACKEND": "django.core.files.storage.FileSystemStorage", "OPTIONS": {"location": folder}}}):
        b_file = file_content_create(tenant=w.b.tenant, purpose="batch", filename="b.jsonl", content=b"{}\n")
        for slug in (w.b.tenant.slug, w.a.tenant.slug):
            _not_found(w.browser_a.get(f"/dashboard/{slug}/files/{b_file.public_id}/"))


# ---------------------------------------------------------------- WebSocket
@case("ws:v1/realtime")
def realtime_socket(w: World) -> None:
    """A's key is A on the socket; a request id is per socket, so B's ids are unknown there."""
    from asgiref.sync import async_to_sync
    from asgiref.testing import ApplicationCommunicator

    from platform_site.asgi import application

    scope = {"type": "websocket", "path": "/v1/realtime", "raw_path": b"/v1/realtime", "query_string": b"",
             "headers": [(b"authorization", f"Bearer {w.a.key}".encode())], "subprotocols": []}

    async def talk():
        socket = ApplicationCommunicator(application, scope)
        await socket.send_input({"type": "websocket.connect"})
        assert (await socket.receive_output(10))["type"] == "websocket.accept"
        hello = json.loads((await socket.receive_output(10))["text"])
        assert hello["type"] == "authenticated" and hello["tenant"] == w.a.tenant.slug
        await socket.send_input({"type": "websocket.receive", "text": json.dumps({"type": "cancel",
                                                                                 "id": w.b.usage.request_id})})
        error = json.loads((await socket.receive_output(10))["text"])
        assert error["type"] == "error" and error["error"]["code"] == "unknown_request"
        await socket.send_input({"type": "websocket.disconnect", "code": 1000})
        await socket.wait(10)

    async_to_sync(talk)()


# ---------------------------------------------------------------- WebSocket frames, one case per (type, attack)
FRAME_ATTACKS = ("other_tenant", "revoked_key", "wrong_scope")
FRAME_CASES: dict[tuple[str, str], Callable] = {}


def frame_case(frame_type: str, attack: str):
    assert attack in FRAME_ATTACKS, attack

    def register(func: Callable) -> Callable:
        assert (frame_type, attack) not in FRAME_CASES, f"two cases for {frame_type} / {attack}"
        FRAME_CASES[(frame_type, attack)] = func
        return func

    return register


class _Socket:
    """/v1/realtime through the project's ASGI application, in this process (the consumer's database reads
    run on other threads: the tests are transactional)."""

    def __init__(self, key: str | None = None) -> None:
        from asgiref.testing import ApplicationCommunicator

        from platform_site.asgi import application

        headers = [(b"authorization", f"Bearer {key}".encode())] if key else []
        scope = {"type": "websocket", "path": "/v1/realtime", "raw_path": b"/v1/realtime", "query_string": b"",
                 "headers": headers, "subprotocols": []}
        self.app = ApplicationCommunicator(application, scope)

    async def open(self) -> None:
        await self.app.send_input({"type": "websocket.connect"})
        assert (await self.app.receive_output(10))["type"] == "websocket.accept"

    async def send(self, frame: dict) -> None:
        await self.app.send_input({"type": "websocket.receive", "text": json.dumps(frame)})

    async def receive(self) -> dict:
        """The next frame, or {"closed": code} when the server closed the socket."""
        message = await self.app.receive_output(10)
        if message["type"] == "websocket.close":
            return {"closed": message.get("code")}
        return json.loads(message["text"])

    async def end(self) -> None:
        await self.app.send_input({"type": "websocket.disconnect", "code": 1000})
        await self.app.wait(10)


def _talk(coroutine_function) -> None:
    from asgiref.sync import async_to_sync

    async_to_sync(coroutine_function)()


async def _authed(w: World, key: str | None = None) -> _Socket:
    socket = _Socket(key or w.a.key)
    await socket.open()
    hello = await socket.receive()
    assert hello["type"] == "authenticated" and hello["tenant"] == w.a.tenant.slug, hello
    return socket


def _behind_the_back(w: World, **changes) -> None:
    """Change A's key in the database with no event (another process's change whose event was lost), then
    let its cached row expire (the cache's TTL, which still bounds this): only the frame's own check is left."""
    from tenants.models import ApiKey
    from tenants.services.api_key_cache import api_key_cache_clear

    ApiKey.objects.filter(pk=w.a.api_key.pk).update(**changes)
    api_key_cache_clear()


def _revoked_behind_the_back(w: World) -> None:
    from django.utils import timezone

    _behind_the_back(w, revoked_at=timezone.now())


def _scope_removed_behind_the_back(w: World) -> None:
    _behind_the_back(w, scopes=["usage:read"])


async def _refused(socket: _Socket, *, code: str, close: int, frame_id: str | None = None) -> None:
    error = await socket.receive()
    assert error["type"] == "error" and error["error"]["code"] == code, error
    assert error.get("id") == frame_id, error
    assert await socket.receive() == {"closed": close}


def _frame_refused_after(w: World, change: Callable, frame: dict, *, code: str, close: int) -> None:
    """A socket of A's, its key changed behind its back, then `frame`: refused with the REST code, closed."""
    from asgiref.sync import sync_to_async

    async def talk():
        socket = await _authed(w)
        await sync_to_async(change)(w)
        await socket.send(frame)
        await _refused(socket, code=code, close=close, frame_id=frame.get("id") if frame["type"] == "request" else None)
        await socket.end()

    _talk(talk)


def _request(model: str, rid: str = "r1") -> dict:
    return {"type": "request", "id": rid, "endpoint": "completions",
            "body": {"model": model, "prompt": "hi", "max_tokens": 1}}


def _scoped_key(w: World, scopes: list[str]) -> str:
    from tenants.services.api_keys import api_key_create

    return api_key_create(tenant=w.a.tenant, name="scoped", scopes=scopes).key


# auth
@frame_case("auth", "other_tenant")
def auth_as_b_on_a_socket(w: World) -> None:
    """An authenticated socket cannot switch to B's key: refused, and it stays A's (B's model unknown)."""
    async def talk():
        socket = await _authed(w)
        await socket.send({"type": "auth", "api_key": w.b.key})
        assert (await socket.receive())["error"]["code"] == "already_authenticated"
        await socket.send(_request(w.b_model))
        refused = await socket.receive()
        assert refused["id"] == "r1" and refused["error"]["code"] == "model_not_found", refused
        await socket.end()

    _talk(talk)


@frame_case("auth", "revoked_key")
def auth_with_a_revoked_key(w: World) -> None:
    """A socket open when A's key is revoked is told and closed at once; a new one cannot authenticate."""
    from asgiref.sync import sync_to_async

    from tenants.services.api_keys import api_key_revoke

    async def talk():
        open_before = await _authed(w)
        await sync_to_async(api_key_revoke)(api_key=w.a.api_key)
        await _refused(open_before, code="invalid_api_key", close=4401)  # no frame needed
        await open_before.end()
        socket = _Socket()
        await socket.open()
        await socket.send({"type": "auth", "api_key": w.a.key})
        await _refused(socket, code="invalid_api_key", close=4401)
        await socket.end()

    _talk(talk)


@frame_case("auth", "wrong_scope")
def auth_without_the_inference_scope(w: World) -> None:
    """The socket serves completions only: a key without `inference` is refused as REST refuses it (403)."""
    key = _scoped_key(w, ["usage:read", "keys:manage"])

    async def talk():
        for header in (False, True):
            socket = _Socket(key if header else None)
            await socket.open()
            if not header:
                await socket.send({"type": "auth", "api_key": key})
            await _refused(socket, code="missing_scope", close=4403)
            await socket.end()

    _talk(talk)


# request
@frame_case("request", "other_tenant")
def request_for_b_model(w: World) -> None:
    async def talk():
        socket = await _authed(w)
        await socket.send(_request(w.b_model, rid=w.b.usage.request_id))
        refused = await socket.receive()
        assert refused["id"] == w.b.usage.request_id and refused["error"]["code"] == "model_not_found", refused
        await socket.end()

    _talk(talk)


@frame_case("request", "revoked_key")
def request_after_revocation(w: World) -> None:
    _frame_refused_after(w, _revoked_behind_the_back, _request("smollm2-135m-instruct"),
                         code="invalid_api_key", close=4401)


@frame_case("request", "wrong_scope")
def request_after_scope_removed(w: World) -> None:
    _frame_refused_after(w, _scope_removed_behind_the_back, _request("smollm2-135m-instruct"),
                         code="missing_scope", close=4403)


# cancel
@frame_case("cancel", "other_tenant")
def cancel_b_request(w: World) -> None:
    """A request id is per socket, so B's ids are unknown on A's."""
    async def talk():
        socket = await _authed(w)
        await socket.send({"type": "cancel", "id": w.b.usage.request_id})
        error = await socket.receive()
        assert error["type"] == "error" and error["error"]["code"] == "unknown_request", error
        await socket.end()

    _talk(talk)


@frame_case("cancel", "revoked_key")
def cancel_after_revocation(w: World) -> None:
    _frame_refused_after(w, _revoked_behind_the_back, {"type": "cancel", "id": "r1"},
                         code="invalid_api_key", close=4401)


@frame_case("cancel", "wrong_scope")
def cancel_after_scope_removed(w: World) -> None:
    _frame_refused_after(w, _scope_removed_behind_the_back, {"type": "cancel", "id": "r1"},
                         code="missing_scope", close=4403)


# ping
@frame_case("ping", "other_tenant")
def ping_naming_b(w: World) -> None:
    """A ping carrying B's ids answers a bare pong: nothing of B's."""
    async def talk():
        socket = await _authed(w)
        await socket.send({"type": "ping", "id": w.b.usage.request_id, "tenant": w.b.tenant.slug})
        assert await socket.receive() == {"type": "pong"}
        await socket.end()

    _talk(talk)


@frame_case("ping", "revoked_key")
def ping_after_revocation(w: World) -> None:
    _frame_refused_after(w, _revoked_behind_the_back, {"type": "ping"}, code="invalid_api_key", close=4401)


@frame_case("ping", "wrong_scope")
def ping_after_scope_removed(w: World) -> None:
    _frame_refused_after(w, _scope_removed_behind_the_back, {"type": "ping"}, code="missing_scope", close=4403)
