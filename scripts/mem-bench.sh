#!/usr/bin/env bash
# Memory per live reservation and recovery time, on a real release-built server.
#
#   scripts/mem-bench.sh            # builds the release binary if missing, prints a report
#
# 1. Starts `stockgate --fsync everysec`, creates one sale with unlimited stock, reads the
#    server's VmRSS (/proc/PID/status), holds N reservations (redis-benchmark RESERVE, one
#    user, random request ids `req<12 digits>`, pipeline 64), reads VmRSS again: the
#    RSS delta divided by DBSIZE is the memory a live reservation costs.
# 2. SAVE (snapshot of the N reservations), then TAIL_N more reservations logged after
#    it, kill -9, restart: time until `listening on`, and the server's own recovery
#    figure (snapshot load + tail replay).
#
# Environment: BIN (default target/release/stockgate), N (default 1000000), TAIL_N
# (default 100000), USERS=many (part 1 with N distinct users `user-<7 digits>`, one
# reservation each, admission tokens minted here and sent with `redis-cli --pipe`,
# instead of one user). Every process it starts is wrapped in `timeout` and killed by PID.
set -euo pipefail

cd "$(dirname "$0")/.."
BIN=${BIN:-target/release/stockgate}
N=${N:-1000000}
TAIL_N=${TAIL_N:-100000}
TMP=$(mktemp -d /tmp/mem-bench.XXXXXX)
PIDS=()

cleanup() {
    for p in "${PIDS[@]}"; do
        kill -9 "$p" 2>/dev/null || true
    done
    rm -rf "$TMP"
}
trap cleanup EXIT

for t in redis-benchmark redis-cli; do
    command -v "$t" >/dev/null || { echo "missing $t (apt-get install redis-tools)" >&2; exit 1; }
done
if [ ! -x "$BIN" ]; then
    timeout 1800 cargo build --release -p stockgate-server --bin stockgate
fi

# start_stockgate DIR -> SG_PID, SG_PORT; SG_START_MS = ms until `listening on`.
start_stockgate() {
    local dir=$1
    local out="$TMP/sg.out.$RANDOM"
    : >"$out"
    : >"$TMP/sg.err"
    local t0
    t0=$(date +%s%N)
    STOCKGATE_LOG=${STOCKGATE_LOG:-info} timeout 3600 "$BIN" --port 0 --data-dir "$dir" --fsync everysec \
        >"$out" 2>>"$TMP/sg.err" &
    SG_TIMEOUT_PID=$!
    PIDS+=("$SG_TIMEOUT_PID")
    SG_PID=""
    local i
    for i in $(seq 1 1000); do
        SG_PID=$(pgrep -P "$SG_TIMEOUT_PID" || true)
        [ -n "$SG_PID" ] && break
        sleep 0.001
    done
    PIDS+=("$SG_PID")
    for i in $(seq 1 60000); do
        grep -q "^listening on" "$out" 2>/dev/null && break
        if ! kill -0 "$SG_PID" 2>/dev/null; then
            echo "stockgate exited; stderr:" >&2
            tail -20 "$TMP/sg.err" >&2
            exit 1
        fi
        sleep 0.002
    done
    SG_START_MS=$((($(date +%s%N) - t0) / 1000000))
    SG_PORT=$(sed -n 's/^listening on .*:\([0-9]*\)$/\1/p' "$out")
}

kill9() {
    kill -9 "$SG_PID" 2>/dev/null || true
    wait "$SG_TIMEOUT_PID" 2>/dev/null || true
}

rss_kb() {
    sed -n 's/^VmRSS:[[:space:]]*\([0-9]*\) kB/\1/p' "/proc/$SG_PID/status"
}

# fill COUNT: COUNT RESERVEs with random request ids (a 1e9 keyspace: ~0.05% of 1e6
# draws collide and are REPLAYs; DBSIZE gives the exact count).
fill() {
    timeout 1200 redis-benchmark -p "$SG_PORT" -c 50 -n "$1" -P 64 -r 1000000000 -q \
        RESERVE BIG u1 "$TOK" 'req__rand_int__' >/dev/null
}

echo "== machine: $(nproc) cores; stockgate: $BIN ($(stat -c %y "$BIN" | cut -d. -f1))"
dir="$TMP/data"
start_stockgate "$dir"
timeout 10 redis-cli -p "$SG_PORT" SALE.CREATE BIG 1000000000 >/dev/null
TOK=$(timeout 10 "$BIN" mint-token --data-dir "$dir" --sku BIG --user u1 --ttl-ms 3600000)
before=$(rss_kb)
t0=$(date +%s%N)
if [ "${USERS:-one}" = many ]; then
    # RESERVE BIG user-i <token for user-i> req<12 digits>, as RESP, for `redis-cli --pipe`.
    python3 - "$dir/secret" "$N" >"$TMP/many.resp" <<'PY'
import base64, hmac, hashlib, sys, time
kid, hexkey = open(sys.argv[1]).read().split()[:2]
key = bytes.fromhex(hexkey)
n = int(sys.argv[2])
exp = int(time.time() * 1000) + 3_600_000
b64 = lambda b: base64.urlsafe_b64encode(b).rstrip(b"=")
out = sys.stdout.buffer
for i in range(n):
    user = f"user-{i:07d}"
    payload = f"v1|{kid}|BIG|{user}|{exp}".encode()
    tok = b64(payload) + b"." + b64(hmac.new(key, payload, hashlib.sha256).digest())
    args = [b"RESERVE", b"BIG", user.encode(), tok, f"req{i:012d}".encode()]
    out.write(b"*5\r\n" + b"".join(b"$%d\r\n%s\r\n" % (len(a), a) for a in args))
PY
    t0=$(date +%s%N)
    timeout 1200 redis-cli -p "$SG_PORT" --pipe <"$TMP/many.resp" >/dev/null
else
    fill "$N"
fi
fill_ms=$((($(date +%s%N) - t0) / 1000000))
count=$(timeout 10 redis-cli -p "$SG_PORT" DBSIZE)
after=$(rss_kb)
echo "== memory: $count live reservations (users: ${USERS:-one}) in $fill_ms ms"
echo "   VmRSS ${before} kB -> ${after} kB: $(((after - before) * 1024 / count)) bytes/reservation (delta), $((after * 1024 / count)) bytes/reservation (whole process)"

t0=$(date +%s%N)
timeout 600 redis-cli -p "$SG_PORT" SAVE >/dev/null
save_ms=$((($(date +%s%N) - t0) / 1000000))
echo "   VmRSS after SAVE: $(rss_kb) kB"
snap_bytes=$(cat "$dir"/wal/snapshot-*.snap | wc -c)
fill "$TAIL_N"
total=$(timeout 10 redis-cli -p "$SG_PORT" DBSIZE)
echo "== recovery: SAVE $save_ms ms, snapshot $snap_bytes bytes = $((snap_bytes / count)) bytes/reservation; then $((total - count)) more reservations in the log tail"
kill9
start_stockgate "$dir"
echo "   restart (snapshot of $count + tail of $((total - count))): ${SG_START_MS} ms to 'listening on'; server says: $(grep -o 'recovered .*' "$TMP/sg.err" | tail -1); $(grep -o 'freed memory handed back in [0-9]* ms' "$TMP/sg.err" | tail -1)"
test "$(timeout 10 redis-cli -p "$SG_PORT" DBSIZE)" = "$total"
echo "   VmRSS after recovery: $(rss_kb) kB"
kill9
