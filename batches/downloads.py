"""A stored file's bytes as a streamed attachment: the API's `/v1/files/{id}/content` and the dashboard's
download (with the member's session) send it alike."""

from __future__ import annotations

from asgiref.sync import sync_to_async
from django.http import StreamingHttpResponse
from django.utils.http import content_disposition_header

from batches.models import StoredFile

CHUNK_BYTES = 256 * 1024


def file_download_response(file: StoredFile, handle) -> StreamingHttpResponse:
    """The bytes in chunks, each read off the event loop: an async iterator, which Django's ASGI handler sends
    as it goes (a synchronous one, a FileResponse's, it would first read whole into memory)."""

    async def chunks():
        try:
            while chunk := await sync_to_async(handle.read, thread_sensitive=False)(CHUNK_BYTES):
                yield chunk
        finally:
            await sync_to_async(handle.close, thread_sensitive=False)()

    response = StreamingHttpResponse(chunks(), content_type="application/octet-stream")
    response["Content-Length"] = str(file.bytes)
    response["Content-Disposition"] = content_disposition_header(True, file.filename)
    return response
