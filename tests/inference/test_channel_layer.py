"""The serving path's Redis channel layer: channels_redis's storage, `send` in one round trip (real Redis)."""

from __future__ import annotations

import time

import pytest
import redis
from channels.exceptions import ChannelFull
from channels_redis.core import RedisChannelLayer as StockLayer

from inference.channel_layer import RedisChannelLayer
from tests.inference.queue_helpers import REDIS_TEST_URL, require_redis


def _layer(cls=RedisChannelLayer, **options):
    require_redis()
    return cls(hosts=[{"address": REDIS_TEST_URL, "socket_timeout": 30}], prefix="test-layer:", **options)


@pytest.fixture
async def layer():
    layer = _layer(capacity=2, expiry=30)
    yield layer
    await layer.flush()
    await layer.close_pools()


async def test_a_process_channel_message_arrives_whole_and_the_stock_layer_reads_it(layer):
    channel = await layer.new_channel("reply.")
    message = {"type": "engine.events", "events": [{"request_id": "r1", "text": "héllo", "token_ids": [1, 2]}]}
    await layer.send(channel, message)
    assert await layer.receive(channel) == message
    general = "general.one"
    await layer.send(general, {"type": "x", "n": 1})
    stock = _layer(StockLayer)  # same keys and encoding: channels_redis itself reads what we wrote
    assert await stock.receive(general) == {"type": "x", "n": 1}
    await stock.close_pools()


async def test_capacity_expiry_and_stale_messages_as_channels_redis(layer):
    channel = "general.capped"
    key = layer.prefix + channel
    client = redis.Redis.from_url(REDIS_TEST_URL)
    client.zadd(key, {b"stale": time.time() - 3600})  # older than the expiry: dropped by the next send
    await layer.send(channel, {"type": "a"})
    await layer.send(channel, {"type": "b"})
    assert client.zcard(key) == 2 and client.zscore(key, b"stale") is None
    assert 0 < client.ttl(key) <= 30
    with pytest.raises(ChannelFull):
        await layer.send(channel, {"type": "c"})
    assert (await layer.receive(channel))["type"] == "a"  # oldest first
    await layer.send(channel, {"type": "c"})
    assert [(await layer.receive(channel))["type"] for _ in range(2)] == ["b", "c"]
    client.close()


async def test_send_is_one_round_trip(layer, monkeypatch):
    channel = await layer.new_channel("reply.")
    connection = layer.connection(layer.consistent_hash(channel))
    calls: list[str] = []
    execute = type(connection).execute_command

    async def counting(self, *args, **options):
        calls.append(str(args[0]))
        return await execute(self, *args, **options)

    monkeypatch.setattr(type(connection), "execute_command", counting)
    await layer.send(channel, {"type": "engine.events", "events": []})
    monkeypatch.undo()
    assert len(calls) == 1 and calls[0].upper() in {"EVAL", "EVALSHA"}
    assert (await layer.receive(channel))["type"] == "engine.events"
