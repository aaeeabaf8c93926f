"""`create_user` and bootstrap's demo owner: dashboard logins with a role in a tenant."""

from __future__ import annotations

import io
import re

import pytest
from django.contrib.auth import get_user_model
from django.core.management import CommandError, call_command

from tenants.models import Membership


def run(*args, **options) -> str:
    out = io.StringIO()
    call_command(*args, stdout=out, **options)
    return out.getvalue()


def test_create_user_roles(tenant):
    out = run("create_user", "--tenant", tenant.slug, "--role", "viewer", "--username", "vera", "--email", "v@x.org")
    password = re.search(r"password (\S+)", out).group(1)
    user = get_user_model().objects.get(username="vera")
    assert user.check_password(password) and user.email == "v@x.org" and not user.is_staff
    assert Membership.objects.get(user=user, tenant=tenant).role == "viewer"
    out = run("create_user", "--tenant", tenant.slug, "--role", "owner", "--username", "olga",
              "--password", "a-long-owner-password-1")
    assert "a-long-owner-password-1" not in out
    assert get_user_model().objects.get(username="olga").check_password("a-long-owner-password-1")
    with pytest.raises(CommandError, match="already exists"):
        run("create_user", "--tenant", tenant.slug, "--role", "member", "--username", "olga")
    with pytest.raises(CommandError, match="Unknown tenant"):
        run("create_user", "--tenant", "nope", "--role", "member", "--username", "x")
    with pytest.raises(CommandError, match="too short|too common"):
        run("create_user", "--tenant", tenant.slug, "--role", "member", "--username", "y", "--password", "abc")


def test_bootstrap_prints_the_demo_owners_login(db):
    out = run("bootstrap", admin_password="a-long-admin-password-1")
    match = re.search(r"Dashboard: \S+/dashboard/  user (\S+)  password (\S+)", out)
    user = get_user_model().objects.get(username=match.group(1))
    assert user.check_password(match.group(2)) and not user.is_staff
    assert Membership.objects.get(user=user, tenant__slug="demo").role == "owner"
    again = run("bootstrap")
    assert match.group(2) not in again and "password unchanged" in again
