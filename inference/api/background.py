"""At most one background task per key: the refresh-ahead reloads of the request path's caches.

    _reloads = OnePerKey("reloading the served model")
    _reloads.start(name, lambda: _load(name))   # no-op while one for `name` runs

The mapping holds each key's task while it runs (a task needs a strong
reference), and the task removes itself when it ends. A failure is logged,
not raised: the cached answer then expires and the next request reads it
itself.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable, Hashable

logger = logging.getLogger(__name__)


class OnePerKey(dict):
    def __init__(self, what: str) -> None:
        super().__init__()
        self.what = what  # for the log line of a failure

    def start(self, key: Hashable, work: Callable[[], Awaitable[object]]) -> None:
        """Run `work()` on the running loop unless a task for `key` is still in flight."""
        task = self.get(key)
        if task is None or task.done():
            self[key] = asyncio.get_running_loop().create_task(self._run(key, work))

    async def _run(self, key: Hashable, work: Callable[[], Awaitable[object]]) -> None:
        try:
            await work()
        except Exception:  # noqa: BLE001 - see the module docstring
            logger.warning("%s %s failed", self.what, key, exc_info=True)
        finally:
            self.pop(key, None)
