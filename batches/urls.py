from django.urls import path

import common.converters  # noqa: F401 - registers <public_id:> and <row_id:>
from batches.apis import batches, files

urlpatterns = [
    path("v1/files", files.FileListCreateApi.as_view(), name="files"),
    # an id of another shape matches no route (404 unknown_url); a well-formed unknown one is file_not_found
    path("v1/files/<public_id:file_id>", files.FileDetailApi.as_view(), name="file-detail"),
    path("v1/files/<public_id:file_id>/content", files.FileContentApi.as_view(), name="file-content"),
    path("v1/batches", batches.BatchListCreateApi.as_view(), name="batches"),
    path("v1/batches/<public_id:batch_id>", batches.BatchDetailApi.as_view(), name="batch-detail"),
    path("v1/batches/<public_id:batch_id>/cancel", batches.BatchCancelApi.as_view(), name="batch-cancel"),
]
