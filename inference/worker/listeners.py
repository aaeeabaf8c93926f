"""Whether anybody still reads a job's reply channel.

Each web process refreshes a liveness key per reply channel while its
requests wait (inference.api.replies, `ReplyLiveness.reply_channels_touch`). A
worker asks about the channels of the jobs it holds about once a second
(`ReplyWatch.unheard`); a channel whose key has been gone for `timeout`
seconds (judged only from answers Redis gave: an outage judges nothing, and a
web process re-touches its keys within a second of Redis coming back) belongs
to a dead web process, and its jobs are aborted: generating for nobody would
cost a slot and bill the tenant for text nobody received.
"""

from __future__ import annotations

from typing import Any

from inference.queue import ReplyLiveness


class ReplyWatch:
    def __init__(self, *, replies: ReplyLiveness, timeout: float) -> None:
        self.replies = replies
        self.timeout = timeout
        self.interval = min(1.0, timeout / 3)
        self.next_at = 0.0  # monotonic time of the next check
        self._missing: dict[str, float] = {}  # channel -> monotonic time it was first seen gone

    def unheard(self, active: dict[str, Any], now: float) -> tuple[set[str], set[str]]:
        """(dead channels, ids of their jobs) among `active` (request id -> ActiveRequest) not yet aborting.
        Raises what the queue raises when Redis cannot be asked."""
        self.next_at = now + self.interval
        channels = {a.job.reply_channel for a in active.values() if not a.aborting}
        alive = self.replies.reply_channels_alive(channels)
        for channel in list(self._missing):
            if channel in alive or channel not in channels:
                del self._missing[channel]
        dead = {channel for channel in channels - alive
                if now - self._missing.setdefault(channel, now) >= self.timeout}
        for channel in dead:
            self._missing.pop(channel, None)
        ids = {rid for rid, a in active.items() if a.job.reply_channel in dead and not a.aborting}
        return dead, ids
