"""No plaintext key, and no unpeppered hash or encoding of one, anywhere in the database."""

import base64
import hashlib
import io
import json
import re

import pytest
from django.contrib.auth import get_user_model
from django.core.management import call_command

from tenants.models import ApiKey
from tests.conftest import bearer
from tests.tenants.dbdump import dump_text

KEY_RE = re.compile(r"sk-[a-z0-9]{10}-[A-Za-z0-9]{43}")


def needles(key: str) -> set[str]:
    secret = key.rsplit("-", 1)[1]
    found = {key, secret, key[3:], secret[:20], secret[-20:-4]}
    for value in (key, secret):
        raw = value.encode()
        for algo in ("md5", "sha1", "sha224", "sha256", "sha384", "sha512", "blake2b", "sha3_256"):
            digest = hashlib.new(algo, raw)
            found |= {digest.hexdigest(), base64.b64encode(digest.digest()).decode().rstrip("=")}
        found |= {base64.b64encode(raw).decode().rstrip("="), base64.urlsafe_b64encode(raw).decode().rstrip("="),
                  raw.hex()}
    return found


@pytest.fixture
def superuser(db):
    return get_user_model().objects.create_superuser("root", "root@example.com", "a-long-test-password-1")


def test_no_key_material_in_any_table(api_client, client, api_key, superuser):
    keys = [api_key.key]

    # 1. the API
    created = api_client.post("/v1/keys", {"name": "via-api"}, format="json", **bearer(api_key.key))
    assert created.status_code == 201
    keys.append(created.json()["key"])

    # 2. the commands
    out = io.StringIO()
    call_command("create_api_key", tenant=api_key.api_key.tenant.slug, name="via-command", json=True, stdout=out)
    keys.append(json.loads(out.getvalue())["key"])
    out = io.StringIO()
    call_command("bootstrap", admin_password="another-long-password-2", stdout=out)
    keys += KEY_RE.findall(out.getvalue())

    # 3. the admin add form (renders the key once in its response)
    client.force_login(superuser)
    response = client.post("/admin/tenants/apikey/add/", {"tenant": api_key.api_key.tenant.pk, "name": "via-admin",
                                                         "scopes": ["inference"]})
    assert response.status_code == 200
    keys += KEY_RE.findall(response.content.decode())
    assert len(set(keys)) == 5 == ApiKey.objects.count()

    # every key works (and touches last_used_at), then a list and a revoke for good measure
    for key in keys:
        assert api_client.get("/v1/models", **bearer(key)).status_code == 200
    api_client.get("/v1/keys", **bearer(keys[0]))
    api_client.post(f"/v1/keys/{ApiKey.objects.get(name='via-api').pk}/revoke", **bearer(keys[0]))

    dump = dump_text()
    lowered = dump.lower()
    assert "sk-" in dump and "via-admin" in dump  # the dump does see the key rows
    for key in keys:
        for needle in needles(key):
            assert needle not in dump and needle.lower() not in lowered, f"key material found in the database: {needle!r}"
    for row in ApiKey.objects.all():
        assert re.fullmatch(r"[0-9a-f]{64}", row.secret_hash)
        assert not any(row.secret_hash == n for key in keys for n in needles(key))


def test_the_check_catches_a_leak(api_key, tenant):
    """Guard against a vacuous test: an unpeppered hash written anywhere is found."""
    secret = api_key.key.rsplit("-", 1)[1]
    tenant.name = "note " + hashlib.sha256(secret.encode()).hexdigest().upper()
    tenant.save()
    lowered = dump_text().lower()
    assert any(needle.lower() in lowered for needle in needles(api_key.key))
