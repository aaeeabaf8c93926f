from django import forms
from django.contrib import admin, messages

from inference.model_inspect import source_inspect
from inference.model_sources import SourceError
from inference.models import ServedModel


class ServedModelForm(forms.ModelForm):
    """The source is checked as `manage.py model_add` checks it: the files are there, readable and servable."""

    class Meta:
        model = ServedModel
        fields = "__all__"
        widgets = {"chat_template": forms.Textarea(attrs={"rows": 8, "cols": 100})}

    def clean_source(self):
        source = self.cleaned_data["source"].strip()
        if self.instance.pk is None or source != self.instance.source:
            try:
                source_inspect(source)
            except SourceError as exc:
                raise forms.ValidationError(str(exc)) from exc
        return source


@admin.register(ServedModel)
class ServedModelAdmin(admin.ModelAdmin):
    form = ServedModelForm
    list_display = ("name", "enabled", "batch_invariant", "context_length", "dtype", "owned_by", "source",
                    "created_at")
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
