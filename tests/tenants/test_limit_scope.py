"""A limit's scope (tenants.services.limits.LimitScope): one typed value, its string form unchanged.

The string form ("t12", "k34") is in live Redis keys and in the budget alerts' task arguments: it must read
as it did before the type existed, and only LimitScope may write or read it.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from tenants.services.limits import LimitScope, ScopeLimits, key_limits, key_scopes, tenant_limits


def test_the_string_form_is_unchanged():
    assert str(LimitScope.tenant(12)) == "t12"
    assert str(LimitScope.key(34)) == "k34"
    assert str(LimitScope.tenant(0)) == "t0"
    assert f"{LimitScope.key(1234567890123)}" == "k1234567890123"


@pytest.mark.parametrize("scope", [LimitScope.tenant(1), LimitScope.key(1), LimitScope.tenant(987654321),
                                   LimitScope.key(2**40)])
def test_parse_reads_back_what_str_wrote(scope):
    assert LimitScope.parse(str(scope)) == scope
    assert hash(LimitScope.parse(str(scope))) == hash(scope)  # (a cache key: billing.selectors.alerts)


def test_kinds_and_ids():
    tenant, key = LimitScope.parse("t12"), LimitScope.parse("k34")
    assert (tenant.kind, tenant.id, tenant.is_tenant, tenant.is_key) == ("tenant", 12, True, False)
    assert (key.kind, key.id, key.is_tenant, key.is_key) == ("key", 34, False, True)
    assert LimitScope.tenant(3) != LimitScope.key(3)


@pytest.mark.parametrize("junk", ["", "t", "k", "12", "x12", "T12", "K12", "t-1", "t+1", "t 1", " t1", "t1 ", "t1\n",
                                  "t01", "k00", "t1.0", "t1e3", "tk1", "t١٢", "t12:k3", None, 12, b"t12"])
def test_parse_refuses_junk(junk):
    with pytest.raises(ValueError):
        LimitScope.parse(junk)


@pytest.mark.parametrize("kind, id", [("team", 1), ("t", 1), ("tenant", -1), ("key", "1"), ("key", 1.0),
                                      ("tenant", True)])
def test_a_scope_is_a_tenant_or_a_key_with_a_whole_id(kind, id):
    with pytest.raises(ValueError):
        LimitScope(kind, id)


def test_the_limits_carry_typed_scopes():
    class Tier:
        requests_per_minute, tokens_per_minute, max_concurrent_requests, monthly_token_quota = 10, 0, 0, 0

    class Tenant:
        pk, monthly_spend_limit_micros, owner_spend_limit_micros = 7, 0, 0
        requests_per_minute = tokens_per_minute = max_concurrent_requests = monthly_token_quota = None

    class Key:
        pk, lineage = 9, [5, 3]
        requests_per_minute, tokens_per_minute, max_concurrent_requests, monthly_token_quota = 2, None, None, None
        monthly_spend_limit_micros = None

    assert tenant_limits(tenant=Tenant(), tier=Tier()).scope == LimitScope.tenant(7)
    assert key_limits(api_key=Key()).scope == LimitScope.key(9)
    assert [limits.scope for limits in key_scopes(api_key=Key())] == [LimitScope.key(9), LimitScope.key(5),
                                                                      LimitScope.key(3)]
    assert isinstance(ScopeLimits(scope=LimitScope.key(1)).scope, LimitScope)


ROOT = Path(__file__).resolve().parents[2]
PRODUCT = ("billing", "inference", "batches", "tenants", "dashboard", "common", "platform_site", "benchmarks")
# what building or reading a scope's string by hand looks like
BY_HAND = re.compile(r"""f["'][tk]\{|scope\[1:\]|scope\.startswith\(|\.startswith\(["'][tk]["']\)""")


def test_no_code_but_limit_scope_builds_or_reads_the_string_form():
    found = []
    for package in PRODUCT:
        for path in sorted((ROOT / package).rglob("*.py")):
            if "migrations" in path.parts:
                continue
            for number, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1):
                if BY_HAND.search(line):
                    found.append(f"{path.relative_to(ROOT)}:{number}: {line.strip()}")
    assert not found, "build or parse limit scopes with tenants.services.limits.LimitScope:\n" + "\n".join(found)
