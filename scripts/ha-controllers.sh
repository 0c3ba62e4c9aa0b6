#!/usr/bin/env bash
# Start a 3-controller tb cluster on loopback, apply the example manifests, show that the
# objects survive the loss of the leader, then stop everything.
#
#   scripts/ha-controllers.sh            # run the whole demo and stop
#   KEEP=1 scripts/ha-controllers.sh     # leave the cluster running (stop with: pkill tb-controller)
set -euo pipefail
cd "$(dirname "$0")/.."

cargo build --release -q -p tb-controller -p tbctl
bin=target/release
data=$(mktemp -d "${TMPDIR:-/tmp}/tb-local.XXXXXX")
ports=(7401 7402 7403)
cluster="1=127.0.0.1:${ports[0]},2=127.0.0.1:${ports[1]},3=127.0.0.1:${ports[2]}"
servers="127.0.0.1:${ports[0]},127.0.0.1:${ports[1]},127.0.0.1:${ports[2]}"
pids=()

stop() {
  if [ -z "${KEEP:-}" ]; then
    for p in "${pids[@]}"; do kill "$p" 2>/dev/null || true; done
    wait 2>/dev/null || true
    rm -rf "$data"
  fi
}
trap stop EXIT

# Controllers share one cluster secret and one CA; the admin token is chosen here so that any
# member may be the one that makes the admin user.
mkdir -p "$data"
echo "tbcluster-$(head -c 32 /dev/urandom | od -An -tx1 | tr -d ' \n')" >"$data/cluster.secret"
echo "tbuser-$(head -c 32 /dev/urandom | od -An -tx1 | tr -d ' \n')" >"$data/admin.token"
chmod 600 "$data/cluster.secret" "$data/admin.token"
export TB_TOKEN
TB_TOKEN=$(cat "$data/admin.token")
# One cluster CA for all three (TLS is on by default); tbctl trusts it.
"$bin/tb-controller" init-ca "$data/ca" >/dev/null
export TB_CA_CERT="$data/ca/ca.pem"

start() {
  local id=$1
  "$bin/tb-controller" --id "$id" --listen "127.0.0.1:${ports[$((id - 1))]}" \
    --data-dir "$data/c$id" --initial-cluster "$cluster" \
    --cluster-secret-file "$data/cluster.secret" --admin-token-file "$data/admin.token" \
    --tls-ca-cert "$data/ca/ca.pem" --tls-ca-key "$data/ca/ca.key" \
    >"$data/c$id.log" 2>&1 &
  pids[$((id - 1))]=$!
}

for id in 1 2 3; do start "$id"; done
tbctl() { "$bin/tbctl" --server "$servers" "$@"; }

echo "== waiting for a leader"
for _ in $(seq 1 100); do
  if tbctl cluster status -o json 2>/dev/null | grep -q '"leader": *[1-9]'; then break; fi
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
echo "== restart controller $leader; it catches up"
start "$leader"
sleep 2
tbctl cluster status
