"""redis-py's `Sentinel`, in its default settings, pointed at the members of a stockgate
Raft group as its "sentinels": reserves one unit per user without pause until told to
stop (a line on stdin), while the test kills the leader. A RESERVE that fails is sent
again with the same request id (a retry whose first send took effect answers REPLAY), as
a checkout would; the client is never rebuilt or re-pointed.

Usage: raft_clients.py PORTS(a,b,c) NAME SECRET_FILE SKU. Prints `AT <port>` (the server
it talks to: at the start, after each retried call and every 20 reservations), `ACK
<request_id> <token> <RESERVED|REPLAY>` per acknowledged RESERVE, and `DONE <retries>`
at the end."""
import base64
import hashlib
import hmac
import sys
import threading
import time

from redis.sentinel import Sentinel

ports, name, secret_file, sku = sys.argv[1:5]
kid, hex_secret = open(secret_file).read().split()[:2]
secret = bytes.fromhex(hex_secret)


def b64(b):
    return base64.urlsafe_b64encode(b).rstrip(b"=").decode()


def mint(user, ttl_ms=600000):
    """docs/protocol.md "Admission token"."""
    exp = int(time.time() * 1000) + ttl_ms
    payload = f"v1|{kid}|{sku}|{user}|{exp}".encode()
    sig = hmac.new(secret, payload, hashlib.sha256).digest()
    return f"{b64(payload)}.{b64(sig)}"


stop = threading.Event()


def wait_stop():
    sys.stdin.readline()
    stop.set()


threading.Thread(target=wait_stop, daemon=True).start()

s = Sentinel([("127.0.0.1", int(p)) for p in ports.split(",")])
m = s.master_for(name)


def port():
    return m.info("server")["tcp_port"]


def text(v):
    return v.decode() if isinstance(v, bytes) else str(v)


retries = 0
print(f"AT {port()}", flush=True)
i = 0
while not stop.is_set():
    user, rid = f"u-{i}", f"req-{i}"
    adm = mint(user)
    deadline = time.time() + 30
    retried = False
    while True:
        try:
            v = m.execute_command("RESERVE", sku, user, adm, rid)
            word = text(v[0])
            if word not in ("RESERVED", "REPLAY"):
                sys.exit(f"unexpected {v!r}")
            if retried or i % 20 == 19:
                print(f"AT {port()}", flush=True)
            print(f"ACK {rid} {text(v[1])} {word}", flush=True)
            break
        except Exception as e:  # noqa: BLE001 - every failure is retried, then reported
            if time.time() > deadline:
                sys.exit(f"{rid}: still failing after 30 s: {e!r}")
            retries += 1
            retried = True
            time.sleep(0.05)
    i += 1
print(f"DONE {retries}", flush=True)
