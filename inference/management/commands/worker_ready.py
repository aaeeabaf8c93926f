"""`manage.py worker_ready [--model M] [--worker-id ID]`: exit 0 when a `run_worker` on this host has
its model loaded and takes work (its heartbeat says "serving"), else 1. The compose file's health check
of the worker service; the web side's /readyz asks the same heartbeats."""

from __future__ import annotations

import socket
import sys

from django.core.management.base import BaseCommand

from inference.selectors import worker_ready


class Command(BaseCommand):
    help = "Exit 0 when a worker on this host serves its model (loaded, not draining), else 1."

    def add_arguments(self, parser) -> None:
        parser.add_argument("--model", default=None, help="only a worker of this model")
        parser.add_argument("--worker-id", default=None, help="only this worker")

    def handle(self, *args, **options) -> None:
        try:
            ready = worker_ready(model=options["model"], host=socket.gethostname(), worker_id=options["worker_id"])
        except Exception as exc:  # noqa: BLE001 - Redis away: not ready
            self.stderr.write(f"not ready: {exc}")
            sys.exit(1)
        if not ready:
            self.stderr.write("not ready: no worker on this host serves its model")
            sys.exit(1)
        self.stdout.write("ready")
