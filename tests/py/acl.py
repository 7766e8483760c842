"""redis-py against a users file with hashed passwords: the right password logs in (on
connect and with AUTH), a wrong one raises AuthenticationError, ACL WHOAMI and ACL LIST
answer, and ACL LIST never shows a password. argv: port, then user:password pairs, the
first an admin."""
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
print("redis-py acl ok")
