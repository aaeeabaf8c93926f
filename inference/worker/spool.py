"""The spool: a durable queue of finished requests' endings, each kept on disk until its sink has written it
and settled it, however long PostgreSQL or Redis is away.

    spool = spool_open(directory, sink)  # this process's spool; `sink` is its owner's (a SpoolSink)
    spool.add(items)                    # durable (fsynced) before anything else happens
    spool.process(items)                # sink.write, and sink.settle_start overlapping it
    spool.done(ids, written=True)       # written / settled: forgotten when both

The spool knows nothing of what its items mean: its owner's sink says what an item's request id is, how it is kept
on disk (`encode`: a JSON object; `decode`: back) and what writing and settling items is. Every finished request
passes through here (inference.worker.finish: its `Ending`, whose sink is billing's settlement service). `add`
encodes its items once, into a SQLite file of this process committed with `synchronous=FULL` (fsynced), before
anything else; `process` hands the same in-memory items to the sink (the record inserted, the reservation settled;
what was done is marked without an fsync of its own: see `done`). Only what is read back from the file is decoded:
what one attempt could not do (the database or Redis away) stays there, and a flusher thread retries it every
FLUSH_INTERVAL_S (backing off to FLUSH_MAX_INTERVAL_S) until it is done, then forgets it; a row that cannot be
decoded is kept and reported as a record that fails (below). The insert is idempotent on request_id and a
reservation is settled once, so a crash between the insert and the spool's update writes nothing twice.

A process that dies leaves its file behind; the next spool opened in the same folder (the restarted worker,
or another one) takes it over: each file is held with an exclusive `flock` on its `.lock` while its process
lives, so a file whose lock can be taken belongs to nobody, and its rows are copied into the taker's file
before it is deleted.

A record that fails for another reason than a lost connection (a price row that cannot be read, a value its column
refuses) is never dropped: the request was served, so it is billed once the cause is fixed. It stays in the file,
logged at ERROR with the reason at each try, and is retried on its own backoff (RETRY_BASE_S doubling to
RETRY_MAX_S; `retry_at`), so it never blocks the others: a batch holding it is written record by record, and the
flusher only picks records that are due. Its reservation is settled at once all the same (the settlement does not
wait for the record), by this process, not only by the beat's stale sweep.
"""

from __future__ import annotations

import fcntl
import json
import logging
import os
import sqlite3
import threading
import time
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any, Generic, Protocol, TypeVar

from common.outage import Outage

logger = logging.getLogger(__name__)

FLUSH_INTERVAL_S = 0.5
FLUSH_MAX_INTERVAL_S = 5.0
FLUSH_BATCH = 500
RETRY_BASE_S = 1.0  # a record that failed (not a lost connection): its first retry, then doubling
RETRY_MAX_S = 300.0

_SCHEMA = ("CREATE TABLE IF NOT EXISTS pending (request_id TEXT PRIMARY KEY, record TEXT NOT NULL, "
           "written INTEGER NOT NULL DEFAULT 0, settled INTEGER NOT NULL DEFAULT 0, added_at REAL NOT NULL, "
           "attempts INTEGER NOT NULL DEFAULT 0, retry_at REAL NOT NULL DEFAULT 0, error TEXT NOT NULL DEFAULT '')")
# columns added since the first spool files: (name, declaration), added to an older file when it is opened
_ADDED_COLUMNS = (("attempts", "INTEGER NOT NULL DEFAULT 0"), ("retry_at", "REAL NOT NULL DEFAULT 0"),
                  ("error", "TEXT NOT NULL DEFAULT ''"))
_COLUMNS = "request_id, record, written, settled, added_at, attempts, retry_at, error"
_dumps = json.JSONEncoder(check_circular=False).encode  # a row is a tree of plain values: 10% less than json.dumps
_UNDECODABLE = object()  # flush_once: a row whose record its sink cannot decode


class ConnectionLost(Exception):
    """The store could not be reached: keep the records and try again later."""


Item = TypeVar("Item")


class SpoolSink(Protocol[Item]):
    """Where a spool's items go, given by its owner (the worker's: inference.worker.finish.EndingsSink):
    an item's key (`request_id`: one row each), its JSON object for the disk (`encode`) and back (`decode`:
    anything raised keeps the row, reported); `write(items)`, idempotent: ConnectionLost when the store is
    away (all kept, retried later), anything else when one is bad (the spool then tries them one by one);
    `settle_start(items)`, idempotent: the returned function waits for it (True: settled)."""

    def request_id(self, item: Item) -> str: ...
    def encode(self, item: Item) -> dict[str, Any]: ...
    def decode(self, row: dict[str, Any]) -> Item: ...
    def write(self, items: list[Item]) -> None: ...
    def settle_start(self, items: list[Item]) -> Callable[[], bool]: ...


class DictSink:
    """A base for a sink whose items are their JSON objects themselves, each with its `request_id`."""

    def request_id(self, item: dict[str, Any]) -> str:
        return item["request_id"]

    def encode(self, item: dict[str, Any]) -> dict[str, Any]:
        return item

    def decode(self, row: dict[str, Any]) -> dict[str, Any]:
        return row


def _connect(path: Path) -> sqlite3.Connection:
    conn = sqlite3.connect(path, timeout=30, isolation_level=None, check_same_thread=False)
    conn.execute("PRAGMA journal_mode=WAL")
    conn.execute("PRAGMA synchronous=FULL")  # a committed row is on disk
    conn.execute(_SCHEMA)
    present = {row[1] for row in conn.execute("PRAGMA table_info(pending)")}
    for name, declaration in _ADDED_COLUMNS:
        if name not in present:  # a file an older worker left behind
            conn.execute(f"ALTER TABLE pending ADD COLUMN {name} {declaration}")
    return conn


class Spool(Generic[Item]):
    def __init__(self, directory: Path, sink: SpoolSink[Item]) -> None:
        self.directory = Path(directory)
        self.directory.mkdir(parents=True, exist_ok=True)
        self.sink = sink
        name = f"spool-{os.getpid()}-{uuid.uuid4().hex[:8]}"
        self.path = self.directory / f"{name}.sqlite3"
        self._lock_file = open(self.directory / f"{name}.lock", "w")  # noqa: SIM115 - held for the process's life
        fcntl.flock(self._lock_file, fcntl.LOCK_EX)
        self._db = _connect(self.path)
        self._db_lock = threading.Lock()
        self._wake = threading.Event()
        self._flusher: threading.Thread | None = None
        self._closed = False
        self.db_outage = Outage(logger, f"usage-record spool {name}: database")
        self.adopted = self._adopt_orphans()
        if self.adopted:
            logger.warning("spool %s took over %d pending usage records of a stopped process", name, self.adopted)
            self._start_flusher()

    # ------------------------------------------------------------ the hot path
    def add(self, items: list[Item]) -> None:
        """Keep `items` on disk (fsynced; encoded by the sink) until `done`."""
        now, sink = time.time(), self.sink
        rows = [(sink.request_id(item), _dumps(sink.encode(item)), now) for item in items]
        with self._db_lock:
            self._db.execute("BEGIN IMMEDIATE")
            self._db.executemany("INSERT OR IGNORE INTO pending (request_id, record, added_at) VALUES (?, ?, ?)", rows)
            self._db.execute("COMMIT")

    def done(self, request_ids: list[str], *, written: bool = False, settled: bool = False) -> None:
        """Mark what was done for `request_ids`; a row both written and settled is forgotten."""
        if not request_ids or not (written or settled):
            return
        with self._db_lock:
            # Not fsynced (WAL, synchronous=NORMAL: the next `add` syncs it along): a mark lost in a power
            # failure only writes the record and settles it again, and both are done once whatever the tries.
            self._db.execute("PRAGMA synchronous=NORMAL")
            try:
                self._db.execute("BEGIN IMMEDIATE")
                for column, flag in (("written", written), ("settled", settled)):
                    if flag:
                        self._db.executemany(f"UPDATE pending SET {column} = 1 WHERE request_id = ?",
                                             [(rid,) for rid in request_ids])
                self._db.execute("DELETE FROM pending WHERE written = 1 AND settled = 1")
                self._db.execute("COMMIT")
            finally:
                self._db.execute("PRAGMA synchronous=FULL")
        if self.pending():
            self._start_flusher()

    def pending(self) -> int:
        with self._db_lock:
            return self._db.execute("SELECT count(*) FROM pending").fetchone()[0]

    def failing(self) -> list[tuple[str, int, str]]:
        """(request id, attempts, last error) of the records that failed other than by a lost connection."""
        with self._db_lock:
            return self._db.execute("SELECT request_id, attempts, error FROM pending WHERE written = 0 AND "
                                    "attempts > 0 ORDER BY added_at").fetchall()

    def _due(self) -> bool:
        """Something to do now: a record to settle, or one to write whose retry time has come."""
        with self._db_lock:
            return self._db.execute("SELECT EXISTS (SELECT 1 FROM pending WHERE settled = 0 OR "
                                    "(written = 0 AND retry_at <= ?))", (time.time(),)).fetchone()[0] == 1

    def _next_retry_in(self) -> float | None:
        """Seconds until the earliest failed record is due (None: none waits)."""
        with self._db_lock:
            at = self._db.execute("SELECT min(retry_at) FROM pending WHERE written = 0").fetchone()[0]
        return None if at is None else max(0.0, at - time.time())

    def retry_later(self) -> None:
        """Something was left undone: make sure the flusher runs."""
        self._start_flusher()
        self._wake.set()

    # ------------------------------------------------------------ one pass
    def process(self, records: list[Item]) -> tuple[bool, bool]:
        """Write and settle `records` (items already added, handed to the sink as they are): (all written,
        all settled). Never raises.

        The settlement runs while the write does (two round trips to two servers, overlapped): one that
        fails is retried like a failed write, and the order of the two does not matter (the spool keeps
        each record until both are done; each is done once). While the database is known to be away,
        nothing is settled until its record is written."""
        ids = [self.sink.request_id(r) for r in records]
        waiting = None
        if not self.db_outage.down:
            waiting = self._settle_started(records)
        written_ids = self._write(records)
        written = len(written_ids) == len(ids)
        settled = False
        if waiting is None and written:
            waiting = self._settle_started(records)
        if waiting is not None:
            settled = self._settle_waited(waiting)
        if settled and len(written_ids) == len(ids):  # the usual case: one mark
            self.done(ids, written=True, settled=True)
        else:
            self.done(written_ids, written=True)
            self.done(ids, settled=settled)
        if not (written and settled):
            self.retry_later()
        return written, settled

    def _settle_started(self, records: list[Item]) -> Callable[[], bool]:
        try:
            return self.sink.settle_start(records)
        except Exception:  # noqa: BLE001 - a settler that raises: settled later, by the flusher
            logger.exception("could not start settling %s", [self.sink.request_id(r) for r in records])
            return lambda: False

    @staticmethod
    def _settle_waited(waiting: Callable[[], bool]) -> bool:
        try:
            return bool(waiting())
        except Exception:  # noqa: BLE001
            logger.exception("settling usage records failed")
            return False

    def _write(self, records: list[Item]) -> list[str]:
        """Write `records`; the request ids written (all, or none while the database is away, or all but
        the ones that fail on their own: each of those is kept with its error and its next retry time)."""
        try:
            self.sink.write(records)
        except ConnectionLost as exc:
            self.db_outage.failed(exc)
            return []
        except Exception as exc:  # noqa: BLE001 - a bad record: find it, keep the others
            if len(records) > 1:
                return [rid for record in records for rid in self._write([record])]
            self._failed(self.sink.request_id(records[0]), exc)
            return []
        self.db_outage.ok()
        return [self.sink.request_id(record) for record in records]

    def _failed(self, request_id: str, exc: Exception) -> None:
        """Keep a record that failed to be written, with its error, until its next retry (backing off)."""
        error = f"{type(exc).__name__}: {exc}".strip()[:2000]
        with self._db_lock:
            row = self._db.execute("SELECT attempts FROM pending WHERE request_id = ?", (request_id,)).fetchone()
            attempts = (row[0] if row else 0) + 1
            delay = min(RETRY_MAX_S, RETRY_BASE_S * 2 ** min(attempts - 1, 30))
            self._db.execute("UPDATE pending SET attempts = ?, retry_at = ?, error = ? WHERE request_id = ?",
                             (attempts, time.time() + delay, error, request_id))
        logger.error("usage record of %s cannot be written (try %d: %s); it stays in the spool %s and is retried "
                     "in %.0f s (the request was served: it is billed once this is fixed)",
                     request_id, attempts, error, self.path.name, delay, exc_info=attempts == 1)

    def flush_once(self) -> int:
        """Retry what is due (the oldest records to write whose retry time has come, the oldest to settle),
        decoded from the disk; returns how many rows are left."""
        with self._db_lock:
            unwritten = self._db.execute(
                "SELECT request_id, record FROM pending WHERE written = 0 AND retry_at <= ? ORDER BY added_at "
                "LIMIT ?", (time.time(), FLUSH_BATCH)).fetchall()
            unsettled = self._db.execute(
                "SELECT request_id, record FROM pending WHERE settled = 0 ORDER BY added_at LIMIT ?",
                (FLUSH_BATCH,)).fetchall()
        decoded: dict[str, Any] = {}  # request id -> its item (or _UNDECODABLE): a row in both lists, decoded once
        unwritten_items = self._decoded(unwritten, decoded, report=True)
        unsettled_items = self._decoded(unsettled, decoded, report=False)
        if unwritten_items:
            self.done(self._write(unwritten_items), written=True)
        if unsettled_items and not self.db_outage.down and self._settle_waited(self._settle_started(unsettled_items)):
            self.done([self.sink.request_id(item) for item in unsettled_items], settled=True)
        return self.pending()

    def _decoded(self, rows: list[tuple[str, str]], decoded: dict[str, Any], *, report: bool) -> list[Item]:
        """The items of rows read from the disk, each decoded once into `decoded`; one that cannot be is kept
        (`report`: as a record that failed to be written; an unsettled one is also unwritten, or was before)."""
        for request_id, record in rows:
            if request_id not in decoded:
                try:
                    decoded[request_id] = self.sink.decode(json.loads(record))
                except Exception as exc:  # noqa: BLE001 - never dropped: fixed, it is written
                    decoded[request_id] = _UNDECODABLE
                    if report:
                        self._failed(request_id, exc)
        return [decoded[request_id] for request_id, _ in rows if decoded[request_id] is not _UNDECODABLE]

    # ------------------------------------------------------------ the flusher
    def _start_flusher(self) -> None:
        if self._closed or (self._flusher is not None and self._flusher.is_alive()):
            return
        self._flusher = threading.Thread(target=self._flush_loop, name="usage-spool", daemon=True)
        self._flusher.start()

    def _flush_loop(self) -> None:
        interval = FLUSH_INTERVAL_S
        while not self._closed:
            self._wake.wait(interval)
            self._wake.clear()
            if self._closed:
                return
            try:
                left = self.flush_once()
            except Exception:  # noqa: BLE001 - never let the flusher die
                logger.exception("flushing the usage-record spool failed")
                left = 1
            if not left:
                return
            interval = min(FLUSH_MAX_INTERVAL_S, interval * 2) if self.db_outage.down else FLUSH_INTERVAL_S
            if not self.db_outage.down and not self._due():  # only failed records, waiting for their retry
                interval = max(FLUSH_INTERVAL_S, min(self._next_retry_in() or 0.0, FLUSH_MAX_INTERVAL_S))

    def close(self, *, flush_timeout: float = 5.0) -> int:
        """Try to empty the spool for `flush_timeout` s, then close; returns the rows left on disk."""
        deadline = time.monotonic() + flush_timeout
        left = self.pending()
        while left and self._due() and time.monotonic() < deadline:  # (failed records wait for the next worker)
            left = self.flush_once()
            if left:
                time.sleep(FLUSH_INTERVAL_S)
        left = self.pending()
        self._closed = True
        self._wake.set()
        flusher = self._flusher
        if flusher is not None and flusher is not threading.current_thread():
            flusher.join(timeout=max(1.0, flush_timeout))  # no write from it after close
        with self._db_lock:
            self._db.close()
        if not left:
            for path in (self.path, Path(f"{self.path}-wal"), Path(f"{self.path}-shm")):
                path.unlink(missing_ok=True)
            (self.directory / f"{self.path.stem}.lock").unlink(missing_ok=True)
        else:  # its lock file stays (unlocked below), so the next spool opened in the folder takes the file over
            logger.error("%d usage records stay in %s for the next worker to write", left, self.path)
        self._lock_file.close()
        return left

    # ------------------------------------------------------------ orphans
    def _adopt_orphans(self) -> int:
        """Copy the rows of every spool file in the folder whose process is gone, then delete it."""
        adopted = 0
        for lock_path in sorted(self.directory.glob("spool-*.lock")):
            if lock_path.stem == self.path.stem:
                continue
            with open(lock_path, "a") as handle:
                try:
                    fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
                except BlockingIOError:
                    continue  # its process is alive
                adopted += self._adopt(self.directory / f"{lock_path.stem}.sqlite3")
                lock_path.unlink(missing_ok=True)
        return adopted

    def _adopt(self, path: Path) -> int:
        if not path.exists():
            return 0
        other = _connect(path)
        try:
            rows = other.execute(f"SELECT {_COLUMNS} FROM pending").fetchall()
        finally:
            other.close()
        with self._db_lock:
            self._db.execute("BEGIN IMMEDIATE")
            self._db.executemany(f"INSERT OR IGNORE INTO pending ({_COLUMNS}) VALUES (?, ?, ?, ?, ?, ?, ?, ?)", rows)
            self._db.execute("COMMIT")
        for leftover in (path, Path(f"{path}-wal"), Path(f"{path}-shm")):
            leftover.unlink(missing_ok=True)
        return len(rows)


_spool: Spool | None = None
_spool_lock = threading.Lock()


def spool_open(directory: Path, sink: SpoolSink[Any]) -> Spool[Any]:
    """This process's spool (opened in `directory`, writing to `sink`, on first use; taking over the rows
    of dead processes there)."""
    global _spool
    if _spool is None:
        with _spool_lock:
            if _spool is None:
                _spool = Spool(Path(directory), sink)
    return _spool


def spool_close(*, flush_timeout: float = 5.0) -> int:
    """Flush (for at most `flush_timeout` s) and close this process's spool; the rows left on disk."""
    global _spool
    with _spool_lock:
        spool, _spool = _spool, None
    return spool.close(flush_timeout=flush_timeout) if spool is not None else 0
