"""Reply liveness, one of the small interfaces a job queue is made of: the web side says which
reply channels still have a reader (`reply_channels_touch`), a worker asks which of its channels
do (`reply_channels_alive`) before it sends to them.

`InProcessReplyLiveness` is the embedded mode's (one process: every channel is read); the Redis
backend's is inference.queue.redis_workers.RedisReplyLiveness. A caller that needs only this (the
worker's listeners, the web's reply mailboxes) can be typed against `ReplyLiveness`.
"""

from __future__ import annotations

from typing import Protocol, runtime_checkable


@runtime_checkable
class ReplyLiveness(Protocol):
    def reply_channels_touch(self, names: list[str], ttl_s: float) -> None:
        """(Web.) These reply channels have a reader for `ttl_s` more seconds."""
        ...

    def reply_channels_alive(self, names: set[str]) -> set[str]:
        """(Worker.) The channels of `names` whose reader was alive lately."""
        ...


class InProcessReplyLiveness:
    """One process serves the channels and their readers: nothing to record, every channel alive."""

    def reply_channels_touch(self, names: list[str], ttl_s: float) -> None:
        pass

    def reply_channels_alive(self, names: set[str]) -> set[str]:
        return set(names)
