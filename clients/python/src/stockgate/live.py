"""A sale's live counts and a buyer's place, pushed by the server over RESP pub/sub
(docs/protocol.md, section 4a, "Live counts over RESP"): ``SUBSCRIBE sale:<sku>:live``
and ``SUBSCRIBE place:<ticket>`` on a connection of their own, each message parsed into
:class:`~stockgate.LiveCounts`.

:meth:`stockgate.Client.watch_sale` / :meth:`~stockgate.Client.watch_place` give a
:class:`LiveWatch` (an iterator), the asyncio client's an :class:`AsyncLiveWatch` (an
async iterator). A refused subscription (``-NOSALE``, ``-NOROOM``, ``-BADTICKET``, the
server's watcher limit) raises the package's typed error; a lost connection raises
:class:`~stockgate.Unavailable` and ends the watch: watch again for the counts now (the
first message of a subscription is always the current state, so nothing is missed but
intermediate states)."""

from __future__ import annotations

import inspect
import time
from typing import Any, Callable, Dict, Optional

import redis
import redis.exceptions as rex

from . import _parse
from ._core import translate
from .errors import StockgateError, Unavailable
from .results import LiveCounts

__all__ = ["LiveWatch", "AsyncLiveWatch", "sale_channel", "place_channel"]

#: How long one read waits before the watch looks again (a quiet sale sends nothing; each
#: wait is bounded so that a read never runs into the connection's socket timeout).
_POLL = 1.0


def sale_channel(sku: str) -> str:
    """A sale's live channel."""
    return f"sale:{sku}:live"


def place_channel(ticket: str) -> str:
    """A buyer's channel: its place and the sale's counts."""
    return f"place:{ticket}"


def _protocol(r: Any) -> int:
    pool = getattr(r, "connection_pool", None)
    kw = getattr(pool, "connection_kwargs", None) or {}
    try:
        return int(kw.get("protocol") or 2)
    except (TypeError, ValueError):
        return 2


def _echo(response: Any) -> Any:
    return response


async def _async_echo(response: Any) -> Any:
    return response


def _awaits_push_handler() -> bool:
    """Whether this redis-py's asyncio RESP3 parser awaits the push handler (newer
    releases) or calls it (older ones)."""
    try:
        from redis._parsers.resp3 import _AsyncRESP3Parser
    except ImportError:  # pragma: no cover - every supported release has it
        return True
    return inspect.iscoroutinefunction(getattr(_AsyncRESP3Parser, "handle_push_response", None))


def _pubsub_kwargs(r: Any, asyncio: bool) -> Dict[str, Any]:
    """Over RESP3 a handler that hands each push back to ``get_message``: without one,
    older redis-py releases also log every message to stdout."""
    if _protocol(r) != 3:
        return {}
    handler: Callable[[Any], Any] = _async_echo if asyncio and _awaits_push_handler() else _echo
    return {"push_handler_func": handler}


def _failed(channel: str, e: BaseException) -> StockgateError:
    err = translate(e)
    if err is not None:
        return err
    return Unavailable(f"live watch of {channel}: {e}", e)


def _same_channel(m: Dict[str, Any], channel: str) -> bool:
    c = m.get("channel")
    return _parse.text(c) == channel if isinstance(c, (bytes, str)) else False


class LiveWatch:
    """The messages of one live channel, as :class:`~stockgate.LiveCounts`, on a
    connection of its own (released by :meth:`close`, or by leaving a ``with`` block).

    Iterating blocks until the next message (the counts now, at once; then one per
    change, at most ~10 a second, none while nothing changes); :meth:`next` takes a
    timeout. Not thread-safe: one reader per watch."""

    def __init__(self, r: "redis.Redis[Any]", channel: str, *, timeout: float = 5.0) -> None:
        self.channel = channel
        self._ps = r.pubsub(**_pubsub_kwargs(r, asyncio=False))
        self._closed = False
        try:
            self._subscribe(timeout)
        except BaseException:
            self.close()
            raise

    def _subscribe(self, timeout: float) -> None:
        """Subscribes, then reads up to the confirmation, or the error reply the server
        sends in its place."""
        try:
            self._ps.subscribe(self.channel)
            end = time.monotonic() + timeout
            while True:
                left = end - time.monotonic()
                if left <= 0:
                    raise Unavailable(f"SUBSCRIBE {self.channel}: no confirmation within {timeout:g} s")
                m = self._ps.get_message(timeout=min(left, _POLL))
                if m is not None and m.get("type") == "subscribe" and _same_channel(m, self.channel):
                    return
        except (rex.RedisError, OSError) as e:
            raise _failed(self.channel, e) from e

    def next(self, timeout: Optional[float] = None) -> Optional[LiveCounts]:
        """The next message; None if none came within ``timeout`` seconds (``None``: wait
        as long as it takes). Raises :class:`~stockgate.Unavailable` when the connection
        is lost, :class:`~stockgate.ProtocolMismatch` for a payload of another shape."""
        if self._closed:
            raise Unavailable(f"live watch of {self.channel} is closed")
        end = None if timeout is None else time.monotonic() + timeout
        while True:
            wait = _POLL if end is None else min(_POLL, end - time.monotonic())
            if wait <= 0:
                return None
            try:
                m = self._ps.get_message(timeout=wait)
            except (rex.RedisError, OSError) as e:
                raise _failed(self.channel, e) from e
            if m is not None and m.get("type") == "message" and _same_channel(m, self.channel):
                return _parse.parse_live(m.get("data"))

    def __iter__(self) -> "LiveWatch":
        return self

    def __next__(self) -> LiveCounts:
        if self._closed:
            raise StopIteration
        counts = self.next()
        assert counts is not None  # no timeout: next() returns only with a message
        return counts

    def close(self) -> None:
        """Closes the watch's connection (the server frees its watcher)."""
        if self._closed:
            return
        self._closed = True
        try:
            self._ps.close()
        except (rex.RedisError, OSError):
            pass

    def __enter__(self) -> "LiveWatch":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


class AsyncLiveWatch:
    """:class:`LiveWatch` for asyncio: ``async with`` subscribes (a refused subscription
    raises there), ``async for`` reads. Without ``async with``, :meth:`open` (or the first
    read) subscribes and :meth:`close` ends it."""

    def __init__(self, r: "redis.asyncio.Redis[Any]", channel: str, *, timeout: float = 5.0) -> None:
        self.channel = channel
        self._r = r
        self._timeout = timeout
        self._ps: Any = None
        self._closed = False

    async def open(self) -> "AsyncLiveWatch":
        """Subscribes, and waits for the confirmation or the error reply in its place."""
        if self._closed:
            raise Unavailable(f"live watch of {self.channel} is closed")
        if self._ps is not None:
            return self
        self._ps = self._r.pubsub(**_pubsub_kwargs(self._r, asyncio=True))
        try:
            await self._ps.subscribe(self.channel)
            end = time.monotonic() + self._timeout
            while True:
                left = end - time.monotonic()
                if left <= 0:
                    raise Unavailable(f"SUBSCRIBE {self.channel}: no confirmation within {self._timeout:g} s")
                m = await self._ps.get_message(timeout=min(left, _POLL))
                if m is not None and m.get("type") == "subscribe" and _same_channel(m, self.channel):
                    return self
        except (rex.RedisError, OSError) as e:
            await self.close()
            raise _failed(self.channel, e) from e
        except BaseException:
            await self.close()
            raise

    async def next(self, timeout: Optional[float] = None) -> Optional[LiveCounts]:
        """See :meth:`LiveWatch.next`."""
        await self.open()
        end = None if timeout is None else time.monotonic() + timeout
        while True:
            wait = _POLL if end is None else min(_POLL, end - time.monotonic())
            if wait <= 0:
                return None
            try:
                m = await self._ps.get_message(timeout=wait)
            except (rex.RedisError, OSError) as e:
                raise _failed(self.channel, e) from e
            if m is not None and m.get("type") == "message" and _same_channel(m, self.channel):
                return _parse.parse_live(m.get("data"))

    def __aiter__(self) -> "AsyncLiveWatch":
        return self

    async def __anext__(self) -> LiveCounts:
        if self._closed:
            raise StopAsyncIteration
        counts = await self.next()
        assert counts is not None  # no timeout: next() returns only with a message
        return counts

    async def close(self) -> None:
        """Closes the watch's connection (the server frees its watcher)."""
        self._closed = True
        ps, self._ps = self._ps, None
        if ps is None:
            return
        closer = getattr(ps, "aclose", None) or ps.close
        try:
            await closer()
        except (rex.RedisError, OSError):
            pass

    async def __aenter__(self) -> "AsyncLiveWatch":
        return await self.open()

    async def __aexit__(self, *exc: object) -> None:
        await self.close()
