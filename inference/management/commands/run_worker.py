"""python manage.py run_worker --model NAME --device cpu|cuda:N [--metrics-port N]

One worker process: loads the model (a built-in name or any `manage.py model_add`ed one), serves its queue until SIGTERM (drain:
no new work, finish the requests in hand, exit). A second SIGTERM or SIGINT
stops at once; unstarted jobs go back to the queue, started ones end with an
error event.
"""

from __future__ import annotations

import argparse
import logging
import re
import signal

from django.conf import settings
from django.core.management.base import BaseCommand, CommandError

from inference.engine.config import check_step_order
from inference.model_sources import SourceError
from inference.queue import get_job_queue
from inference.served_models import served_model_check
from inference.worker.engine_factory import engine_build
from inference.worker.events import EventSink
from inference.worker.loop import WorkerLoop

logger = logging.getLogger(__name__)

DEVICE_RE = re.compile(r"^(cpu|cuda(:\d+)?)$")


def step_order(*, sync_output: bool, async_scheduling: bool | None) -> dict:
    """EngineConfig's async_output / async_scheduling for the two flags (None: the engine's default);
    a CommandError, before any model loads, for a pair EngineConfig would refuse."""
    order = {"async_output": False if sync_output else None, "async_scheduling": async_scheduling}
    try:
        check_step_order(**order)
    except ValueError as exc:
        raise CommandError(str(exc)) from exc
    return order


class Command(BaseCommand):
    help = "Serve one model from the job queue (needs REDIS_URL)."

    def add_arguments(self, parser) -> None:
        parser.add_argument("--model", default=settings.DEFAULT_MODEL)
        parser.add_argument("--device", default=settings.ENGINE_DEVICE, help="cpu or cuda:N")
        parser.add_argument("--worker-id", default=None)
        parser.add_argument("--max-num-seqs", type=int, default=None)
        parser.add_argument("--kv-cache-mb", type=int, default=None,
                            help="KV cache size in MiB (default ENGINE_KV_CACHE_MB; unset: sized from free memory)")
        parser.add_argument("--kv-cache-fraction", type=float, default=None,
                            help="without a KV cache size: the fraction of the memory free at start that this "
                                 "device's workers may fill with weights and KV cache (default "
                                 "ENGINE_KV_CACHE_FRACTION, else 0.5 on the CPU, 0.9 on CUDA)")
        parser.add_argument("--workers-per-device", type=int, default=None,
                            help="worker processes sharing this device's memory (the host's RAM for cpu), each "
                                 "sizing its KV cache from its share (default ENGINE_WORKERS_PER_DEVICE, else 1)")
        parser.add_argument("--dtype", default=None, choices=["float32", "bfloat16", "float16"])
        parser.add_argument("--no-cuda-graphs", action="store_true",
                            help="run CUDA decode steps eagerly instead of replaying CUDA graphs (debugging)")
        parser.add_argument("--async-scheduling", action=argparse.BooleanOptionalAction, default=None,
                            help="schedule and launch the next step before the tokens of the one in flight are "
                                 "read back, overlapping the GPU (default: on for CUDA unless --sync-output, off "
                                 "on the CPU; see BENCHMARKS.md)")
        parser.add_argument("--sync-output", action="store_true",
                            help="on CUDA, finish each step (tokens read back, deltas built) before the next one "
                                 "starts (debugging; deltas then arrive one step sooner, at a throughput cost)")

        parser.add_argument("--metrics-port", type=int, default=None,
                            help="serve this worker's Prometheus metrics on this port (/metrics; inference.metrics)")
        parser.add_argument("--metrics-host", default="127.0.0.1",
                            help="address the metrics port listens on (0.0.0.0 for a Prometheus on another host)")

    def handle(self, *args, **options) -> None:
        if not settings.REDIS_URL:
            raise CommandError("run_worker needs REDIS_URL: the embedded mode serves from a thread of the web process.")
        device = options["device"]
        if not DEVICE_RE.match(device):
            raise CommandError(f"--device must be cpu or cuda:N, not {device!r}")
        model = options["model"]
        try:
            served = served_model_check(name=model)  # before any heartbeat says it is loading; its row read once
        except SourceError as exc:
            raise CommandError(f"cannot serve {model!r}: {exc}") from exc
        max_num_seqs = options["max_num_seqs"] or settings.ENGINE_MAX_NUM_SEQS

        def build():
            return engine_build(model=model, device=device, dtype=options["dtype"],
                                kv_cache_mb=options["kv_cache_mb"], kv_cache_fraction=options["kv_cache_fraction"],
                                workers_per_device=options["workers_per_device"], max_num_seqs=max_num_seqs,
                                cuda_graphs=not options["no_cuda_graphs"], row_options=served.engine_options,
                                **step_order(sync_output=options["sync_output"],
                                             async_scheduling=options["async_scheduling"]))

        sink = EventSink()
        loop = WorkerLoop(
            queue=get_job_queue(), model=model, sink=sink, engine_factory=build,
            worker_id=options["worker_id"], device=device, max_num_seqs=max_num_seqs,
            reply_alive_timeout=settings.REPLY_ALIVE_TIMEOUT_S,
        )

        def on_signal(signum, _frame) -> None:
            if loop.draining:
                logger.warning("second signal: stopping now")
                loop.request_stop()
            else:
                logger.warning("signal %s: draining (no new work; finishing %d requests)", signum, len(loop.active))
                loop.request_drain()

        if options["metrics_port"] is not None:
            from inference.metrics.exposition import worker_metrics_serve

            try:
                worker_metrics_serve(port=options["metrics_port"], host=options["metrics_host"])
            except OSError as exc:
                raise CommandError(f"cannot serve metrics on {options['metrics_host']}:{options['metrics_port']}: "
                                   f"{exc}") from exc
        signal.signal(signal.SIGTERM, on_signal)
        signal.signal(signal.SIGINT, on_signal)
        self.stdout.write(f"worker {loop.worker_id}: loading {model} on {device}")
        try:
            loop.run()
        except Exception as exc:
            if loop.engine is None:  # unknown model, bad device or dtype, out of memory...
                raise CommandError(f"could not load {model!r} on {device}: {exc}") from exc
            raise
        finally:
            sink.close()
        dead = getattr(loop.engine, "dead", None)
        if dead:  # a non-zero exit: the supervisor restarts the worker (or an operator looks at the device)
            raise CommandError(f"worker {loop.worker_id}: {dead}")
        self.stdout.write(f"worker {loop.worker_id}: stopped")
