"""Small Postgres connection pools for the checkout (autocommit connections: every ledger
function is one statement and its own transaction).

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
        self._all: List["psycopg.Connection[Any]"] = []

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
                conn = psycopg.connect(self._conninfo, autocommit=True, connect_timeout=int(self._timeout))
                with self._lock:
                    self._all.append(conn)
            try:
                yield conn
            finally:
                if _healthy(conn):
                    self._idle.put(conn)
                else:
                    self._forget(conn)

    def _forget(self, conn: "psycopg.Connection[Any]") -> None:
        conn.close()
        with self._lock:
            if conn in self._all:
                self._all.remove(conn)

    def close(self) -> None:
        with self._lock:
            for c in self._all:
                c.close()
            self._all.clear()


class AsyncPool:
    """The asyncio twin of :class:`SyncPool`."""

    def __init__(self, conninfo: str, max_size: int = 10, connect_timeout: float = 5.0) -> None:
        self._conninfo = conninfo
        self._max = max_size
        self._timeout = connect_timeout
        self._idle: List["psycopg.AsyncConnection[Any]"] = []
        self._slots: Optional[asyncio.Semaphore] = None
        self._all: List["psycopg.AsyncConnection[Any]"] = []

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
                    self._conninfo, autocommit=True, connect_timeout=int(self._timeout)
                )
                self._all.append(conn)
            try:
                yield conn
            finally:
                if _healthy(conn):
                    self._idle.append(conn)
                else:
                    await self._forget(conn)

    async def _forget(self, conn: "psycopg.AsyncConnection[Any]") -> None:
        await conn.close()
        if conn in self._all:
            self._all.remove(conn)

    async def close(self) -> None:
        for c in self._all:
            await c.close()
        self._all.clear()
        self._idle.clear()
