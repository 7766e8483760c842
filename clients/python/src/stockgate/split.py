"""A sale split over several groups (docs/cluster.md, "A split sale"): each buyer has a
home part, a hash of the user that the Rust and Node clients compute the same way, and
is sent to at most two more parts when the home answers SOLDOUT."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, List, Sequence, Tuple, Union

from .results import ReserveOutcome, SoldOut

__all__ = ["MAX_PROBES", "user_hash", "home_part", "probe_order", "SplitReserve", "reserve_split", "reserve_split_async"]

#: Parts tried after the home part when it is sold out.
MAX_PROBES = 2


def user_hash(user: str) -> int:
    """32-bit FNV-1a of the user's UTF-8 bytes (the shared vectors are in docs/cluster.md)."""
    h = 0x811C9DC5
    for b in user.encode("utf-8"):
        h = ((h ^ b) * 0x01000193) & 0xFFFFFFFF
    return h


def home_part(user: str, parts: int) -> int:
    """The buyer's home part among ``parts`` (0 when there are none)."""
    return user_hash(user) % parts if parts > 0 else 0


def probe_order(user: str, parts: int) -> List[int]:
    """The home, then the next :data:`MAX_PROBES` parts after it (wrapping), each once."""
    home = home_part(user, parts)
    return [(home + k) % parts for k in range(min(parts, MAX_PROBES + 1))]


@dataclass(frozen=True)
class SplitReserve:
    """What :func:`reserve_split` got: ``part`` answered ``outcome`` (the last part tried
    when every one tried was sold out); ``tried`` lists the parts asked, in order."""

    part: int
    sku: str
    tried: Tuple[int, ...]
    outcome: ReserveOutcome


def _clients(client: object, parts: Sequence[str]) -> Sequence[object]:
    if not parts:
        raise ValueError("reserve_split: no parts")
    if isinstance(client, (list, tuple)):
        if len(client) != len(parts):
            raise ValueError(f"reserve_split: {len(parts)} parts and {len(client)} clients: give one client per part")
        return client
    return [client] * len(parts)


def reserve_split(
    client: Union[object, Sequence[object]],
    parent: str,
    parts: Sequence[str],
    user: str,
    qty: int = 1,
    *,
    admission: Callable[[str], str],
    request_id: str,
) -> SplitReserve:
    """Reserve ``qty`` units of the split sale ``parent`` whose part skus are ``parts``
    (index order, as ``stockgate-sweeper split`` printed them): the home part, then at
    most two others, each only after the one before answered SOLDOUT (any other answer, a
    Limit included, is final). ``client`` is one :class:`stockgate.Client` for every part
    or a list of them, one per part (each talking to that part's group);
    ``admission(sku)`` gives the admission token for that part and this user."""
    clients = _clients(client, parts)
    tried: List[int] = []
    out: ReserveOutcome = SoldOut()
    for i in probe_order(user, len(parts)):
        tried.append(i)
        out = clients[i].reserve(parts[i], user, admission(parts[i]), request_id, qty)  # type: ignore[attr-defined]
        if not isinstance(out, SoldOut):
            break
    return SplitReserve(tried[-1], parts[tried[-1]], tuple(tried), out)


async def reserve_split_async(
    client: Union[object, Sequence[object]],
    parent: str,
    parts: Sequence[str],
    user: str,
    qty: int = 1,
    *,
    admission: Callable[[str], str],
    request_id: str,
) -> SplitReserve:
    """:func:`reserve_split` over :class:`stockgate.AsyncClient` s."""
    clients = _clients(client, parts)
    tried: List[int] = []
    out: ReserveOutcome = SoldOut()
    for i in probe_order(user, len(parts)):
        tried.append(i)
        out = await clients[i].reserve(parts[i], user, admission(parts[i]), request_id, qty)  # type: ignore[attr-defined]
        if not isinstance(out, SoldOut):
            break
    return SplitReserve(tried[-1], parts[tried[-1]], tuple(tried), out)
