"""redis-py against a users file with hashed passwords: the right password logs in (on
connect and with AUTH), a wrong one raises AuthenticationError, ACL WHOAMI and ACL LIST
answer, and ACL LIST never shows a password. argv: port, then user:password pairs, the
first an admin. Then redis-py's own acl_setuser, acl_getuser and acl_deluser make, read
and delete a user."""
import hashlib
import sys

import redis
from redis.backoff import NoBackoff
from redis.retry import Retry

# Refusals are answers, not faults to retry.
NO_RETRY = Retry(NoBackoff(), 0)

port = int(sys.argv[1])
pairs = [a.split(":", 1) for a in sys.argv[2:]]
admin_user, admin_pw = pairs[0]

for user, pw in pairs:
    r = redis.Redis(port=port, username=user, password=pw, protocol=3, decode_responses=True)
    assert r.acl_whoami() == user, r.acl_whoami()
    r.close()
    try:
        redis.Redis(port=port, username=user, password=pw + "x", protocol=2, retry=NO_RETRY).ping()
        raise SystemExit(f"{user}: a wrong password was accepted")
    except redis.exceptions.AuthenticationError:
        pass

admin = redis.Redis(port=port, username=admin_user, password=admin_pw, decode_responses=True)
lines = admin.execute_command("ACL", "LIST")
assert len(lines) == len(pairs), lines
text = "\n".join(lines)
for _, pw in pairs:
    assert pw not in text, f"password shown in ACL LIST: {text}"
assert all(" on #" in l for l in lines), lines

try:
    redis.Redis(port=port, protocol=2, retry=NO_RETRY).ping()
    raise SystemExit("an unauthenticated PING was answered")
except redis.exceptions.AuthenticationError:
    pass
assert admin.acl_setuser(
    "py-cart", enabled=True, passwords=["+py-cart-pw"], categories=["+@checkout"]
), "acl_setuser"
cart = redis.Redis(port=port, username="py-cart", password="py-cart-pw", decode_responses=True)
assert cart.acl_whoami() == "py-cart"
try:
    cart.execute_command("SALE.CREATE", "PY", "5")
    raise SystemExit("a checkout user ran SALE.CREATE")
except redis.exceptions.NoPermissionError:
    pass
cart.close()
u = admin.acl_getuser("py-cart")
assert u["enabled"], u
assert u["passwords"] == [hashlib.sha256(b"py-cart-pw").hexdigest()], u
assert "-@all" in u["categories"] and "reserve" in " ".join(u["commands"]), u
assert admin.acl_getuser("nobody") is None
assert admin.acl_deluser("py-cart") == 1
try:
    redis.Redis(port=port, username="py-cart", password="py-cart-pw", retry=NO_RETRY).ping()
    raise SystemExit("a deleted user logged in")
except redis.exceptions.AuthenticationError:
    pass
print("redis-py acl ok")
