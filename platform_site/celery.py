"""The Celery app: configured from Django's settings (CELERY_*), tasks found in each app's `tasks` module.

Tasks are sent by their registered name (e.g. `celery.signature("billing.tasks.send_budget_alert")`), so a
service never imports its app's task module (the tasks import the services). Celery's workers import the
task modules when they start; every other process (web, eager tasks in embedded mode) does it once the app
is finalized, i.e. on first use of its task registry.
"""

import os

from celery import Celery

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "platform_site.settings")

app = Celery("platform_site")
app.config_from_object("django.conf:settings", namespace="CELERY")
app.autodiscover_tasks()


@app.on_after_finalize.connect
def _task_modules_import(sender: Celery, **_kwargs) -> None:
    from django.apps import apps

    # A Celery worker finalizes the app before Django is set up: it imports the task modules itself, later
    if apps.ready:
        sender.autodiscover_tasks(force=True)
