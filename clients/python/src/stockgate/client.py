"""The synchronous client, on redis-py: one address (``redis.Redis``), a Raft group's
leader found through the Sentinel interface its members answer, or groups in cluster
mode (``redis.cluster.RedisCluster``, which follows ``-MOVED`` and ``-ASK``)."""

from __future__ import annotations

import threading
import time
from typing import Any, List, Optional, Sequence, Tuple, TypeVar, Union

import redis
import redis.cluster
import redis.sentinel
from redis.backoff import NoBackoff
from redis.retry import Retry

from . import _core
from ._core import Command, RetryPolicy, log, translate
from .errors import Unavailable
from .live import LiveWatch, place_channel, sale_channel
from .results import Reservation, ReserveOutcome, RoomInfo, RoomStatus, RoomTicket, SaleInfo

__all__ = ["Client"]

T = TypeVar("T")

Address = Union[str, Tuple[str, int]]


class Client:
    """Stockgate commands with typed replies, retried across lost replies and failovers.

    Thread-safe: one client serves every thread; at most ``max_connections`` calls are on
    the wire at once (each on its own connection), the others wait for a slot.

    Build one with :meth:`connect` (one address) or :meth:`sentinel` (a Raft group's
    members as the Sentinels), or wrap a ``redis.Redis`` of your own with
    :meth:`from_redis`.
    """

    def __init__(
        self,
        r: "redis.Redis[Any]",
        *,
        retry: RetryPolicy = RetryPolicy(),
        max_connections: int = 64,
        sentinel: Optional[redis.sentinel.Sentinel] = None,
        service_name: Optional[str] = None,
    ) -> None:
        self._r = r
        #: Redirections are the cluster client's to follow; one that still reaches this
        #: client is retried. A single-address client raises them (wrong group).
        self._retried = _core.CLUSTER_RETRIED if isinstance(r, redis.cluster.RedisCluster) else frozenset()
        self.retry = retry
        self._slots = threading.BoundedSemaphore(max_connections)
        self._sentinel = sentinel
        self._service_name = service_name
        self._lock = threading.Lock()
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
    ) -> "Client":
        """A client of the server at ``addr`` (``host:port``, ``redis://host:port``, or
        ``rediss://host:port`` for TLS).

        ``ssl=True`` (or a ``rediss://`` address) connects over TLS, redis-py's options:
        ``ssl_ca_certs`` the CA file that verifies the server, ``ssl_certfile`` and
        ``ssl_keyfile`` this client's certificate for a server that requires one. Every
        connection of the client's pool uses them."""
        host, port = _core.parse_address(addr)
        username, password = _core.credentials(addr, username, password)
        tls = _core.tls_kwargs(addr, ssl, ssl_ca_certs, ssl_certfile, ssl_keyfile)
        r = redis.Redis(
            host=host,
            port=port,
            username=username,
            password=password,
            decode_responses=True,
            socket_timeout=socket_timeout,
            socket_connect_timeout=connect_timeout,
            # This client decides what is sent again, and for how long.
            retry=Retry(NoBackoff(), 0),
            protocol=protocol,
            **tls,
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
    ) -> "Client":
        """A client of whichever member the Sentinels name the leader.

        ``sentinels`` are a group's members' client addresses (each member answers the
        Sentinel discovery commands); ``service_name`` is the group's ``--group-name``,
        ``stockgate`` by default (docs/replication.md). After a failover, the next attempt
        of a call asks the Sentinels again and goes to the new leader.
        """
        no_retry = Retry(NoBackoff(), 0)
        s = redis.sentinel.Sentinel(
            _core.sentinel_addresses(sentinels),
            sentinel_kwargs={
                "socket_timeout": sentinel_timeout,
                "socket_connect_timeout": sentinel_timeout,
                "retry": no_retry,
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
            retry=no_retry,
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
    ) -> "Client":
        """A client of groups in cluster mode (docs/cluster.md), through redis-py's
        ``RedisCluster``: ``nodes`` are one or more seed addresses (a list, or
        ``"h1:p1,h2:p2"``); the slot map comes from ``CLUSTER SLOTS``, each command goes
        to the group owning its sku's slot, and ``-MOVED`` / ``-ASK`` are followed. A
        redirection or ``-TRYAGAIN`` that outlasts redis-py's own attempts is sent again
        by this client until its deadline, like a lost reply."""
        seeds, kw = _core.cluster_kwargs(nodes, username, password, (ssl, ssl_ca_certs, ssl_certfile, ssl_keyfile))
        r = redis.cluster.RedisCluster(
            startup_nodes=[redis.cluster.ClusterNode(h, p) for h, p in seeds],
            decode_responses=True,
            socket_timeout=socket_timeout,
            socket_connect_timeout=connect_timeout,
            protocol=protocol,
            max_connections=max_connections,
            **kw,
        )
        return cls(r, retry=retry, max_connections=max_connections)

    @classmethod
    def from_redis(cls, r: "redis.Redis[Any]", *, retry: RetryPolicy = RetryPolicy(), max_connections: int = 64) -> "Client":
        """Wraps an existing ``redis.Redis`` (bytes or decoded replies, RESP2 or RESP3)."""
        return cls(r, retry=retry, max_connections=max_connections)

    @property
    def redis(self) -> "redis.Redis[Any]":
        """The underlying redis-py client, for commands this package does not wrap."""
        return self._r

    def close(self) -> None:
        self._r.close()

    def __enter__(self) -> "Client":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def primary_address(self) -> Tuple[str, int]:
        """The address calls go to: the fixed one, or the leader the Sentinels name now."""
        if self._sentinel is not None and self._service_name is not None:
            try:
                host, port = self._sentinel.discover_master(self._service_name)
            except redis.RedisError as e:
                raise Unavailable(f"no leader named for {self._service_name!r}: {e}", e) from e
            return str(host), int(port)
        if isinstance(self._r, redis.cluster.RedisCluster):
            node = self._r.get_default_node()
            return str(node.host), int(node.port)
        kw = self._r.connection_pool.connection_kwargs
        return str(kw.get("host", "127.0.0.1")), int(kw.get("port", 7379))

    # --- the retry loop ---------------------------------------------------------------

    def _run(self, cmd: Command[T], deadline: Optional[float] = None) -> T:
        limit = self.retry.deadline if deadline is None else deadline
        start = time.monotonic()
        attempt = 0
        while True:
            try:
                with self._slots:
                    reply = self._r.execute_command(*cmd.args)
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
                with self._lock:
                    self.retries += 1
                log.debug("%s: %s; sending it again (attempt %d)", cmd.args[0], e, attempt + 1)
                time.sleep(pause)
                continue
            return cmd.parse(reply)

    # --- commands ---------------------------------------------------------------------

    def reserve(
        self, sku: str, user: str, admission: str, request_id: str, qty: int = 1, *, deadline: Optional[float] = None
    ) -> ReserveOutcome:
        """``RESERVE``: :class:`Reserved`, :class:`Replay`, :class:`SoldOut`, :class:`Limit`
        or :class:`Denied`. Idempotent per (sku, user, request id): after a lost reply it is
        sent again with the same request id, and answers ``Replay`` if the first send took
        effect. ``-NOSALE``, ``-FENCED``, ``-PAUSED`` and argument errors are raised."""
        return self._run(_core.reserve_cmd(sku, user, admission, request_id, qty), deadline)

    def commit(self, token: str, *, verified: bool = False, deadline: Optional[float] = None) -> bool:
        """``COMMIT token [VERIFIED]``: True if this call committed, False if it was already
        committed (also when a lost reply's first send did). Raises :class:`Expired`,
        :class:`Released`, :class:`NoReservation`, :class:`Fenced`, :class:`NoPerm`."""
        return self._run(_core.commit_cmd(token, verified), deadline)

    def release(self, token: str, reason: Optional[str] = None, *, deadline: Optional[float] = None) -> bool:
        """``RELEASE token [REASON r]``: True if this call gave the units back."""
        return self._run(_core.release_cmd(token, reason), deadline)

    def extend(self, token: str, ms: int, *, deadline: Optional[float] = None) -> int:
        """``EXTEND token ms``: the new ``expires_at_ms``. Raises :class:`NoReservation`,
        :class:`Expired`."""
        return self._run(_core.extend_cmd(token, ms), deadline)

    def reservation(self, token: str, *, deadline: Optional[float] = None) -> Optional[Reservation]:
        """``RESERVATION token``, or None if the server has no full record of it."""
        return self._run(_core.reservation_cmd(token), deadline)

    def stock(self, sku: str, *, deadline: Optional[float] = None) -> int:
        """``STOCK sku``: units available now."""
        return self._run(_core.stock_cmd(sku), deadline)

    def sale_info(self, sku: str, *, deadline: Optional[float] = None) -> SaleInfo:
        """``SALE.INFO sku``. Raises :class:`NoSale`."""
        return self._run(_core.sale_info_cmd(sku), deadline)

    def sale_create(
        self,
        sku: str,
        total: int,
        *,
        shards: Optional[int] = None,
        ttl_ms: Optional[int] = None,
        limit: Optional[int] = None,
        deadline: Optional[float] = None,
    ) -> None:
        """``SALE.CREATE`` (admin): the same parameters again are fine, others raise
        :class:`Exists`. A sale that a ledger should know of is better created with
        ``stockgate-sweeper create-sale``, which records its allocation."""
        self._run(_core.sale_create_cmd(sku, total, shards, ttl_ms, limit), deadline)

    def sale_list(self, *, deadline: Optional[float] = None) -> List[str]:
        return self._run(_core.sale_list_cmd(), deadline)


    # --- the waiting room (docs/protocol.md, section 4a) ----------------------------------

    def open_room(
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
        """``ROOM.OPEN sku [OPENS-AT ms] [RATE n] [OVERADMIT permille] [ADMIT-TTL ms]
        [WINDOW ms] [MAX n]`` (admin); a setting left out is the server's default. The
        same settings again are fine; other settings raise :class:`Exists`, an unknown
        sale :class:`NoSale`, one out of range :class:`CommandError`."""
        self._run(
            _core.room_open_cmd(sku, opens_at_ms, rate, overadmit_permille, admit_ttl_ms, window_ms, max_waiting),
            deadline,
        )

    def join(self, sku: str, user: str, *, deadline: Optional[float] = None) -> RoomTicket:
        """``ROOM.JOIN``: the user's :class:`RoomTicket` (the same one again while the user
        holds a place, so a lost reply is simply sent again). Raises :class:`QueueFull`,
        :class:`SoldOutError`, :class:`TooManyJoins`, :class:`NoRoom`, :class:`NoSale`."""
        return self._run(_core.room_join_cmd(sku, user), deadline)

    def status(self, sku: str, user: str, ticket: str, *, deadline: Optional[float] = None) -> RoomStatus:
        """``ROOM.STATUS``: :class:`RoomWaiting`, :class:`RoomAdmitted` (its ``admission``
        goes to :meth:`reserve`), :class:`RoomBeforeOpen`, :class:`RoomReserved`,
        :class:`RoomSoldOut`, :class:`RoomExpired` or :class:`RoomLeft`. Raises
        :class:`BadTicket`, :class:`NotQueued`, :class:`NoRoom`, :class:`NoSale`."""
        return self._run(_core.room_status_cmd(sku, user, ticket), deadline)

    def leave(self, sku: str, user: str, *, deadline: Optional[float] = None) -> bool:
        """``ROOM.LEAVE``: True if this call gave the user's place up, False if the user
        held none (also when a lost reply's first send gave it up). Raises
        :class:`NoRoom`, :class:`NoSale`."""
        return self._run(_core.room_leave_cmd(sku, user), deadline)

    def room_info(self, sku: str, *, deadline: Optional[float] = None) -> RoomInfo:
        """``ROOM.INFO``: the room's settings and counts. Raises :class:`NoRoom`."""
        return self._run(_core.room_info_cmd(sku), deadline)

    # --- live counts over RESP (docs/protocol.md, section 4a, "Live counts over RESP") ------

    def watch_sale(self, sku: str, *, timeout: float = 5.0) -> LiveWatch:
        """``SUBSCRIBE sale:<sku>:live`` on a connection of its own: a :class:`LiveWatch`
        iterating :class:`LiveCounts`, the counts now at once, then one per change (at most
        ~10 a second). Raises :class:`NoSale` for an unknown sale, :class:`CommandError`
        when the server has its most watchers, :class:`Unavailable` when no confirmation
        comes within ``timeout`` seconds. Close it (or use ``with``) to free the watcher.
        """
        return LiveWatch(self._r, sale_channel(sku), timeout=timeout)

    def watch_place(self, ticket: str, *, timeout: float = 5.0) -> LiveWatch:
        """``SUBSCRIBE place:<ticket>`` (the ticket :meth:`join` gave): as
        :meth:`watch_sale`, each :class:`LiveCounts` with ``you``, the buyer's place
        (:class:`RoomWaiting`, :class:`PlaceAdmitted`, ... :class:`RoomGone`). The ticket is
        checked once, here: a forged or malformed one raises :class:`BadTicket`, one of a
        sale without a room :class:`NoRoom`. An admitted buyer's admission token comes
        from :meth:`status`."""
        return LiveWatch(self._r, place_channel(ticket), timeout=timeout)
