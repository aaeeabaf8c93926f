"""The Redis channel layer of the serving path: channels_redis with `send` in one round trip.

channels_redis 4's `send` makes four sequential Redis calls (drop expired
messages, count against the capacity, add, set the expiry); the message is
visible to its receiver only after the third. Every engine event the workers
send to a web process, and so every first token, paid those round trips
(BENCHMARKS.md, serving). Here the same four steps run as one Lua script: one
round trip, the same keys, scores, capacity and expiry, atomic where the
original could leak slightly over capacity. `send` restates channels_redis
4.3's (its prelude, key and score layout): an upgrade of channels_redis must
re-check it (tests/inference/test_channel_layer.py reads our messages back with
the stock layer).

Receiving is channels_redis's own, but for single-reader channels
(`new_single_reader_channel`, `receive_single_reader`): the web process's reply
channel, which every engine event of its requests reaches it through
(inference.api.replies). channels_redis guards each received message against
its receiver being cancelled: a clean-up script before every blocking pop, and
a copy of the popped message into a backup set before it is handed over (a
round trip between the pop and the hand-over), then a task to delete that copy;
plus, for process-local channels, a lock and two tasks per receive. A reply
channel has one reader, a loop that is not cancelled while requests wait, so it
reads with the bare blocking pop: one round trip, the message handed over as
it arrives. Each such channel has a Redis key of its own (its name up to the
`!` is unique), so a pop left blocked by a reader that went away (a closed
event loop) can only ever take its own channel's messages. Other channels
are received as channels_redis does.

settings.CHANNEL_LAYERS names this class whenever REDIS_URL is set.
"""

from __future__ import annotations

import time
import uuid

from channels.exceptions import ChannelFull
from channels_redis.core import RedisChannelLayer as _RedisChannelLayer

# KEYS[1] channel key; ARGV: expired-before score, capacity, score, message, expiry seconds
_SEND = """
redis.call('ZREMRANGEBYSCORE', KEYS[1], 0, ARGV[1])
if redis.call('ZCOUNT', KEYS[1], '-inf', '+inf') >= tonumber(ARGV[2]) then
    return 0
end
redis.call('ZADD', KEYS[1], ARGV[3], ARGV[4])
redis.call('EXPIRE', KEYS[1], ARGV[5])
return 1
"""


class RedisChannelLayer(_RedisChannelLayer):
    async def send(self, channel, message):
        """Send a message onto a (general or specific) channel, in one round trip."""
        assert isinstance(message, dict), "message is not a dict"
        assert self.require_valid_channel_name(channel), "Channel name not valid"
        assert "__asgi_channel__" not in message
        channel_non_local_name = channel
        if "!" in channel:  # process-local: the full name travels in the message
            message = dict(message.items())
            message["__asgi_channel__"] = channel
            channel_non_local_name = self.non_local_name(channel)
            index = self.consistent_hash(channel)
        else:
            index = next(self._send_index_generator)
        channel_key = self.prefix + channel_non_local_name
        added = await self.connection(index).eval(
            _SEND, 1, channel_key,
            int(time.time()) - int(self.expiry), self.get_capacity(channel), repr(time.time()),
            self.serialize(message), int(self.expiry),
        )
        if not added:
            raise ChannelFull()

    # ------------------------------------------------------------ single-reader channels
    async def new_single_reader_channel(self, prefix: str = "reply") -> str:
        """A process-local channel name with a key of its own: `<prefix>.<client prefix>.<uuid>!`.

        Read it with `receive_single_reader` only (channels_redis's `receive`
        expects the part before the `!` to be shared by the whole process).
        """
        return f"{prefix}.{self.client_prefix}.{uuid.uuid4().hex}!"

    async def receive_single_reader(self, channel: str) -> dict:
        """The next message of `channel` (from `new_single_reader_channel`), popped and handed over.

        For one reader that is not cancelled while a message may be in flight:
        a cancellation that lands after Redis popped a message loses it (the
        stock `receive` would keep a backup copy). Waits as long as it takes.
        """
        assert channel.endswith("!"), "not a single-reader channel"
        assert self.require_valid_channel_name(channel, receive=True), "Channel name not valid"
        connection = self.connection(self.consistent_hash(channel))  # where `send` puts it
        key = self.prefix + channel
        while True:
            result = await connection.bzpopmin(key, timeout=self.brpop_timeout)
            if result is not None:
                message = self.deserialize(result[1])
                message.pop("__asgi_channel__", None)
                return message
