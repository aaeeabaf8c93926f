"""API keys, passwords and secrets never appear in the logs of a full run.

Against the hostile-test server (DEBUG logging, uvicorn's access log on, as
deployed): completions with a valid key (whole and streamed), requests with
invalid, revoked and malformed keys, a key in a query string, a key created
through the API (its secret is in the response), WebSocket auth frames with
good and bad keys, admin logins with a wrong and the right password, requests
that fail validation; then the process's whole log is searched for every
secret it was given or handed out. The log must not be empty of the run
either: the access log lines of these requests are there.
"""

from __future__ import annotations

import json

import httpx
import pytest
from websockets.exceptions import ConnectionClosed
from websockets.sync.client import connect

from tests.e2e.processes import MODEL
from tests.security.hostile_server import hostile_server_shared

pytestmark = [pytest.mark.slow]


@pytest.fixture(scope="module")
def server(tmp_path_factory, pytestconfig):
    return hostile_server_shared(tmp_path_factory, pytestconfig)


def _admin_login(server, password: str) -> int:
    with httpx.Client(base_url=server.url, timeout=60) as browser:
        page = browser.get("/admin/login/")
        token = browser.cookies["csrftoken"]
        response = browser.post("/admin/login/?next=/admin/", data={
            "username": "admin", "password": password, "csrfmiddlewaretoken": token, "next": "/admin/"},
            headers={"Referer": f"{server.url}/admin/login/"})
        assert page.status_code == 200
        return response.status_code


def test_a_full_run_logs_no_secret(server):
    good, other = server.keys["pro"], server.keys["free"]
    forged = good[:-6] + "AAAAAA"  # right prefix, wrong secret
    stranger = "sk-abcdefghij-" + "Q" * 43  # well-formed, unknown
    api = httpx.Client(base_url=server.url, timeout=300)
    auth = {"Authorization": f"Bearer {good}"}

    body = {"model": MODEL, "messages": [{"role": "user", "content": "Say hi"}], "max_tokens": 3}
    assert api.post("/v1/chat/completions", json=body, headers=auth).status_code == 200
    with api.stream("POST", "/v1/completions", headers=auth,
                    json={"model": MODEL, "prompt": "Hi", "max_tokens": 3, "stream": True}) as stream:
        assert stream.status_code == 200 and "[DONE]" in "".join(stream.iter_text())
    created = api.post("/v1/keys", json={"name": "to-revoke"}, headers=auth).json()
    new_key = created["key"]
    assert api.post(f"/v1/keys/{created['id']}/revoke", headers=auth).status_code == 200
    for key in (forged, stranger, new_key, "garbage-key", good + "x"):
        assert api.get("/v1/models", headers={"Authorization": f"Bearer {key}"}).status_code in (401, 403)
    assert api.get(f"/v1/models?api_key={good}").status_code == 401  # a key where it does not belong
    assert api.post("/v1/chat/completions", json={"model": MODEL, "messages": "nope"}, headers=auth).status_code == 400
    assert api.post("/v1/keys", content=b"{not json", headers={**auth, "Content-Type": "application/json"}
                    ).status_code == 400
    assert api.get("/v1/does-not-exist", headers={"Authorization": f"Bearer {other}"}).status_code == 404

    with connect(server.ws_url, open_timeout=30) as ws:
        ws.send(json.dumps({"type": "auth", "api_key": good}))
        assert json.loads(ws.recv(timeout=30))["type"] == "authenticated"
    with connect(server.ws_url, open_timeout=30) as ws:
        ws.send(json.dumps({"type": "auth", "api_key": forged}))
        assert json.loads(ws.recv(timeout=30))["type"] == "error"
        with pytest.raises(ConnectionClosed):
            ws.recv(timeout=30)

    wrong_password = "wrong-" + server.secrets["ADMIN_PASSWORD"][::-1]
    assert _admin_login(server, wrong_password) == 200  # the form again, with an error
    assert _admin_login(server, server.secrets["ADMIN_PASSWORD"]) == 302
    api.close()

    log = server.log_text()
    assert '"POST /v1/chat/completions HTTP/1.1" 200' in log and "/v1/models?api_key=" in log  # the run is there
    secrets_ = {
        "valid key": good, "other tenant's key": other, "forged key": forged, "unknown key": stranger,
        "created key": new_key, "wrong admin password": wrong_password, **server.secrets,
    }
    for name in ("valid key", "other tenant's key", "forged key", "unknown key", "created key"):
        secrets_[f"{name} (secret part)"] = secrets_[name].rsplit("-", 1)[1]
    leaked = sorted(name for name, value in secrets_.items() if value in log)
    assert leaked == [], f"secrets in the server's log: {leaked}"
