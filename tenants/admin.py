"""Operator admin for tiers, tenants, memberships and API keys (usage records: billing.admin).

Secrets never appear: `secret_hash` is excluded from every form and list. A key
created here is shown exactly once, on the page that answers the add form (it
is rendered into that response only, never put in a message, the session or a
log entry). `manage.py create_api_key` does the same from a shell.
"""

from __future__ import annotations

from django import forms
from django.contrib import admin, messages
from django.contrib.admin.views.main import ChangeList
from django.db.models import Count, Q
from django.template.response import TemplateResponse
from django.urls import reverse
from django.utils import timezone
from django.utils.html import format_html, format_html_join

from tenants.models import PUBLIC_ID_PREFIX, ApiKey, Membership, Tenant, Tier, TierModelLimit
from tenants.selectors import api_key_status
from tenants.services.api_keys import api_key_issue, api_key_revoke
from tenants.services.limits import LIMIT_FIELDS, limits_explain
from tenants.services.tenants import tenant_change_tier, tenant_reactivate, tenant_suspend


class TierModelLimitInline(admin.TabularInline):
    """A tier's own limits for one model, per tenant (OpenAI's are per model); saving one empties the verified-key
    cache in every web process (key_events), so the next request is admitted under it."""

    model = TierModelLimit
    extra = 0
    fields = ("model_name", "requests_per_minute", "tokens_per_minute", "batch_queue_tokens")
    verbose_name = "per-model limit"
    verbose_name_plural = "per-model limits (each tenant, per model, on top of the tier's limits above)"


@admin.register(Tier)
class TierAdmin(admin.ModelAdmin):
    inlines = (TierModelLimitInline,)
    list_display = (
        "name", "display_name", "priority", "queue_weight", "requests_per_minute", "tokens_per_minute",
        "max_concurrent_requests", "max_output_tokens", "max_context", "monthly_token_quota",
        "allowed_models", "price_multiplier", "tenant_count",
    )
    search_fields = ("name", "display_name")
    list_filter = ("priority",)
    ordering = ("priority", "name")

    def get_queryset(self, request):
        return super().get_queryset(request).annotate(_tenant_count=Count("tenants"))

    @admin.display(description="tenants", ordering="_tenant_count")
    def tenant_count(self, obj):
        return obj._tenant_count


class MembershipInline(admin.TabularInline):
    model = Membership
    extra = 0
    raw_id_fields = ("user",)


class ApiKeyInline(admin.TabularInline):
    model = ApiKey
    extra = 0
    can_delete = False
    show_change_link = True
    fields = ("name", "redacted", "scopes", "created_at", "expires_at", "revoked_at", "last_used_at")
    readonly_fields = fields

    def has_add_permission(self, request, obj=None):
        return False  # keys are issued through the API key admin or `create_api_key` (shown once)


class ChangeTierForm(forms.Form):
    tier = forms.ModelChoiceField(queryset=Tier.objects.all(), empty_label=None)


def limits_table(*, tenant, api_key=None, explain=limits_explain):
    """The tier's value, the override, the effective limit and where it comes from (0: none). `explain`: billing's
    admin passes its own (billing.services.budgets.limits_explain), which knows the tenant's budget."""
    rows = format_html_join(
        "", "<tr><td>{}</td><td>{}</td><td>{}</td><td><b>{}</b></td><td>{}</td></tr>",
        ((row.name, _shown(row.tier), _shown(row.override), _shown(row.effective) if row.effective else "none",
          row.source) for row in explain(tenant=tenant, api_key=api_key)),
    )
    override = "key" if api_key is not None else "tenant"
    return format_html("<table><tr><th>limit</th><th>tier</th><th>{}</th><th>effective</th><th>from</th></tr>{}</table>",
                       override, rows)


def _shown(value):
    return "-" if value is None else value


@admin.register(Tenant)
class TenantAdmin(admin.ModelAdmin):
    list_display = (
        "name", "slug", "tier", "status", "timezone", "active_keys", "cache_share_group", "created_at",
    )
    list_filter = ("status", "tier", "created_at")
    search_fields = ("name", "slug")
    list_select_related = ("tier",)
    prepopulated_fields = {"slug": ("name",)}
    inlines = (MembershipInline, ApiKeyInline)
    actions = ("change_tier", "suspend", "reactivate")
    # the tenant's budget is billing's: billing.budget_admin adds its inline and column to this admin
    readonly_fields = ("effective_limits",)

    explain = staticmethod(limits_explain)  # billing's admin puts the one that knows the budget

    @admin.display(description="effective limits")
    def effective_limits(self, obj):
        return limits_table(tenant=obj, explain=self.explain) if obj.pk else "-"

    def get_queryset(self, request):
        active = Count("api_keys", filter=Q(api_keys__revoked_at__isnull=True))
        return super().get_queryset(request).annotate(_active_keys=active)

    @admin.display(description="active keys", ordering="_active_keys")
    def active_keys(self, obj):
        return obj._active_keys

    @admin.action(description="Change tier of selected tenants", permissions=["change"])
    def change_tier(self, request, queryset):
        form = ChangeTierForm(request.POST if "apply" in request.POST else None)
        if "apply" in request.POST and form.is_valid():
            tier = form.cleaned_data["tier"]
            for tenant in queryset:
                tenant_change_tier(tenant=tenant, tier=tier)
            self.message_user(request, f"Moved {queryset.count()} tenant(s) to tier {tier.name}.", messages.SUCCESS)
            return None
        context = {
            **self.admin_site.each_context(request),
            "title": "Change tier",
            "opts": self.model._meta,
            "queryset": queryset,
            "form": form,
            "action_checkbox_name": admin.helpers.ACTION_CHECKBOX_NAME,
        }
        return TemplateResponse(request, "admin/tenants/tenant/change_tier.html", context)

    @admin.action(description="Suspend selected tenants (their keys get 403)", permissions=["change"])
    def suspend(self, request, queryset):
        for tenant in queryset:
            tenant_suspend(tenant=tenant)
        self.message_user(request, f"Suspended {queryset.count()} tenant(s).", messages.SUCCESS)

    @admin.action(description="Reactivate selected tenants", permissions=["change"])
    def reactivate(self, request, queryset):
        for tenant in queryset:
            tenant_reactivate(tenant=tenant)
        self.message_user(request, f"Reactivated {queryset.count()} tenant(s).", messages.SUCCESS)


@admin.register(Membership)
class MembershipAdmin(admin.ModelAdmin):
    list_display = ("user", "tenant", "role", "created_at")
    list_filter = ("role", "tenant__tier")
    search_fields = ("user__username", "user__email", "tenant__slug", "tenant__name")
    list_select_related = ("user", "tenant")
    raw_id_fields = ("user", "tenant")


class ApiKeyStatusFilter(admin.SimpleListFilter):
    title = "status"
    parameter_name = "status"

    def lookups(self, request, model_admin):
        return (("active", "active"), ("revoked", "revoked"), ("expired", "expired"))

    def queryset(self, request, queryset):
        now = timezone.now()
        live = queryset.filter(revoked_at__isnull=True)
        if self.value() == "active":
            return live.exclude(expires_at__lte=now)
        if self.value() == "revoked":
            return queryset.filter(revoked_at__isnull=False)
        if self.value() == "expired":
            return live.filter(expires_at__lte=now)
        return queryset


class ApiKeyForm(forms.ModelForm):
    scopes = forms.MultipleChoiceField(
        choices=[(scope, scope) for scope in ApiKey.ALL_SCOPES],
        required=False,
        widget=forms.CheckboxSelectMultiple,
        help_text="None ticked = all scopes.",
    )

    class Meta:
        model = ApiKey
        fields = ("tenant", "name", "scopes", "expires_at", *LIMIT_FIELDS)

    def clean_scopes(self):
        return sorted(set(self.cleaned_data["scopes"]))


class ApiKeyChangeList(ChangeList):
    """The changelist links each key by its public id (`/admin/tenants/apikey/key_.../change/`)."""

    def url_for_result(self, result):
        return reverse(f"admin:{self.opts.app_label}_{self.opts.model_name}_change", args=(result.public_id,),
                       current_app=self.model_admin.admin_site.name)


@admin.register(ApiKey)
class ApiKeyAdmin(admin.ModelAdmin):
    form = ApiKeyForm
    exclude = ("secret_hash",)
    list_display = (
        "name", "redacted", "tenant", "key_status", "scopes", "created_at", "expires_at", "last_used_at", "revoked_at",
    )
    list_filter = (ApiKeyStatusFilter, "tenant__tier", "created_at")
    search_fields = ("name", "public_id", "prefix", "tenant__slug", "tenant__name")
    list_select_related = ("tenant", "created_by")
    raw_id_fields = ("tenant",)
    actions = ("revoke",)

    def get_changelist(self, request, **kwargs):
        return ApiKeyChangeList

    def get_object(self, request, object_id, from_field=None):
        """A key's pages answer to its public id (the links use it) and, for old links, to its row id."""
        if from_field is None and str(object_id).startswith(PUBLIC_ID_PREFIX):
            return self.get_queryset(request).filter(public_id=object_id).first()
        return super().get_object(request, object_id, from_field)

    def get_readonly_fields(self, request, obj=None):
        if obj is None:
            return ()
        return ("tenant", "public_id", "prefix", "last_four", "created_by", "created_at", "revoked_at", "last_used_at",
                "effective_limits")

    def get_fields(self, request, obj=None):
        if obj is None:
            return ("tenant", "name", "scopes", "expires_at")
        return ("tenant", "name", "public_id", "prefix", "last_four", "scopes", "expires_at", "created_by", "created_at",
                "revoked_at", "last_used_at", *LIMIT_FIELDS, "effective_limits")

    explain = staticmethod(limits_explain)  # billing's admin puts the one that knows the budget

    @admin.display(description="effective limits")
    def effective_limits(self, obj):
        return limits_table(tenant=obj.tenant, api_key=obj, explain=self.explain)

    @admin.display(description="status")
    def key_status(self, obj):
        return api_key_status(api_key=obj)

    def save_model(self, request, obj, form, change):
        if change:
            super().save_model(request, obj, form, change)
            return
        obj.created_by = request.user
        obj._plaintext_once = api_key_issue(api_key=obj)

    def response_add(self, request, obj, post_url_continue=None):
        plaintext = getattr(obj, "_plaintext_once", None)
        if plaintext is None:
            return super().response_add(request, obj, post_url_continue)
        context = {
            **self.admin_site.each_context(request),
            "title": "API key created",
            "opts": self.model._meta,
            "api_key": obj,
            "plaintext": plaintext,
            "change_url": reverse("admin:tenants_apikey_change", args=[obj.public_id]),
            "list_url": reverse("admin:tenants_apikey_changelist"),
        }
        response = TemplateResponse(request, "admin/tenants/apikey/key_created.html", context)
        response["Cache-Control"] = "no-store"
        return response

    @admin.action(description="Revoke selected keys (they stop working at once)", permissions=["change"])
    def revoke(self, request, queryset):
        for api_key in queryset:
            api_key_revoke(api_key=api_key)
        self.message_user(request, f"Revoked {queryset.count()} key(s).", messages.SUCCESS)
