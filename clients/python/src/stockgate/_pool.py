"""Small Postgres connection pools for the checkout (autocommit connections: every ledger
function is one statement and its own transaction; no server-side prepared statements, so
a pooler in transaction mode in front of the ledger works too).

Anything with a ``connection()`` context manager that yields a psycopg connection works in
their place, e.g. ``psycopg_pool.ConnectionPool`` / ``AsyncConnectionPool``."""

from __future__ import annotations

import asyncio
import contextlib
import queue
import threading
from typing import Any, AsyncIterator, Iterator, List, Optional

import psycopg

__all__ = ["SyncPool", "AsyncPool"]


def _healthy(conn: Any) -> bool:
    if conn.closed or getattr(conn, "broken", False):
        return False
    return bool(conn.info.transaction_status == psycopg.pq.TransactionStatus.IDLE)


class SyncPool:
    """At most ``max_size`` connections to ``conninfo``, opened when first needed."""

    def __init__(self, conninfo: str, max_size: int = 10, connect_timeout: float = 5.0) -> None:
        self._conninfo = conninfo
        self._max = max_size
        self._timeout = connect_timeout
        self._idle: "queue.LifoQueue[psycopg.Connection[Any]]" = queue.LifoQueue()
        self._slots = threading.BoundedSemaphore(max_size)
        self._lock = threading.Lock()
        self._closed = False

    @contextlib.contextmanager
    def connection(self) -> Iterator["psycopg.Connection[Any]"]:
        with self._slots:
            conn: Optional["psycopg.Connection[Any]"] = None
            try:
                conn = self._idle.get_nowait()
            except queue.Empty:
                conn = None
            if conn is None or not _healthy(conn):
                if conn is not None:
                    self._forget(conn)
                conn = psycopg.connect(
                    self._conninfo, autocommit=True, connect_timeout=int(self._timeout), prepare_threshold=None
                )
            try:
                yield conn
            finally:
                with self._lock:
                    keep = _healthy(conn) and not self._closed
                if keep:
                    self._idle.put(conn)
                else:
                    conn.close()

    def _forget(self, conn: "psycopg.Connection[Any]") -> None:
        conn.close()

    def close(self) -> None:
        """Closes the idle connections now and the others as they come back: a connection
        is never closed under a statement that is still running on it."""
        with self._lock:
            self._closed = True
        while True:
            try:
                self._idle.get_nowait().close()
            except queue.Empty:
                return


class AsyncPool:
    """The asyncio twin of :class:`SyncPool`."""

    def __init__(self, conninfo: str, max_size: int = 10, connect_timeout: float = 5.0) -> None:
        self._conninfo = conninfo
        self._max = max_size
        self._timeout = connect_timeout
        self._idle: List["psycopg.AsyncConnection[Any]"] = []
        self._slots: Optional[asyncio.Semaphore] = None
        self._closed = False

    @contextlib.asynccontextmanager
    async def connection(self) -> AsyncIterator["psycopg.AsyncConnection[Any]"]:
        if self._slots is None:
            self._slots = asyncio.Semaphore(self._max)
        async with self._slots:
            conn = self._idle.pop() if self._idle else None
            if conn is None or not _healthy(conn):
                if conn is not None:
                    await self._forget(conn)
                conn = await psycopg.AsyncConnection.connect(
                    self._conninfo, autocommit=True, connect_timeout=int(self._timeout), prepare_threshold=None
                )
            try:
                yield conn
            finally:
                if _healthy(conn) and not self._closed:
                    self._idle.append(conn)
                else:
                    await conn.close()

    async def _forget(self, conn: "psycopg.AsyncConnection[Any]") -> None:
        await conn.close()

    async def close(self) -> None:
        """Closes the idle connections now and the others as they come back."""
        self._closed = True
        while self._idle:
            await self._idle.pop().close()
