"""The Python package `stockgate` in cluster mode (tests/clients/cluster_packages.rs): ONE
`Client.cluster` (sync) or `AsyncClient.cluster` (asyncio) given one seed address buys on
sales owned by different groups while `stockgate-sweeper move-slots` moves one sale's slot
to another group. Reserves one unit for a new user at a time, round robin over the skus,
commits every other hold, for DURATION seconds. No redirection, TRYAGAIN or lost reply
may reach the caller: any raised error fails the run.

Then, with the same one client, a split sale whose three parts (PARTS, one per group,
created here with 2 units each) are on different groups: eight buyers `reserve_split`,
so the six units sell through probes across the groups and two buyers get SOLDOUT.

Usage: package_cluster.py sync|async SEED(host:port or redis://...) SECRET_FILE
SKUS(a,b,..) DURATION PARTS(a,b,c). Prints `ACK <token> <0|1>` per acknowledged hold (1:
its COMMIT was acknowledged), `RETRIED <n>`, `SPLIT_RESERVED <n>` and `buyer ok`."""
import asyncio
import sys
import time

import stockgate

mode, seed, secret_file, sku_list, duration, part_list = sys.argv[1:7]
parts = part_list.split(",")
skus = sku_list.split(",")
keyring = stockgate.Keyring.from_file(secret_file)
until = time.monotonic() + float(duration)


def buy_sync() -> int:
    client = stockgate.Client.cluster(seed)
    i = 0
    while time.monotonic() < until:
        sku = skus[i % len(skus)]
        user = f"u{i}"
        out = client.reserve(sku, user, keyring.mint(sku, user), f"r{i}")
        assert isinstance(out, (stockgate.Reserved, stockgate.Replay)), out
        committed = i % 2 == 0 and client.commit(out.token)
        print(f"ACK {out.token} {1 if committed else 0}", flush=True)
        i += 1
    for p in parts:
        client.sale_create(p, 2)
    split = [
        stockgate.reserve_split(client, "SPLIT", parts, f"s{j}", 1,
                                admission=lambda sku, j=j: keyring.mint(sku, f"s{j}"), request_id="r")
        for j in range(8)
    ]
    print(f"SPLIT_RESERVED {sum(isinstance(r.outcome, stockgate.Reserved) for r in split)}")
    retries = client.retries
    client.close()
    return retries


async def buy_async() -> int:
    client = stockgate.AsyncClient.cluster(seed)
    i = 0
    while time.monotonic() < until:
        sku = skus[i % len(skus)]
        user = f"u{i}"
        out = await client.reserve(sku, user, keyring.mint(sku, user), f"r{i}")
        assert isinstance(out, (stockgate.Reserved, stockgate.Replay)), out
        committed = i % 2 == 0 and await client.commit(out.token)
        print(f"ACK {out.token} {1 if committed else 0}", flush=True)
        i += 1
    for p in parts:
        await client.sale_create(p, 2)
    split = [
        await stockgate.reserve_split_async(client, "SPLIT", parts, f"s{j}", 1,
                                            admission=lambda sku, j=j: keyring.mint(sku, f"s{j}"), request_id="r")
        for j in range(8)
    ]
    print(f"SPLIT_RESERVED {sum(isinstance(r.outcome, stockgate.Reserved) for r in split)}")
    retries = client.retries
    await client.close()
    return retries


retried = buy_sync() if mode == "sync" else asyncio.run(buy_async())
print(f"RETRIED {retried}")
print("buyer ok")
