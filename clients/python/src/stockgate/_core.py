"""What the sync and async clients share: how a redis-py error maps to this package's
errors (or to "retry"), the retry policy, and each command's arguments and reply parser."""

from __future__ import annotations

import logging
import random
from dataclasses import dataclass
from typing import Any, Callable, Dict, Generic, List, Optional, Sequence, Tuple, TypeVar, Union
from urllib.parse import unquote, urlparse

import redis.exceptions as rex

from . import _parse
from .errors import (
    CommandError,
    NoAuth,
    StockgateError,
    WrongPass,
    _BY_CODE,
    server_error,
)
from .results import Reservation, ReserveOutcome, RoomInfo, RoomStatus, RoomTicket, SaleInfo

log = logging.getLogger("stockgate")

T = TypeVar("T")

RELEASE_REASONS = ("cancel", "expired", "admin", "rebuild")


@dataclass(frozen=True)
class RetryPolicy:
    """How long a call that is safe to repeat keeps trying.

    Every command of the clients is safe to resend (docs/protocol.md, section 10: RESERVE
    with the same request id, COMMIT, RELEASE, EXTEND, the reads, SALE.CREATE with the same
    parameters). A call is sent again after a connection error, a timeout, ``-READONLY`` or
    ``-LOADING`` (a member that is not, or not yet, the writable leader: it did not run
    the command), with the same arguments, until ``deadline`` seconds have passed since the
    call began; then :class:`~stockgate.errors.Unavailable` is raised. The pause between
    attempts starts at ``backoff_min`` and doubles up to ``backoff_max``, with jitter so
    that many callers failing together do not come back together.
    """

    deadline: float = 30.0
    backoff_min: float = 0.05
    backoff_max: float = 0.5

    def backoff(self, attempt: int) -> float:
        base = min(self.backoff_max, self.backoff_min * (2 ** min(attempt - 1, 16)))
        return base * (0.5 + random.random() / 2)


def _status_code(e: BaseException) -> Optional[str]:
    code = getattr(e, "status_code", None)
    return code if isinstance(code, str) and code else None


def _class_codes() -> List[Tuple[type, str]]:
    """redis-py's own exception classes for codes it takes off the message, with those
    codes. Older releases lack some of the classes (they leave the code in the message)."""
    names = (
        ("MovedError", "MOVED"),
        ("AskError", "ASK"),
        ("TryAgainError", "TRYAGAIN"),
        ("ClusterCrossSlotError", "CROSSSLOT"),
        ("ClusterDownError", "CLUSTERDOWN"),
        ("ExecAbortError", "EXECABORT"),
        ("NoPermissionError", "NOPERM"),
        ("ReadOnlyError", "READONLY"),
        ("BusyLoadingError", "LOADING"),
    )
    return [(getattr(rex, n), c) for n, c in names if isinstance(getattr(rex, n, None), type)]


_CLASS_CODES = _class_codes()


def split_reply(e: BaseException) -> Tuple[str, str]:
    """The error reply's code and the rest of its text, whatever redis-py did to it.

    redis-py takes the code off the message for the codes it knows (``ERR``, ``MOVED``,
    ``NOAUTH``, ...) and leaves any other code in place; 8.x also names the code in
    ``status_code`` but keeps an unknown one in the message. So: ``status_code`` when
    given (the message may still start with it), else the class redis-py chose, else the
    first word when it is one of the server's codes (docs/protocol.md, section 10); what
    is left is an ``ERR`` whose text redis-py stripped."""
    msg = str(e)
    code = _status_code(e)
    if code is not None:
        if msg == code or msg.startswith(code + " "):
            msg = msg[len(code) :].lstrip(" ")
        return code, msg
    for cls, c in _CLASS_CODES:
        if isinstance(e, cls):
            return c, msg
    word, _, rest = msg.partition(" ")
    if word in _BY_CODE:
        return word, rest
    return "ERR", msg


def translate(e: BaseException) -> Optional[StockgateError]:
    """The error to raise for a redis-py exception, or None when the call is to be sent
    again (the connection broke, it timed out, the member refused before running it, or
    the sale was frozen for a move: none of them ran the command)."""
    # redis-py raises these as ConnectionError subclasses: they are not transient.
    if isinstance(e, rex.AuthenticationError):
        code, msg = split_reply(e)
        if code == "NOAUTH" or "Authentication required" in msg:
            return NoAuth(msg)
        return WrongPass(msg)
    if isinstance(e, (rex.ConnectionError, rex.TimeoutError)):
        return None
    if isinstance(e, rex.ResponseError):
        code, msg = split_reply(e)
        if code in _RETRIED:
            return None
        return CommandError(msg) if code == "ERR" else server_error(code, msg)
    if isinstance(e, (rex.ClusterError, rex.RedisClusterException)):
        # A cluster client out of its own redirections, or without a slot map for now
        # (every node it knew unreachable): the command did not run; the map is learned
        # anew on the next attempt.
        return None
    if isinstance(e, rex.RedisError):
        return StockgateError(str(e), "CLIENT")
    return None


#: Codes of replies to a command that did not run and will run if sent again shortly:
#: not the leader (yet), still catching up, the sale frozen while it moves.
_RETRIED = frozenset(("READONLY", "LOADING", "TRYAGAIN"))


def parse_address(addr: Union[str, Tuple[str, int]]) -> Tuple[str, int]:
    """``host:port``, ``redis://[user:password@]host:port`` or ``(host, port)``."""
    if isinstance(addr, tuple):
        return addr[0], int(addr[1])
    if "://" in addr:
        u = urlparse(addr)
        return u.hostname or "127.0.0.1", u.port or 7379
    host, sep, port = addr.rpartition(":")
    if not sep:
        return addr, 7379
    return host.strip("[]") or "127.0.0.1", int(port)


def credentials(
    addr: Union[str, Tuple[str, int]], username: Optional[str], password: Optional[str]
) -> Tuple[Optional[str], Optional[str]]:
    """The user and password to authenticate with: the ones given, else those of a
    ``redis://user:password@host:port`` or ``redis://:password@host:port`` address
    (percent-decoded, as redis-py's ``from_url`` reads them), else none. A URL's
    credentials are never dropped silently: given both ways, they must agree."""
    if not isinstance(addr, str) or "://" not in addr:
        return username, password
    u = urlparse(addr)
    url_user = unquote(u.username) if u.username else None
    url_pass = unquote(u.password) if u.password is not None else None
    if url_user is not None and username is not None and url_user != username:
        raise ValueError("the address names one user and username= another")
    if url_pass is not None and password is not None and url_pass != password:
        raise ValueError("the address carries one password and password= another")
    return username if username is not None else url_user, password if password is not None else url_pass


def cluster_seeds(seeds: Union[str, Sequence[Union[str, Tuple[str, int]]]]) -> List[Union[str, Tuple[str, int]]]:
    """A cluster's seed addresses as given: a list, or one comma-separated string."""
    items = seeds.split(",") if isinstance(seeds, str) else list(seeds)
    out = [s.strip() if isinstance(s, str) else s for s in items]
    out = [s for s in out if s != ""]
    if not out:
        raise ValueError("no cluster node address given")
    return out


def cluster_kwargs(
    nodes: Union[str, Sequence[Union[str, Tuple[str, int]]]],
    username: Optional[str],
    password: Optional[str],
    tls: Tuple[bool, Optional[str], Optional[str], Optional[str]],
) -> Tuple[List[Tuple[str, int]], Dict[str, Any]]:
    """The seeds' host and port, and the options every node's connections get: the
    credentials (given, or the first seed's URL's) and TLS."""
    seeds = cluster_seeds(nodes)
    username, password = credentials(seeds[0], username, password)
    kw: Dict[str, Any] = dict(tls_kwargs(seeds[0], *tls))
    kw.update(username=username, password=password)
    return [parse_address(s) for s in seeds], kw


#: Error codes a cluster client follows by itself; when one still reaches the retry loop
#: the client had run out of its own redirections (a map changing under it): the call is
#: sent again, the map learned anew, until the deadline.
CLUSTER_RETRIED = frozenset(("MOVED", "ASK", "CLUSTERDOWN", "TRYAGAIN"))


def tls_kwargs(
    addr: Union[str, Tuple[str, int]],
    ssl: bool,
    ssl_ca_certs: Optional[str],
    ssl_certfile: Optional[str],
    ssl_keyfile: Optional[str],
) -> Dict[str, Any]:
    """redis-py's TLS options for ``addr``: on with ``ssl`` or a ``rediss://`` address;
    the files only with TLS on (a CA given to a plain connection would be ignored
    silently, so it is refused)."""
    on = ssl or (isinstance(addr, str) and addr.lower().startswith("rediss://"))
    if not on:
        if ssl_ca_certs or ssl_certfile or ssl_keyfile:
            raise ValueError("ssl_ca_certs, ssl_certfile and ssl_keyfile need ssl=True or a rediss:// address")
        return {}
    if bool(ssl_certfile) != bool(ssl_keyfile):
        raise ValueError("ssl_certfile and ssl_keyfile go together")
    kw: Dict[str, Any] = {"ssl": True}
    if ssl_ca_certs:
        kw["ssl_ca_certs"] = ssl_ca_certs
    if ssl_certfile:
        kw["ssl_certfile"] = ssl_certfile
        kw["ssl_keyfile"] = ssl_keyfile
    return kw


@dataclass(frozen=True)
class Command(Generic[T]):
    """One command: its arguments, how its reply becomes a result, and which error
    replies are results rather than errors (RESERVE's ``-DENIED``)."""

    args: Tuple[Any, ...]
    parse: Callable[[Any], T]
    on_error: Optional[Callable[[StockgateError], Optional[T]]] = None


def _denied_is_a_result(err: StockgateError) -> Optional[ReserveOutcome]:
    if err.code == "DENIED":
        return _parse.parse_denied(err.detail)
    return None


def reserve_cmd(sku: str, user: str, admission: str, request_id: str, qty: int = 1) -> Command[ReserveOutcome]:
    return Command(
        ("RESERVE", sku, user, admission, request_id, "QTY", int(qty), "WITHLIMIT"),
        _parse.parse_reserve,
        _denied_is_a_result,
    )


def _bool01(v: Any) -> bool:
    n = _parse.parse_int(v)
    if n not in (0, 1):
        raise _parse.ProtocolMismatch(f"expected :0 or :1, got {v!r}")
    return n == 1


def commit_cmd(token: str, verified: bool = False) -> Command[bool]:
    args: Tuple[Any, ...] = ("COMMIT", token, "VERIFIED") if verified else ("COMMIT", token)
    return Command(args, _bool01)


def release_cmd(token: str, reason: Optional[str] = None) -> Command[bool]:
    if reason is not None and reason not in RELEASE_REASONS:
        raise ValueError(f"release reason must be one of {', '.join(RELEASE_REASONS)}")
    args: Tuple[Any, ...] = ("RELEASE", token) if reason is None else ("RELEASE", token, "REASON", reason)
    return Command(args, _bool01)


def extend_cmd(token: str, ms: int) -> Command[int]:
    return Command(("EXTEND", token, int(ms)), _parse.parse_int)


def reservation_cmd(token: str) -> Command[Optional[Reservation]]:
    return Command(("RESERVATION", token), _parse.parse_reservation)


def stock_cmd(sku: str) -> Command[int]:
    return Command(("STOCK", sku), _parse.parse_int)


def sale_info_cmd(sku: str) -> Command[SaleInfo]:
    return Command(("SALE.INFO", sku), _parse.parse_sale_info)


def _ok(v: Any) -> None:
    if v is True or _parse.text(v) == "OK":
        return None
    raise _parse.ProtocolMismatch(f"expected +OK, got {v!r}")


def sale_create_cmd(
    sku: str,
    total: int,
    shards: Optional[int] = None,
    ttl_ms: Optional[int] = None,
    limit: Optional[int] = None,
) -> Command[None]:
    args: List[Any] = ["SALE.CREATE", sku, int(total)]
    if shards is not None:
        args += ["SHARDS", int(shards)]
    if ttl_ms is not None:
        args += ["TTL", int(ttl_ms)]
    if limit is not None:
        args += ["LIMIT", int(limit)]
    return Command(tuple(args), _ok)


def sale_list_cmd() -> Command[List[str]]:
    def parse(v: Any) -> List[str]:
        if not isinstance(v, (list, tuple)):
            raise _parse.ProtocolMismatch(f"unexpected SALE.LIST reply {v!r}")
        return [_parse.text(x) for x in v]

    return Command(("SALE.LIST",), parse)


def room_open_cmd(
    sku: str,
    opens_at_ms: Optional[int] = None,
    rate: Optional[int] = None,
    overadmit_permille: Optional[int] = None,
    admit_ttl_ms: Optional[int] = None,
    window_ms: Optional[int] = None,
    max_waiting: Optional[int] = None,
) -> Command[None]:
    args: List[Any] = ["ROOM.OPEN", sku]
    for word, value in (
        ("OPENS-AT", opens_at_ms),
        ("RATE", rate),
        ("OVERADMIT", overadmit_permille),
        ("ADMIT-TTL", admit_ttl_ms),
        ("WINDOW", window_ms),
        ("MAX", max_waiting),
    ):
        if value is not None:
            args += [word, int(value)]
    return Command(tuple(args), _ok)


def room_join_cmd(sku: str, user: str) -> Command[RoomTicket]:
    return Command(("ROOM.JOIN", sku, user), _parse.parse_room_join)


def room_status_cmd(sku: str, user: str, ticket: str) -> Command[RoomStatus]:
    return Command(("ROOM.STATUS", sku, user, ticket), _parse.parse_room_status)


def room_leave_cmd(sku: str, user: str) -> Command[bool]:
    return Command(("ROOM.LEAVE", sku, user), _bool01)


def room_info_cmd(sku: str) -> Command[RoomInfo]:
    return Command(("ROOM.INFO", sku), _parse.parse_room_info)


def sentinel_addresses(sentinels: Sequence[Union[str, Tuple[str, int]]]) -> List[Tuple[str, int]]:
    out = [parse_address(s) for s in sentinels]
    if not out:
        raise ValueError("no Sentinel address given")
    return out
