"""redis-py `RedisCluster`, unmodified, against three stockgate groups in cluster mode
(tests/clients/cluster_clients.rs), in RESP2 and RESP3: creates the sales, warms up, then
reserves and commits for many users on every sale with plain `execute_command`.
redis-py finds a command's key from the server's `COMMAND` reply (position 1 for every
keyed stockgate command), so each request goes to the owning group at once. Keyless
commands (SALE.LIST, EXPIRED) need `target_nodes`, as docs/cluster.md says.

Usage: cluster.py PORTS(a,b,c) SECRET_FILE SKUS(a,b,..) USERS. Prints
`MOVED_AFTER_WARMUP <n>` per protocol and `cluster clients ok`."""
import base64
import hashlib
import hmac
import sys
import time

import redis
from redis.cluster import ClusterNode, RedisCluster

ports = [int(p) for p in sys.argv[1].split(",")]
kid, hex_secret = open(sys.argv[2]).read().split()[:2]
secret = bytes.fromhex(hex_secret)
skus = sys.argv[3].split(",")
users = int(sys.argv[4])


def b64(b):
    return base64.urlsafe_b64encode(b).rstrip(b"=").decode()


def mint(sku, user, ttl_ms=600_000):
    """docs/protocol.md "Admission token"."""
    payload = f"v1|{kid}|{sku}|{user}|{int(time.time() * 1000) + ttl_ms}".encode()
    return b64(payload) + "." + b64(hmac.new(secret, payload, hashlib.sha256).digest())


def moved_total():
    total = 0
    for p in ports:
        total += int(redis.Redis(port=p).info("cluster")["cluster_redirections_moved"])
    return total


def text(v):
    return v.decode() if isinstance(v, bytes) else str(v)


def run(protocol):
    rc = RedisCluster(
        startup_nodes=[ClusterNode("127.0.0.1", ports[0])], protocol=protocol
    )
    assert len(rc.get_primaries()) == 3, rc.get_primaries()
    tag = f"p{protocol}"
    mine = [f"{s}-{tag}" for s in skus]
    for sku in mine:
        assert rc.execute_command("SALE.CREATE", sku, 100000) in (b"OK", True, "OK")
    for sku in mine:
        rc.execute_command("STOCK", sku)
    before = moved_total()
    committed = 0
    for sku in mine:
        for u in range(users):
            user = f"py-{u}"
            r = rc.execute_command("RESERVE", sku, user, mint(sku, user), f"req-{u}")
            assert text(r[0]) == "RESERVED", r
            token = text(r[1])
            if u % 2 == 0:
                assert rc.execute_command("COMMIT", token) == 1
                committed += 1
            else:
                state = rc.execute_command("RESERVATION", token)
                if isinstance(state, list):
                    state = dict(zip(state[::2], state[1::2]))
                assert text(state[b"state"] if b"state" in state else state["state"]) == "RESERVED"
    print(f"MOVED_AFTER_WARMUP {moved_total() - before}", flush=True)
    print(f"COMMITTED {committed}", flush=True)
    # Keyless: every primary lists its own sales; together they are all of them.
    per_node = rc.execute_command("SALE.LIST", target_nodes=rc.get_primaries())
    listed = {text(s) for v in per_node.values() for s in v}
    assert set(mine) <= listed, (mine, listed)
    # A multi-key pipeline over several slots would be split by redis-py itself; the
    # server's slot of a key agrees with the client's.
    for sku in mine:
        assert rc.keyslot(sku) == rc.execute_command("CLUSTER KEYSLOT", sku)
    rc.close()


run(2)
run(3)
print("cluster clients ok", flush=True)
