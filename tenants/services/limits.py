"""Which limits apply to a request: the tier's defaults, the tenant's overrides, the key's own ceilings.

A tenant's limit is its override when set, else its tier's; 0 means no limit.
A key's limits (empty unless set) apply on top of its tenant's, so a key per
application can have a lower ceiling than the tenant; the stricter wins.
A tier may also limit requests and tokens per minute of one model (tenants.models.TierModelLimit,
`model_limits`): each of its tenants then has that model's own counters, on top of its tenant-wide ones.

A tenant's monthly budget is billing's (billing.models.TenantBudget: the operator's cap and the
owners' own, the lower of those that are set applies; billing.services.budgets): billing passes it
in (`tenant_limits(budget_micros=)`, `limits_explain(budget_micros=, budget_source=)`), and this
module never imports billing. A key may have its own budget (`ApiKey.monthly_spend_limit_micros`) on top.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import ClassVar, Literal
from urllib.parse import quote, unquote

LIMIT_FIELDS = ("requests_per_minute", "tokens_per_minute", "max_concurrent_requests", "monthly_token_quota",
                "monthly_spend_limit_micros")
TIER_FIELDS = LIMIT_FIELDS[:4]  # the tier has no budget: a budget is the tenant's


@dataclass(frozen=True, slots=True)
class LimitScope:
    """Whose limit: a tenant's, an API key's, or a tenant's for one model (`LimitScope.tenant(pk)`,
    `LimitScope.key(pk)`, `LimitScope.tenant_model(pk, model)`: its tier's per-model limits, `model_limits`).

    Its string form ("t12", "k34", "t12@smollm2-135m-instruct") names it in the admission counters' keys
    (billing.counters.keys), in the budget alerts' task arguments and in the stored counters of live Redis: it is
    built here (`__str__`) and read back here (`parse`), nowhere else, and it never changes (rolling deploys share
    the live counters). A model's name is percent-encoded there (only letters, digits and "_.~-" stay as they
    are), so that no name can hold the keys' ":" separator or a Redis hash tag's braces.
    """

    kind: Literal["tenant", "key", "tenant_model"]
    id: int
    model: str = ""

    TENANT: ClassVar[str] = "tenant"
    KEY: ClassVar[str] = "key"
    TENANT_MODEL: ClassVar[str] = "tenant_model"
    _LETTERS: ClassVar[dict[str, str]] = {"tenant": "t", "key": "k", "tenant_model": "t"}
    _KINDS: ClassVar[dict[str, str]] = {"t": "tenant", "k": "key"}
    _FORM: ClassVar[re.Pattern] = re.compile(r"([tk])(0|[1-9][0-9]*)(?:@([A-Za-z0-9_.~%-]+))?", re.ASCII)

    def __post_init__(self) -> None:
        if self.kind not in self._LETTERS:
            raise ValueError(f"a limit scope is a tenant's, a key's or a tenant's for a model, not {self.kind!r}")
        if type(self.id) is not int or self.id < 0:
            raise ValueError(f"a limit scope's id is a whole number >= 0, not {self.id!r}")
        if not isinstance(self.model, str) or (self.kind == self.TENANT_MODEL) != bool(self.model):
            raise ValueError(f"a model's name goes with a tenant-model scope, and only with it: {self.model!r}")

    @classmethod
    def tenant(cls, pk: int) -> "LimitScope":
        return cls(cls.TENANT, int(pk))

    @classmethod
    def key(cls, pk: int) -> "LimitScope":
        return cls(cls.KEY, int(pk))

    @classmethod
    def tenant_model(cls, pk: int, model: str) -> "LimitScope":
        """The tenant's counters for one model (its tier's TierModelLimit row)."""
        return cls(cls.TENANT_MODEL, int(pk), model)

    @classmethod
    def parse(cls, text: str) -> "LimitScope":
        """The scope `str(scope)` wrote ("t12", "k34", "t12@name"); ValueError for anything else."""
        match = cls._FORM.fullmatch(text) if isinstance(text, str) else None
        if match is None:
            raise ValueError(f"not a limit scope (t<tenant id>, k<key id> or t<tenant id>@<model>): {text!r}")
        letter, number, encoded = match.groups()
        if encoded is None:
            return cls(cls._KINDS[letter], int(number))
        model = unquote(encoded, errors="strict")  # (UnicodeDecodeError is a ValueError)
        if letter != "t" or quote(model, safe="") != encoded:  # one spelling per scope: keys compare as strings
            raise ValueError(f"not a limit scope (a tenant's model, percent-encoded as str writes it): {text!r}")
        return cls.tenant_model(int(number), model)

    @property
    def is_key(self) -> bool:
        return self.kind == self.KEY

    @property
    def is_tenant(self) -> bool:
        return self.kind == self.TENANT

    @property
    def is_tenant_model(self) -> bool:
        return self.kind == self.TENANT_MODEL

    def __str__(self) -> str:
        whose = f"{self._LETTERS[self.kind]}{self.id}"
        return f"{whose}@{quote(self.model, safe='')}" if self.model else whose


@dataclass(frozen=True, slots=True)
class ScopeLimits:
    """One scope's limits (a tenant, a key, or a tenant's for a model); 0 = none."""

    scope: LimitScope
    requests_per_minute: int = 0
    tokens_per_minute: int = 0
    max_concurrent_requests: int = 0
    monthly_token_quota: int = 0
    monthly_spend_limit_micros: int = 0

    @property
    def any(self) -> bool:
        return any(getattr(self, name) for name in LIMIT_FIELDS)


@dataclass(frozen=True, slots=True)
class LimitSource:
    """One limit of a tenant or key as the admin shows it: the values and which one applies."""

    name: str
    tier: int | None
    override: int | None
    effective: int
    source: str  # "tier", "tenant", "operator", "owner", "key" or "none"


def _stricter(*values: int) -> int:
    """The lowest of the limits that are set (> 0); 0 when none is."""
    return min((value for value in values if value > 0), default=0)


def tenant_limits(*, tenant, tier, budget_micros: int = 0) -> ScopeLimits:
    """The tenant's limits: its overrides, else its tier's; `budget_micros` is its budget in force (billing's)."""
    values = {}
    for name in TIER_FIELDS:
        override = getattr(tenant, name, None)
        values[name] = int(override if override is not None else getattr(tier, name) or 0)
    return ScopeLimits(scope=LimitScope.tenant(tenant.pk), monthly_spend_limit_micros=int(budget_micros or 0),
                       **values)


def key_limits(*, api_key) -> ScopeLimits | None:
    """The key's own ceilings, or None when it has none (only its tenant's apply)."""
    if api_key is None or getattr(api_key, "pk", None) is None:
        return None
    values = {name: int(getattr(api_key, name, None) or 0) for name in LIMIT_FIELDS}
    limits = ScopeLimits(scope=LimitScope.key(api_key.pk), **values)
    return limits if limits.any else None


MAX_LINEAGE = 16  # how many creators a key's requests also count against (a chain of keys made by keys)


def key_scopes(*, api_key) -> list[ScopeLimits]:
    """The key's own ceilings, and the same ceilings on the scope of each key in its lineage (the keys that made
    it, `ApiKey.lineage`): a key made by a limited key got copies of its creator's ceilings, and counting its
    requests on the creator's counters too means that a limited key's keys share its limits rather than each
    having as much again. Empty when the key has no ceilings of its own."""
    own = key_limits(api_key=api_key)
    if own is None:
        return []
    values = {name: getattr(own, name) for name in LIMIT_FIELDS}
    lineage = [int(key_id) for key_id in (getattr(api_key, "lineage", None) or [])[:MAX_LINEAGE]]
    return [own, *(ScopeLimits(scope=LimitScope.key(key_id), **values) for key_id in lineage)]


MODEL_LIMIT_FIELDS = ("requests_per_minute", "tokens_per_minute")  # what a TierModelLimit row may set


def model_limits(*, tenant, row) -> ScopeLimits | None:
    """The tier's limits for one model (a TierModelLimit row, or None) as the tenant's own for that model, on
    counters of their own (`LimitScope.tenant_model`), on top of its tenant-wide limits; None when there are none.
    (OpenAI's rate limits are per model; a tenant's overrides stay tenant-wide.)"""
    if row is None:
        return None
    values = {name: int(getattr(row, name, None) or 0) for name in MODEL_LIMIT_FIELDS}
    limits = ScopeLimits(scope=LimitScope.tenant_model(tenant.pk, row.model_name), **values)
    return limits if limits.any else None

def limits_explain(*, tenant, api_key=None, budget_micros: int = 0, budget_source: str = "none") -> list[LimitSource]:
    """Every limit of `tenant` (and `api_key`): tier value, override, the effective one and where it comes from.

    The tenant's budget in force and its source ("operator", "owner" or "none") are billing's: pass them
    (billing.services.budgets.limits_explain_budgeted does)."""
    tier = tenant.tier
    rows = []
    for name in LIMIT_FIELDS:
        tier_value = getattr(tier, name, None) if name in TIER_FIELDS else None
        if name in TIER_FIELDS:
            override = getattr(tenant, name, None)
            tenant_value = int(override if override is not None else tier_value or 0)
            source = "tenant" if override is not None else ("tier" if tier_value else "none")
        else:  # the budget: billing's, passed in
            tenant_value = int(budget_micros or 0)
            override, source = tenant_value or None, (budget_source if tenant_value else "none")
        key_value = getattr(api_key, name, None) if api_key is not None else None
        effective = tenant_value
        if key_value is not None and key_value > 0 and (tenant_value == 0 or key_value < tenant_value):
            effective, source = int(key_value), "key"
        rows.append(LimitSource(name=name, tier=tier_value, override=key_value if api_key is not None else override,
                                effective=effective, source=source if effective else "none"))
    return rows


# Command-line and admin names of the limits -> field names.
LIMIT_OPTIONS = {
    "rpm": "requests_per_minute",
    "tpm": "tokens_per_minute",
    "max-concurrent": "max_concurrent_requests",
    "monthly-token-quota": "monthly_token_quota",
    "monthly-budget-usd": "monthly_spend_limit_micros",
}


def usd_to_micros(value) -> int:
    from decimal import Decimal, InvalidOperation

    try:
        micros = Decimal(str(value)) * 1_000_000
    except InvalidOperation as exc:
        raise ValueError(f"a budget in USD, e.g. 25 or 12.50, not {value!r}") from exc
    if micros < 0 or micros != micros.to_integral_value():
        raise ValueError(f"a budget in USD >= 0 with at most 6 decimal places, not {value!r}")
    return int(micros)


def limits_set(*, tenant, api_key=None, values: dict[str, int], clear: list[str] = ()) -> list[LimitSource]:
    """Set (or clear) limit overrides of a tenant, or of one of its keys; the effective limits after.

    `values` maps field names (LIMIT_FIELDS) to integers >= 0 (0: no limit;
    budgets in micro-dollars). Clearing a tenant's override falls back to its
    tier; clearing a key's leaves only its tenant's. A tenant's budget is
    billing's (billing.services.budgets.limits_set sets it, and calls this for the rest).
    The auth cache drops the row on save, so the next request sees the change.
    """
    target = api_key if api_key is not None else tenant
    fields = LIMIT_FIELDS if api_key is not None else TIER_FIELDS
    changed = [*clear, *values]
    for name in clear:
        if name not in fields:
            raise ValueError(f"unknown limit {name!r}; one of {', '.join(LIMIT_OPTIONS)}")
        if name in values:
            raise ValueError(f"{name} is both set and cleared")
        setattr(target, name, None)
    for name, value in values.items():
        if name not in fields:
            raise ValueError(f"unknown limit {name!r}")
        if value is None or int(value) < 0:
            raise ValueError(f"{name} is a whole number >= 0 (0: no limit)")
        setattr(target, name, int(value))
    if changed:
        target.full_clean()
        target.save(update_fields=changed)  # only these: an admin's change to another column at the same time stays
    return limits_explain(tenant=tenant, api_key=api_key)
