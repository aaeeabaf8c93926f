"""WebSocket routes (platform_site.asgi mounts them under the ProtocolTypeRouter)."""

from django.urls import path

from inference.consumers import RealtimeConsumer

websocket_urlpatterns = [
    path("v1/realtime", RealtimeConsumer.as_asgi()),
]
