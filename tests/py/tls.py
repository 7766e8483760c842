"""redis-py over TLS (`ssl=True`) against stockgate's --tls-port: runs one command and
prints its reply; with --hold, keeps the connection, waits for a line on stdin, and runs
the command again on the same connection (a connection opened before a certificate
reload keeps working after it).

Usage: python3 tests/py/tls.py PORT CA_FILE CERT_FILE|- KEY_FILE|- [--hold] CMD ARG...
Exits 1, printing the error, when the connection or the command fails.
"""
import sys

import redis

port, ca, cert, key = int(sys.argv[1]), sys.argv[2], sys.argv[3], sys.argv[4]
rest = sys.argv[5:]
hold = rest[:1] == ["--hold"]
if hold:
    rest = rest[1:]
try:
    r = redis.Redis(
        host="127.0.0.1",
        port=port,
        ssl=True,
        ssl_ca_certs=ca,
        ssl_certfile=None if cert == "-" else cert,
        ssl_keyfile=None if key == "-" else key,
        decode_responses=True,
        single_connection_client=True,
        retry_on_timeout=False,
        retry=None,
        socket_timeout=10,
    )
    print(r.execute_command(*rest), flush=True)
    if hold:
        sys.stdin.readline()
        print(r.execute_command(*rest), flush=True)
except Exception as e:  # noqa: BLE001 - the test reads the words
    print(f"error: {type(e).__name__}: {e}", flush=True)
    sys.exit(1)
