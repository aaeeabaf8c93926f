"""Saying once that a dependency is down, and once that it is back.

    redis_down = Outage(logger, "job queue (Redis)")
    try:
        ...
        redis_down.ok()          # logs "back after 3.2 s (41 failures)" if it had been down
    except RedisError as exc:
        redis_down.failed(exc)   # the first failure is logged (no traceback); the rest are counted

A loop that polls Redis or PostgreSQL many times a second would otherwise log
a traceback per poll while the server restarts (thousands in seconds). Each
component keeps one `Outage` per dependency: the first failure is logged at
WARNING with its message, later ones only every `repeat_s` ("still down"),
and the recovery once. Thread-safe.
"""

from __future__ import annotations

import logging
import threading
import time


class Outage:
    def __init__(self, logger: logging.Logger, what: str, *, repeat_s: float = 60.0) -> None:
        self.logger = logger
        self.what = what
        self.repeat_s = repeat_s
        self._lock = threading.Lock()
        self._since: float | None = None  # monotonic time of the first failure of the current outage
        self._failures = 0
        self._last_log = 0.0

    @property
    def down(self) -> bool:
        return self._since is not None

    def failed(self, error: object) -> bool:
        """Count a failure; True (and a log line) for the first of an outage and then every repeat_s."""
        now = time.monotonic()
        with self._lock:
            self._failures += 1
            if self._since is None:
                self._since = self._last_log = now
                first = True
            elif now - self._last_log >= self.repeat_s:
                self._last_log = now
                first = False
            else:
                return False
            failures, since = self._failures, self._since
        if first:
            self.logger.warning("%s unavailable: %s", self.what, error)
        else:
            self.logger.warning("%s still unavailable after %.0f s (%d failures): %s", self.what, now - since,
                                failures, error)
        return True

    def ok(self) -> None:
        """The dependency answered: log the end of an outage, if there was one."""
        if self._since is None:
            return
        with self._lock:
            since, failures = self._since, self._failures
            self._since, self._failures = None, 0
        if since is not None:
            self.logger.warning("%s back after %.1f s (%d failures)", self.what, time.monotonic() - since, failures)


def connection_lost(exc: BaseException) -> bool:
    """True when `exc` (or what caused it) says a server could not be reached: Redis's connection and
    timeout errors, a socket error, the database's OperationalError or InterfaceError."""
    import redis
    from django.db import InterfaceError, OperationalError

    kinds = (redis.ConnectionError, redis.TimeoutError, ConnectionError, TimeoutError, OperationalError,
             InterfaceError)
    while exc is not None:
        if isinstance(exc, kinds):
            return True
        exc = exc.__cause__ or exc.__context__
    return False
