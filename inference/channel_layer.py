"""The Redis channel layer of the serving path: channels_redis with `send` in one round trip.

channels_redis 4's `send` makes four sequential Redis calls (drop expired
messages, count against the capacity, add, set the expiry); the message is
visible to its receiver only after the third. Every engine event the workers
send to a web process, and so every first token, paid those round trips
(BENCHMARKS.md, serving). Here the same four steps run as one Lua script: one
round trip, the same keys, scores, capacity and expiry, atomic where the
original could leak slightly over capacity. Receiving, groups and everything
else are channels_redis's own. `send` restates channels_redis 4.3's (its
prelude, key and score layout): an upgrade of channels_redis must re-check it
(tests/inference/test_channel_layer.py reads our messages back with the stock
layer).

settings.CHANNEL_LAYERS names this class whenever REDIS_URL is set.
"""

from __future__ import annotations

import time

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
