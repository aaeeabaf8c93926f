from django.contrib import admin
from django.urls import include, path

urlpatterns = [
    path("admin/console/", include("dashboard.console_urls")),
    path("admin/", admin.site.urls),
    path("accounts/", include("django.contrib.auth.urls")),
    path("dashboard/", include("dashboard.urls")),
    path("", include("inference.urls")),
    path("", include("tenants.urls")),
    path("", include("billing.urls")),
]

handler404 = "common.errors.handler404"
handler500 = "common.errors.handler500"
