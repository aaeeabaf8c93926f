"""ASGI entry point: HTTP (Django, plus streaming) and WebSocket routing."""

import os

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "platform_site.settings")

from django.core.asgi import get_asgi_application  # noqa: E402

django_asgi_app = get_asgi_application()

from django.conf import settings  # noqa: E402

if settings.DEBUG:  # `make run`: admin CSS/JS from the app finders; production serves STATIC_ROOT via nginx
    from common.static_files import SafeASGIStaticFilesHandler  # noqa: E402

    django_asgi_app = SafeASGIStaticFilesHandler(django_asgi_app)  # a path out of the static dirs: 404

from channels.routing import ProtocolTypeRouter, URLRouter  # noqa: E402

from batches.runner_embedded import runner_on_batch_requests  # noqa: E402
from batches.uploads import is_other_api_path, is_upload_path, upload_body_max_bytes  # noqa: E402
from common.request_body import body_deadline, body_limit  # noqa: E402
from inference.api.asgi import API_PATHS, api_http_router  # noqa: E402
from inference.metrics.gateway import http_metrics  # noqa: E402
from inference.routing import ApiOriginValidator, websocket_urlpatterns  # noqa: E402

application = ProtocolTypeRouter(
    {
        # the completion endpoints skip the middleware stack (see inference/api/asgi.py); every body has
        # REQUEST_BODY_TIMEOUT_S to arrive, and one under /v1 over DATA_UPLOAD_MAX_MEMORY_SIZE is refused
        # before it is read (the completion views count it against the key's RPM first) (common/request_body.py);
        # every response is counted by status (inference.metrics); POST /v1/files takes up to FILES_MAX_BYTES
        # (batches.uploads); in the embedded mode a /v1/batches request starts the batch runner on this loop
        # (batches.runner_embedded)
        "http": http_metrics(body_deadline(body_limit(
            body_limit(runner_on_batch_requests(api_http_router(django_asgi_app)), refused_by_app=API_PATHS,
                       applies=is_other_api_path),
            max_bytes=upload_body_max_bytes, applies=is_upload_path))),
        # a browser's Origin must be allowed (settings.WEBSOCKET_ALLOWED_ORIGINS)
        "websocket": ApiOriginValidator(URLRouter(websocket_urlpatterns)),
    }
)
