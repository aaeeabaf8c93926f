"""`manage.py run_batches`: the batch runner as its own process (production: deploy/Procfile).

Runs in_progress batches' lines on spare capacity through the job queue (Redis) until SIGTERM or SIGINT; the
lines in hand then go back to pending for the next runner (batches.runner). Several may run at once: each
claims different lines.
"""

from __future__ import annotations

import asyncio
import signal

from django.core.management.base import BaseCommand


class Command(BaseCommand):
    help = "Run the Batch API's lines on spare capacity (batches.runner), until SIGTERM."

    def add_arguments(self, parser):
        parser.add_argument("--max-in-flight", type=int, default=None,
                            help="lines run at once (default settings.BATCH_MAX_IN_FLIGHT)")

    def handle(self, *args, **options):
        asyncio.run(self._run(options["max_in_flight"]))

    async def _run(self, max_in_flight: int | None) -> None:
        from batches.runner import BatchRunner

        stop = asyncio.Event()
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(sig, stop.set)
        runner = BatchRunner(max_in_flight=max_in_flight)
        self.stdout.write(f"batch runner {runner.name} started")
        await runner.run(stop=stop)
        self.stdout.write(f"batch runner {runner.name} stopped")
