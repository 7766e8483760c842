"""A storm of checkout clients through a Raft group's Sentinel interface
(tests/clients/raft_clients.rs).

argv: <unused port> <dir with the secret> <member ports, comma separated> <group name>
      <sku> <seconds> <workers> <out.json>

Each worker loops: RESERVE (a fresh request id), then COMMIT or RELEASE it (or leave it
held). Every call goes through redis-py's Sentinel-managed connection, unmodified: on a
connection error, READONLY, LOADING or a timeout it retries the same call (same request
id: RESERVE is idempotent per request) until it is acknowledged or the storm ends.
Only acknowledged outcomes are recorded: {request, token, state} with the last state the
server acknowledged, for the test to find on the final leader."""
import json, random, sys, threading, time

import sg
from redis.sentinel import Sentinel
from redis.exceptions import ConnectionError, ReadOnlyError, ResponseError, TimeoutError

sentinels = [("127.0.0.1", int(p)) for p in sys.argv[3].split(",")]
name, sku = sys.argv[4], sys.argv[5]
seconds, workers, out = float(sys.argv[6]), int(sys.argv[7]), sys.argv[8]

stop_at = time.time() + seconds
stop_file = out + ".stop"  # the test creates it to end the storm early


def stopper():
    import os
    global stop_at
    while time.time() < stop_at:
        if os.path.exists(stop_file):
            stop_at = time.time()
        time.sleep(0.1)
acked = []  # (request, token, state)
lock = threading.Lock()
errors = {"retries": 0, "soldout": 0}


def call(master, *args):
    """Retries one call until acknowledged; None when the storm ended first."""
    while time.time() < stop_at:
        try:
            return master.execute_command(*args)
        except (ConnectionError, ReadOnlyError, TimeoutError, ResponseError) as e:
            if isinstance(e, ResponseError) and not str(e).startswith(("LOADING", "READONLY")):
                raise
            with lock:
                errors["retries"] += 1
            time.sleep(0.05)
    return None


def worker(w):
    s = Sentinel(sentinels, socket_timeout=1.0)
    master = s.master_for(name, socket_timeout=3.0, socket_connect_timeout=1.0)
    rnd = random.Random(w)
    n = 0
    while time.time() < stop_at:
        n += 1
        user, req = f"w{w}u{n}", f"w{w}r{n}"
        r = call(master, "RESERVE", sku, user, sg.mint(sku, user, 600_000), req)
        if r is None:
            return
        status = r[0].decode() if isinstance(r[0], bytes) else str(r[0])
        if status == "SOLDOUT":
            with lock:
                errors["soldout"] += 1
            time.sleep(0.01)
            continue
        if status not in ("RESERVED", "REPLAY"):
            raise RuntimeError(f"unexpected RESERVE reply {r!r}")
        token = r[1].decode()
        with lock:
            acked.append([req, token, "RESERVED"])
            idx = len(acked) - 1
        # Mostly released again: the sale keeps churning instead of selling out at once.
        what = rnd.choices(["COMMIT", "RELEASE", None], weights=[1, 18, 1])[0]
        if what is None:
            continue
        try:
            r = call(master, what, token)
        except ResponseError as e:
            # Only possible if the acknowledged reservation was lost: the test fails on it.
            with lock:
                acked[idx][2] = f"ERR {e}"
            continue
        if r is None:
            return
        with lock:
            acked[idx][2] = "COMMITTED" if what == "COMMIT" else "RELEASED"


threads = [threading.Thread(target=worker, args=(w,)) for w in range(workers)]
threads.append(threading.Thread(target=stopper))
for t in threads:
    t.start()
for t in threads:
    t.join()
with open(out, "w") as f:
    json.dump({"acked": acked, **errors}, f)
print(f"storm: {len(acked)} acknowledged reservations, {errors}")
