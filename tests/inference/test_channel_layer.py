"""The serving path's Redis channel layer: channels_redis's storage, `send` in one round trip, single-reader receive (real Redis)."""

from __future__ import annotations

import asyncio
import time

import pytest
import redis
from channels.exceptions import ChannelFull
from channels_redis.core import RedisChannelLayer as StockLayer

from inference.channel_layer import RedisChannelLayer
from inference.protocol import BATCH
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
    message = {"type": BATCH, "events": [{"request_id": "r1", "text": "héllo", "token_ids": [1, 2]}]}
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
    await layer.send(channel, {"type": BATCH, "events": []})
    monkeypatch.undo()
    assert len(calls) == 1 and calls[0].upper() in {"EVAL", "EVALSHA"}
    assert (await layer.receive(channel))["type"] == BATCH


async def test_a_single_reader_channel_pops_with_one_command_and_keeps_no_backup(layer, monkeypatch):
    channel = await layer.new_single_reader_channel("reply")
    assert channel.startswith(f"reply.{layer.client_prefix}.") and channel.endswith("!")
    message = {"type": BATCH, "events": [{"request_id": "r1", "text": "héllo"}]}
    await layer.send(channel, message)
    connection = layer.connection(layer.consistent_hash(channel))
    calls: list[str] = []
    execute = type(connection).execute_command

    async def counting(self, *args, **options):
        calls.append(str(args[0]).upper())
        return await execute(self, *args, **options)

    monkeypatch.setattr(type(connection), "execute_command", counting)
    assert await layer.receive_single_reader(channel) == message
    monkeypatch.undo()
    assert calls == ["BZPOPMIN"]
    client = redis.Redis.from_url(REDIS_TEST_URL)
    assert client.keys(layer.prefix + "*") == []  # no backup set, nothing left behind
    client.close()


async def test_single_reader_channels_have_keys_of_their_own(layer):
    one, two = await layer.new_single_reader_channel("reply"), await layer.new_single_reader_channel("reply")
    await layer.send(one, {"type": "x", "to": "one"})
    await layer.send(two, {"type": "x", "to": "two"})
    client = redis.Redis.from_url(REDIS_TEST_URL)
    assert client.zcard(layer.prefix + one) == 1 and client.zcard(layer.prefix + two) == 1
    client.close()
    assert (await layer.receive_single_reader(two))["to"] == "two"
    assert (await layer.receive_single_reader(one))["to"] == "one"


async def test_a_single_reader_receive_waits_past_the_blocking_pops_timeout(layer):
    layer.brpop_timeout = 1  # each BZPOPMIN gives up after a second; the receive goes on waiting
    channel = await layer.new_single_reader_channel("reply")
    reader = asyncio.ensure_future(layer.receive_single_reader(channel))
    await asyncio.sleep(1.5)
    assert not reader.done()
    await layer.send(channel, {"type": "late"})
    assert (await asyncio.wait_for(reader, 5))["type"] == "late"
