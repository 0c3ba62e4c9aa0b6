#!/usr/bin/env bash
# Start a 3-controller tb cluster on loopback from three commands — the first forms the cluster,
# two more join it with its join token — apply the example manifests, show that the objects
# survive the loss of the leader, then stop everything.
#
#   scripts/ha-controllers.sh            # run the whole demo and stop
#   KEEP=1 scripts/ha-controllers.sh     # leave the cluster running (stop with the pids printed)
set -euo pipefail
cd "$(dirname "$0")/.."

cargo build --release -q -p tb-controller -p tbctl
bin=target/release
data=$(mktemp -d "${TMPDIR:-/tmp}/tb-local.XXXXXX")
ports=(7401 7402 7403)
servers="127.0.0.1:${ports[0]},127.0.0.1:${ports[1]},127.0.0.1:${ports[2]}"
pids=()

stop() {
  if [ -z "${KEEP:-}" ]; then
    for p in "${pids[@]}"; do kill "$p" 2>/dev/null || true; done
    wait 2>/dev/null || true
    rm -rf "$data"
  else
    echo "controllers left running: pids ${pids[*]}; data in $data"
  fi
}
trap stop EXIT

# The same command starts (and restarts) each controller: the first forms the cluster; the
# others join it with the token from the first's data dir (a restart ignores --join).
start() {
  local id=$1
  local args=(--id "$id" --listen "127.0.0.1:${ports[$((id - 1))]}" --data-dir "$data/c$id")
  if [ "$id" != 1 ]; then
    args+=(--join "https://127.0.0.1:${ports[0]}" --token-file "$data/c1/join.token")
  fi
  "$bin/tb-controller" "${args[@]}" >>"$data/c$id.log" 2>&1 &
  pids[$((id - 1))]=$!
}

echo "== controller 1 forms the cluster"
start 1
for _ in $(seq 1 100); do
  [ -s "$data/c1/admin.token" ] && [ -s "$data/c1/join.token" ] && break
  sleep 0.1
done
# tbctl talks to the cluster as its first admin, trusting its CA.
export TB_TOKEN TB_CA_CERT="$data/c1/ca.pem"
TB_TOKEN=$(cat "$data/c1/admin.token")
tbctl() { "$bin/tbctl" --server "$servers" "$@"; }

echo "== controllers 2 and 3 join with the join token"
start 2
start 3
for _ in $(seq 1 200); do
  if [ "$(tbctl cluster status -o json 2>/dev/null | grep -c '"role": *"voter"')" = 3 ]; then break; fi
  sleep 0.1
done
tbctl cluster status

echo "== tbctl apply -f manifests/"
tbctl apply -f manifests/
tbctl get models
tbctl get trainingjobs -A

leader=$(tbctl cluster status -o json | sed -n 's/.*"leader": *\([0-9]*\).*/\1/p' | head -1)
echo "== kill -9 the leader (controller $leader)"
kill -9 "${pids[$((leader - 1))]}"
for _ in $(seq 1 100); do
  new=$(tbctl cluster status -o json 2>/dev/null | sed -n 's/.*"leader": *\([0-9]*\).*/\1/p' | head -1)
  if [ -n "$new" ] && [ "$new" != "$leader" ] && [ "$new" != 0 ]; then break; fi
  sleep 0.1
done
tbctl cluster status
echo "== the objects are still there, and writes go on"
tbctl apply -f manifests/
tbctl get models -o wide
echo "== restart controller $leader with the same command; it catches up"
start "$leader"
sleep 2
tbctl cluster status
