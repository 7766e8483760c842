"""Shared by the redis-py test scripts: the server's port and data dir from argv, and an
admission-token minter (docs/protocol.md's format, with the server's secret file)."""
import base64, hashlib, hmac, sys, time

port, data_dir = int(sys.argv[1]), sys.argv[2]
kid, hexsecret = open(f"{data_dir}/secret").read().split()[:2]
secret = bytes.fromhex(hexsecret)


def b64(b):
    return base64.urlsafe_b64encode(b).rstrip(b"=").decode()


def mint(sku, user, ttl_ms=60_000):
    payload = f"v1|{kid}|{sku}|{user}|{int(time.time() * 1000) + ttl_ms}".encode()
    return b64(payload) + "." + b64(hmac.new(secret, payload, hashlib.sha256).digest())
