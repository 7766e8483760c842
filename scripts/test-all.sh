#!/usr/bin/env bash
# Runs every test of the workspace. On a fresh Debian machine with Rust it first installs
# what the end-to-end tests talk to: redis-tools/redis-server (redis-cli is a real client
# under test, redis-server runs the Redis+Lua baseline), PostgreSQL (the ledger tests
# start a throwaway cluster from its binaries), redis-py, the npm packages of tests/node,
# tests/node-oldest and clients/node, and what the operations tests drive
# (tests/ops/metrics_e2e.rs): prometheus-redis-exporter (the real exporter scrapes
# stockgate), chromium (the status page, headless) and tmux (`stockgate top` in a detached
# pane), and systemd-analyze (the units in deploy/systemd). Node.js itself (20 or newer) and
# npm must be there already.
set -euo pipefail
cd "$(dirname "$0")/.."

need=()
command -v redis-cli >/dev/null 2>&1 || need+=(redis-tools)
command -v redis-server >/dev/null 2>&1 || need+=(redis-server)
ls /usr/lib/postgresql/*/bin/initdb >/dev/null 2>&1 || need+=(postgresql)
command -v prometheus-redis-exporter >/dev/null 2>&1 || need+=(prometheus-redis-exporter)
command -v chromium >/dev/null 2>&1 || need+=(chromium)
command -v tmux >/dev/null 2>&1 || need+=(tmux)
# systemd-analyze checks the units in deploy/systemd (tests/ops/deploy_systemd.rs).
command -v systemd-analyze >/dev/null 2>&1 || need+=(systemd)
# promtool checks and tests the rules in deploy/prometheus (tests/ops/deploy_prometheus.rs).
command -v promtool >/dev/null 2>&1 || need+=(prometheus)
command -v curl >/dev/null 2>&1 || need+=(curl)
# openssl (the command) makes the test CA and certificates of tests/ops/ops_tls.rs.
command -v openssl >/dev/null 2>&1 || need+=(openssl)
if [ ${#need[@]} -gt 0 ]; then
  SUDO=""
  [ "$(id -u)" -ne 0 ] && SUDO="sudo"
  echo "installing: ${need[*]}"
  $SUDO apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq "${need[@]}" >/dev/null
fi
# Python: two virtual environments of the suite's own under target/py, each installed
# exactly from a lock file (pinned versions, never the machine's site-packages):
#   newest: tests/py/requirements.txt, the newest redis-py the package allows, and every
#           Python tool the tests use; its python3 comes first on PATH for every test;
#   oldest: tests/py/requirements-oldest.txt, the oldest redis-py it allows, where
#           tests/clients/python_package.rs runs the package's tests again.
# The package under test (tests/clients/python_package.rs runs its pytest suite;
# tests/ledger/checkout_scenario.rs runs tests/scenario/run_python.py with it) goes into both
# from this checkout every run, as `pip install` gives it, so the tests see the source.
py_env() {
  local dir="target/py/$1" lock="$2"
  if [ ! -x "$dir/bin/python" ] || ! cmp -s "$lock" "$dir/installed-from.txt"; then
    rm -rf "$dir"
    python3 -m venv "$dir"
    "$dir/bin/python" -m pip install -q --disable-pip-version-check -r "$lock"
    cp "$lock" "$dir/installed-from.txt"
  fi
  # Without build isolation the pinned flit_core builds it: nothing is downloaded.
  "$dir/bin/python" -m pip install -q --disable-pip-version-check --no-deps \
    --no-build-isolation --force-reinstall ./clients/python
}
py_env newest tests/py/requirements.txt
py_env oldest tests/py/requirements-oldest.txt
export PATH="$PWD/target/py/newest/bin:$PATH"
export STOCKGATE_PYTHON_OLDEST="$PWD/target/py/oldest/bin/python"
# ioredis 6 and node-redis 6 need Node.js 20 or newer (npm would only warn).
node_major=$(node -p 'process.versions.node.split(".")[0]')
if [ "$node_major" -lt 20 ]; then
  echo "Node.js $(node --version) is too old: the newest ioredis and node-redis need 20 or newer" >&2
  exit 1
fi
# Node: three npm installs, each exactly from its committed lock file (`npm ci`), again
# whenever the lock file differs from the one it was installed from:
#   tests/node: the newest ioredis and node-redis, driven by the scripts of tests/node
#               (tests/clients/node_clients.rs, raft_clients.rs, cluster_clients.rs, ...);
#   tests/node-oldest: the oldest ioredis and node-redis the project supports, on which the
#               same scripts run again, and the Node package's other dependencies: its
#               tests run again on this install (the oldest ioredis the package allows);
#   clients/node: the Node package under test (tests/clients/node_package.rs;
#               tests/ledger/checkout_scenario.rs runs tests/scenario/run_node.mjs with it).
node_env() {
  local dir="$1"
  if [ ! -d "$dir/node_modules" ] || ! cmp -s "$dir/package-lock.json" "$dir/node_modules/.installed-from.json"; then
    npm ci --prefix "$dir" --no-audit --no-fund
    cp "$dir/package-lock.json" "$dir/node_modules/.installed-from.json"
  fi
}
node_env tests/node
node_env tests/node-oldest
node_env clients/node

# Formatting and lints are part of the tests: a warning fails the run.
cargo fmt --all --check
cargo clippy --workspace --all-targets -- -D warnings
# End-to-end tests start the real binaries: build them first.
cargo build --workspace --bins --tests
cargo test --workspace --no-fail-fast -- --test-threads="${TEST_THREADS:-2}"
# Every fuzz target for a bounded time, FUZZ_SECONDS each (0 skips), from its committed
# seeds: libFuzzer through cargo-fuzz (installed if missing) on the stable toolchain
# (scripts/fuzz.sh says how). A crash, a failed assertion or a timeout fails the run; the
# reproducer is in fuzz/artifacts/TARGET/.
fuzz_seconds=${FUZZ_SECONDS:-20}
if [ "$fuzz_seconds" -gt 0 ]; then
  scripts/fuzz.sh all "$fuzz_seconds"
fi
