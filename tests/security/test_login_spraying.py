"""Password spraying: one address trying many usernames is locked out (common.login_throttle).

Through the real login forms (the dashboard's `/accounts/login/` and the
admin's), with the address in REMOTE_ADDR as uvicorn sets it. Before the
per-address limit, an address could fail once on each of any number of
usernames and never be slowed (axes counted per username and address only).
"""

import pytest

pytestmark = pytest.mark.django_db

PASSWORD = "right-Passw0rd-for-tests"
SPRAYER = "203.0.113.7"
ELSEWHERE = "198.51.100.9"


@pytest.fixture(autouse=True)
def _fast_hashing(settings):
    settings.PASSWORD_HASHERS = ["django.contrib.auth.hashers.MD5PasswordHasher"]  # many logins per test
    settings.AXES_USERNAMES_PER_ADDRESS = 10


def _login(client, username: str, password: str, *, address: str = SPRAYER, form: str = "/accounts/login/"):
    return client.post(form, {"username": username, "password": password}, REMOTE_ADDR=address)


def test_an_address_failing_on_many_usernames_is_locked_for_every_username(client, django_user_model, settings):
    django_user_model.objects.create_user("victim", "v@example.com", PASSWORD)
    limit = settings.AXES_USERNAMES_PER_ADDRESS
    assert limit < settings.AXES_FAILURE_LIMIT * limit  # one failure per username: the per-pair limit never fires
    for index in range(limit - 1):
        assert _login(client, f"user-{index}", "guess").status_code == 200  # the form again
    assert _login(client, f"user-{limit - 1}", "guess").status_code == 429  # the limit-th username locks
    assert _login(client, "victim", PASSWORD).status_code == 429  # every username, the right password too
    assert _login(client, "victim", PASSWORD, form="/admin/login/?next=/admin/").status_code == 429
    assert _login(client, "victim", PASSWORD, address=ELSEWHERE).status_code == 302  # other addresses are not


def test_fewer_usernames_than_the_limit_are_not_locked(client, django_user_model, settings):
    django_user_model.objects.create_user("victim", "v@example.com", PASSWORD)
    for index in range(settings.AXES_USERNAMES_PER_ADDRESS - 1):
        assert _login(client, f"user-{index}", "guess").status_code == 200
    assert _login(client, "victim", PASSWORD).status_code == 302


def test_a_success_of_its_own_account_does_not_reset_the_address(client, django_user_model, settings):
    """A sprayer with a valid account of its own cannot clear its count by logging in between rounds."""
    django_user_model.objects.create_user("mallory", "m@example.com", PASSWORD)
    limit = settings.AXES_USERNAMES_PER_ADDRESS
    for index in range(limit - 1):
        assert _login(client, f"user-{index}", "guess").status_code == 200
    assert _login(client, "mallory", PASSWORD).status_code == 302
    client.logout()
    assert _login(client, "another-user", "guess").status_code == 429


def test_zero_turns_the_address_limit_off(client, django_user_model, settings):
    settings.AXES_USERNAMES_PER_ADDRESS = 0
    django_user_model.objects.create_user("victim", "v@example.com", PASSWORD)
    for index in range(25):
        assert _login(client, f"user-{index}", "guess").status_code == 200
    assert _login(client, "victim", PASSWORD).status_code == 302
