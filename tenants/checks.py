"""Deploy checks (`manage.py check --deploy`) for the API key pepper."""

from django.conf import settings
from django.core.checks import Tags, Warning, register


@register(Tags.security, deploy=True)
def check_api_key_pepper(app_configs, **kwargs):
    pepper = settings.API_KEY_PEPPER
    if not pepper or pepper.startswith("dev-pepper:"):
        return [Warning(
            "API_KEY_PEPPER is not set; API key hashes are peppered with a value derived from SECRET_KEY.",
            hint="Set API_KEY_PEPPER to a long random value kept apart from the database (deploy/env.example).",
            id="tenants.W001",
        )]
    if len(pepper) < 32:
        return [Warning("API_KEY_PEPPER is shorter than 32 characters.", id="tenants.W002")]
    return []
