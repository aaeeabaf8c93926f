"""Tenants, tiers, memberships and API keys.

Money is integer micro-dollars (1 USD = 1_000_000) everywhere; never floats.
"""

import secrets
import string
import zoneinfo

from django.conf import settings
from django.core.exceptions import ValidationError
from django.core.validators import MinValueValidator
from django.db import models
from django.utils import timezone


def validate_timezone(name: str) -> None:
    """An IANA time zone name that this system's tz database knows ("UTC", "America/Los_Angeles")."""
    try:
        zoneinfo.ZoneInfo(name)
    except (zoneinfo.ZoneInfoNotFoundError, ValueError, TypeError) as exc:
        raise ValidationError(f"{name!r} is not an IANA time zone name (e.g. UTC, Europe/Paris)") from exc


class Tier(models.Model):
    name = models.SlugField(max_length=40, unique=True)
    display_name = models.CharField(max_length=80, blank=True)
    # Engine priority: lower runs first (enterprise 0, pro 1, free 2).
    priority = models.PositiveSmallIntegerField(default=2)
    # Share of worker pulls relative to the other tiers' weights.
    queue_weight = models.PositiveIntegerField(default=1)
    requests_per_minute = models.PositiveIntegerField(default=60)
    tokens_per_minute = models.PositiveIntegerField(default=40_000)
    max_concurrent_requests = models.PositiveIntegerField(default=4)
    max_output_tokens = models.PositiveIntegerField(default=1024)
    max_context = models.PositiveIntegerField(default=8192)
    monthly_token_quota = models.BigIntegerField(default=1_000_000, help_text="0 means unlimited")
    allowed_models = models.JSONField(default=list, blank=True, help_text='Model names; ["*"] allows every enabled model')
    price_multiplier = models.DecimalField(max_digits=6, decimal_places=3, default=1)
    batch_queue_tokens = models.BigIntegerField(
        default=0, validators=[MinValueValidator(0)],
        help_text="Batch API: prompt tokens a tenant may have enqueued per model across its unfinished batches "
                  "(OpenAI's batch queue limit); a per-model limit below replaces it for its model. 0 means unlimited")

    class Meta:
        ordering = ["priority", "name"]

    def __str__(self) -> str:
        return self.name

    def clean(self) -> None:
        models_ = self.allowed_models
        if not isinstance(models_, list) or not all(isinstance(name, str) and name for name in models_):
            raise ValidationError({"allowed_models": 'A list of model names, e.g. ["smollm2-135m-instruct"] or ["*"].'})

    def allows_model(self, model_name: str) -> bool:
        allowed = self.allowed_models if isinstance(self.allowed_models, list) else []
        return "*" in allowed or model_name in allowed


class TierModelLimit(models.Model):
    """A tier's own rate limits for one model (OpenAI's limits are per model): each tenant of the tier gets
    them per model, on counters of their own (tenants.services.limits.model_limits), on top of its tenant-wide
    limits; the stricter binds. A model without a row has only the tenant-wide limits."""

    tier = models.ForeignKey(Tier, on_delete=models.CASCADE, related_name="model_limits")
    model_name = models.CharField(max_length=100, help_text="A served model's name, as requests name it")
    requests_per_minute = models.PositiveIntegerField(null=True, blank=True, validators=[MinValueValidator(1)],
                                                      help_text="Empty: only the tenant-wide limit")
    tokens_per_minute = models.PositiveIntegerField(null=True, blank=True, validators=[MinValueValidator(1)],
                                                    help_text="Empty: only the tenant-wide limit")
    batch_queue_tokens = models.PositiveBigIntegerField(
        null=True, blank=True, validators=[MinValueValidator(1)],
        help_text="Batch API: prompt tokens enqueued for this model across a tenant's unfinished batches. "
                  "Empty: the tier's batch queue limit")

    class Meta:
        ordering = ["model_name"]  # (not by tier: that would join the tiers into the key rows' prefetch)
        constraints = [models.UniqueConstraint(fields=["tier", "model_name"], name="uniq_tier_model_limit")]

    def __str__(self) -> str:
        return f"{self.model_name} (tier {self.tier_id})"

    def clean(self) -> None:
        if not (self.model_name or "").strip() or self.model_name != self.model_name.strip():
            raise ValidationError({"model_name": "A model's name, without surrounding spaces."})
        if self.requests_per_minute is None and self.tokens_per_minute is None:
            raise ValidationError("Set requests per minute, tokens per minute or both (a row with neither limits "
                                  "nothing: delete it).")


class Tenant(models.Model):
    class Status(models.TextChoices):
        ACTIVE = "active", "Active"
        SUSPENDED = "suspended", "Suspended"

    name = models.CharField(max_length=120)
    slug = models.SlugField(max_length=60, unique=True)
    status = models.CharField(max_length=16, choices=Status.choices, default=Status.ACTIVE, db_index=True)
    tier = models.ForeignKey(Tier, on_delete=models.PROTECT, related_name="tenants")
    # Its monthly budgets and budget alert thresholds are billing's (billing.models.TenantBudget).

    # Overrides of the tier's limits for this tenant (empty: the tier's; 0: no limit).
    requests_per_minute = models.PositiveIntegerField(null=True, blank=True, help_text="Empty: the tier's")
    tokens_per_minute = models.PositiveIntegerField(null=True, blank=True, help_text="Empty: the tier's")
    max_concurrent_requests = models.PositiveIntegerField(null=True, blank=True, help_text="Empty: the tier's")
    monthly_token_quota = models.BigIntegerField(null=True, blank=True, help_text="Empty: the tier's; 0 means unlimited")
    # Tenants in the same non-empty group may share prefix-cache blocks (operator decision).
    cache_share_group = models.CharField(max_length=60, blank=True, default="")
    created_at = models.DateTimeField(default=timezone.now)
    # Billing periods (invoices, budgets, quotas, dashboard days) start at local midnight here.
    # (Declared last: the name shadows django.utils.timezone inside this class body.)
    timezone = models.CharField(max_length=64, default="UTC", validators=[validate_timezone],
                                help_text="IANA time zone name, e.g. America/Los_Angeles")

    class Meta:
        ordering = ["name"]

    def __str__(self) -> str:
        return self.slug

    @property
    def is_active(self) -> bool:
        return self.status == self.Status.ACTIVE

    @property
    def zone(self) -> zoneinfo.ZoneInfo:
        return zoneinfo.ZoneInfo(self.timezone)

    @property
    def cache_salt(self) -> str:
        return f"group:{self.cache_share_group}" if self.cache_share_group else f"tenant:{self.pk}"


class Membership(models.Model):
    class Role(models.TextChoices):
        OWNER = "owner", "Owner"
        MEMBER = "member", "Member"
        VIEWER = "viewer", "Viewer"

    user = models.ForeignKey(settings.AUTH_USER_MODEL, on_delete=models.CASCADE, related_name="memberships")
    tenant = models.ForeignKey(Tenant, on_delete=models.CASCADE, related_name="memberships")
    role = models.CharField(max_length=10, choices=Role.choices, default=Role.MEMBER)
    created_at = models.DateTimeField(default=timezone.now)

    class Meta:
        constraints = [models.UniqueConstraint(fields=["user", "tenant"], name="uniq_membership")]

    def __str__(self) -> str:
        return f"{self.user} @ {self.tenant} ({self.role})"

    # What each role may change on the dashboard (a viewer only reads).
    @property
    def can_manage_keys(self) -> bool:
        return self.role in (self.Role.OWNER, self.Role.MEMBER)

    @property
    def can_manage_settings(self) -> bool:
        """The tenant's budget and alert settings: owners only."""
        return self.role == self.Role.OWNER


PUBLIC_ID_PREFIX = "key_"
_PUBLIC_ID_ALPHABET = string.ascii_letters + string.digits


def api_key_public_id_new() -> str:
    """`key_` + 20 random base62 characters (~119 bits): the id the API and pages show, never the row's pk."""
    return PUBLIC_ID_PREFIX + "".join(secrets.choice(_PUBLIC_ID_ALPHABET) for _ in range(20))


class ApiKey(models.Model):
    """An API key. The secret is shown once; only its peppered HMAC is stored.

    `public_id` names the key in the API (`id`), in usage groups and in tenant-facing
    URLs; the integer pk stays internal, so a tenant cannot count or guess other keys.
    """

    SCOPE_INFERENCE = "inference"
    SCOPE_KEYS = "keys:manage"
    SCOPE_USAGE = "usage:read"
    ALL_SCOPES = [SCOPE_INFERENCE, SCOPE_KEYS, SCOPE_USAGE]

    tenant = models.ForeignKey(Tenant, on_delete=models.CASCADE, related_name="api_keys")
    public_id = models.CharField(max_length=32, unique=True, default=api_key_public_id_new, editable=False)
    name = models.CharField(max_length=100)
    prefix = models.CharField(max_length=32, unique=True, help_text="Public part, safe to show")
    last_four = models.CharField(max_length=4)
    secret_hash = models.CharField(max_length=64, help_text="HMAC-SHA-256(pepper, secret), hex")
    scopes = models.JSONField(default=list, blank=True)
    created_by = models.ForeignKey(
        settings.AUTH_USER_MODEL, null=True, blank=True, on_delete=models.SET_NULL, related_name="+"
    )
    created_at = models.DateTimeField(default=timezone.now)
    expires_at = models.DateTimeField(null=True, blank=True)
    revoked_at = models.DateTimeField(null=True, blank=True, db_index=True)
    last_used_at = models.DateTimeField(null=True, blank=True)
    # A key's own ceilings, on top of its tenant's (empty: none; billing.counters).
    requests_per_minute = models.PositiveIntegerField(null=True, blank=True, help_text="Empty: only the tenant's limit")
    tokens_per_minute = models.PositiveIntegerField(null=True, blank=True, help_text="Empty: only the tenant's limit")
    max_concurrent_requests = models.PositiveIntegerField(null=True, blank=True, help_text="Empty: only the tenant's limit")
    monthly_token_quota = models.BigIntegerField(null=True, blank=True, help_text="Empty: only the tenant's quota")
    monthly_spend_limit_micros = models.BigIntegerField(
        null=True, blank=True, help_text="Micro-dollars; empty: only the tenant's budget"
    )
    # The keys that created this one (a key made through /v1/keys), its creator first: its requests also count
    # against their ceilings, so the keys a limited key makes share its limits (tenants.services.limits.key_scopes).
    lineage = models.JSONField(default=list, blank=True, editable=False,
                               help_text="Ids of the keys that created this key, nearest first")

    class Meta:
        ordering = ["-created_at"]

    def __str__(self) -> str:
        return f"{self.name} ({self.redacted})"

    @property
    def redacted(self) -> str:
        return f"{self.prefix}...{self.last_four}"

    def is_usable(self, now=None) -> bool:
        now = now or timezone.now()
        if self.revoked_at is not None:
            return False
        return self.expires_at is None or self.expires_at > now

    def has_scope(self, scope: str) -> bool:
        return not self.scopes or scope in self.scopes
