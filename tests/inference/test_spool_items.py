"""The spool carries its owner's items in memory on the hot path (encoded once, for the disk) and decodes
only what it reads back from its file: the flusher's retries and the rows it takes over from a dead
process; a row that cannot be decoded is kept and reported, never dropped."""

from __future__ import annotations

import json
import time

import pytest

from inference.worker.spool import ConnectionLost, Spool


class Item:
    def __init__(self, request_id: str, tokens: int = 0) -> None:
        self.request_id, self.tokens = request_id, tokens


class ItemSink:
    """A sink of `Item`s that counts its conversions and keeps what it wrote and settled."""

    def __init__(self) -> None:
        self.encoded = self.decoded = 0
        self.down = False
        self.written: dict[str, Item] = {}
        self.settled: list[str] = []

    def request_id(self, item: Item) -> str:
        return item.request_id

    def encode(self, item: Item) -> dict:
        self.encoded += 1
        return {"request_id": item.request_id, "tokens": item.tokens}

    def decode(self, row: dict) -> Item:
        self.decoded += 1
        if row.get("tokens") == "bad":
            raise ValueError("this row cannot be read")
        return Item(row["request_id"], row["tokens"])

    def write(self, items: list[Item]) -> None:
        if self.down:
            raise ConnectionLost("connection refused")
        for item in items:
            self.written.setdefault(item.request_id, item)

    def settle_start(self, items: list[Item]):
        return lambda: not self.settled.extend(item.request_id for item in items)


@pytest.fixture
def no_flusher(monkeypatch):
    monkeypatch.setattr(Spool, "_start_flusher", lambda self: None)  # these tests flush by hand


def test_the_hot_path_hands_the_items_themselves_and_encodes_each_once(tmp_path, no_flusher):
    sink = ItemSink()
    spool = Spool(tmp_path, sink)
    items = [Item(f"r{i}", i) for i in range(3)]
    spool.add(items)
    assert spool.process(items) == (True, True) and spool.pending() == 0
    assert all(sink.written[item.request_id] is item for item in items)  # the same objects, not copies
    assert sink.settled == ["r0", "r1", "r2"]
    assert (sink.encoded, sink.decoded) == (3, 0)
    spool.close(flush_timeout=0)


def test_what_is_retried_is_decoded_from_the_disk(tmp_path, no_flusher):
    sink = ItemSink()
    spool = Spool(tmp_path, sink)
    items = [Item("a", 5), Item("b", 7)]
    sink.down = True
    spool.add(items)
    assert spool.process(items) == (False, True) and spool.pending() == 2
    sink.down = False
    assert spool.flush_once() == 0
    assert {rid: item.tokens for rid, item in sink.written.items()} == {"a": 5, "b": 7}
    assert all(sink.written[item.request_id] is not item for item in items)  # read back from the file
    assert sink.decoded == 2
    spool.close(flush_timeout=0)


def test_a_row_both_to_write_and_to_settle_is_decoded_once_a_pass(tmp_path, no_flusher, monkeypatch):
    """The flusher reads the rows to write and the rows to settle; a row in both lists is one decode, not two
    (and one that cannot be decoded is tried, and reported, once a pass)."""
    monkeypatch.setattr("inference.worker.spool.RETRY_BASE_S", 0.0)
    sink = ItemSink()
    spool = Spool(tmp_path, sink)
    items = [Item("a", 5), Item("b", 7)]
    sink.down = True
    sink.settle_start = lambda items: lambda: False  # Redis away too
    spool.add(items)
    assert spool.process(items) == (False, False) and spool.pending() == 2
    with spool._db_lock:
        spool._db.execute("INSERT INTO pending (request_id, record, added_at) VALUES (?, ?, ?)",
                          ("bad", json.dumps({"request_id": "bad", "tokens": "bad"}), time.time()))
    sink.down = False
    del sink.settle_start  # back
    assert spool.flush_once() == 1  # the bad row stays
    assert sink.decoded == 3  # a, b and the bad row: each read back once, though each was in both lists
    assert {rid: item.tokens for rid, item in sink.written.items()} == {"a": 5, "b": 7}
    assert sink.settled == ["a", "b"] and [(rid, n) for rid, n, _ in spool.failing()] == [("bad", 1)]
    spool.close(flush_timeout=0)


def test_a_row_that_cannot_be_decoded_is_kept_and_reported_and_blocks_nothing(tmp_path, no_flusher, monkeypatch):
    monkeypatch.setattr("inference.worker.spool.RETRY_BASE_S", 0.0)
    sink = ItemSink()
    spool = Spool(tmp_path, sink)
    with spool._db_lock:  # a row as a broken older writer might have left it
        spool._db.execute("INSERT INTO pending (request_id, record, added_at) VALUES (?, ?, ?)",
                          ("bad", json.dumps({"request_id": "bad", "tokens": "bad"}), time.time()))
    later = [Item("ok", 1)]
    spool.add(later)
    assert spool.process(later) == (True, True)
    assert spool.flush_once() == 1  # still there, with its error
    assert [(rid, attempts) for rid, attempts, _ in spool.failing()] == [("bad", 1)]
    assert "cannot be read" in spool.failing()[0][2] and list(sink.written) == ["ok"]
    spool.close(flush_timeout=0)


def test_a_dead_processs_rows_are_decoded_by_the_spool_that_takes_them_over(tmp_path, no_flusher):
    first = ItemSink()
    spool = Spool(tmp_path, first)
    first.down = True
    items = [Item("x", 3)]
    spool.add(items)
    spool.process(items)
    spool._closed = True  # the process dies: its lock is let go, its file stays
    spool._lock_file.close()
    second = ItemSink()
    successor = Spool(tmp_path, second)
    assert successor.adopted == 1 and successor.flush_once() == 0
    assert second.written["x"].tokens == 3 and second.decoded >= 1
    successor.close(flush_timeout=0)


@pytest.mark.django_db
def test_an_ending_is_not_read_back_from_json_on_its_first_attempt(tenant_factory, settings, tmp_path, monkeypatch):
    from billing.models import UsageRecord
    from billing.services.settlement import Ending, ending_make
    from inference.worker.finish import endings_record, endings_spool

    settings.WORKER_SPOOL_DIR = str(tmp_path / "llm-spool-test-items")

    def refused(row):
        raise AssertionError("from_json on the hot path")

    monkeypatch.setattr(Ending, "from_json", staticmethod(refused))
    tenant = tenant_factory()
    now = time.time()
    ending = ending_make(request_id="hot-1", tenant_id=tenant.pk, api_key_id=None, model="smollm2-135m-instruct",
                         tier=tenant.tier.name, finish_reason="stop", prompt_tokens=10, completion_tokens=3,
                         admitted_at=now, created_at=now)
    assert endings_record([ending]) is True
    assert UsageRecord.objects.filter(request_id="hot-1").count() == 1 and endings_spool().pending() == 0
