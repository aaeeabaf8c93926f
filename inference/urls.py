from django.urls import path

from . import views
from .api import completion_views

urlpatterns = [
    path("health", views.health, name="health"),
    path("healthz", views.healthz, name="healthz"),
    path("metrics", views.metrics, name="metrics"),
    path("livez", views.livez, name="livez"),
    path("readyz", views.readyz, name="readyz"),
    path("v1/openapi.json", views.OpenApiDocument.as_view(), name="openapi"),
    path("v1/models", views.ModelListApi.as_view(), name="models"),
    path("v1/models/<path:model_id>", views.ModelDetailApi.as_view(), name="model-detail"),
    path("v1/chat/completions", completion_views.chat_completions, name="chat-completions"),
    path("v1/completions", completion_views.completions, name="completions"),
]
