"""A failover during a sale: a 3-member Raft group, reached through the Sentinel interface
its members answer (service name `stockgate`). Sync clients (threads) and an async client
(tasks) reserve and commit without pause; once the sale is in flight this test writes the
signal file, the harness `kill -9`s the leader, restarts it and writes `<signal>.done`.

The package finds the new leader and sends every interrupted call again with the same
arguments (a RESERVE with the same request id answers REPLAY if its first send took
effect): no error reaches the application, and every acknowledged hold and commit is on
the new leader afterwards, once."""

from __future__ import annotations

import asyncio
import os
import threading
import time
import uuid
from dataclasses import dataclass
from typing import Callable, List, Tuple


import stockgate
from stockgate import AsyncClient, Client, Replay, Reserved, RetryPolicy

from conftest import env

SYNC_WORKERS = 4
ASYNC_WORKERS = 8
TOTAL = 1_000_000


@dataclass
class Ack:
    request_id: str
    token: str
    committed: bool
    replay: bool


class Sale:
    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.acks: List[Ack] = []
        self.errors: List[str] = []
        self.stop = threading.Event()

    def ack(self, a: Ack) -> None:
        with self.lock:
            self.acks.append(a)

    def count(self) -> int:
        with self.lock:
            return len(self.acks)


def sync_buyer(c: Client, keyring: stockgate.Keyring, sku: str, w: int, sale: Sale) -> None:
    i = 0
    try:
        while not sale.stop.is_set():
            user = f"s{w}-{i}"
            rid = f"req-{user}"
            out = c.reserve(sku, user, keyring.mint(sku, user, 600_000), rid)
            assert isinstance(out, (Reserved, Replay)), (rid, out)
            commit = i % 3 == 0
            if commit:
                c.commit(out.token)
            sale.ack(Ack(rid, out.token, commit, isinstance(out, Replay)))
            i += 1
    except Exception as e:  # noqa: BLE001 - any error reaching the application fails the test
        sale.errors.append(f"sync worker {w}: {e!r}")


async def async_sale(addrs: List[str], keyring: stockgate.Keyring, sku: str, sale: Sale) -> Tuple[int, int]:
    c = AsyncClient.sentinel(addrs, "stockgate", retry=RetryPolicy(deadline=30))
    before = await c.primary_address()

    async def buyer(w: int) -> None:
        i = 0
        try:
            while not sale.stop.is_set():
                user = f"a{w}-{i}"
                rid = f"req-{user}"
                out = await c.reserve(sku, user, keyring.mint(sku, user, 600_000), rid)
                assert isinstance(out, (Reserved, Replay)), (rid, out)
                commit = i % 3 == 1
                if commit:
                    await c.commit(out.token)
                sale.ack(Ack(rid, out.token, commit, isinstance(out, Replay)))
                i += 1
        except Exception as e:  # noqa: BLE001
            sale.errors.append(f"async worker {w}: {e!r}")

    await asyncio.gather(*(buyer(w) for w in range(ASYNC_WORKERS)))
    after = await c.primary_address()
    retries = c.retries
    await c.close()
    return retries, int(before != after)


def wait_for(what: str, limit: float, cond: Callable[[], bool], sale: Sale) -> None:
    t = time.monotonic()
    while not cond():
        assert not sale.errors, sale.errors
        assert time.monotonic() - t < limit, f"{what}: not within {limit} s"
        time.sleep(0.02)


def test_sale_through_a_leader_kill() -> None:
    addrs = env("STOCKGATE_GROUP_ADDRS").split(",")
    signal = env("STOCKGATE_FAILOVER_SIGNAL")
    keyring = stockgate.Keyring.from_file(env("STOCKGATE_SECRET_FILE"))
    sku = f"FAIL-PY-{uuid.uuid4().hex[:8]}"
    c = Client.sentinel(addrs, "stockgate", retry=RetryPolicy(deadline=30))
    c.sale_create(sku, TOTAL, ttl_ms=600_000)
    leader_before = c.primary_address()

    sale = Sale()
    threads = [threading.Thread(target=sync_buyer, args=(c, keyring, sku, w, sale)) for w in range(SYNC_WORKERS)]
    async_result: List[Tuple[int, int]] = []
    threads.append(
        threading.Thread(target=lambda: async_result.append(asyncio.run(async_sale(addrs, keyring, sku, sale))))
    )
    for t in threads:
        t.start()
    try:
        wait_for("the sale in flight", 30, lambda: sale.count() >= 300, sale)
        at_signal = sale.count()
        with open(signal, "w") as f:
            f.write(f"{sku}\n")
        wait_for("the harness's kill and restart", 60, lambda: os.path.exists(signal + ".done"), sale)
        at_done = sale.count()
        # The sale goes on after the failover, on the new leader.
        wait_for("the sale after the failover", 30, lambda: sale.count() >= at_done + 300, sale)
    finally:
        sale.stop.set()
        for t in threads:
            t.join(60)
    assert not sale.errors, sale.errors
    assert async_result, "the async client did not finish"
    async_retries, async_moved = async_result[0]

    leader_after = c.primary_address()
    assert leader_after != leader_before, "the leader did not change"
    assert async_moved == 1, "the async client did not follow the new leader"
    assert c.retries + async_retries > 0, "no call was sent again: the kill did not reach the clients"

    acks = sale.acks
    tokens = [a.token for a in acks]
    assert len(set(tokens)) == len(tokens), "a token handed out twice"
    assert len({a.request_id for a in acks}) == len(acks)

    # Every acknowledged hold, and every acknowledged commit, is on the new leader.
    missing = []
    for a in acks:
        r = c.reservation(a.token)
        want = stockgate.ReservationState.COMMITTED if a.committed else stockgate.ReservationState.RESERVED
        if r is None or r.state != want or r.request_id != a.request_id:
            missing.append((a, r))
    assert not missing, f"{len(missing)} acknowledged holds not as acknowledged, e.g. {missing[:3]}"
    info = c.sale_info(sku)
    committed = sum(1 for a in acks if a.committed)
    assert (info.reserved, info.committed) == (len(acks) - committed, committed), info
    assert info.available + info.reserved + info.committed == TOTAL
    replays = sum(1 for a in acks if a.replay)
    print(
        f"failover: {len(acks)} holds acknowledged ({at_signal} before the signal, {at_done} at done), "
        f"{committed} committed, {replays} answered REPLAY after a retry, "
        f"{c.retries} sync + {async_retries} async retries; leader {leader_before} -> {leader_after}"
    )
    c.close()


