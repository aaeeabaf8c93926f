import pytest


@pytest.mark.django_db
def test_unknown_api_path_is_openai_shaped(client):
    response = client.get("/v1/does-not-exist")
    assert response.status_code == 404
    body = response.json()
    assert set(body["error"]) == {"message", "type", "param", "code"}
    assert body["error"]["code"] == "unknown_url"


@pytest.mark.django_db
def test_unknown_html_path_stays_html(client):
    response = client.get("/nowhere", HTTP_ACCEPT="text/html")
    assert response.status_code == 404
    assert "application/json" not in response["Content-Type"]
