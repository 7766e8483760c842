"""redis-py's Sentinel client, unchanged, pointed at the members of a stockgate Raft
group as its "sentinels": it finds the leader and reads through it.
Usage: raft_sentinel.py PORT1,PORT2,PORT3 SKU. Prints `leader PORT stock N`."""
import sys

from redis.sentinel import Sentinel

ports = [int(p) for p in sys.argv[1].split(",")]
sku = sys.argv[2]
s = Sentinel([("127.0.0.1", p) for p in ports], socket_timeout=1)
host, port = s.discover_master("stockgate")
replicas = s.discover_slaves("stockgate")
assert (host, port) not in replicas, (host, port, replicas)
m = s.master_for("stockgate", socket_timeout=2)
stock = m.execute_command("STOCK", sku)
role = m.execute_command("ROLE")
assert role[0] in (b"master", "master"), role
print(f"leader {port} stock {stock}")
