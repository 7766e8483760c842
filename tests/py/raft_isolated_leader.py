"""redis-py's `Sentinel`, default discovery, with the members of a stockgate Raft group
as its "sentinels" in the order given (the test lists the cut-off old leader first):
reserves one unit, resending the same request id after every failure (a retry whose
first send took effect answers REPLAY) until a reply acknowledges it or time runs out.

Usage: raft_isolated_leader.py PORTS(a,b,c) NAME SKU USER TOKEN REQUEST SECONDS.
Prints `ACK <token> <port> <ms>` (the server that acknowledged, ms since the start) and
exits 0; exits non-zero with the last error otherwise."""
import sys
import time

from redis.sentinel import Sentinel

ports, name, sku, user, token, rid, seconds = sys.argv[1:8]
start = time.monotonic()
deadline = start + float(seconds)
s = Sentinel([("127.0.0.1", int(p)) for p in ports.split(",")], socket_timeout=1)
m = s.master_for(name, socket_timeout=1)


def text(v):
    return v.decode() if isinstance(v, bytes) else str(v)


last = None
while time.monotonic() < deadline:
    try:
        v = m.execute_command("RESERVE", sku, user, token, rid)
        word = text(v[0])
        if word not in ("RESERVED", "REPLAY"):
            sys.exit(f"unexpected reply {v!r}")
        ms = int((time.monotonic() - start) * 1000)
        port = m.info("server")["tcp_port"]
        print(f"ACK {text(v[1])} {port} {ms}", flush=True)
        sys.exit(0)
    except Exception as e:  # noqa: BLE001 - every failure is retried until the deadline
        last = e
        time.sleep(0.05)
sys.exit(f"no acknowledged RESERVE within {seconds} s; last error: {last!r}")
