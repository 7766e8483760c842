#!/usr/bin/env python3
"""A stockgate Raft group's failover time under load, through redis-py's Sentinel client at its
default settings (docs/benchmarks.md, "Failover and switchover" and "Failover by fault kind").

Three members (`--fsync always`) on 127.0.0.1; LOAD threads reserve without pause through
`Sentinel(...).master_for("stockgate")`; the leader is faulted ROUNDS times, each time after the
group has run under load for a few seconds with every member up. Measured per fault: fault ->
the first RESERVE acknowledged that was sent after the fault (the client rediscovers the leader
on its own). Also: how many terms each failover took (one is an election won at the first try),
and, over the whole run, elections the faults do not explain. At the end every acknowledged
reservation is looked up (`RESERVATION`) on the leader: an acknowledged write that is gone would
be a safety bug.

FAULT (env) picks the fault:
  kill  `kill -9` of the leader, restarted once the fault is measured (default).
  stop  SIGSTOP of the leader: the process stays, frozen, its sockets open (connections to it
        are accepted by the kernel and never answered: the clients leave only on their socket
        timeout, 5 s in redis-py 8). It is resumed (SIGCONT) once a RESERVE sent after the fault
        is acknowledged plus SETTLE_SECS, or after HOLD_SECS at most, so that a resume does not
        free clients that their timeouts would have freed anyway. Also measured: SIGCONT -> the
        old leader no longer claiming master, by INFO replication `raft_state` and by `ROLE`
        (a refused connection counts: a deposed leader re-executes itself), and whether it
        re-executed (its `run_id` changed).
  cut   The leader's Raft links to and from the other two are cut (each member reaches each
        other's Raft port through a loopback proxy of this script, `--raft-route`), while
        clients still reach all three client ports. Healed like `stop` is resumed. Also
        recorded: RESERVEs the isolated old leader acknowledged after the cut.

Usage: python3 benches/raft_failover.py [ROUNDS] [BIN]   (default 12, target/release/stockgate)
Env: FAULT (kill|stop|cut), LOAD (threads, default 8), RAFT_ARGS (extra flags for every member,
e.g. "--raft-election-min-ms 300 --raft-election-max-ms 600"), QUIET_SECS (a run without faults
first, counting elections, default 0), HOLD_SECS (longest stop/cut, default 30), SETTLE_SECS
(stop/cut kept on after the first acknowledged RESERVE, default 2), CLIENT_TIMEOUT (seconds:
the buyers' redis-py socket_timeout; default: redis-py's own).
"""
import multiprocessing, os, select, shlex, signal, socket, statistics, subprocess, sys, tempfile
import threading, time

import redis
from redis.sentinel import Sentinel

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
ROUNDS = int(sys.argv[1]) if len(sys.argv) > 1 else 12
BIN = sys.argv[2] if len(sys.argv) > 2 else os.path.join(ROOT, "target/release/stockgate")
LOAD = int(os.environ.get("LOAD", "8"))
EXTRA = shlex.split(os.environ.get("RAFT_ARGS", ""))
QUIET = int(os.environ.get("QUIET_SECS", "0"))
FAULT = os.environ.get("FAULT", "kill")
HOLD = float(os.environ.get("HOLD_SECS", "30"))
SETTLE = float(os.environ.get("SETTLE_SECS", "2"))
CLIENT_TIMEOUT = float(os.environ["CLIENT_TIMEOUT"]) if os.environ.get("CLIENT_TIMEOUT") else None
if FAULT not in ("kill", "stop", "cut"):
    raise SystemExit(f"FAULT={FAULT}: expected kill, stop or cut")


def free_port():
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    p = s.getsockname()[1]
    s.close()
    return p


tmp = tempfile.mkdtemp(prefix="sg-failover-")
ids = [1, 2, 3]
ports = {i: free_port() for i in ids}
rports = {i: free_port() for i in ids}
peers = ",".join(f"{i}=127.0.0.1:{ports[i]}/127.0.0.1:{rports[i]}" for i in ids)
procs = {}
# FAULT=cut: member `a` reaches member `b`'s Raft port through proxy port links[(a, b)].
links = {(a, b): free_port() for a in ids for b in ids if a != b} if FAULT == "cut" else {}


def proxies(ctl):
    """Runs in its own process (the buyers' threads would slow its forwarding under the GIL):
    one listener per directed link, two pumping threads per connection. Commands on `ctl`:
    ("cut", id) closes every connection of a link to or from `id` and refuses new ones until
    ("heal", id); each is answered "ok" once done."""
    lock = threading.Lock()
    cut = set()  # links cut
    live = {k: set() for k in links}  # open sockets per link

    def close(s):
        try:
            s.shutdown(socket.SHUT_RDWR)
        except OSError:
            pass
        s.close()

    def pump(link, a, b):
        try:
            while True:
                r, _, _ = select.select([a], [], [], 0.05)
                if link in cut:
                    break
                if r:
                    data = a.recv(65536)
                    if not data or link in cut:
                        break
                    b.sendall(data)
        except (OSError, ValueError):  # closed by a cut
            pass
        with lock:
            live[link].discard(a)
            live[link].discard(b)
        close(a)
        close(b)

    def listen(link, lport):
        ls = socket.socket()
        ls.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        ls.bind(("127.0.0.1", lport))
        ls.listen(64)
        while True:
            c, _ = ls.accept()
            if link in cut:
                close(c)  # refused while cut
                continue
            try:
                o = socket.create_connection(("127.0.0.1", rports[link[1]]), timeout=1)
            except OSError:
                close(c)
                continue
            o.settimeout(None)
            for s in (c, o):
                s.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            with lock:
                live[link] |= {c, o}
            threading.Thread(target=pump, args=(link, c, o), daemon=True).start()
            threading.Thread(target=pump, args=(link, o, c), daemon=True).start()

    for link, lport in links.items():
        threading.Thread(target=listen, args=(link, lport), daemon=True).start()
    ctl.send("ok")
    while True:
        try:
            what, node = ctl.recv()
        except EOFError:
            return
        mine = {k for k in links if node in k}
        with lock:
            if what == "cut":
                cut.update(mine)
                for k in mine:
                    for s in live[k]:
                        close(s)
                    live[k].clear()
            else:
                cut.difference_update(mine)
        ctl.send("ok")


def start(i, first=False):
    args = [BIN, "--port", str(ports[i]), "--data-dir", f"{tmp}/n{i}", "--fsync", "always",
            "--raft-id", str(i), "--raft-listen", f"127.0.0.1:{rports[i]}", "--raft-peers", peers,
            "--secret-file", f"{tmp}/secret", "--reservation-key-file", f"{tmp}/reservation.key",
            "--create-keys", *EXTRA]
    for (a, b), lport in links.items():
        if a == i:
            args += ["--raft-route", f"{b}=127.0.0.1:{lport}"]
    if first:
        args.append("--raft-bootstrap")
    log = open(f"{tmp}/n{i}.log", "a")
    procs[i] = subprocess.Popen(args, stdout=subprocess.DEVNULL, stderr=log,
                                env={**os.environ, "STOCKGATE_LOG": "info,openraft=warn"})
    for _ in range(200):
        try:
            redis.Redis(port=ports[i], socket_timeout=1).ping()
            return
        except redis.RedisError:
            time.sleep(0.05)
    raise SystemExit(f"member {i} did not start; see {tmp}/n{i}.log")


frozen = set()  # members SIGSTOPped: not asked anything (they would not answer)


def info(i, section="replication"):
    if i in frozen:
        return {}
    try:
        return {k: str(v) for k, v in
                redis.Redis(port=ports[i], socket_timeout=1).info(section).items()}
    except redis.RedisError:
        return {}


def leader():
    for i in ids:
        if procs.get(i) and procs[i].poll() is None and info(i).get("raft_state") == "leader":
            return i
    return None


def whole_group():
    """Every member up, one leader, all in the same term: a healed or resumed old leader that
    still believes it leads (it has not heard the newer term yet) is not a whole group."""
    got = [info(i) for i in ids]
    states = [g.get("raft_state") for g in got]
    return (states.count("leader") == 1 and states.count("follower") == len(ids) - 1
            and len({g.get("raft_term") for g in got}) == 1)


def wait(what, cond, limit=60):
    deadline = time.time() + limit
    while time.time() < deadline:
        if cond():
            return
        time.sleep(0.05)
    raise SystemExit(f"timed out waiting for {what}; logs in {tmp}")


class Tracked(redis.Redis):
    """Remembers which member's client port answered the last command."""
    answered = None

    def parse_response(self, connection, command_name, **options):
        r = super().parse_response(connection, command_name, **options)
        self.answered = connection.port
        return r


acks = []  # (sent, done, client port that answered, reservation token) per acknowledged RESERVE
acks_lock = threading.Lock()
stop = threading.Event()


def buyer(n, token):
    kw = {} if CLIENT_TIMEOUT is None else {"socket_timeout": CLIENT_TIMEOUT}
    sentinel = Sentinel([("127.0.0.1", ports[i]) for i in ids], **kw)
    master = sentinel.master_for("stockgate", redis_class=Tracked, **kw)
    k = 0
    while not stop.is_set():
        k += 1
        sent = time.time()
        try:
            reply = master.execute_command("RESERVE", "FO", f"u{n}", token, f"r{n}-{k}")
        except redis.RedisError:
            time.sleep(0.005)
            continue
        done = time.time()
        with acks_lock:
            acks.append((sent, done, master.answered, reply[1]))


def terms():
    return max(int(info(i).get("raft_term", "0") or 0) for i in ids if procs[i].poll() is None)


def first_ack(t0):
    with acks_lock:
        after = [a[1] for a in acks if a[0] > t0]
    return min(after) if after else None


def watch_claim(i, t_resume, out):
    """From SIGCONT on, polls member i until it no longer claims master, by INFO replication
    `raft_state` and by `ROLE` separately (a refused or reset connection counts for both:
    it is re-executing)."""
    deadline = t_resume + 60
    while time.time() < deadline and ("state" not in out or "role" not in out):
        try:
            r = redis.Redis(port=ports[i], socket_timeout=0.5, socket_connect_timeout=0.5)
            # One answer with both: which process answered (the resumed one or its
            # re-execution) and what it claimed.
            got = r.info("server", "replication")
            st = got.get("raft_state")
            t = time.time()
            if "first_state" not in out:
                out["first_state"] = st
                out["first_at"] = t - t_resume
                out["first_run_id"] = got.get("run_id")
            if st != "leader":
                out.setdefault("state", t - t_resume)
            role = r.execute_command("ROLE")[0]
            role = role.decode() if isinstance(role, bytes) else role
            t = time.time()
            if role != "master":
                out.setdefault("role", t - t_resume)
            r.close()
        except redis.RedisError:
            t = time.time()
            out.setdefault("state", t - t_resume)
            out.setdefault("role", t - t_resume)
            out.setdefault("first_state", "no answer")
            out.setdefault("first_at", t - t_resume)
        time.sleep(0.005)


def verify():
    """Every acknowledged reservation must be found by RESERVATION on the leader; and the
    stock taken is at least the number acknowledged (more: requests whose reply was lost with
    a fault may have taken effect; each was retried under a new request id)."""
    wait("a whole group to verify on", whole_group, 60)
    m = Sentinel([("127.0.0.1", ports[i]) for i in ids], socket_timeout=5).master_for(
        "stockgate", socket_timeout=5)
    missing = 0
    with acks_lock:
        tokens = [a[3] for a in acks]
    for at in range(0, len(tokens), 1000):
        for attempt in range(20):
            try:
                p = m.pipeline(transaction=False)
                for t in tokens[at:at + 1000]:
                    p.execute_command("RESERVATION", t)
                missing += sum(1 for r in p.execute() if not r)
                break
            except redis.RedisError:
                time.sleep(0.2)
        else:
            raise SystemExit("RESERVATION lookups kept failing")
    taken = 10**12 - int(m.execute_command("STOCK", "FO"))
    return len(tokens), len({a[3] for a in acks}), missing, taken


proxy_proc = None
try:
    if links:
        ctl, child = multiprocessing.get_context("fork").Pipe()
        proxy_proc = multiprocessing.get_context("fork").Process(target=proxies, args=(child,),
                                                                  daemon=True)
        proxy_proc.start()
        ctl.recv()

        def links_do(what, node):
            ctl.send((what, node))
            ctl.recv()
    with open(f"{tmp}/secret", "w") as f:
        f.write(f"k1 {os.urandom(32).hex()}\n")
    start(1, first=True)
    for i in ids[1:]:
        start(i)
    wait("a leader", lambda: leader() is not None)
    l = leader()
    r = redis.Redis(port=ports[l], socket_timeout=5)
    r.execute_command("SALE.CREATE", "FO", 10**12)
    token = {}
    for n in range(LOAD):
        token[n] = subprocess.check_output(
            [BIN, "mint-token", "--secret-file", f"{tmp}/secret", "--sku", "FO", "--user", f"u{n}",
             "--ttl-ms", "86400000"], text=True).strip()
    threads = [threading.Thread(target=buyer, args=(n, token[n]), daemon=True) for n in range(LOAD)]
    for t in threads:
        t.start()
    if QUIET:
        t0 = terms()
        time.sleep(QUIET)
        print(f"quiet run: {QUIET} s under load, {terms() - t0} elections, "
              f"{len(acks)} reservations acknowledged")
    times, extra_terms, claims, stale = [], [], [], []
    for rnd in range(ROUNDS):
        if FAULT == "kill":
            wait("every member up and following", lambda: leader() is not None and all(
                info(i).get("raft_state") in ("leader", "follower") for i in ids), 60)
        else:
            wait("every member up and following one leader", whole_group, 60)
        time.sleep(3)
        old = leader()
        before = terms()
        if FAULT == "kill":
            t0 = time.time()
            procs[old].send_signal(signal.SIGKILL)
            procs[old].wait()
            wait("an acknowledged RESERVE after the kill", lambda: first_ack(t0) is not None, 30)
            ms = int((first_ack(t0) - t0) * 1000)
            times.append(ms)
            extra_terms.append(terms() - before)
            print(f"round {rnd + 1}: killed member {old}: first acknowledged RESERVE after {ms} ms, "
                  f"{terms() - before} term(s)", flush=True)
            start(old)
            continue
        run_id = info(old, "server").get("run_id")
        t0 = time.time()
        if FAULT == "stop":
            frozen.add(old)
            procs[old].send_signal(signal.SIGSTOP)
        else:
            links_do("cut", old)
        deadline = t0 + HOLD
        while time.time() < deadline:
            f = first_ack(t0)
            if f is not None and time.time() >= min(deadline, f + SETTLE):
                break
            time.sleep(0.01)
        t1 = time.time()
        during = first_ack(t0) is not None
        out = {}
        if FAULT == "stop":
            procs[old].send_signal(signal.SIGCONT)
            frozen.discard(old)
            w = threading.Thread(target=watch_claim, args=(old, t1, out))
            w.start()
        else:
            links_do("heal", old)
        wait("an acknowledged RESERVE after the fault", lambda: first_ack(t0) is not None, 30)
        ms = int((first_ack(t0) - t0) * 1000)
        times.append(ms)
        held = int((t1 - t0) * 1000)
        when = "during the fault" if during else "only after it ended"
        if FAULT == "stop":
            w.join()
            wait("the old leader back and following", whole_group, 60)
            again = info(old, "server").get("run_id") != run_id
            claims.append((int(out["state"] * 1000), int(out["role"] * 1000), again))
            n_terms = terms() - before
            extra_terms.append(n_terms)
            by = {None: "", run_id: " from the resumed process"}.get(
                out.get("first_run_id"), " from its re-execution")
            print(f"round {rnd + 1}: stopped member {old} for {held} ms: first acknowledged "
                  f"RESERVE after {ms} ms ({when}), {n_terms} term(s); after SIGCONT its first "
                  f"answer ({int(out['first_at'] * 1000)} ms) was raft_state "
                  f"{out['first_state']}{by}, it stopped claiming master after "
                  f"{claims[-1][0]} ms (raft_state) / {claims[-1][1]} ms (ROLE), "
                  f"{'re-executed itself' if again else 'same process, now a follower'}",
                  flush=True)
        else:
            with acks_lock:
                by_old = [a for a in acks if a[2] == ports[old] and t0 < a[1] < t1]
            sent_after = sum(1 for a in by_old if a[0] > t0)
            stale.append((sent_after, len(by_old) - sent_after))
            wait("the old leader back and following", whole_group, 60)
            again = info(old, "server").get("run_id") != run_id
            n_terms = terms() - before
            extra_terms.append(n_terms)
            print(f"round {rnd + 1}: cut member {old} off for {held} ms: first acknowledged "
                  f"RESERVE after {ms} ms ({when}), {n_terms} term(s); the isolated old leader "
                  f"acknowledged {sent_after} RESERVE(s) sent after the cut and answered "
                  f"{len(by_old) - sent_after} sent before it; on healing it "
                  f"{'re-executed itself' if again else 'stayed the same process'}", flush=True)
    stop.set()
    for t in threads:
        t.join(timeout=5)
    if not times:
        raise SystemExit(0)
    n_acks, n_ids, missing, taken = verify()
    s = sorted(times)
    p90 = s[min(len(s) - 1, int(len(s) * 0.9))]
    what = {"kill": "kills", "stop": "stops", "cut": "cuts"}[FAULT]
    timing = ' '.join(EXTRA) or 'default timings'
    if CLIENT_TIMEOUT is not None:
        timing += f", client socket_timeout {CLIENT_TIMEOUT:g} s"
    print(f"raft failover over {len(s)} {what} (LOAD={LOAD}, {timing}): "
          f"median {int(statistics.median(s))} ms, p90 {p90} ms, max {s[-1]} ms; "
          f"{sum(1 for t in extra_terms if t > 1)} took more than one election; "
          f"{n_acks} reservations acknowledged")
    print(f"times: {times}")
    if claims:
        st = sorted(c[0] for c in claims)
        ro = sorted(c[1] for c in claims)
        print(f"after SIGCONT the old leader stopped claiming master: raft_state median "
              f"{int(statistics.median(st))} ms, max {st[-1]} ms; ROLE median "
              f"{int(statistics.median(ro))} ms, max {ro[-1]} ms; re-executed itself in "
              f"{sum(1 for c in claims if c[2])} of {len(claims)}")
    if stale:
        print(f"isolated old leader: acknowledged {sum(a for a, _ in stale)} RESERVE(s) sent "
              f"after the cut (per round: {[a for a, _ in stale]}); answered "
              f"{sum(b for _, b in stale)} sent before it")
    print(f"verify: {n_acks} acknowledged ({n_ids} distinct request ids), {missing} not found by "
          f"RESERVATION; stock taken {taken} ({taken - n_ids} by requests whose reply was lost)")
finally:
    stop.set()
    for i, p in procs.items():
        if i in frozen:
            p.send_signal(signal.SIGCONT)
        p.kill()
    if proxy_proc is not None:
        proxy_proc.kill()
    if not os.environ.get("KEEP"):
        import shutil
        shutil.rmtree(tmp, ignore_errors=True)
    else:
        print(f"kept {tmp}")
