from django.contrib import admin, messages

from inference.models import ServedModel


@admin.register(ServedModel)
class ServedModelAdmin(admin.ModelAdmin):
    list_display = ("name", "enabled", "batch_invariant", "context_length", "owned_by", "source", "created_at")
    list_filter = ("enabled", "batch_invariant", "owned_by")
    search_fields = ("name", "source")
    actions = ("enable", "disable")

    @admin.action(description="Enable selected models", permissions=["change"])
    def enable(self, request, queryset):
        updated = queryset.update(enabled=True)
        self.message_user(request, f"Enabled {updated} model(s).", messages.SUCCESS)

    @admin.action(description="Disable selected models (GET /v1/models stops listing them)", permissions=["change"])
    def disable(self, request, queryset):
        updated = queryset.update(enabled=False)
        self.message_user(request, f"Disabled {updated} model(s).", messages.SUCCESS)
