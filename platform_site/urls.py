from django.contrib import admin
from django.urls import include, path

urlpatterns = [
    path("admin/", admin.site.urls),
    path("", include("inference.urls")),
    path("", include("tenants.urls")),
    path("", include("billing.urls")),
]

handler404 = "inference.errors.handler404"
handler500 = "inference.errors.handler500"
