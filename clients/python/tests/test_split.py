"""reserve_split (docs/cluster.md, "A split sale"): the same home as the Rust and Node
clients for the shared vectors (tests/split/vectors.json), and, against the real server,
a buyer whose home part is sold out is served by the next part."""

from __future__ import annotations

import json
from pathlib import Path

import stockgate
from stockgate import Client, Limit, Reserved, SoldOut

VECTORS = json.loads((Path(__file__).resolve().parents[3] / "tests" / "split" / "vectors.json").read_text())


def test_split_shared_vectors() -> None:
    for user, h in VECTORS["hashes"]:
        assert stockgate.user_hash(user) == h, user
    for user, of3, of5 in VECTORS["homes"]:
        assert (stockgate.home_part(user, 3), stockgate.home_part(user, 5)) == (of3, of5), user
    assert stockgate.probe_order("a", 5) == [0, 1, 2]
    assert stockgate.probe_order("a", 2) == [0, 1]


def test_split_falls_over_when_home_is_sold_out(addr: str, keyring: stockgate.Keyring, sku: str) -> None:
    parts = [f"{sku}.p{i}-0" for i in range(3)]
    c = Client.connect(addr)
    try:
        for p in parts:
            c.sale_create(p, 2, shards=1, ttl_ms=60_000, limit=1)
        # "user-7" is homed on part 0 of 3; part 0 is sold out.
        assert stockgate.home_part("user-7", 3) == 0
        for u in ("o1", "o2"):
            assert isinstance(c.reserve(parts[0], u, keyring.mint(parts[0], u), "x"), Reserved)
        assert c.stock(parts[0]) == 0
        mint = lambda user: (lambda s: keyring.mint(s, user))  # noqa: E731
        moved = stockgate.reserve_split(c, sku, parts, "user-7", admission=mint("user-7"), request_id="a")
        assert (moved.part, moved.sku, moved.tried) == (1, parts[1], (0, 1)) and isinstance(moved.outcome, Reserved)
        # The limit (1 per part) on the part that answered is final: no third probe.
        again = stockgate.reserve_split([c, c, c], sku, parts, "user-7", admission=mint("user-7"), request_id="b")
        assert (again.part, again.tried) == (1, (0, 1)) and isinstance(again.outcome, Limit)
        for p in parts[1:]:
            while c.stock(p) > 0:
                u = f"drain-{c.stock(p)}"
                assert isinstance(c.reserve(p, u, keyring.mint(p, u), "d"), Reserved)
        last = stockgate.reserve_split(c, sku, parts, "dave", admission=mint("dave"), request_id="z")
        assert last.tried == (1, 2, 0) and last.outcome == SoldOut()
    finally:
        c.close()
