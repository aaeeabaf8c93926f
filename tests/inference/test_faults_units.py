"""The pieces the fault tests rely on, in one process: sequence numbers on the web side, the worker's
held deliveries, the usage-record spool, and saying an outage once."""

from __future__ import annotations

import asyncio
import logging
import time


from common.outage import Outage
from inference.api.job_run import EventsLost, JobRun
from inference.protocol import Delta, Done, Usage
from inference.worker.events import EventSink
from inference.worker.spool import ConnectionLost, DictSink, Spool
from tests.inference.queue_helpers import OneMailboxReply


class FnSink(DictSink):
    """A spool sink (inference.worker.spool.SpoolSink) of test functions: `write(rows)`, and `settle(rows)` run
    when the spool waits for the settlement it started (or `settle_start(rows)` itself)."""

    def __init__(self, write, settle=None, settle_start=None):
        self._write, self._settle, self._settle_start = write, settle, settle_start

    def write(self, rows):
        self._write(rows)

    def settle_start(self, rows):
        if self._settle_start is not None:
            return self._settle_start(rows)
        return lambda: self._settle(rows)


async def _read(events) -> tuple[list, JobRun]:
    reply = OneMailboxReply()
    run = JobRun(reply=reply, request_id="r", model="m")
    run.cancel = lambda: setattr(run, "cancelled", True)  # no queue here
    for event in events:
        reply.mailbox.put_nowait(event)
    seen = []
    while run.done is None:
        seen.append(await run.next_event(1.0))
    return seen, run


def test_a_resent_event_is_dropped_and_a_gap_is_reported_with_what_was_billed():
    events = [Delta("r", "a", [1], seq=1), Delta("r", "a", [1], seq=1), Delta("r", "b", [2], seq=2),
              Delta("r", "d", [4], seq=4), Done("r", "abort", Usage(5, 0, 4), seq=5)]
    seen, run = asyncio.run(_read(events))
    assert [e.seq for e in seen] == [1, 2, 5]  # the duplicate and the delta after the gap never reach the client
    assert run.missing == (3, 3) and run.cancelled and run.delivered_tokens == 2
    from inference.api.job_run import events_lost

    error = events_lost(run)
    assert isinstance(error, EventsLost) and error.status_code == 503 and error.code == "stream_interrupted"
    assert "2 of 4 generated tokens" in error.message and "4 completion tokens" in error.message


def test_numbered_events_without_a_gap_pass_unchanged():
    events = [Delta("r", "a", [1], seq=1), Delta("r", "b", [2], seq=2), Done("r", "length", Usage(5, 0, 2), seq=3)]
    seen, run = asyncio.run(_read(events))
    assert seen == events and run.missing is None and not run.cancelled


class _FlakyLayer:
    """A channel layer that fails its first `fail` sends, then records what it is sent."""

    def __init__(self, fail: int) -> None:
        self.fail = fail
        self.sent: list[dict] = []

    async def send(self, channel, message):
        if self.fail:
            self.fail -= 1
            raise ConnectionError("Connection refused")
        self.sent.append(message)


def test_the_worker_holds_undelivered_events_and_sends_them_again_in_order():
    layer = _FlakyLayer(fail=3)
    sink = EventSink(layer=layer)
    try:
        sink.send_many([("c", Delta("r", "a", [1], seq=1))])
        sink.send_many([("c", Delta("r", "b", [2], seq=2))])
        sink.send_many([("c", Done("r", "length", seq=3))])
        assert sink.flush(timeout=10)
    finally:
        sink.close()
    seqs = [event["seq"] for message in layer.sent for event in message["events"]]
    assert seqs == [1, 2, 3]


def test_the_spool_keeps_records_until_the_database_takes_them(tmp_path):
    database: dict[str, dict] = {}
    down = {"db": True}
    settled: list[str] = []

    def write(records):
        if down["db"]:
            raise ConnectionLost("connection refused")
        for record in records:
            database.setdefault(record["request_id"], record)  # ON CONFLICT DO NOTHING

    def settle(records):
        settled.extend(r["request_id"] for r in records)
        return True

    spool = Spool(tmp_path, FnSink(write=write, settle=settle))
    records = [{"request_id": f"r{i}", "completion_tokens": i} for i in range(3)]
    spool.add(records)
    # (the settlement overlaps the first write, before the database is known away: settled, not written)
    assert spool.process(records) == (False, True) and spool.pending() == 3 and database == {}
    assert spool.process(records) == (False, False)  # the database known away: nothing settled before its write
    # the process dies: its file is taken over by the next spool opened in the folder
    spool._closed = True
    spool._wake.set()
    spool._flusher.join(5)
    spool._lock_file.close()
    down["db"] = False
    successor = Spool(tmp_path, FnSink(write=write, settle=settle))
    assert successor.adopted == 3
    assert successor.flush_once() == 0
    assert sorted(database) == ["r0", "r1", "r2"] and sorted(settled) == ["r0", "r1", "r2"]
    assert successor.close() == 0 and list(tmp_path.glob("spool-*.sqlite3")) == []


def test_a_record_that_fails_to_be_written_is_kept_and_retried_without_blocking_the_others(tmp_path, monkeypatch):
    """Issue 35 (2): a record the database refuses for another reason than a lost connection (a price that cannot
    be read, a value its column refuses) is never dropped. It stays in the spool with its error, retried on its own
    backoff; the others of its batch, and later ones, are written meanwhile; it is settled at once all the same."""
    import inference.worker.spool as spool_module

    database, settled, broken = {}, [], {"bad": True}

    def write(records):
        for record in records:
            if record["request_id"] == "bad" and broken["bad"]:
                raise ValueError("price #7 of zz cannot be used")
        database.update({r["request_id"]: r for r in records})

    def settle(records):
        settled.extend(r["request_id"] for r in records)
        return True

    clock = {"now": 1_000.0}
    monkeypatch.setattr(spool_module.time, "time", lambda: clock["now"])
    spool = Spool(tmp_path, FnSink(write=write, settle=settle))
    monkeypatch.setattr(spool, "_start_flusher", lambda: None)  # flushed by hand below
    records = [{"request_id": "good"}, {"request_id": "bad"}, {"request_id": "good-2"}]
    spool.add(records)
    assert spool.process(records) == (False, True)
    assert sorted(database) == ["good", "good-2"] and sorted(settled) == ["bad", "good", "good-2"]
    assert spool.pending() == 1 and spool.failing() == [("bad", 1, "ValueError: price #7 of zz cannot be used")]
    later = [{"request_id": "later"}]
    spool.add(later)
    assert spool.process(later) == (True, True) and "later" in database
    assert spool.flush_once() == 1 and spool.failing()[0][1] == 1  # not due yet: not even tried
    clock["now"] += spool_module.RETRY_BASE_S
    assert spool.flush_once() == 1 and spool.failing()[0][1] == 2  # due: tried, failed, kept
    clock["now"] += spool_module.RETRY_BASE_S  # the backoff doubled: still not due
    assert spool.flush_once() == 1 and spool.failing()[0][1] == 2
    for attempt in range(3, 14):
        clock["now"] += spool_module.RETRY_MAX_S
        spool.flush_once()
    assert spool.failing()[0][1] == 13  # the delay stops growing at RETRY_MAX_S
    broken["bad"] = False  # the cause is fixed
    clock["now"] += spool_module.RETRY_MAX_S
    assert spool.flush_once() == 0 and "bad" in database and settled.count("bad") == 1
    assert spool.close() == 0


def test_close_keeps_a_failing_record_for_the_next_worker_and_an_old_spool_file_is_taken_over(tmp_path):
    """close() does not spin on a record that waits for its retry: it stays on disk, and the next spool opened in
    the folder takes it over with its tries. A file an older worker left (without the tries' columns) is taken
    over too."""
    import sqlite3

    def write(records):
        raise ValueError("refused")

    spool = Spool(tmp_path, FnSink(write=write, settle=lambda records: True))
    records = [{"request_id": "bad"}]
    spool.add(records)
    spool.process(records)
    started = time.monotonic()
    assert spool.close(flush_timeout=5) == 1 and time.monotonic() - started < 2
    old = sqlite3.connect(tmp_path / "spool-1-old.sqlite3")
    old.execute("CREATE TABLE pending (request_id TEXT PRIMARY KEY, record TEXT NOT NULL, "
                "written INTEGER NOT NULL DEFAULT 0, settled INTEGER NOT NULL DEFAULT 0, added_at REAL NOT NULL)")
    old.execute("INSERT INTO pending VALUES ('old', '{\"request_id\": \"old\"}', 0, 1, 1.0)")
    old.commit()
    old.close()
    (tmp_path / "spool-1-old.lock").touch()
    database = {}
    successor = Spool(tmp_path, FnSink(write=lambda records: database.update({r["request_id"]: r for r in records}),
                                       settle=lambda records: True))
    assert successor.adopted == 2
    assert [(rid, attempts) for rid, attempts, _ in successor.failing()] == [("bad", 1)]
    successor._db.execute("UPDATE pending SET retry_at = 0")  # due now
    assert successor.flush_once() == 0 and sorted(database) == ["bad", "old"]
    successor.close()


def test_a_closed_spool_writes_nothing_more(tmp_path):
    """close() waits for the flusher thread: after it returns, no write runs (a worker's shutdown; a test's end)."""
    import threading

    writes: list[int] = []
    entered = threading.Event()

    def write(records):
        writes.append(len(records))
        if len(writes) > 1:  # the flusher's retry: slow, so close() finds it mid-write
            entered.set()
            time.sleep(0.3)
        raise ConnectionLost("connection refused")

    spool = Spool(tmp_path, FnSink(write=write, settle=lambda records: True))
    records = [{"request_id": "r1"}]
    spool.add(records)
    spool.process(records)
    assert entered.wait(5)
    assert spool.close(flush_timeout=0) == 1
    assert not spool._flusher.is_alive()
    count = len(writes)
    time.sleep(0.6)
    assert len(writes) == count


def test_the_settlement_overlaps_the_insert_and_a_failed_one_is_retried(tmp_path):
    """Spool.process starts the settlement before the write and waits for both; a settlement that failed
    leaves the record spooled until the spool's flusher settles it (the write is not repeated)."""
    import threading

    started = threading.Event()
    writes: list[str] = []
    settled: list[str] = []
    outcome = {"ok": False}

    def write(records):
        assert started.wait(5)  # the settlement was started first: the two round trips overlap
        writes.extend(r["request_id"] for r in records)

    def settle_start(records):
        started.set()
        return lambda: outcome["ok"] and not settled.extend(r["request_id"] for r in records)

    spool = Spool(tmp_path, FnSink(write=write, settle_start=settle_start))
    spool._start_flusher = lambda: None  # not before the settlement can succeed (below)
    records = [{"request_id": "r1"}]
    spool.add(records)
    assert spool.process(records) == (True, False)
    outcome["ok"] = True
    del spool._start_flusher
    spool.retry_later()
    deadline = time.monotonic() + 5
    while spool.pending() and time.monotonic() < deadline:  # the spool's flusher, woken by the failure
        time.sleep(0.01)
    assert spool.pending() == 0 and writes == ["r1"] and settled == ["r1"]
    started.clear()
    records = [{"request_id": "r2"}]
    spool.add(records)
    assert spool.process(records) == (True, True) and spool.pending() == 0
    assert writes == ["r1", "r2"] and settled == ["r1", "r2"]
    spool.close()


def test_adding_is_fsynced_and_marking_done_is_not(tmp_path):
    """A record is on disk before anything else (synchronous=FULL); marking it done skips the fsync (a mark lost
    in a power failure only repeats idempotent work) and leaves the connection at FULL for the next add."""
    statements: list[str] = []
    spool = Spool(tmp_path, FnSink(write=lambda records: None, settle=lambda records: True))
    spool._db.set_trace_callback(statements.append)
    records = [{"request_id": "r1"}]
    spool.add(records)
    assert spool.process(records) == (True, True)
    spool._db.set_trace_callback(None)
    begins = [i for i, sql in enumerate(statements) if sql.startswith("BEGIN")]
    assert len(begins) == 2  # add, then done
    assert statements.index("PRAGMA synchronous=NORMAL") == begins[1] - 1  # only for the second: after add's COMMIT
    assert spool._db.execute("PRAGMA synchronous").fetchone()[0] == 2  # FULL again
    spool.close()


def test_an_outage_is_said_once_and_its_end_once(caplog):
    outage = Outage(logging.getLogger("test.outage"), "thing")
    with caplog.at_level(logging.WARNING, logger="test.outage"):
        for _ in range(50):
            outage.failed("refused")
        outage.ok()
        outage.ok()
    messages = [record.getMessage() for record in caplog.records]
    assert len(messages) == 2 and "unavailable: refused" in messages[0] and "back after" in messages[1]
    assert "(50 failures)" in messages[1]




def test_a_reply_channel_is_judged_dead_only_after_its_key_is_gone_for_the_timeout():
    from types import SimpleNamespace

    from inference.worker.listeners import ReplyWatch

    alive = {"a", "b"}
    replies = SimpleNamespace(reply_channels_alive=lambda channels: channels & alive)
    watch = ReplyWatch(replies=replies, timeout=3.0)
    active = {rid: SimpleNamespace(job=SimpleNamespace(reply_channel=ch), aborting=False)
              for rid, ch in (("r1", "a"), ("r2", "b"), ("r3", "b"))}
    assert watch.unheard(active, 0.0) == (set(), set())
    alive.discard("b")  # its web process stopped refreshing the key
    assert watch.unheard(active, 1.0) == (set(), set())  # gone, but not for long enough
    alive.add("b")  # back (e.g. after a Redis restart): the clock starts again
    assert watch.unheard(active, 2.0) == (set(), set())
    alive.discard("b")
    assert watch.unheard(active, 3.0) == (set(), set())
    assert watch.unheard(active, 6.0) == ({"b"}, {"r2", "r3"})


def test_a_spooled_row_is_kept_as_given_and_written_from_the_spool_as_it_was_added(tmp_path):
    """The spool knows nothing of its rows: a JSON object (the worker's: an Ending with its cost,
    billing.services.settlement) comes back from the file as it went in, for the sink to write."""
    written: list[dict] = []
    down = {"db": True}

    def write(records):
        if down["db"]:
            raise ConnectionLost("connection refused")
        written.extend(records)

    spool = Spool(tmp_path, FnSink(write=write, settle=lambda records: True))
    record = {"request_id": "r-costed", "completion_tokens": 3, "created_at": 1764120000.25,
              "priced": {"terms": None, "multiplier_milli": 1000, "cost": {"input": 10**30, "cached_input": 0,
                                                                            "output": 7}}}
    spool.add([record])
    assert spool.process([record]) == (False, True) and spool.pending() == 1
    down["db"] = False
    assert spool.flush_once() == 0
    # (the spool's own flusher thread may have written it too, as a second worker could: the insert is idempotent)
    assert written and all(r == record for r in written)
    spool.close()


def test_the_spool_and_the_heartbeats_know_nothing_of_their_owners():
    """Issue 36: the spool is a durable queue (no billing, no worker: its sink is given), and the heartbeats are
    given a `figures` function, not the loop (no import cycle: finish <-> spool, heartbeat <-> loop)."""
    import ast
    from pathlib import Path

    import inference.worker.heartbeat as heartbeat
    import inference.worker.spool as spool

    def imported(module) -> set[str]:
        tree = ast.parse(Path(module.__file__).read_text())
        names = {alias.name for node in ast.walk(tree) if isinstance(node, ast.Import) for alias in node.names}
        return names | {"." * node.level + (node.module or "") for node in ast.walk(tree)
                        if isinstance(node, ast.ImportFrom)}

    assert not {name for name in imported(spool) if name.startswith(("billing", "inference", "."))}
    assert not {name for name in imported(heartbeat) if name.startswith(("inference.worker", "."))}
