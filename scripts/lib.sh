# Shared by the scripts in scripts/ (source it; it runs nothing by itself).

# listening_port OUT ERR [TRIES]: the port a starting stockgate printed to OUT
# ("listening on <addr>:<port>"), waiting up to TRIES × 0.1 s (default 300); on timeout
# prints ERR and fails.
listening_port() {
  local out=$1 err=$2 tries=${3:-300} port=
  for _ in $(seq 1 "$tries"); do
    port=$(sed -n 's/^listening on .*:\([0-9][0-9]*\)$/\1/p' "$out" | head -n 1)
    [[ -n $port ]] && { echo "$port"; return 0; }
    sleep 0.1
  done
  cat "$err" >&2
  echo "stockgate did not start (no 'listening on' in $out)" >&2
  return 1
}
