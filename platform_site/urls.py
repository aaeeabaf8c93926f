from django.contrib import admin
from django.contrib.auth import views as auth_views
from django.urls import include, path

from dashboard.views import landing

urlpatterns = [
    path("", landing.landing, name="landing"),
    path("favicon.ico", landing.favicon, name="favicon"),
    path("admin/console/", include("dashboard.console_urls")),
    path("admin/", admin.site.urls),
    # the dashboard's logins: in, out, password change (no e-mailed password reset)
    path("accounts/login/", auth_views.LoginView.as_view(), name="login"),
    path("accounts/logout/", auth_views.LogoutView.as_view(), name="logout"),
    path("accounts/password_change/", auth_views.PasswordChangeView.as_view(), name="password_change"),
    path("accounts/password_change/done/", auth_views.PasswordChangeDoneView.as_view(), name="password_change_done"),
    path("dashboard/", include("dashboard.urls")),
    path("", include("inference.urls")),
    path("", include("tenants.urls")),
    path("", include("billing.urls")),
    path("", include("batches.urls")),
]

handler404 = "common.errors.handler404"
handler500 = "common.errors.handler500"
