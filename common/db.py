"""Database calls that survive a restarted PostgreSQL.

A connection broken by a database restart fails the first query sent on it
(psycopg: "the connection is closed"). Django replaces such a connection at a
request's start or end (`close_old_connections`; with DB_POOL, the pool checks
each connection it hands out), but a connection broken between two requests
(a background reload on the API's shared thread) would still fail the next
request's first query. `aretry_on_lost_connection` drops the broken connection
and runs the query once more: after a restart, the first request is served.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import TypeVar

from asgiref.sync import sync_to_async
from django.db import InterfaceError, OperationalError, connection

T = TypeVar("T")


def connection_drop() -> None:
    """Close this thread's connection (it goes back to the pool, which discards a broken one)."""
    if not connection.in_atomic_block:
        connection.close()


async def aretry_on_lost_connection(query: Callable[[], Awaitable[T]]) -> T:
    """`await query()`; when its connection was lost, once more on a new connection."""
    try:
        return await query()
    except (OperationalError, InterfaceError):
        await sync_to_async(connection_drop)()  # on the thread the query ran on (the API's shared one)
        return await query()
