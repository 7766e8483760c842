#!/usr/bin/env bash
# Instructions per RESERVE on one member of a three-member Raft group, counted by
# valgrind's callgrind: the leader's or a follower's user-space work per request, a
# figure that does not move with the machine's load (for where a member's time goes in
# the kernel, `perf` with `benches/pinned.sh`'s PERF_DIR).
#
#   scripts/callgrind-group.sh [BIN] [N] [P] [WHO]
#     BIN  stockgate binary (default target/release/stockgate)
#     N    requests (default 50000), P pipeline depth (default 16), 50 clients
#     WHO  follower (default) or leader: the member run under callgrind
#   KEEP=1 keeps the callgrind output file for callgrind_annotate.
#
# Member 1 forms the group and is asked to lead; the member under callgrind runs about
# fifty times slower, so every member gets election timeouts of 3 to 6 s (a follower
# under callgrind must not stand while the leader is merely slow to reach it).
# Prints the instructions per request in total and without SHA-256 (valgrind does not
# emulate SHA-NI; see scripts/callgrind-reserve.sh).
set -euo pipefail
ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
BIN=${1:-$ROOT/target/release/stockgate}
N=${2:-50000}
P=${3:-16}
WHO=${4:-follower}
for tool in valgrind callgrind_annotate redis-cli redis-benchmark python3; do
  command -v "$tool" >/dev/null || { echo "missing $tool" >&2; exit 2; }
done
[[ $WHO == follower || $WHO == leader ]] || { echo "WHO is follower or leader" >&2; exit 2; }
D=$(mktemp -d /tmp/sg-callgrind-group.XXXXXX)
PIDS=()
cleanup() {
  local p
  for p in "${PIDS[@]}"; do kill -TERM "$p" 2>/dev/null || true; done
  wait 2>/dev/null || true
  if [[ -n ${KEEP:-} ]]; then echo "callgrind output: $D/cg.out" >&2; else rm -rf "$D"; fi
}
trap cleanup EXIT

# Six free loopback ports, picked at once so that none repeats.
read -r -a PORTS <<<"$(python3 -c '
import socket
s = [socket.socket() for _ in range(6)]
for x in s: x.bind(("127.0.0.1", 0))
print(" ".join(str(x.getsockname()[1]) for x in s))
for x in s: x.close()')"
PEERS=1=127.0.0.1:${PORTS[0]}/127.0.0.1:${PORTS[1]},2=127.0.0.1:${PORTS[2]}/127.0.0.1:${PORTS[3]},3=127.0.0.1:${PORTS[4]}/127.0.0.1:${PORTS[5]}
head -c 32 /dev/urandom | od -An -tx1 | tr -d ' \n' | sed 's/^/k1 /' >"$D/secret"
# The member measured: member 2 as a follower, member 1 (which forms the group) as leader.
MEASURED=2
[[ $WHO == leader ]] && MEASURED=1
for i in 1 2 3; do
  cport=${PORTS[$(((i - 1) * 2))]}
  rport=${PORTS[$(((i - 1) * 2 + 1))]}
  boot=()
  [[ $i == 1 ]] && boot=(--raft-bootstrap)
  run=("$BIN")
  [[ $i == "$MEASURED" ]] && run=(valgrind --tool=callgrind --callgrind-out-file="$D/cg.out" "$BIN")
  STOCKGATE_LOG=warn,openraft=error "${run[@]}" --bind 127.0.0.1 --port "$cport" \
    --data-dir "$D/n$i" --fsync always --threads 1 --secret-file "$D/secret" \
    --reservation-key-file "$D/reservation.key" --create-keys \
    --raft-id "$i" --raft-listen "127.0.0.1:$rport" --raft-peers "$PEERS" "${boot[@]}" \
    --raft-election-min-ms 3000 --raft-election-max-ms 6000 >"$D/n$i.out" 2>"$D/n$i.err" &
  PIDS+=("$!")
  for _ in $(seq 1 600); do
    timeout 2 redis-cli -p "$cport" PING >/dev/null 2>&1 && break
    sleep 0.1
  done
done
LEADER=
for _ in $(seq 1 600); do
  for i in 1 2 3; do
    cport=${PORTS[$(((i - 1) * 2))]}
    if [[ $(timeout 5 redis-cli -p "$cport" ROLE 2>/dev/null | head -n 1) == master ]]; then
      LEADER=$i
      break 2
    fi
  done
  sleep 0.2
done
[[ -n $LEADER ]] || { echo "the group elected no leader" >&2; tail -n 5 "$D"/n*.err >&2; exit 1; }
if [[ $WHO == leader && $LEADER != 1 ]] || [[ $WHO == follower && $LEADER == 2 ]]; then
  echo "member $LEADER leads, not the one this run needs; run again" >&2
  exit 1
fi
LPORT=${PORTS[$(((LEADER - 1) * 2))]}
timeout 60 redis-cli -p "$LPORT" SALE.CREATE BENCH 1000000000000 >/dev/null
TOKEN=$(timeout 30 "$BIN" mint-token --secret-file "$D/secret" --sku BENCH --user bench-user --ttl-ms 86400000)
timeout 3600 redis-benchmark -p "$LPORT" -c 50 -n "$N" -P "$P" -r 1000000000 \
  RESERVE BENCH bench-user "$TOKEN" 'req-__rand_int__' >/dev/null 2>&1
echo "leader: member $LEADER; measured: member $MEASURED ($WHO)"
echo "stock after: $(timeout 30 redis-cli -p "$LPORT" STOCK BENCH)"
# The measured member must have applied every batch before it is stopped: wait until
# its own count of the stock (a READONLY read) is the leader's.
MPORT=${PORTS[$(((MEASURED - 1) * 2))]}
WANT=$(timeout 30 redis-cli -p "$LPORT" STOCK BENCH)
for _ in $(seq 1 600); do
  HAVE=$(printf 'READONLY\r\nSTOCK BENCH\r\n' | timeout 30 redis-cli -p "$MPORT" 2>/dev/null | tail -n 1)
  [[ $HAVE == "$WANT" ]] && break
  sleep 0.2
done
[[ $HAVE == "$WANT" ]] || { echo "member $MEASURED never caught up: $HAVE of $WANT" >&2; exit 1; }
kill -TERM "${PIDS[$((MEASURED - 1))]}"
wait "${PIDS[$((MEASURED - 1))]}" 2>/dev/null || true
callgrind_annotate --auto=no --threshold=100 "$D/cg.out" 2>/dev/null | awk -v n="$N" '
  /PROGRAM TOTALS/ { gsub(",", "", $1); total = $1 }
  (/sha2::sha256/ || /sha2-[0-9.]*\/src\/sha256\//) && !/PROGRAM/ { v = $1; gsub(",", "", v); sha += v }
  END { printf "instructions per request: %d total, %d outside SHA-256 (N=%d)\n", total / n, (total - sha) / n, n }'
# A follower's own part: applying committed batches (the state machine), which does
# not depend on how the batches happened to be cut, unlike the per-batch costs around it.
callgrind_annotate --inclusive=yes --threshold=100 "$D/cg.out" 2>/dev/null | awk -v n="$N" '
  /StateMachine::apply_batch \[/ { v = $1; gsub(",", "", v); if (v > a) a = v }
  END { printf "of which applying committed batches: %d per request\n", a / n }'
