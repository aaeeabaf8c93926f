from django.contrib import admin
from django.urls import include, path

urlpatterns = [
    path("admin/", admin.site.urls),
    path("", include("inference.urls")),
    path("", include("tenants.urls")),
    path("", include("billing.urls")),
]

handler404 = "common.errors.handler404"
handler500 = "common.errors.handler500"
