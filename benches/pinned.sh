#!/usr/bin/env bash
# Per-core comparison, one run, every target under the same conditions:
#
#   server under test pinned to one core   (taskset -c $SERVER_CPU, default 1)
#   load generator pinned to the other     (taskset -c $LOAD_CPU,   default 0)
#
# A target made of several server processes (a primary and its replica, the three members
# of a Raft group) has ALL of them on $SERVER_CPU: the load generator keeps the other core
# to itself, so "per core" means the whole replicated system on one core.
#
# Targets (each a fresh process, or set of processes):
#   redis-ping        redis-server, PING
#   redis-per-user    redis-server + benches/lua/reserve_per_user.lua (EVALSHA)
#   redis-seed        redis-server + benches/lua/reserve.lua (EVALSHA)
#   sg-t1             stockgate --fsync everysec --threads 1, RESERVE
#   sg-cluster        sg-t1 in cluster mode (--cluster-enabled yes, one node owning all
#                     16384 slots, docs/cluster.md): the cost of the slot check per request
#   sg-t2             stockgate --fsync everysec --threads 2, RESERVE
#   sg-room-join      sg-t1 with a waiting room on the sale (ROOM.OPEN BENCH RATE 1 MAX
#                     50000000): ROOM.JOIN of a random user per request, so nearly every
#                     call is a new place in the line (a logged record, like a RESERVE)
#   sg-room-status    the same room with 1,000 buyers ahead of bench-user: ROOM.STATUS of
#                     bench-user's ticket per request (its position and wait; at RATE 1 it
#                     stays waiting for the whole run)
#   sg-ping           stockgate --fsync everysec --threads 1, PING
#   sg-t1-always      stockgate --fsync always --threads 1, RESERVE: the single node to
#                     compare the group with (fdatasync before every acknowledgement)
#   sg-raft           a 3-member Raft group (--raft-id 1..3, --fsync always --threads 1 on
#                     each, all three on $SERVER_CPU), RESERVE sent to the leader (found
#                     with SENTINEL get-master-addr-by-name, confirmed by ROLE): a reply
#                     leaves once a majority has the record durable
#   sg-tls            sg-t1 with --tls-port (a test CA made with openssl, no client
#                     certificates), RESERVE over TLS: redis-benchmark --tls
#   redis-tls         redis-per-user over TLS: redis-server --tls-port with the same
#                     certificate, redis-benchmark --tls (Redis's own TLS, OpenSSL)
#   sg-raft-lg        sg-raft driven by the load generator redis-wait uses (below) instead
#                     of redis-benchmark: the like-for-like row against redis-wait, and
#                     next to sg-raft a check of the two load generators against each other
#   redis-wait        redis-server primary + one replica (both on $SERVER_CPU), both
#                     --appendonly yes --appendfsync always, reserve_per_user.lua by EVALSHA
#                     on the primary followed by WAIT 1 0 after EVERY reservation (the pair
#                     is one request): the closest Redis comes to "acknowledged means
#                     replicated". redis-benchmark cannot send two commands per request
#                     (and WAIT does not block inside MULTI/EXEC, nor run in a script), so
#                     this target is driven by `stockgate-bench rbench --wait 1`
#                     (benches/loadgen/src/rbench.rs: redis-benchmark's -c/-n/-P/-r
#                     semantics, the latency of a request is until its WAIT reply).
#                     Redis 7.0's WAIT counts replicas that acknowledged the write; it
#                     does not promise they fsynced it (WAITAOF, Redis 7.2, does).
# Points: C=50 P=1, C=1000 P=1, C=50 P=16, $N requests each (default 300,000).
#
# Columns: req/s and p50/p99/p99.9 as the load generator reports them (redis-benchmark:
# its percentile distribution; rbench: an HDR histogram), the durability of an
# acknowledgement ("fsync"), which load generator drove it (rb = redis-benchmark, lg =
# stockgate-bench rbench), and the server CPU per request: utime+stime of the server
# processes (all threads) from /proc/PID/stat before and after the point, divided by
# requests, summed over every process of the target (group: the three members; redis-wait:
# primary + replica), and the leader's / primary's alone as a second figure.
# That column is the one that survives a noisy shared machine; req/s and latency move
# with whatever else runs on the cores. Ratios are against Redis PING of this run.
# "taken": units the point took from the stock over its requests (below 100 %: replies
# were errors or REPLAYs; redis-benchmark does not report error replies, this does).
#
# RESERVE is driven as in benches/redis_benchmark.sh: ONE minted admission token for ONE
# user, unlimited stock, no per-user limit, random request id per call (a repeated id is
# an idempotent REPLAY), so nearly every call is a new reservation on one shard.
#
# Before/after in one run: BASE_BIN=<older stockgate binary> adds base-t1, base-t2 and
# base-ping (the same three stockgate targets on that binary) to the default targets, so
# both builds meet the same machine load; on a shared machine that matters more than
# anything else (figures move ±20–40 % between runs here, same-run ratios much less).
#
# Usage: benches/pinned.sh [TARGETS...]          (from anywhere; default: all)
# Env:   STOCKGATE_BIN (default target/release/stockgate)  N=300000  POINTS="50:1 1000:1 50:16"
#        STOCKGATE_BENCH_BIN (default: stockgate-bench next to STOCKGATE_BIN; needed by
#        sg-raft-lg and redis-wait: cargo build --release --bin stockgate-bench)
#        BASE_BIN=path  SERVER_CPU=1 LOAD_CPU=0  OUT=file (also write the table there)
#        RAFT_FLAGS="..." extra flags for every Raft member (default: none, the defaults)
#        PERF_DIR=dir  also profile every server process during each point (perf record,
#                      software clock, call graphs) into dir/<target>-<C>-<P>-<role>.data;
#                      role: lead (the leader / primary) or the process id of another
set -euo pipefail

ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
SG_BIN=${STOCKGATE_BIN:-$ROOT/target/release/stockgate}
LG_BIN=${STOCKGATE_BENCH_BIN:-$(dirname "$SG_BIN")/stockgate-bench}
N=${N:-300000}
POINTS=${POINTS:-"50:1 1000:1 50:16"}
SERVER_CPU=${SERVER_CPU:-1}
LOAD_CPU=${LOAD_CPU:-0}
TARGETS=("$@")
BASE_BIN=${BASE_BIN:-}
# Extra flags for every Raft member, e.g. RAFT_FLAGS="--raft-election-min-ms 1000
# --raft-election-max-ms 2000" where a loaded core makes the group lose its leader.
read -r -a RAFT_EXTRA <<<"${RAFT_FLAGS:-}"
if [[ ${#TARGETS[@]} -eq 0 ]]; then
  if [[ -n $BASE_BIN ]]; then
    # Interleaved, so slow drifts of the machine's load hit both builds alike.
    TARGETS=(redis-ping redis-per-user redis-seed sg-t1 base-t1 sg-cluster sg-t2 base-t2 sg-ping base-ping)
  else
    TARGETS=(redis-ping redis-per-user redis-seed sg-t1 sg-cluster sg-t2 sg-ping)
  fi
  # The replicated group against the single node and Redis + WAIT 1, same run.
  TARGETS+=(sg-t1-always sg-raft sg-raft-lg redis-wait)
  # TLS: stockgate's (rustls) and Redis's (OpenSSL), same certificate, same run.
  TARGETS+=(sg-tls redis-tls)
fi
SKU=BENCH
UNITS=1000000000000
HZ=$(getconf CLK_TCK)

for tool in redis-server redis-cli redis-benchmark timeout taskset; do
  command -v "$tool" >/dev/null || { echo "missing $tool" >&2; exit 2; }
done
[[ -x $SG_BIN ]] || { echo "no $SG_BIN: cargo build --release -p stockgate-server --bin stockgate" >&2; exit 2; }
for t in "${TARGETS[@]}"; do
  if [[ $t == sg-raft-lg || $t == redis-wait ]] && [[ ! -x $LG_BIN ]]; then
    echo "$t needs $LG_BIN: cargo build --release --bin stockgate-bench (or set STOCKGATE_BENCH_BIN)" >&2
    exit 2
  fi
done
# 1000 clients need 1000 descriptors on both sides.
ulimit -n "$(ulimit -Hn)" 2>/dev/null || true

TMP=$(mktemp -d /tmp/sg-pinned.XXXXXX)
PIDS=()
cleanup() {
  for pid in "${PIDS[@]}"; do kill -TERM "$pid" 2>/dev/null || true; done
  for pid in "${PIDS[@]}"; do
    for _ in $(seq 1 100); do kill -0 "$pid" 2>/dev/null || break; sleep 0.1; done
    kill -KILL "$pid" 2>/dev/null || true
  done
  rm -rf "$TMP"
}
trap cleanup EXIT
trap 'exit 130' INT TERM

stop() { # pid
  kill -TERM "$1" 2>/dev/null || true
  for _ in $(seq 1 100); do kill -0 "$1" 2>/dev/null || return 0; sleep 0.1; done
  kill -KILL "$1" 2>/dev/null || true
}

# A port nothing on the machine uses, not even as the local end of a connection, and
# outside the kernel's ephemeral range (the load generator's 1000 connections and
# everybody else's tests take theirs there: a bind would collide with them).
free_port() { # [ports not to return...]
  local p lo hi used
  read -r lo hi </proc/sys/net/ipv4/ip_local_port_range 2>/dev/null || { lo=32768; hi=60999; }
  used=" $(ss -Htan 2>/dev/null | awk '{ n = split($4, a, ":"); print a[n] }' | sort -u | tr '\n' ' ') $* "
  for _ in $(seq 1 100); do
    if (( lo > 11000 )); then p=$((10000 + RANDOM % (lo - 10000))); else p=$((hi + 1 + RANDOM % (65535 - hi))); fi
    [[ $used == *" $p "* ]] && continue
    if ! (exec 3<>"/dev/tcp/127.0.0.1/$p") 2>/dev/null; then echo "$p"; return 0; fi
  done
  echo "no free port found" >&2; return 1
}

cpu_ticks() { # pid -> utime+stime in clock ticks (the comm field may hold spaces: cut after ')')
  sed 's/^.*) //' "/proc/$1/stat" | awk '{print $12 + $13}'
}

cpu_sum() { # the CPU ticks of every server process of the target (SPIDS)
  local pid sum=0
  for pid in "${SPIDS[@]}"; do sum=$((sum + $(cpu_ticks "$pid"))); done
  echo "$sum"
}

# A CA and a server certificate for 127.0.0.1 (P-256), made once per run for the TLS
# targets; both servers get the same files, clients verify against the CA.
TLS_DIR=
tls_certs() {
  [[ -n $TLS_DIR ]] && return 0
  command -v openssl >/dev/null || { echo "the TLS targets need openssl" >&2; exit 2; }
  TLS_DIR=$TMP/tls; mkdir -p "$TLS_DIR"
  local ec=(-newkey ec -pkeyopt ec_paramgen_curve:prime256v1 -nodes)
  (cd "$TLS_DIR" &&
    openssl req -x509 "${ec[@]}" -days 2 -keyout ca.key -out ca.pem -subj "/CN=bench CA" &&
    openssl req -new "${ec[@]}" -keyout server.key -out server.csr -subj /CN=localhost &&
    printf 'subjectAltName=IP:127.0.0.1,DNS:localhost\nbasicConstraints=CA:FALSE\nextendedKeyUsage=serverAuth\n' >ext &&
    openssl x509 -req -in server.csr -CA ca.pem -CAkey ca.key -CAcreateserial -days 2 \
      -extfile ext -out server.pem) >/dev/null 2>&1 || { echo "openssl failed" >&2; exit 1; }
  # Redis reads its key as whoever runs it; keep the files readable.
  chmod 644 "$TLS_DIR"/*
}

stock_left() { # the target's remaining stock (STOCK_CMD on PORT), or "-" for PING targets
  if [[ ${#STOCK_CMD[@]} -eq 0 ]]; then echo -; return 0; fi
  timeout 10 redis-cli -p "$PORT" "${STOCK_CMD[@]}" 2>/dev/null | head -n 1
}

# Runs one point with the target's load generator (DRIVER: rb = redis-benchmark, lg =
# stockgate-bench rbench, with --wait WAIT_R if set); prints
# "rps p50 p99 p999 cpu_us_per_req(all processes) cpu_us_per_req(leader/primary) taken".
point() { # port clients pipeline cmd...
  local port=$1 c=$2 p=$3; shift 3
  local t0 t1 m0 m1 s0 s1 out rps p50 p99 p999 rc=0 taken=-
  s0=$(stock_left)
  local perfs=()
  [[ -n ${PERF_DIR:-} ]] && mapfile -t perfs < <(perf_start "$c" "$p")
  m0=$(cpu_ticks "$SPID"); t0=$(cpu_sum)
  if [[ $DRIVER == rb ]]; then
    out=$(timeout 300 taskset -c "$LOAD_CPU" redis-benchmark -h 127.0.0.1 -p "$port" "${LOAD_TLS[@]}" \
          -c "$c" -n "$N" -P "$p" -r 1000000000 "$@" 2>"$TMP/lg.err" | tr '\r' '\n') || rc=$?
    rps=$(echo "$out" | awk '/throughput summary:/ {print $3}' | tail -n 1)
    # "latency summary (msec):" header, names line, values line: avg min p50 p95 p99 max
    read -r p50 p99 < <(echo "$out" | awk '/latency summary/ {getline; getline; print $3, $5}' | tail -n 1)
    # Percentile distribution lines: "99.900% <= 1.234 milliseconds (cumulative count N)"
    p999=$(echo "$out" | awk '/milliseconds \(cumulative count/ { sub(/%/, "", $1); if ($1 + 0 >= 99.9) { print $3; exit } }')
  else
    local wait=()
    [[ -n $WAIT_R ]] && wait=(--wait "$WAIT_R")
    # One line: requests seconds req/s p50_ms p99_ms p999_ms errors
    out=$(timeout 300 taskset -c "$LOAD_CPU" "$LG_BIN" rbench -p "$port" -c "$c" -n "$N" -P "$p" \
          -r 1000000000 "${wait[@]}" -- "$@" 2>"$TMP/lg.err") || rc=$?
    read -r _ _ rps p50 p99 p999 _ <<<"$out"
  fi
  if [[ $rc -ne 0 ]]; then
    tail -n 5 "$TMP/lg.err" >&2
    echo "warning: the load generator exited with $rc (C=$c P=$p)" >&2
  fi
  t1=$(cpu_sum); m1=$(cpu_ticks "$SPID")
  perf_stop "${perfs[@]}"
  s1=$(stock_left)
  if [[ $s0 =~ ^[0-9]+$ && $s1 =~ ^[0-9]+$ ]]; then
    taken=$(awk -v a="$s0" -v b="$s1" -v n="$N" 'BEGIN { printf "%.1f%%", (a - b) / n * 100 }')
  fi
  awk -v r="${rps:-0}" -v a="${p50:-nan}" -v b="${p99:-nan}" -v c="${p999:-nan}" \
      -v d=$((t1 - t0)) -v m=$((m1 - m0)) -v hz="$HZ" -v n="$N" -v k="$taken" \
      'BEGIN { printf "%s %s %s %s %.2f %.2f %s\n", r, a, b, c, d / hz * 1e6 / n, m / hz * 1e6 / n, k }'
}

# With PERF_DIR: one `perf record` per server process of the target; prints their pids.
perf_start() { # clients pipeline
  local pid role
  mkdir -p "$PERF_DIR"
  for pid in "${SPIDS[@]}"; do
    role=$pid; [[ $pid == "$SPID" ]] && role=lead
    perf record -q -e cpu-clock -F 1999 -g -p "$pid" \
      -o "$PERF_DIR/$CUR_TARGET-$1-$2-$role.data" >/dev/null 2>&1 &
    echo $!
  done
  sleep 0.5
}
perf_stop() { # perf pids
  local pid
  for pid in "$@"; do kill -INT "$pid" 2>/dev/null || true; done
  for pid in "$@"; do
    for _ in $(seq 1 100); do kill -0 "$pid" 2>/dev/null || break; sleep 0.1; done
  done
}

# `timeout` forks the server: CPU is read from its child, the server itself.
child_of() { # wrapper pid -> the server's pid
  local c
  for _ in $(seq 1 200); do
    c=$(pgrep -P "$1" | head -n 1 || true)
    [[ -n $c ]] && { echo "$c"; return 0; }
    kill -0 "$1" 2>/dev/null || break
    sleep 0.05
  done
  echo "server process not found under $1" >&2; return 1
}
SPID=
server_pid() { SPID=$(child_of "$PID"); }

# Every process of the current target: TPIDS (the `timeout` wrappers, to stop them),
# SPIDS (the servers, for CPU), PID/SPID/PORT the one the load goes to.
TPIDS=() SPIDS=()

start_redis() { # dir [extra redis-server args...] -> sets PID SPID PORT
  local d=$1; shift
  mkdir -p "$d"
  # A free-looking port can be taken between the probe and the bind (another process,
  # an ephemeral port of the load generator): on a bind failure, try another port.
  for _ in 1 2 3 4 5; do
    PORT=$(free_port)
    taskset -c "$SERVER_CPU" timeout 3600 redis-server --port "$PORT" --bind 127.0.0.1 --save "" \
      --appendonly no --dir "$d" --daemonize no --logfile "$d/log" --maxclients 10000 "$@" &
    PID=$!; PIDS+=("$PID"); TPIDS+=("$PID")
    server_pid || true
    for _ in $(seq 1 150); do
      if timeout 2 redis-cli -p "$PORT" PING >/dev/null 2>&1; then
        [[ -n $SPID ]] || server_pid || exit 1
        SPIDS+=("$SPID"); return 0
      fi
      kill -0 "$PID" 2>/dev/null || break
      sleep 0.1
    done
    if ! grep -q "Address already in use" "$d/log" 2>/dev/null; then break; fi
    stop "$PID"
  done
  cat "$d/log" >&2; echo "redis did not start" >&2; exit 1
}

start_sg() { # dir threads bin fsync [extra flags...] -> sets PID SPID PORT
  mkdir -p "$1"
  local d=$1 th=$2 b=$3 fs=$4; shift 4
  taskset -c "$SERVER_CPU" timeout 3600 "$b" --bind 127.0.0.1 --port "${SG_PORT:-0}" --data-dir "$d/data" \
    --fsync "$fs" --threads "$th" "$@" >"$d/out" 2>"$d/err" &
  PID=$!; PIDS+=("$PID"); TPIDS+=("$PID")
  server_pid || exit 1
  SPIDS+=("$SPID")
  PORT=
  for _ in $(seq 1 150); do
    PORT=$(sed -n 's/^listening on .*:\([0-9][0-9]*\)$/\1/p' "$d/out" | head -n 1)
    [[ -n $PORT ]] && return 0
    kill -0 "$PID" 2>/dev/null || { cat "$d/err" >&2; exit 1; }
    sleep 0.1
  done
  echo "stockgate did not start" >&2; cat "$d/err" >&2; exit 1
}

wait_ping() { # port pid what
  for _ in $(seq 1 200); do
    timeout 2 redis-cli -p "$1" PING 2>/dev/null | grep -q PONG && return 0
    kill -0 "$2" 2>/dev/null || break
    sleep 0.1
  done
  echo "$3 did not answer PING on $1" >&2; return 1
}

# Three members, each --fsync always --threads 1 on $SERVER_CPU, shared keys; started one
# after the other (the first creates the reservation key), then the leader is found as a
# Sentinel-aware client finds it. Sets PID SPID PORT (the leader) and SPIDS (leader first).
# Three members, each --fsync always --threads 1 on $SERVER_CPU, shared keys; started one
# after the other (the first creates the reservation key), then the leader is found as a
# Sentinel-aware client finds it. Sets PID SPID PORT (the leader), SPIDS (leader first)
# and RAFT_PORTS. A member that cannot bind its ports (taken between the probe and the
# bind) makes the whole group start again on other ports.
RAFT_PORTS=()
start_raft() { # dir bin
  local attempt
  for attempt in 1 2 3 4 5; do
    start_raft_once "$1/try$attempt" "$2" && return 0
    local pid
    for pid in "${TPIDS[@]}"; do stop "$pid"; done
    TPIDS=()
    grep -qs "Address already in use" "$1/try$attempt"/n*.err || break
    echo "raft group: a port was taken, starting again on others" >&2
  done
  echo "the raft group did not start" >&2; tail -n 20 "$1"/try*/n*.err >&2; exit 1
}

start_raft_once() { # dir bin
  local d=$1 b=$2 i peers='' wpid lport='' addr pp picked=()
  mkdir -p "$d"
  head -c 32 /dev/urandom | od -An -tx1 | tr -d ' \n' | sed 's/^/k1 /' >"$d/secret"
  local mport=() rfport=() wpids=() spids=()
  for i in 1 2 3; do
    mport[i]=$(free_port "${picked[@]}"); picked+=("${mport[i]}")
    rfport[i]=$(free_port "${picked[@]}"); picked+=("${rfport[i]}")
    peers+="${peers:+,}$i=127.0.0.1:${mport[i]}/127.0.0.1:${rfport[i]}"
  done
  for i in 1 2 3; do
    # Member 1 forms the group, once.
    local boot=(); [ "$i" = 1 ] && boot=(--raft-bootstrap)
    STOCKGATE_LOG=warn,openraft=error taskset -c "$SERVER_CPU" timeout 3600 "$b" \
      --bind 127.0.0.1 --port "${mport[i]}" --data-dir "$d/n$i" --fsync always --threads 1 \
      --secret-file "$d/secret" --reservation-key-file "$d/reservation.key" --create-keys \
      --raft-id "$i" --raft-listen "127.0.0.1:${rfport[i]}" --raft-peers "$peers" "${boot[@]}" "${RAFT_EXTRA[@]}" \
      >"$d/n$i.out" 2>"$d/n$i.err" &
    wpid=$!; PIDS+=("$wpid"); TPIDS+=("$wpid"); wpids[i]=$wpid
    spids[i]=$(child_of "$wpid" 2>/dev/null) || return 1
    wait_ping "${mport[i]}" "$wpid" "raft member $i" 2>/dev/null || return 1
  done
  for _ in $(seq 1 300); do
    for i in 1 2 3; do
      addr=$(timeout 2 redis-cli -p "${mport[i]}" SENTINEL get-master-addr-by-name stockgate 2>/dev/null | tr '\n' ' ' || true)
      read -r _ pp _ <<<"$addr"
      if [[ ${pp:-} =~ ^[0-9]+$ ]] && [[ $(timeout 2 redis-cli -p "$pp" ROLE 2>/dev/null | head -n 1) == master ]]; then
        lport=$pp; break 2
      fi
    done
    sleep 0.1
  done
  [[ -n $lport ]] || { echo "the raft group elected no leader" >&2; return 1; }
  RAFT_PORTS=()
  for i in 1 2 3; do
    if [[ ${mport[i]} == "$lport" ]]; then
      PID=${wpids[i]} SPID=${spids[i]} PORT=$lport
      echo "raft leader: member $i on port $lport" >&2
    fi
  done
  SPIDS+=("$SPID")
  for i in 1 2 3; do
    [[ ${spids[i]} == "$SPID" ]] || SPIDS+=("${spids[i]}")
    RAFT_PORTS+=("${mport[i]}")
  done
  ln -sfn "$d/secret" "${d%/*}/secret"
}

# The waiting-room targets: a room on the sale, and the command each request sends
# (sets cmd; STOCK is not what they change, so "taken" is left out).
room_target() { # target
  local ticket i
  [[ $(timeout 10 redis-cli -p "$PORT" ROOM.OPEN "$SKU" RATE 1 MAX 50000000) == OK ]] ||
    { echo "ROOM.OPEN failed on $1" >&2; exit 1; }
  STOCK_CMD=()
  if [[ $1 == sg-room-join ]]; then
    cmd=(ROOM.JOIN "$SKU" "u__rand_int__")
    return 0
  fi
  for i in $(seq 1 1000); do echo "ROOM.JOIN $SKU ahead-$i"; done |
    timeout 60 redis-cli -p "$PORT" >/dev/null
  ticket=$(timeout 10 redis-cli -p "$PORT" ROOM.JOIN "$SKU" bench-user | head -n 1)
  [[ $ticket == t1\|* ]] || { echo "ROOM.JOIN failed on $1: $ticket" >&2; exit 1; }
  cmd=(ROOM.STATUS "$SKU" bench-user "$ticket")
}

declare -A RES FSYNC LOADGEN NOTE
run_target() { # name
  local t=$1 dir=$TMP/$1 cmd=() pt c p
  CUR_TARGET=$t
  TPIDS=() SPIDS=() STOCK_CMD=() DRIVER=rb WAIT_R='' REPL_PORTS=()
  # The TLS targets send the load to LOAD_PORT with LOAD_TLS; setup and STOCK go to the
  # plain PORT.
  LOAD_PORT='' LOAD_TLS=()
  case $t in
    redis-ping|redis-per-user|redis-seed|redis-wait|redis-tls)
      local tag="{${SKU}_SHARD_1}"
      FSYNC[$t]=none
      if [[ $t == redis-wait ]]; then
        FSYNC[$t]="AOF always x2, WAIT 1"
        DRIVER=lg WAIT_R=1
        start_redis "$dir/replica" --appendonly yes --appendfsync always
        local rport=$PORT
        start_redis "$dir" --appendonly yes --appendfsync always
        timeout 10 redis-cli -p "$rport" REPLICAOF 127.0.0.1 "$PORT" >/dev/null
        local synced=
        for _ in $(seq 1 200); do
          if timeout 2 redis-cli -p "$rport" INFO replication 2>/dev/null | grep -q '^master_link_status:up' &&
             [[ $(timeout 5 redis-cli -p "$PORT" WAIT 1 2000 2>/dev/null) == 1 ]]; then
            synced=1; break
          fi
          sleep 0.1
        done
        [[ -n $synced ]] || { echo "redis replica did not sync" >&2; cat "$dir/replica/log" >&2; exit 1; }
        REPL_PORTS=("$rport")
        # The primary's process is the one whose CPU is also shown alone: put it first.
        SPIDS=("${SPIDS[1]}" "${SPIDS[0]}")
      elif [[ $t == redis-tls ]]; then
        tls_certs
        LOAD_PORT=$(free_port)
        FSYNC[$t]="none, TLS"
        start_redis "$dir" --tls-port "$LOAD_PORT" --tls-cert-file "$TLS_DIR/server.pem" \
          --tls-key-file "$TLS_DIR/server.key" --tls-ca-cert-file "$TLS_DIR/ca.pem" --tls-auth-clients no
        LOAD_TLS=(--tls --cacert "$TLS_DIR/ca.pem")
      else
        start_redis "$dir"
      fi
      timeout 10 redis-cli -p "$PORT" SET "$tag:stock" "$UNITS" >/dev/null
      case $t in
        redis-ping) cmd=(PING) ;;
        redis-per-user|redis-wait|redis-tls)
          local sha
          sha=$(timeout 10 redis-cli -p "$PORT" SCRIPT LOAD "$(cat "$ROOT/benches/lua/reserve_per_user.lua")")
          STOCK_CMD=(GET "$tag:stock")
          cmd=(EVALSHA "$sha" 2 "$tag:stock" "$tag:user:u__rand_int__" 1 600 "{$SKU}tok__rand_int__") ;;
        redis-seed)
          local sha expiry
          sha=$(timeout 10 redis-cli -p "$PORT" SCRIPT LOAD "$(cat "$ROOT/benches/lua/reserve.lua")")
          expiry=$(( $(date +%s) + 630 ))
          STOCK_CMD=(GET "$tag:stock")
          cmd=(EVALSHA "$sha" 3 "$tag:stock" "$tag:expiry_index" "$tag:reservation:{$SKU}tok__rand_int__"
               "$SKU" bench-user 1 630 "$expiry" "{$SKU}tok__rand_int__") ;;
      esac ;;
    sg-t1|sg-t2|sg-ping|base-t1|base-t2|base-ping|sg-t1-always|sg-raft|sg-raft-lg|sg-tls|sg-cluster|sg-room-join|sg-room-status)
      local threads=1 bin=$SG_BIN fsync=everysec keys
      [[ $t == *-t2 ]] && threads=2
      [[ $t == sg-t1-always ]] && fsync=always
      if [[ $t == base-* ]]; then
        [[ -x $BASE_BIN ]] || { echo "$t needs BASE_BIN" >&2; exit 2; }
        bin=$BASE_BIN
      fi
      FSYNC[$t]=$fsync
      keys=(--data-dir "$dir/data")
      if [[ $t == sg-raft* ]]; then
        FSYNC[$t]="raft 2 of 3, always"
        [[ $t == sg-raft-lg ]] && DRIVER=lg
        start_raft "$dir" "$bin"
        local mp
        for mp in "${RAFT_PORTS[@]}"; do [[ $mp == "$PORT" ]] || REPL_PORTS+=("$mp"); done
        keys=(--secret-file "$dir/secret")
      elif [[ $t == sg-tls ]]; then
        tls_certs
        LOAD_PORT=$(free_port)
        FSYNC[$t]="everysec, TLS"
        start_sg "$dir" "$threads" "$bin" "$fsync" --tls-port "$LOAD_PORT" \
          --tls-cert-file "$TLS_DIR/server.pem" --tls-key-file "$TLS_DIR/server.key" --tls-auth-clients no
        LOAD_TLS=(--tls --cacert "$TLS_DIR/ca.pem")
      elif [[ $t == sg-cluster ]]; then
        # The map names the node's port, so the port is chosen before it starts.
        local cport
        cport=$(free_port)
        mkdir -p "$dir"
        printf 'group all 0-16383\nnode %s 127.0.0.1:%s\n' \
          0000000000000000000000000000000000000001 "$cport" >"$dir/cluster.map"
        SG_PORT=$cport start_sg "$dir" "$threads" "$bin" "$fsync" \
          --cluster-enabled yes --cluster-config "$dir/cluster.map"
      else
        start_sg "$dir" "$threads" "$bin" "$fsync"
      fi
      if [[ $t == *-ping ]]; then
        cmd=(PING)
      else
        local token check created=
        for _ in $(seq 1 50); do
          [[ $(timeout 10 redis-cli -p "$PORT" SALE.CREATE "$SKU" "$UNITS" 2>/dev/null) == OK ]] && { created=1; break; }
          sleep 0.1
        done
        [[ -n $created ]] || { echo "SALE.CREATE failed on $t" >&2; exit 1; }
        token=$(timeout 10 "$bin" mint-token "${keys[@]}" --sku "$SKU" --user bench-user --ttl-ms 86400000)
        check=$(timeout 10 redis-cli -p "$PORT" RESERVE "$SKU" bench-user "$token" check-1 | head -n 1)
        [[ $check == RESERVED ]] || { echo "RESERVE check failed: $check" >&2; exit 1; }
        STOCK_CMD=(STOCK "$SKU")
        cmd=(RESERVE "$SKU" bench-user "$token" "req-__rand_int__")
        [[ $t == sg-room-* ]] && room_target "$t"
      fi ;;
    *) echo "unknown target $t" >&2; exit 2 ;;
  esac
  LOADGEN[$t]=$DRIVER
  for pt in $POINTS; do
    c=${pt%%:*}; p=${pt##*:}
    RES[$t,$pt]=$(point "${LOAD_PORT:-$PORT}" "$c" "$p" "${cmd[@]}")
    [[ ${RES[$t,$pt]%% *} == 0 ]] && NOTE[$t]+="C=$c P=$p failed (the error is above the table); "
    echo "$t C=$c P=$p: ${RES[$t,$pt]}" >&2
  done
  if [[ $t == sg-raft* ]] && [[ $(timeout 2 redis-cli -p "$PORT" ROLE 2>/dev/null | head -n 1) != master ]]; then
    NOTE[$t]+="leader changed during the run; "
    echo "warning: $t: the member on $PORT is no longer the leader" >&2
  fi
  # Every replica / follower ends with the leader's stock (what was acknowledged is there).
  if [[ ${#REPL_PORTS[@]} -gt 0 && ${#STOCK_CMD[@]} -gt 0 ]]; then
    local want got rp
    want=$(stock_left)
    for rp in "${REPL_PORTS[@]}"; do
      for _ in $(seq 1 100); do
        # A stockgate follower answers reads after READONLY (Redis refuses it, harmlessly).
        got=$(printf 'READONLY\n%s\n' "${STOCK_CMD[*]}" | timeout 2 redis-cli -p "$rp" 2>/dev/null | tail -n 1)
        [[ $got == "$want" ]] && break
        sleep 0.1
      done
      if [[ $got != "$want" ]]; then
        NOTE[$t]+="the replica on $rp has stock $got, the leader $want; "
        echo "warning: $t: the replica on $rp has stock $got, the leader $want" >&2
      fi
    done
  fi
  local pid
  for pid in "${TPIDS[@]}"; do stop "$pid"; done
}

for t in "${TARGETS[@]}"; do run_target "$t"; done

{
  echo "benches/pinned.sh: $N requests per point, server(s) on CPU $SERVER_CPU, load generator on CPU $LOAD_CPU"
  [[ -n $BASE_BIN ]] && echo "base-*: the same stockgate targets on $BASE_BIN"
  [[ -n ${RAFT_FLAGS:-} ]] && echo "raft members: RAFT_FLAGS=$RAFT_FLAGS"
  echo "($(nproc) cores, $(redis-server --version | awk '{print $3}'), stockgate $(git -C "$ROOT" rev-parse --short HEAD 2>/dev/null || echo '?'), $(date -u +%FT%TZ))"
  echo "load: rb = redis-benchmark, lg = stockgate-bench rbench (benches/loadgen/src/rbench.rs)"
  echo "CPU µs/req: all server processes of the target; lead only: the leader / primary alone"
  echo
  printf '| %-14s | %-21s | %-4s | %-6s | %10s | %7s | %7s | %7s | %10s | %9s | %11s | %6s |\n' \
    target fsync load "C/P" "req/s" "p50 ms" "p99 ms" "p99.9" "CPU µs/req" "lead only" "CPU vs PING" taken
  printf '|%s|%s|%s|%s|%s|%s|%s|%s|%s|%s|%s|%s|\n' "----------------" "-----------------------" "------" \
    "--------" "-----------:" "--------:" "--------:" "--------:" "-----------:" "----------:" "------------:" "-------:"
  for pt in $POINTS; do
    for t in "${TARGETS[@]}"; do
      read -r rps p50 p99 p999 cpu lead taken <<<"${RES[$t,$pt]}"
      ratio="-"
      if [[ -n ${RES[redis-ping,$pt]:-} ]]; then
        base=$(awk '{print $5}' <<<"${RES[redis-ping,$pt]}")
        ratio=$(awk -v a="$cpu" -v b="$base" 'BEGIN { if (b > 0) printf "%.2fx", a / b; else print "-" }')
      fi
      printf '| %-14s | %-21s | %-4s | %-6s | %10.0f | %7s | %7s | %7s | %10s | %9s | %11s | %6s |\n' \
        "$t" "${FSYNC[$t]}" "${LOADGEN[$t]}" "${pt/:/\/}" "$rps" "$p50" "$p99" "$p999" "$cpu" "$lead" "$ratio" "$taken"
    done
  done
  for t in "${TARGETS[@]}"; do
    [[ -n ${NOTE[$t]:-} ]] && echo "note: $t: ${NOTE[$t]}"
  done
  true
} | tee "${OUT:-/dev/null}"
