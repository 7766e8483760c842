"""The asyncio client, on ``redis.asyncio``: the same commands, results, errors and retry
rules as :class:`stockgate.Client`."""

from __future__ import annotations

import asyncio
import time
from typing import Any, List, Optional, Sequence, Tuple, TypeVar, Union

import redis
import redis.asyncio
import redis.asyncio.cluster
import redis.asyncio.sentinel
from redis.asyncio.retry import Retry
from redis.backoff import NoBackoff

from . import _core
from ._core import Command, RetryPolicy, log, translate
from .errors import Unavailable
from .live import AsyncLiveWatch, place_channel, sale_channel
from .results import Reservation, ReserveOutcome, RoomInfo, RoomStatus, RoomTicket, SaleInfo

__all__ = ["AsyncClient"]

T = TypeVar("T")

Address = Union[str, Tuple[str, int]]


class AsyncClient:
    """Stockgate commands with typed replies, retried across lost replies and failovers.

    One client serves every task of an event loop; at most ``max_connections`` calls are
    on the wire at once (each on its own connection), the others wait for a slot.
    """

    def __init__(
        self,
        r: "redis.asyncio.Redis[Any]",
        *,
        retry: RetryPolicy = RetryPolicy(),
        max_connections: int = 64,
        sentinel: Optional[redis.asyncio.sentinel.Sentinel] = None,
        service_name: Optional[str] = None,
    ) -> None:
        self._r = r
        #: See :class:`stockgate.Client`: redirections reaching this client are retried
        #: only in cluster mode.
        self._retried = _core.CLUSTER_RETRIED if isinstance(r, redis.asyncio.cluster.RedisCluster) else frozenset()
        self.retry = retry
        self._max = max_connections
        self._slots: Optional[asyncio.Semaphore] = None
        self._sentinel = sentinel
        self._service_name = service_name
        #: Attempts sent again after a connection error, a timeout, -READONLY or -LOADING.
        self.retries = 0

    @classmethod
    def connect(
        cls,
        addr: Address = "127.0.0.1:7379",
        *,
        username: Optional[str] = None,
        password: Optional[str] = None,
        retry: RetryPolicy = RetryPolicy(),
        max_connections: int = 64,
        socket_timeout: float = 5.0,
        connect_timeout: float = 1.0,
        protocol: int = 2,
        ssl: bool = False,
        ssl_ca_certs: Optional[str] = None,
        ssl_certfile: Optional[str] = None,
        ssl_keyfile: Optional[str] = None,
    ) -> "AsyncClient":
        """A client of the server at ``addr`` (``host:port``, ``redis://host:port``, or
        ``rediss://host:port`` for TLS).

        ``ssl=True`` (or a ``rediss://`` address) connects over TLS, redis-py's options:
        ``ssl_ca_certs`` the CA file that verifies the server, ``ssl_certfile`` and
        ``ssl_keyfile`` this client's certificate for a server that requires one. Every
        connection of the client's pool uses them."""
        host, port = _core.parse_address(addr)
        username, password = _core.credentials(addr, username, password)
        tls = _core.tls_kwargs(addr, ssl, ssl_ca_certs, ssl_certfile, ssl_keyfile)
        r = redis.asyncio.Redis(
            host=host,
            port=port,
            username=username,
            password=password,
            decode_responses=True,
            socket_timeout=socket_timeout,
            socket_connect_timeout=connect_timeout,
            retry=Retry(NoBackoff(), 0),
            protocol=protocol,
            **tls,
            max_connections=max_connections,
        )
        return cls(r, retry=retry, max_connections=max_connections)

    @classmethod
    def sentinel(
        cls,
        sentinels: Sequence[Address],
        service_name: str = "stockgate",
        *,
        username: Optional[str] = None,
        password: Optional[str] = None,
        retry: RetryPolicy = RetryPolicy(),
        max_connections: int = 64,
        socket_timeout: float = 5.0,
        connect_timeout: float = 1.0,
        sentinel_timeout: float = 0.5,
        protocol: int = 2,
    ) -> "AsyncClient":
        """A client of whichever member the Sentinels name the leader (see
        :meth:`stockgate.Client.sentinel`)."""
        s = redis.asyncio.sentinel.Sentinel(
            _core.sentinel_addresses(sentinels),
            sentinel_kwargs={
                "socket_timeout": sentinel_timeout,
                "socket_connect_timeout": sentinel_timeout,
                "retry": Retry(NoBackoff(), 0),
                "decode_responses": True,
            },
        )
        r = s.master_for(
            service_name,
            username=username,
            password=password,
            decode_responses=True,
            socket_timeout=socket_timeout,
            socket_connect_timeout=connect_timeout,
            retry=Retry(NoBackoff(), 0),
            protocol=protocol,
        )
        return cls(r, retry=retry, max_connections=max_connections, sentinel=s, service_name=service_name)

    @classmethod
    def cluster(
        cls,
        nodes: Union[str, Sequence[Address]],
        *,
        username: Optional[str] = None,
        password: Optional[str] = None,
        retry: RetryPolicy = RetryPolicy(),
        max_connections: int = 64,
        socket_timeout: float = 5.0,
        connect_timeout: float = 1.0,
        protocol: int = 2,
        ssl: bool = False,
        ssl_ca_certs: Optional[str] = None,
        ssl_certfile: Optional[str] = None,
        ssl_keyfile: Optional[str] = None,
    ) -> "AsyncClient":
        """Groups in cluster mode through ``redis.asyncio.cluster.RedisCluster`` (see
        :meth:`stockgate.Client.cluster`)."""
        seeds, kw = _core.cluster_kwargs(nodes, username, password, (ssl, ssl_ca_certs, ssl_certfile, ssl_keyfile))
        r = redis.asyncio.cluster.RedisCluster(
            startup_nodes=[redis.asyncio.cluster.ClusterNode(h, p) for h, p in seeds],
            decode_responses=True,
            socket_timeout=socket_timeout,
            socket_connect_timeout=connect_timeout,
            protocol=protocol,
            max_connections=max_connections,
            **kw,
        )
        return cls(r, retry=retry, max_connections=max_connections)

    @classmethod
    def from_redis(
        cls, r: "redis.asyncio.Redis[Any]", *, retry: RetryPolicy = RetryPolicy(), max_connections: int = 64
    ) -> "AsyncClient":
        """Wraps an existing ``redis.asyncio.Redis``."""
        return cls(r, retry=retry, max_connections=max_connections)

    @property
    def redis(self) -> "redis.asyncio.Redis[Any]":
        return self._r

    async def close(self) -> None:
        closer = getattr(self._r, "aclose", None) or self._r.close
        await closer()

    async def __aenter__(self) -> "AsyncClient":
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    async def primary_address(self) -> Tuple[str, int]:
        """The address calls go to: the fixed one, or the leader the Sentinels name now."""
        if self._sentinel is not None and self._service_name is not None:
            try:
                host, port = await self._sentinel.discover_master(self._service_name)
            except redis.RedisError as e:
                raise Unavailable(f"no leader named for {self._service_name!r}: {e}", e) from e
            return str(host), int(port)
        if isinstance(self._r, redis.asyncio.cluster.RedisCluster):
            node = self._r.get_default_node()
            return str(node.host), int(node.port)
        kw = self._r.connection_pool.connection_kwargs
        return str(kw.get("host", "127.0.0.1")), int(kw.get("port", 7379))

    async def _run(self, cmd: Command[T], deadline: Optional[float] = None) -> T:
        if self._slots is None:
            # Created on first use, inside the loop that runs the calls.
            self._slots = asyncio.Semaphore(self._max)
        limit = self.retry.deadline if deadline is None else deadline
        start = time.monotonic()
        attempt = 0
        while True:
            try:
                async with self._slots:
                    reply = await self._r.execute_command(*cmd.args)
            except (redis.RedisError, redis.exceptions.RedisClusterException) as e:
                err = translate(e)
                if err is not None and err.code not in self._retried:
                    if cmd.on_error is not None:
                        result = cmd.on_error(err)
                        if result is not None:
                            return result
                    raise err from e
                attempt += 1
                pause = self.retry.backoff(attempt)
                if time.monotonic() - start + pause > limit:
                    raise Unavailable(
                        f"{cmd.args[0]} still failing after {attempt} attempts in {limit:g} s: {e}", e
                    ) from e
                self.retries += 1
                log.debug("%s: %s; sending it again (attempt %d)", cmd.args[0], e, attempt + 1)
                await asyncio.sleep(pause)
                continue
            return cmd.parse(reply)

    async def reserve(
        self, sku: str, user: str, admission: str, request_id: str, qty: int = 1, *, deadline: Optional[float] = None
    ) -> ReserveOutcome:
        """See :meth:`stockgate.Client.reserve`."""
        return await self._run(_core.reserve_cmd(sku, user, admission, request_id, qty), deadline)

    async def commit(self, token: str, *, verified: bool = False, deadline: Optional[float] = None) -> bool:
        """See :meth:`stockgate.Client.commit`."""
        return await self._run(_core.commit_cmd(token, verified), deadline)

    async def release(self, token: str, reason: Optional[str] = None, *, deadline: Optional[float] = None) -> bool:
        return await self._run(_core.release_cmd(token, reason), deadline)

    async def extend(self, token: str, ms: int, *, deadline: Optional[float] = None) -> int:
        return await self._run(_core.extend_cmd(token, ms), deadline)

    async def reservation(self, token: str, *, deadline: Optional[float] = None) -> Optional[Reservation]:
        return await self._run(_core.reservation_cmd(token), deadline)

    async def stock(self, sku: str, *, deadline: Optional[float] = None) -> int:
        return await self._run(_core.stock_cmd(sku), deadline)

    async def sale_info(self, sku: str, *, deadline: Optional[float] = None) -> SaleInfo:
        return await self._run(_core.sale_info_cmd(sku), deadline)

    async def sale_create(
        self,
        sku: str,
        total: int,
        *,
        shards: Optional[int] = None,
        ttl_ms: Optional[int] = None,
        limit: Optional[int] = None,
        deadline: Optional[float] = None,
    ) -> None:
        await self._run(_core.sale_create_cmd(sku, total, shards, ttl_ms, limit), deadline)

    async def sale_list(self, *, deadline: Optional[float] = None) -> List[str]:
        return await self._run(_core.sale_list_cmd(), deadline)


    # --- the waiting room (docs/protocol.md, section 4a) ----------------------------------

    async def open_room(
        self,
        sku: str,
        *,
        opens_at_ms: Optional[int] = None,
        rate: Optional[int] = None,
        overadmit_permille: Optional[int] = None,
        admit_ttl_ms: Optional[int] = None,
        window_ms: Optional[int] = None,
        max_waiting: Optional[int] = None,
        deadline: Optional[float] = None,
    ) -> None:
        """See :meth:`stockgate.Client.open_room`."""
        await self._run(
            _core.room_open_cmd(sku, opens_at_ms, rate, overadmit_permille, admit_ttl_ms, window_ms, max_waiting),
            deadline,
        )

    async def join(self, sku: str, user: str, *, deadline: Optional[float] = None) -> RoomTicket:
        """See :meth:`stockgate.Client.join`."""
        return await self._run(_core.room_join_cmd(sku, user), deadline)

    async def status(self, sku: str, user: str, ticket: str, *, deadline: Optional[float] = None) -> RoomStatus:
        """See :meth:`stockgate.Client.status`."""
        return await self._run(_core.room_status_cmd(sku, user, ticket), deadline)

    async def leave(self, sku: str, user: str, *, deadline: Optional[float] = None) -> bool:
        """See :meth:`stockgate.Client.leave`."""
        return await self._run(_core.room_leave_cmd(sku, user), deadline)

    async def room_info(self, sku: str, *, deadline: Optional[float] = None) -> RoomInfo:
        """See :meth:`stockgate.Client.room_info`."""
        return await self._run(_core.room_info_cmd(sku), deadline)

    # --- live counts over RESP (docs/protocol.md, section 4a, "Live counts over RESP") ------

    def watch_sale(self, sku: str, *, timeout: float = 5.0) -> AsyncLiveWatch:
        """See :meth:`stockgate.Client.watch_sale`: ``async with client.watch_sale(sku) as
        w`` subscribes (a refusal raises there), ``async for counts in w`` reads."""
        return AsyncLiveWatch(self._r, sale_channel(sku), timeout=timeout)

    def watch_place(self, ticket: str, *, timeout: float = 5.0) -> AsyncLiveWatch:
        """See :meth:`stockgate.Client.watch_place` and :meth:`watch_sale`."""
        return AsyncLiveWatch(self._r, place_channel(ticket), timeout=timeout)
