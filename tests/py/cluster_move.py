"""redis-py `RedisCluster`, unmodified, buying while `stockgate-sweeper move-slots` moves
the sales' slots to another group (tests/cluster/cluster_move.rs): reserves one unit for a new
user at a time, round robin over the skus, commits every other hold, for DURATION
seconds. redis-py follows -ASK and retries -TRYAGAIN itself; what it gives up on (its
request TTL) is sent again with the same request id, so each request reserves once.

Usage: cluster_move.py PORT SECRET_FILE SKUS(a,b,..) DURATION. Prints `ACK <token>
<0|1>` per acknowledged hold (1: its COMMIT was acknowledged), `RETRIED <n>` and
`buyer ok`. Over TLS when SG_TLS_CA names the CA file (with SG_TLS_CERT and SG_TLS_KEY,
the client certificate, when set; tests/cluster/cluster_tls.rs)."""
import base64
import hashlib
import hmac
import os
import sys
import time

from redis.cluster import ClusterNode, RedisCluster
from redis.exceptions import RedisError

port = int(sys.argv[1])
kid, hex_secret = open(sys.argv[2]).read().split()[:2]
secret = bytes.fromhex(hex_secret)
skus = sys.argv[3].split(",")
duration = float(sys.argv[4])


def b64(b):
    return base64.urlsafe_b64encode(b).rstrip(b"=").decode()


def mint(sku, user, ttl_ms=600_000):
    """docs/protocol.md "Admission token"."""
    payload = f"v1|{kid}|{sku}|{user}|{int(time.time() * 1000) + ttl_ms}".encode()
    return b64(payload) + "." + b64(hmac.new(secret, payload, hashlib.sha256).digest())


def text(v):
    return v.decode() if isinstance(v, bytes) else str(v)


def until_done(f):
    """Sends again what redis-py gave up on; counts the retries."""
    global retried
    deadline = time.time() + 30
    while True:
        try:
            return f()
        except RedisError as e:
            if "SOLDOUT" in str(e) or time.time() > deadline:
                raise
            retried += 1
            time.sleep(0.02)


retried = 0
tls = {}
if os.environ.get("SG_TLS_CA"):
    tls = dict(
        ssl=True,
        ssl_ca_certs=os.environ["SG_TLS_CA"],
        ssl_certfile=os.environ.get("SG_TLS_CERT"),
        ssl_keyfile=os.environ.get("SG_TLS_KEY"),
    )
rc = RedisCluster(startup_nodes=[ClusterNode("127.0.0.1", port)], **tls)
end = time.time() + duration
n = 0
while time.time() < end:
    sku = skus[n % len(skus)]
    user = f"py{n}"
    adm = mint(sku, user)
    reply = until_done(lambda: rc.execute_command("RESERVE", sku, user, adm, f"q{n}"))
    token = text(reply[1])
    committed = 0
    if n % 2 == 0:
        until_done(lambda: rc.execute_command("COMMIT", token))
        committed = 1
    print(f"ACK {token} {committed}")
    n += 1
print(f"RETRIED {retried}")
print("buyer ok")
