"""The Python package's checkout across a slot move (tests/clients/cluster_packages.rs).

Usage: package_cluster_pay.py hold ADDR SECRET_FILE DATABASE_URL SKU USER
         reserves and records a hold through a single-address client; prints `TOKEN <t>`;
       package_cluster_pay.py pay plain|cluster ADDR SECRET_FILE DATABASE_URL TOKEN
         pays it (money moved) after the harness moved the sale's slot to another group,
         through a single-address client of the OLD group (its COMMIT meets -MOVED) or a
         cluster client seeded with it; prints `OUTCOME <class> <server_confirmed>`.
A raised error fails the run: once money moved and the ledger committed, pay() answers."""
import sys

import stockgate

mode = sys.argv[1]
if mode == "hold":
    addr, secret_file, url, sku, user = sys.argv[2:7]
    client = stockgate.Client.connect(addr)
    co = stockgate.Checkout(client, url)
    token = stockgate.Keyring.from_file(secret_file).mint(sku, user)
    hold = co.reserve_and_record(sku, user, token, f"req-{user}")
    assert isinstance(hold, stockgate.Hold), hold
    print(f"TOKEN {hold.token}")
else:
    how, addr, secret_file, url, token = sys.argv[2:7]
    client = stockgate.Client.connect(addr) if how == "plain" else stockgate.Client.cluster(addr)
    co = stockgate.Checkout(client, url)
    out = co.pay(token, f"psp-{token[-6:]}", money_moved=True)
    print(f"OUTCOME {type(out).__name__} {getattr(out, 'server_confirmed', '-')}")
co.close()
client.close()
