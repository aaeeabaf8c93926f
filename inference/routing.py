"""WebSocket routes (platform_site.asgi mounts them under the ProtocolTypeRouter), behind the Origin check."""

from channels.security.websocket import OriginValidator
from django.conf import settings
from django.urls import path

from inference.consumers import RealtimeConsumer

websocket_urlpatterns = [
    path("v1/realtime", RealtimeConsumer.as_asgi()),
]


class ApiOriginValidator(OriginValidator):
    """Channels' OriginValidator over settings.WEBSOCKET_ALLOWED_ORIGINS, letting a handshake without Origin through.

    A browser always sends Origin, so a page on a foreign site cannot open a
    socket here with its visitor's ambient credentials (the handshake is
    refused with 403). Clients that are not browsers (the openai SDK,
    `websockets`, curl) send none; they are let through, and the socket still
    needs an API key (handshake header or auth frame) before it does anything.
    """

    def __init__(self, application) -> None:
        super().__init__(application, allowed_origins=())

    @property
    def allowed_origins(self):
        return settings.WEBSOCKET_ALLOWED_ORIGINS

    @allowed_origins.setter
    def allowed_origins(self, value) -> None:
        pass  # always read from the settings (tests change them)

    async def __call__(self, scope, receive, send):
        if not any(name == b"origin" for name, _value in scope.get("headers") or ()):
            return await self.application(scope, receive, send)
        return await super().__call__(scope, receive, send)
