"""A worker's heartbeats: its sign of life in the queue, and what it reports there (shown by
live_workers, the admin, metrics).

The loop beats between steps (`beat`, every ~interval). A step that outlasts
the interval (a long prefill on a slow CPU) would look like a dead worker and
get reaped mid-step, so a side thread (`start`) repeats the loop's last beat
while one runs; it reads no engine state (the step owns it), only what the
loop's last beat reported. While the engine loads, another thread beats with
status "loading" (`while_loading`), so the model counts as served meanwhile.
What a beat says of the worker comes from the `figures` function its owner
gives (`WorkerLoop.figures`): this module knows nothing of the loop.
"""

from __future__ import annotations

import logging
import os
import socket
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

from common.outage import Outage, connection_lost
from inference.queue import WorkerRegistry

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class WorkerFigures:
    """What a heartbeat reports of its worker (besides its throughput, which the heartbeats measure)."""

    device: str
    started_at: float
    draining: bool
    active: int  # requests in hand
    max_num_seqs: int | None
    steps: int
    engine: Any = None  # its `stats()` are read (None while it loads)


def heartbeat_info(figures: WorkerFigures, *, tok_s: float = 0.0, loading: bool = False) -> dict[str, Any]:
    """id and model are added by the queue; the rest describes the worker's load."""
    status = "loading" if loading else ("draining" if figures.draining else "serving")
    info: dict[str, Any] = {
        "device": figures.device, "pid": os.getpid(), "host": socket.gethostname(),
        "started_at": figures.started_at, "status": status, "running": 0, "waiting": 0, "kv_usage": 0.0,
        "tok_s": round(tok_s, 2), "active": figures.active, "max_num_seqs": figures.max_num_seqs,
        "steps": figures.steps,
    }
    if not loading and figures.engine is not None:
        try:
            stats = dict(figures.engine.stats())
        except Exception:  # noqa: BLE001 - a heartbeat without engine figures is still a heartbeat
            stats = {}
        for key in ("running", "waiting", "kv_usage"):
            if key in stats:
                info[key] = stats[key]
        info["engine"] = {k: v for k, v in stats.items() if v is None or isinstance(v, (int, float, str, bool))}
    return info


class Heartbeats:
    """The heartbeats of one worker (see the module docstring): `figures()` says what to report."""

    def __init__(self, *, registry: WorkerRegistry, worker_id: str, model: str, figures: Callable[[], WorkerFigures],
                 interval: float) -> None:
        self.registry, self.worker_id, self.model = registry, worker_id, model
        self.figures = figures
        self.interval = interval
        self.next_at = 0.0  # monotonic time of the loop's next beat
        self.tok_s = 0.0  # tokens generated per second since the beat before the last
        self._tokens = 0
        self._last = time.monotonic()
        self._lock = threading.Lock()  # the loop and the in-step beater share the queue client
        self._last_info: dict[str, Any] | None = None
        self._step_started: float | None = None  # monotonic start of the step in progress
        self._reaped_in_step = False
        self._done = threading.Event()
        self._beater: threading.Thread | None = None
        self.outage = Outage(logger, f"worker {worker_id}: heartbeats (Redis)")

    def tokens_add(self, count: int) -> None:
        self._tokens += count

    def due(self, now: float) -> bool:
        return now >= self.next_at

    def beat(self) -> bool:
        """The loop's beat: False when the queue says this worker was reaped."""
        now = time.monotonic()
        elapsed = now - self._last
        if elapsed > 0:
            self.tok_s = self._tokens / elapsed
        self._tokens, self._last = 0, now
        self.next_at = now + self.interval
        info = heartbeat_info(self.figures(), tok_s=self.tok_s)
        self._last_info = info
        return self._send(info)

    @property
    def engine_stats(self) -> dict[str, Any] | None:
        """The engine figures of the loop's last beat (None before the engine loaded)."""
        return None if self._last_info is None else self._last_info.get("engine")

    def _send(self, info: dict[str, Any]) -> bool:
        try:
            with self._lock:
                alive = self.registry.heartbeat(self.worker_id, self.model, info)
        except Exception as exc:  # noqa: BLE001 - Redis blips must not kill the worker
            if connection_lost(exc):
                self.outage.failed(repr(exc))
            else:
                logger.exception("heartbeat failed")
            return True
        self.outage.ok()
        return alive

    # ------------------------------------------------------------ during a step
    def step_started(self) -> None:
        self._step_started = time.monotonic()

    def step_ended(self) -> bool:
        """After a step: True when a beat during it found this worker reaped (its news is not ours to send)."""
        self._step_started = None
        reaped, self._reaped_in_step = self._reaped_in_step, False
        return reaped

    def start(self) -> None:
        """Start the in-step beater thread."""
        self._beater = threading.Thread(target=self._beat_during_steps, name=f"{self.worker_id}-step-beats",
                                        daemon=True)
        self._beater.start()

    def stop(self) -> None:
        self._done.set()
        if self._beater is not None and self._beater.is_alive():
            self._beater.join(5.0)

    def _beat_during_steps(self) -> None:
        while not self._done.wait(self.interval / 2):
            started, info = self._step_started, self._last_info
            if started is None or info is None:
                continue
            in_step = time.monotonic() - started
            if in_step < self.interval:
                continue  # short steps: the loop beats between them
            if not self._send(dict(info, in_step_s=round(in_step, 1))):
                self._reaped_in_step = True

    # ------------------------------------------------------------ while loading
    @contextmanager
    def while_loading(self) -> Iterator[None]:
        """Beat with status "loading" now and every interval until the block ends."""
        done = threading.Event()

        def beat_while_loading() -> None:
            while not done.wait(self.interval):
                self._send(heartbeat_info(self.figures(), loading=True))

        self._send(heartbeat_info(self.figures(), loading=True))
        ticker = threading.Thread(target=beat_while_loading, name=f"{self.worker_id}-loading", daemon=True)
        ticker.start()
        try:
            yield
        finally:
            done.set()
            ticker.join()
