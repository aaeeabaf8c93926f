"""What a worker reports in its heartbeat (shown by live_workers, the admin, metrics)."""

from __future__ import annotations

import os
import socket
from typing import Any


def heartbeat_info(loop: Any, *, loading: bool = False) -> dict[str, Any]:
    """id and model are added by the queue; the rest describes the worker's load."""
    status = "loading" if loading else ("draining" if loop.draining else "serving")
    info: dict[str, Any] = {
        "device": loop.device, "pid": os.getpid(), "host": socket.gethostname(), "started_at": loop.started_at,
        "status": status, "running": 0, "waiting": 0, "kv_usage": 0.0, "tok_s": round(loop.tok_s, 2),
        "active": len(loop.active), "max_num_seqs": loop._max_num_seqs, "steps": loop.steps,
    }
    if not loading and loop.engine is not None:
        try:
            stats = dict(loop.engine.stats())
        except Exception:  # noqa: BLE001 - a heartbeat without engine figures is still a heartbeat
            stats = {}
        for key in ("running", "waiting", "kv_usage"):
            if key in stats:
                info[key] = stats[key]
        info["engine"] = {k: v for k, v in stats.items() if v is None or isinstance(v, (int, float, str, bool))}
    return info
