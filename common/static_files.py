"""Static files under DEBUG (`make run`): Django's ASGI handler, less its 500 on a path that climbs out.

uvicorn passes a request path as the client sent it (`curl --path-as-is
/static/../.env`, or `%2e%2e`, which it decodes): Django's staticfiles view
hands `../.env` to its finders, whose `safe_join` refuses it with
SuspiciousFileOperation, which the handler does not catch (only Http404): a
500, nothing disclosed. Here a path with a `..` or `.` segment, a backslash
or a NUL byte is a 404 before any finder runs, so nothing outside the static
directories is even looked at; a finder's SuspiciousFileOperation on any
other path is a 404 too. Production serves STATIC_ROOT from nginx and never
mounts this handler.
"""

from __future__ import annotations

from django.contrib.staticfiles.handlers import ASGIStaticFilesHandler
from django.core.exceptions import SuspiciousFileOperation
from django.http import Http404

_REFUSED_SEGMENTS = frozenset({"..", "."})


def static_path_is_safe(relative: str) -> bool:
    """False for a path below STATIC_URL that names anything but a file inside the static directories."""
    if "\\" in relative or "\x00" in relative:
        return False
    return not any(segment in _REFUSED_SEGMENTS for segment in relative.split("/"))


class SafeASGIStaticFilesHandler(ASGIStaticFilesHandler):
    def serve(self, request):
        relative = self.file_path(request.path)
        if not static_path_is_safe(relative):
            raise Http404("No such file")
        try:
            return super().serve(request)
        except SuspiciousFileOperation:
            raise Http404("No such file") from None
