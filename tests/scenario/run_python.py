"""The shared checkout scenario (tests/scenario/checkout.json) through the Python package
(`stockgate`: AsyncClient + AsyncCheckout), printing its summary as one line
`SUMMARY <json>`; tests/ledger/checkout_scenario.rs runs it beside the Rust and Node runners
and compares the summaries. The steps, the same in every runner:

1. every buyer reserves its qty, concurrently (a SOLDOUT while STOCK is positive is asked
   again with the same request id);
2. every sold_out buyer reserves: SOLDOUT (nothing has gone back yet);
3. each buyer's action: pay / pay_twice / cancel now; pay_late / authorize_late after the
   last hold's deadline; abandon does nothing;
4. wait until the sweeper has given back every unpaid unit;
5. summary: the outcomes, the ledger's orders of the sale by status (count, units), the
   server's SALE.INFO.

Environment: STOCKGATE_ADDR, STOCKGATE_SECRET_FILE, STOCKGATE_DATABASE_URL,
STOCKGATE_LEDGER_SCHEMA, SCENARIO_FILE, SCENARIO_SKU."""

from __future__ import annotations

import asyncio
import json
import os
import sys
import time
from collections import Counter
from typing import Any, Dict, List

import psycopg

import stockgate
from stockgate import (
    AlreadyCommitted,
    AsyncCheckout,
    AsyncClient,
    Committed,
    Hold,
    RefundRequired,
    Refused,
    SoldOut,
)


def outcome_name(out: object) -> str:
    if isinstance(out, Committed):
        return "committed"
    if isinstance(out, AlreadyCommitted):
        return "already_committed"
    if isinstance(out, Refused):
        return "refused"
    if isinstance(out, RefundRequired):
        return "refund_required"
    raise AssertionError(f"unexpected payment outcome {out!r}")


async def main() -> None:
    spec: Dict[str, Any] = json.load(open(os.environ["SCENARIO_FILE"]))
    sku = os.environ["SCENARIO_SKU"]
    url = os.environ["STOCKGATE_DATABASE_URL"]
    schema = os.environ.get("STOCKGATE_LEDGER_SCHEMA") or "stockgate"
    keyring = stockgate.Keyring.from_file(os.environ["STOCKGATE_SECRET_FILE"])
    client = AsyncClient.connect(os.environ["STOCKGATE_ADDR"], max_connections=32)
    co = AsyncCheckout(client, url, schema=schema, pool_size=16)
    counts: Counter[str] = Counter()
    try:
        await client.sale_create(sku, spec["total"], shards=spec["shards"], ttl_ms=spec["ttl_ms"])

        async def reserve(user: str, qty: int) -> stockgate.StartOutcome:
            while True:
                out = await co.reserve_and_record(sku, user, keyring.mint(sku, user), f"req-{user}", qty)
                if not isinstance(out, SoldOut) or await client.stock(sku) == 0:
                    return out

        buyers: List[Dict[str, Any]] = spec["buyers"]
        holds = await asyncio.gather(*(reserve(b["user"], b["qty"]) for b in buyers))
        for b, h in zip(buyers, holds):
            assert isinstance(h, Hold), (b, h)
            counts["hold"] += 1
        for user in spec["sold_out"]:
            out = await reserve(user, 1)
            assert isinstance(out, SoldOut), (user, out)
            counts["sold_out"] += 1

        async def act(b: Dict[str, Any], h: Hold) -> None:
            a = b["action"]
            if a == "pay":
                counts[outcome_name(await co.pay(h.token, f"pay-{b['user']}", money_moved=True))] += 1
            elif a == "pay_twice":
                for _ in range(2):
                    counts[outcome_name(await co.pay(h.token, f"pay-{b['user']}", money_moved=True))] += 1
            elif a == "cancel":
                if await co.cancel(h.token):
                    counts["cancelled"] += 1

        await asyncio.gather(*(act(b, h) for b, h in zip(buyers, holds)))  # type: ignore[arg-type]

        deadline = max(h.expires_at_ms for h in holds)  # type: ignore[union-attr]
        while stockgate.now_ms() <= deadline + 20:
            await asyncio.sleep(0.05)
        late = [(b, h) for b, h in zip(buyers, holds) if b["action"] in ("pay_late", "authorize_late")]
        outs = await asyncio.gather(
            *(co.pay(h.token, f"late-{b['user']}", money_moved=b["action"] == "pay_late") for b, h in late)  # type: ignore[union-attr]
        )
        for out in outs:
            counts[outcome_name(out)] += 1

        paid = sum(b["qty"] for b in buyers if b["action"] in ("pay", "pay_twice"))
        t = time.monotonic()
        while (await client.sale_info(sku)).available != spec["total"] - paid:
            assert time.monotonic() - t < 60, "the sweeper did not give the unpaid units back"
            await asyncio.sleep(0.1)
        info = await client.sale_info(sku)
        with psycopg.connect(url, autocommit=True) as db:
            rows = db.execute(
                f'SELECT status, count(*), sum(qty) FROM "{schema}".orders WHERE sku = %s GROUP BY status',
                (sku,),
            ).fetchall()
        summary = {
            "outcomes": dict(counts),
            "orders": {s: [int(n), int(u)] for s, n, u in rows},
            "server": {"committed": info.committed, "reserved": info.reserved, "available": info.available},
        }
        print("SUMMARY " + json.dumps(summary, sort_keys=True))
    finally:
        await co.close()
        await client.close()


if __name__ == "__main__":
    asyncio.run(asyncio.wait_for(main(), 120))
    sys.stdout.flush()
