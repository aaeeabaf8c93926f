"""Login attempts are throttled (django-axes): after AXES_FAILURE_LIMIT failures a username is locked out
from that address, even with the right password, while other users still log in."""

import pytest

pytestmark = pytest.mark.django_db


@pytest.fixture(autouse=True)
def _fast_hashing(settings):
    settings.PASSWORD_HASHERS = ["django.contrib.auth.hashers.MD5PasswordHasher"]  # many logins per test

PASSWORD = "right-Passw0rd-for-tests"


def _login(client, username: str, password: str):
    return client.post("/admin/login/?next=/admin/", {"username": username, "password": password, "next": "/admin/"})


def test_repeated_failures_lock_out_the_username(client, django_user_model, settings):
    django_user_model.objects.create_superuser("victim", "v@example.com", PASSWORD)
    django_user_model.objects.create_superuser("bystander", "b@example.com", PASSWORD)
    for _attempt in range(settings.AXES_FAILURE_LIMIT - 1):
        assert _login(client, "victim", "wrong").status_code == 200  # the form again
    assert _login(client, "victim", "wrong").status_code == 429  # the limit-th failure locks
    assert _login(client, "victim", PASSWORD).status_code == 429  # even the right password, now
    assert _login(client, "bystander", PASSWORD).status_code == 302


def test_a_success_resets_the_count(client, django_user_model, settings):
    django_user_model.objects.create_superuser("forgetful", "f@example.com", PASSWORD)
    for _round in range(2):
        for _attempt in range(settings.AXES_FAILURE_LIMIT - 1):
            assert _login(client, "forgetful", "wrong").status_code == 200
        assert _login(client, "forgetful", PASSWORD).status_code == 302
        client.logout()
