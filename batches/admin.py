"""Operator admin: tenants' files and batches, read-only (written by the API and the batch runner only)."""

from __future__ import annotations

from django.contrib import admin

from batches.models import Batch, BatchLine, StoredFile


class ReadOnlyAdmin(admin.ModelAdmin):
    def has_add_permission(self, request, obj=None):
        return False

    def has_change_permission(self, request, obj=None):
        return False

    def has_delete_permission(self, request, obj=None):
        return False


@admin.register(StoredFile)
class StoredFileAdmin(ReadOnlyAdmin):
    list_display = ("public_id", "tenant", "purpose", "filename", "bytes", "status", "created_at", "deleted_at")
    list_filter = ("purpose", "status")
    search_fields = ("public_id", "filename", "tenant__slug")
    list_select_related = ("tenant",)
    date_hierarchy = "created_at"


@admin.register(Batch)
class BatchAdmin(ReadOnlyAdmin):
    list_display = ("public_id", "tenant", "endpoint", "model", "status", "total", "completed", "failed",
                    "input_tokens", "created_at", "expires_at")
    list_filter = ("status", "endpoint")
    search_fields = ("public_id", "tenant__slug", "input_file__public_id")
    list_select_related = ("tenant",)
    raw_id_fields = ("input_file", "output_file", "error_file", "api_key")
    date_hierarchy = "created_at"


@admin.register(BatchLine)
class BatchLineAdmin(ReadOnlyAdmin):
    """A batch's lines (no inline on the batch's page: a batch may hold 50,000): search by the batch's id."""

    list_display = ("batch", "line_no", "custom_id", "status", "attempts", "response_status", "finished_at")
    list_filter = ("status",)
    search_fields = ("batch__public_id", "custom_id", "request_id")
    list_select_related = ("batch",)
    raw_id_fields = ("batch",)
